"""The optimizers the playground offers (hyperparameter widgets and how each is built on a toy
problem) and the per-problem start points, step counts and hyperparameter scales."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import optimizers as opt_suite
import toy_problems as tp
from toy_problems import figures


@dataclass(frozen=True)
class Hyper:
    """One hyperparameter widget: name, default, bounds and whether it is set on a log scale."""

    name: str
    default: float
    low: float
    high: float
    log: bool = True
    help: str = ""


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    hypers: tuple[Hyper, ...]
    build: Callable[[list[torch.nn.Parameter], dict[str, float], tp.ToyProblem], torch.optim.Optimizer]
    neighbourhood: str | None = None  # "ball", "asam", "fisher": the region SAM-type methods probe
    note: str = ""


def _lr(default: float = 0.05) -> Hyper:
    return Hyper("lr", default, 1e-5, 1000.0, help="learning rate of the (base) optimizer")


def _rho(default: float = 0.05, high: float = 50.0) -> Hyper:
    return Hyper("rho", default, 1e-4, high, help="perturbation radius")


def _fisher_of(prob: tp.ToyProblem):
    """The analytic diagonal Fisher of the problem for FisherSAM, or None (gradient-magnitude Fisher)."""
    if not hasattr(prob, "fisher"):
        return None

    def fisher(param: torch.Tensor) -> torch.Tensor:
        return prob.fisher(param.detach())

    return fisher


def _num_data(prob: tp.ToyProblem) -> int:
    return int(getattr(prob, "num_data", 100))


SGD = torch.optim.SGD

OPTIMIZERS: dict[str, OptimizerSpec] = {
    spec.name: spec
    for spec in [
        OptimizerSpec("GD", (_lr(),), lambda p, h, prob: SGD(p, lr=h["lr"])),
        OptimizerSpec("Adam", (_lr(),), lambda p, h, prob: torch.optim.Adam(p, lr=h["lr"])),
        OptimizerSpec(
            "SAM",
            (_lr(), _rho()),
            lambda p, h, prob: opt_suite.SAM(p, SGD, rho=h["rho"], lr=h["lr"]),
            neighbourhood="ball",
            note="Foret et al. 2021: eps = rho g/||g||",
        ),
        OptimizerSpec(
            "ASAM",
            (_lr(), _rho(0.5), Hyper("eta", 0.01, 0.0, 10.0, log=False)),
            lambda p, h, prob: opt_suite.ASAM(p, SGD, rho=h["rho"], eta=h["eta"], lr=h["lr"], scale_all=True),
            neighbourhood="asam",
            note="Kwon et al. 2021: eps = rho T^2 g/||T g||, T = |w| + eta",
        ),
        OptimizerSpec(
            "FisherSAM",
            (_lr(), _rho(0.1), Hyper("eta", 1.0, 0.0, 10.0, log=False)),
            lambda p, h, prob: opt_suite.FisherSAM(
                p, SGD, rho=h["rho"], eta=h["eta"], lr=h["lr"], fisher=_fisher_of(prob)
            ),
            neighbourhood="fisher",
            note="Kim et al. 2022 eq. 10-12; the problem's analytic Fisher when it has one",
        ),
        OptimizerSpec(
            "RandomSAM",
            (_lr(), _rho()),
            lambda p, h, prob: opt_suite.RandomSAM(p, SGD, rho=h["rho"], lr=h["lr"], seed=0),
            neighbourhood="ball",
            note="VSAM seed Alg. 1: gradient at w + (rho/sqrt(p)) z",
        ),
        OptimizerSpec(
            "MixSAM",
            (_lr(), _rho(), Hyper("kappa", 1.0, 0.0, 10.0, log=False)),
            lambda p, h, prob: opt_suite.MixSAM(p, SGD, rho=h["rho"], kappa=h["kappa"], lr=h["lr"], seed=0),
            neighbourhood="ball",
        ),
        OptimizerSpec(
            "BayesianSAM",
            (_lr(0.1), _rho(0.05), Hyper("prior_precision", 1.0, 0.0, 1000.0)),
            lambda p, h, prob: opt_suite.BayesianSAM(
                p,
                lr=h["lr"],
                num_data=_num_data(prob),
                rho=h["rho"],
                prior_precision=h["prior_precision"],
                seed=0,
            ),
            note="Moellenhoff & Khan 2023, Alg. 1",
        ),
        OptimizerSpec(
            "SGDTracer",
            (_lr(), Hyper("rho", 0.05, 0.0, 10.0, log=False), Hyper("delta", 1e-2, 1e-8, 10.0)),
            lambda p, h, prob: opt_suite.SGDTracer(
                p, lr=h["lr"], rho=h["rho"], delta=h["delta"], hvp="finite_difference"
            ),
            note="G-TRACER seed Alg. 1 (finite-difference Hessian-vector product)",
        ),
    ]
}


def hyper_defaults(name: str, problem: str | None = None) -> dict[str, float]:
    """Default hyperparameters of ``name``, tuned per problem where the scale differs."""
    if name not in OPTIMIZERS:
        raise KeyError(f"unknown optimizer {name!r}; choose from {sorted(OPTIMIZERS)}")
    out = {h.name: h.default for h in OPTIMIZERS[name].hypers}
    settings = PROBLEM_SETTINGS.get(problem or "", {})
    if "lr" in settings and name not in OWN_LR_SCALE:
        out["lr"] = settings["lr"]
    out.update(settings.get("hypers", {}).get(name, {}))
    return out


#: optimizers whose learning rate is not a plain gradient step (Adam's is a step length per
#: coordinate, bSAM's a natural-gradient step): a problem's "lr" does not apply to them
OWN_LR_SCALE = frozenset({"Adam", "BayesianSAM"})

# Problem-specific settings: a start point, a step count, the learning rate of the gradient-step
# optimizers (stable for the problem's curvature along the default paths) and per-optimizer values.
PROBLEM_SETTINGS: dict[str, dict[str, Any]] = {
    # Fisher-SAM Fig. 2/3 setting (toy_problems.figures.FSAM_SETTINGS): from (0, 20) SAM (rho 1) and
    # ASAM (its own rho 0.1) end in the sharp minimum, Fisher-SAM (gamma 1) in the flat one
    "gaussian_mixture": {
        "start": figures.FSAM_SETTINGS["fig2_start"],
        "steps": 300,
        "hypers": {
            "GD": {"lr": 400.0},
            "Adam": {"lr": 0.5},
            "SAM": {"lr": 400.0, "rho": figures.FSAM_SETTINGS["gamma"]},
            "ASAM": {
                "lr": 400.0,
                "rho": figures.FSAM_SETTINGS["asam_rho"],
                "eta": figures.FSAM_SETTINGS["asam_eta"],
            },
            "FisherSAM": {"lr": 400.0, "rho": figures.FSAM_SETTINGS["gamma"], "eta": 1.0},
            "RandomSAM": {"lr": 400.0, "rho": 0.2},
            "MixSAM": {"lr": 400.0, "rho": 0.2},
            "BayesianSAM": {"lr": 50.0, "rho": 0.05, "prior_precision": 0.0},
            "SGDTracer": {"lr": 100.0, "rho": 0.01, "delta": 1e-2},
        },
    },
    "rosenbrock": {
        "start": (-1.5, 2.0),
        "steps": 300,
        "lr": 5e-4,
        "hypers": {
            "GD": {"lr": 1e-3},
            "SAM": {"lr": 1e-3, "rho": 0.05},
            "BayesianSAM": {"lr": 0.01, "rho": 1e-3},
        },
    },
    "beale": {"lr": 3e-4, "hypers": {"BayesianSAM": {"lr": 0.01, "rho": 1e-4}}},
    "himmelblau": {
        "start": (0.0, 0.0),
        "steps": 200,
        "lr": 0.01,
        "hypers": {"SAM": {"lr": 0.01, "rho": 0.3}},
    },
    "rastrigin": {"lr": 0.01},
    # curvature 100 along y: a gradient step needs lr < 2/100
    "ill_conditioned_quadratic": {"lr": 0.015, "hypers": {"ASAM": {"rho": 0.1}}},
}


def playground_problems() -> tuple[list[str], dict[str, str]]:
    """``(offered, excluded)``: the registered problems the playground can draw (a 2-D parameter, so
    a contour of the loss over it), and for every other one the reason it is left out."""
    offered, excluded = [], {}
    for name in tp.names():
        prob = tp.get(name)
        if prob.dim == 2:
            offered.append(name)
        else:
            excluded[name] = (
                f"its parameter is a {prob.dim:,}-dimensional weight vector, so there is no 2-D loss "
                "surface to draw paths on"
            )
    return offered, excluded


def problem_settings(problem: str) -> dict[str, Any]:
    """Start point and step count of the playground for ``problem`` (ValueError if it is not 2-D)."""
    prob = tp.get(problem)
    if prob.dim != 2:
        raise ValueError(
            f"{problem} has a {prob.dim}-dimensional parameter; the playground needs a 2-D problem "
            f"({', '.join(playground_problems()[0])})"
        )
    settings = PROBLEM_SETTINGS.get(problem, {})
    (x0, x1), (y0, y1) = prob.bounds
    default_start = (x0 + 0.25 * (x1 - x0), y0 + 0.75 * (y1 - y0))
    return {"start": settings.get("start", default_start), "steps": settings.get("steps", 100)}


def validate_hypers(name: str, hypers: dict[str, float]) -> dict[str, float]:
    spec = OPTIMIZERS[name]
    out = {}
    for h in spec.hypers:
        v = float(hypers.get(h.name, h.default))
        if not math.isfinite(v) or v < h.low or v > h.high:
            raise ValueError(
                f"{name}: {h.name}={v} is outside [{h.low}, {h.high}]; pick a value in that range"
            )
        out[h.name] = v
    return out
