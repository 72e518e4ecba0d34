"""Logic of the toy-problem pages: optimizer catalogue, trajectory runs, Plotly figures.

Everything here is plain Python over ``toy_problems`` and ``optimizers`` (no Streamlit), so the
tests call it directly and assert on the returned figures' traces.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import optimizers as opt_suite
import toy_problems as tp
from toy_problems import figures

# ----------------------------------------------------------------------------------------------
# optimizer catalogue
# ----------------------------------------------------------------------------------------------


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
    out.update(PROBLEM_SETTINGS.get(problem or "", {}).get("hypers", {}).get(name, {}))
    return out


# Problem-specific settings: a start point, a step count and hyperparameters on the right scale.
PROBLEM_SETTINGS: dict[str, dict[str, Any]] = {
    # Fisher-SAM Fig. 2 setting (toy_problems.figures.FSAM_SETTINGS): SAM ends in the sharp basin,
    # Fisher-SAM crosses to the flat one
    "gaussian_mixture": {
        "start": figures.FSAM_SETTINGS["fig2_start"],
        "steps": 300,
        "hypers": {
            "GD": {"lr": 400.0},
            "Adam": {"lr": 0.5},
            "SAM": {"lr": 400.0, "rho": figures.FSAM_SETTINGS["gamma"]},
            "ASAM": {
                "lr": 400.0,
                "rho": figures.FSAM_SETTINGS["gamma"],
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
        "hypers": {"GD": {"lr": 1e-3}, "SAM": {"lr": 1e-3, "rho": 0.05}},
    },
    "himmelblau": {
        "start": (0.0, 0.0),
        "steps": 200,
        "hypers": {"GD": {"lr": 0.01}, "SAM": {"lr": 0.01, "rho": 0.3}},
    },
}


def problem_settings(problem: str) -> dict[str, Any]:
    prob = tp.get(problem)
    settings = PROBLEM_SETTINGS.get(problem, {})
    (x0, x1), (y0, y1) = prob.bounds
    default_start = (x0 + 0.25 * (x1 - x0), y0 + 0.75 * (y1 - y0))
    return {"start": settings.get("start", default_start), "steps": settings.get("steps", 100)}


# ----------------------------------------------------------------------------------------------
# runs
# ----------------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    optimizer: str
    hypers: dict[str, float]
    trajectory: tp.Trajectory
    extra: dict[str, Any] = field(default_factory=dict)


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


def run(
    problem: str, start: tuple[float, float], steps: int, configs: list[tuple[str, dict[str, float]]]
) -> list[Run]:
    """Run each ``(optimizer name, hyperparameters)`` from ``start`` for ``steps`` steps.

    Bad inputs raise ``ValueError`` with a readable message (start outside the domain, unknown
    optimizer, hyperparameter out of range); a diverging run returns with ``trajectory.diverged``.
    """
    prob = tp.get(problem)
    prob.domain_check(torch.tensor(start, dtype=prob.dtype))
    if steps < 1 or steps > 5000:
        raise ValueError(f"steps must be between 1 and 5000, got {steps}")
    runs = []
    for i, (name, hypers) in enumerate(configs):
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; choose from {sorted(OPTIMIZERS)}")
        h = validate_hypers(name, hypers)
        spec = OPTIMIZERS[name]
        traj = tp.run_trajectory(prob, lambda p, spec=spec, h=h: spec.build(p, h, prob), start, steps)
        label = name if sum(n == name for n, _ in configs) == 1 else f"{name} #{i + 1}"
        runs.append(Run(label, name, h, traj))
    return runs


# ----------------------------------------------------------------------------------------------
# geometry of the SAM-type neighbourhoods
# ----------------------------------------------------------------------------------------------


def neighbourhood(prob: tp.ToyProblem, run_: Run, step: int, n: int = 120) -> np.ndarray | None:
    """Boundary ``[n, 2]`` of the region the method searches for its perturbation at ``path[step]``.

    SAM/RandomSAM/MixSAM: the ball ``||eps|| <= rho``; ASAM: the ellipse ``||eps / T|| <= rho`` with
    ``T = |w| + eta``; FisherSAM: ``eps^T F eps <= rho^2`` with the problem's Fisher (or ``1 + eta g^2``).
    """
    kind = OPTIMIZERS[run_.optimizer].neighbourhood
    if kind is None:
        return None
    w = run_.trajectory.path[min(step, len(run_.trajectory.path) - 1)]
    rho = run_.hypers["rho"]
    if kind == "ball":
        axes = torch.tensor([rho, rho], dtype=w.dtype)
    elif kind == "asam":
        axes = rho * (w.abs() + run_.hypers["eta"])
    else:
        if hasattr(prob, "fisher"):
            f = prob.fisher(w)
        else:
            f = 1.0 + run_.hypers["eta"] * tp.gradient(prob, w) ** 2
        axes = rho / f.sqrt()
    t = torch.linspace(0, 2 * math.pi, n, dtype=w.dtype)
    pts = w[None, :] + torch.stack([axes[0] * t.cos(), axes[1] * t.sin()], -1)
    return pts.numpy()


def hessian_summary(prob: tp.ToyProblem, point) -> dict[str, Any]:
    """Exact Hessian at ``point`` with its eigenvalues, trace and condition number."""
    h = tp.hessian(prob, torch.as_tensor(point, dtype=prob.dtype))
    ev = torch.linalg.eigvalsh(h)
    return {
        "hessian": h.tolist(),
        "eigenvalues": ev.tolist(),
        "trace": float(ev.sum()),
        "condition": float(ev.abs().max() / ev.abs().min()) if float(ev.abs().min()) > 0 else math.inf,
    }


# ----------------------------------------------------------------------------------------------
# figures
# ----------------------------------------------------------------------------------------------

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def loss_grid(prob: tp.ToyProblem, resolution: int = 120) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xs, ys, Z)`` with ``Z[i, j]`` the loss at ``(xs[j], ys[i])``; NaN outside the domain."""
    xs, ys, theta = prob.grid(resolution)
    with torch.no_grad():
        z = prob.loss(theta, check=False)
        z = torch.where(prob.in_domain(theta), z, torch.full_like(z, math.nan))
    return xs.numpy(), ys.numpy(), z.numpy()


def _display(z: np.ndarray, log: bool) -> np.ndarray:
    if not log:
        return z
    finite = z[np.isfinite(z)]
    shift = 1e-12 - min(0.0, float(finite.min())) if finite.size else 0.0
    return np.log10(z + shift + 1e-12)


def contour_figure(
    prob: tp.ToyProblem,
    runs: list[Run],
    resolution: int = 120,
    log: bool = False,
    neighbourhood_step: int | None = 0,
) -> go.Figure:
    """Contour of the loss with each run's path, its minima, and the probe region at one step."""
    xs, ys, z = loss_grid(prob, resolution)
    fig = go.Figure()
    fig.add_trace(
        go.Contour(
            x=xs,
            y=ys,
            z=_display(z, log),
            colorscale="Viridis",
            ncontours=40,
            name="log10 loss" if log else "loss",
            showscale=True,
            opacity=0.85,
        )
    )
    for m in prob.minima:
        fig.add_trace(
            go.Scatter(
                x=[m.theta[0]],
                y=[m.theta[1]],
                mode="markers+text",
                text=[m.label or "min"],
                textposition="top center",
                marker=dict(symbol="star", size=14, color="white", line=dict(color="black", width=1)),
                name=f"minimum {m.label}".strip(),
            )
        )
    for i, r in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        path = r.trajectory.path.numpy()
        fig.add_trace(
            go.Scatter(
                x=path[:, 0],
                y=path[:, 1],
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=color, width=2),
                name=r.label,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[path[-1, 0]],
                y=[path[-1, 1]],
                mode="markers",
                showlegend=False,
                marker=dict(symbol="x", size=12, color=color),
                name=f"{r.label} end",
            )
        )
        if neighbourhood_step is not None:
            region = neighbourhood(prob, r, neighbourhood_step)
            if region is not None:
                fig.add_trace(
                    go.Scatter(
                        x=region[:, 0],
                        y=region[:, 1],
                        mode="lines",
                        name=f"{r.label} neighbourhood",
                        line=dict(color=color, dash="dot"),
                    )
                )
                k = min(neighbourhood_step, len(r.trajectory.perturbations) - 1)
                if k >= 0:
                    w = path[k]
                    e = r.trajectory.perturbations[k].numpy()
                    fig.add_trace(
                        go.Scatter(
                            x=[w[0], w[0] + e[0]],
                            y=[w[1], w[1] + e[1]],
                            mode="lines+markers",
                            name=f"{r.label} probe",
                            line=dict(color=color, width=3),
                            marker=dict(symbol="arrow", angleref="previous", size=10),
                        )
                    )
    (x0, x1), (y0, y1) = prob.bounds
    fig.update_layout(
        xaxis=dict(range=[x0, x1], title=prob.axis_labels[0]),
        yaxis=dict(range=[y0, y1], title=prob.axis_labels[1]),
        height=560,
        legend=dict(orientation="h"),
        margin=dict(l=40, r=20, t=30, b=40),
    )
    return fig


def surface_figure(
    prob: tp.ToyProblem, runs: list[Run], resolution: int = 80, log: bool = False
) -> go.Figure:
    """3-D surface of the loss with each path lifted onto it."""
    xs, ys, z = loss_grid(prob, resolution)
    zd = _display(z, log)
    fig = go.Figure(
        go.Surface(x=xs, y=ys, z=zd, colorscale="Viridis", opacity=0.9, name="loss", showscale=False)
    )
    for i, r in enumerate(runs):
        path = r.trajectory.path.numpy()
        lz = r.trajectory.losses.numpy()
        lz = _display(lz, log) if log else lz
        fig.add_trace(
            go.Scatter3d(
                x=path[:, 0],
                y=path[:, 1],
                z=lz,
                mode="lines+markers",
                name=r.label,
                marker=dict(size=2, color=COLORS[i % len(COLORS)]),
                line=dict(color=COLORS[i % len(COLORS)], width=5),
            )
        )
    fig.update_layout(
        height=560,
        scene=dict(
            xaxis_title=prob.axis_labels[0],
            yaxis_title=prob.axis_labels[1],
            zaxis_title="log10 loss" if log else "loss",
        ),
        margin=dict(l=0, r=0, t=30, b=0),
    )
    return fig


def loss_curves_figure(runs: list[Run]) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(runs):
        fig.add_trace(
            go.Scatter(
                y=r.trajectory.losses.numpy(),
                mode="lines",
                name=r.label,
                line=dict(color=COLORS[i % len(COLORS)]),
            )
        )
    fig.update_layout(xaxis_title="step", yaxis_title="loss", height=320, margin=dict(l=40, r=20, t=30, b=40))
    return fig


def smoothed_panels(
    problem: str, rho: float, resolution: int = 60, n_quad: int = 24
) -> dict[str, np.ndarray]:
    """The four panels of the VSAM paper's Fig. 1 on one grid: loss, Gaussian-smoothed loss, exact
    worst case in the ball of radius ``rho`` and SAM's first-order objective."""
    if not (0 < rho <= 50):
        raise ValueError(f"rho must lie in (0, 50], got {rho}")
    prob = tp.get(problem)
    xs, ys, theta = prob.grid(resolution)
    with torch.no_grad():
        a = prob.loss(theta, check=False)
    b = tp.gaussian_smoothed(prob, theta, rho, n_quad=n_quad)
    c = tp.worst_case_ball(prob, theta, rho, n_radii=8, n_angles=64)
    d = tp.sam_first_order(prob, theta, rho)
    valid = prob.in_domain(theta)
    nan = torch.full_like(a, math.nan)
    panels = {
        k: torch.where(valid, v, nan).numpy()
        for k, v in {"loss": a, "gaussian_smoothed": b, "worst_case": c, "sam_first_order": d}.items()
    }
    panels["xs"], panels["ys"] = xs.numpy(), ys.numpy()
    panels["basins"] = {
        k: len(tp.basins(panels[k])[1])
        for k in ("loss", "gaussian_smoothed", "worst_case", "sam_first_order")
    }
    return panels


PANEL_TITLES = {
    "loss": "A: loss L(θ)",
    "gaussian_smoothed": "B: E L(θ+ε), ε~N(0, ρ²/p I)",
    "worst_case": "C: max_{‖ε‖≤ρ} L(θ+ε)",
    "sam_first_order": "D: L(θ + ρ∇L/‖∇L‖)",
}


def smoothed_figure(panels: dict[str, Any], log: bool = True) -> go.Figure:
    fig = make_subplots(
        rows=1, cols=4, subplot_titles=[PANEL_TITLES[k] for k in PANEL_TITLES], horizontal_spacing=0.04
    )
    for j, key in enumerate(PANEL_TITLES, start=1):
        fig.add_trace(
            go.Contour(
                x=panels["xs"],
                y=panels["ys"],
                z=_display(panels[key], log),
                name=key,
                colorscale="Viridis",
                showscale=False,
                ncontours=30,
            ),
            row=1,
            col=j,
        )
    fig.update_layout(height=380, margin=dict(l=30, r=10, t=50, b=30))
    return fig
