"""Logic of the "Network landscape" page, its bottom layer: train a small digits network with
several optimizers (:class:`TrainedRun`), rebuild a run's model, data and objective, and its test
metrics. The analyses of a trained run are in :mod:`network_analyses`, its figures in
:mod:`network_plots`, the page's texts and tables in :mod:`network_text`; each imports this module,
never the other way round.

Built directly on ``landscape`` (Objective, surface, directions, eigenvalues, spectral_density,
sharpness_report, models.train) and ``optimizers``; no Streamlit here, so tests call it directly.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

import landscape as ls
import optimizers as opt_suite
from landscape import metrics

from .network_text import MEASURE_OPTIONS

__all__ = [
    "ARCHITECTURES",
    "NETWORK_OPTIMIZERS",
    "SHARPNESS_MEASURES",
    "TrainedRun",
    "data_of",
    "digits",
    "interpolation_of",
    "make_model",
    "metric_rows",
    "model_of",
    "objective_of",
    "run_label",
    "surface_caption",
    "train_network",
]

# optimizer name -> (factory(params, lr, rho, num_data), default lr, default rho)
NETWORK_OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], float, float]] = {
    "SGD": (lambda p, lr, rho, n: torch.optim.SGD(p, lr=lr, momentum=0.9), 0.05, 0.0),
    "SAM": (
        lambda p, lr, rho, n: opt_suite.SAM(p, torch.optim.SGD, rho=rho, lr=lr, momentum=0.9),
        0.05,
        0.05,
    ),
    "ASAM": (
        # the MLP has no normalisation layers: "dim>1" scales exactly the weights (the authors' rule)
        lambda p, lr, rho, n: opt_suite.ASAM(p, torch.optim.SGD, rho=rho, lr=lr, momentum=0.9, scale="dim>1"),
        0.05,
        0.5,
    ),
    "FisherSAM": (
        lambda p, lr, rho, n: opt_suite.FisherSAM(p, torch.optim.SGD, rho=rho, lr=lr, momentum=0.9),
        0.05,
        0.1,
    ),
    "Adam": (lambda p, lr, rho, n: torch.optim.Adam(p, lr=lr), 0.003, 0.0),
    "BayesianSAM": (
        lambda p, lr, rho, n: opt_suite.BayesianSAM(
            p, lr=lr, num_data=n, rho=rho, prior_precision=1.0, seed=0
        ),
        0.5,
        0.01,
    ),
}

#: the page's sharpness measures with their default options (:data:`network_text.MEASURE_OPTIONS`)
SHARPNESS_MEASURES: list[tuple[str, dict[str, Any]]] = [(m, dict(o)) for m, o in MEASURE_OPTIONS.items()]

#: page label -> (``landscape.models.model_factory`` name, keyword arguments, image input): all take
#: the 8x8 scikit-learn digits (flat 64-vectors for the MLP, 1x8x8 images for the others)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], bool]] = {
    "MLP": ("mlp", {"activation": "tanh"}, False),
    "LeNet-5": ("lenet5-digits", {}, True),
    "ResNet": ("resnet", {"in_channels": 1, "width": 4, "blocks": (1, 1, 1)}, True),
}


@dataclass
class TrainedRun:
    """One trained network: final weights, recorded trajectory and test metrics."""

    name: str
    lr: float
    rho: float
    state_dict: dict[str, torch.Tensor]
    initial_state: dict[str, torch.Tensor]
    trajectory: torch.Tensor  # [T, p] flat weights (float64), first row = initialisation
    history: dict[str, list[float]]
    test: dict[str, float]
    config: dict[str, Any] = field(default_factory=dict)
    warning: str = ""  # non-empty when the run diverged (training loss above the initialisation's)


def _arch(arch: str) -> tuple[str, dict[str, Any], bool]:
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown model {arch!r}; choose from {list(ARCHITECTURES)}")
    return ARCHITECTURES[arch]


def make_model(hidden: int, seed: int, arch: str = "MLP") -> nn.Module:
    """The page's network: the MLP 64-hidden-10, LeNet-5 on 8x8 images or a small ResNet (width 4)."""
    name, kwargs, _ = _arch(arch)
    if name == "mlp":
        kwargs = {**kwargs, "sizes": [64, hidden, 10]}
    return ls.models.model_factory(name, seed=seed, **kwargs)


def digits(
    seed: int = 0, image: bool = False
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return (
        ls.data.load_digits("train", seed=seed, image=image),
        ls.data.load_digits("test", seed=seed, image=image),
    )


def run_label(run: TrainedRun) -> str:
    """``"SGD"`` for seed 0, ``"SGD (seed 2)"`` otherwise."""
    seed = run.config["seed"]
    return run.name if seed == 0 else f"{run.name} (seed {seed})"


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def train_network(
    name: str,
    *,
    lr: float | None = None,
    rho: float | None = None,
    epochs: int = 10,
    hidden: int = 32,
    batch_size: int = 64,
    seed: int = 0,
    record_every: int = 5,
    arch: str = "MLP",
    on_step: Callable[[float], None] | None = None,
) -> TrainedRun:
    """Train ``arch`` (same initialisation for every optimizer, one per seed) on the digits train split.

    ``on_step(fraction_done)`` is called as training proceeds (the page drives a progress bar).
    A diverging run raises ``ValueError`` with a hint to lower the learning rate.
    """
    if name not in NETWORK_OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose from {sorted(NETWORK_OPTIMIZERS)}")
    factory, lr0, rho0 = NETWORK_OPTIMIZERS[name]
    lr = lr0 if lr is None else float(lr)
    rho = rho0 if rho is None else float(rho)
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"learning rate must be positive, got {lr}")
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if not (1 <= epochs <= 200):
        raise ValueError(f"epochs must be between 1 and 200, got {epochs}")
    image = _arch(arch)[2]
    (xtr, ytr), (xte, yte) = digits(seed, image)
    model = make_model(hidden, seed, arch)
    initial = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        loss0 = float(nn.functional.cross_entropy(model.eval()(xtr), ytr))
    model.train()
    steps_total = epochs * math.ceil(len(ytr) / batch_size)
    snapshots = [_flat(model)]

    def callback(step: int, m: nn.Module, loss: float) -> None:
        if step % record_every == 0 or step == steps_total:
            snapshots.append(_flat(m))
        if on_step is not None:
            on_step(step / steps_total)

    try:
        history = ls.models.train(
            model,
            (xtr, ytr),
            lambda p: factory(p, lr, rho, len(ytr)),
            epochs=epochs,
            batch_size=batch_size,
            seed=seed,
            callback=callback,
        )
    except FloatingPointError as exc:
        raise ValueError(
            f"{name} (lr {lr:g}, seed {seed}) diverged ({exc}); lower its learning rate"
        ) from exc
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(xte), dim=1)
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(
            f"{name} (lr {lr:g}, seed {seed}) diverged: the trained network's outputs are not finite; "
            "lower its learning rate"
        )
    with torch.no_grad():
        loss1 = float(nn.functional.cross_entropy(model(xtr), ytr))
    warning = ""
    if not loss1 <= loss0:  # also NaN
        warning = (
            f"{name} (lr {lr:g}, seed {seed}) diverged: its training loss rose from {loss0:.4g} at the "
            f"initialisation to {loss1:.4g}; lower its learning rate"
        )
    test = {
        "accuracy": float(metrics.accuracy(probs, yte)),
        "nll": float(metrics.nll(probs, yte)),
        "ece": float(metrics.ece(probs, yte)),
    }
    return TrainedRun(
        name=name,
        lr=lr,
        rho=rho,
        state_dict=copy.deepcopy(model.state_dict()),
        initial_state=initial,
        trajectory=torch.stack(snapshots),
        history=history,
        test=test,
        warning=warning,
        config={
            "optimizer": name,
            "lr": lr,
            "rho": rho,
            "epochs": epochs,
            "hidden": hidden,
            "arch": arch,
            "batch_size": batch_size,
            "seed": seed,
            "record_every": record_every,
        },
    )


def model_of(run: TrainedRun) -> nn.Module:
    arch = run.config.get("arch", "MLP")
    model = make_model(run.config["hidden"], run.config["seed"], arch)
    model.load_state_dict(run.state_dict)
    return model.eval()


def data_of(run: TrainedRun, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """The digits split (``"train"`` or ``"test"``) the run's model takes (images for the CNNs)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    image = _arch(run.config.get("arch", "MLP"))[2]
    return ls.data.load_digits(split, seed=run.config["seed"], image=image)


def objective_of(run: TrainedRun, split: str = "train") -> ls.Objective:
    return ls.Objective(model_of(run), nn.CrossEntropyLoss(), data_of(run, split))


def interpolation_of(
    run_a: TrainedRun, run_b: TrainedRun, *, split: str = "train", n_points: int = 21
) -> ls.PathResult:
    """Loss and accuracy on the straight line between two trained solutions (``landscape.interpolate``;
    Goodfellow et al. 2015, Garipov et al. 2018's barrier)."""
    if (
        run_a.config.get("arch") != run_b.config.get("arch")
        or run_a.config["hidden"] != run_b.config["hidden"]
    ):
        raise ValueError("both runs must have the same architecture to interpolate between them")
    return ls.interpolate(
        model_of(run_a), model_of(run_b), nn.CrossEntropyLoss(), data_of(run_a, split), n_points=n_points
    )


def _mean_std(values: list[float]) -> str:
    """``"0.9528"`` for one value, ``"0.9528 ± 0.0041"`` (sample std) for several."""
    v = np.asarray(values, dtype=float)
    if len(v) == 1:
        return f"{v[0]:.4f}"
    return f"{v.mean():.4f} ± {v.std(ddof=1):.4f}"


def metric_rows(runs: dict[str, TrainedRun | list[TrainedRun]]) -> list[dict[str, Any]]:
    """One row per optimizer with its test metrics: the value for one seed, mean ± standard deviation
    over the seeds for several (a list of runs)."""
    rows = []
    for n, r in runs.items():
        seeds = r if isinstance(r, list) else [r]
        row: dict[str, Any] = {"optimizer": n, "seeds": len(seeds)}
        for k in seeds[0].test:
            row[k] = _mean_std([s.test[k] for s in seeds])
        rows.append(row)
    return rows


def surface_caption(s: ls.Surface) -> str:
    """The loss at the surface's centre (the trained weights) and what computing it cost."""
    centre = float(s.loss[np.argmin(np.abs(s.xs)), np.argmin(np.abs(s.ys))])
    return f"centre loss {centre:.4g}; {s.evaluations} evaluations in {s.seconds:.1f} s ({s.strategy})"
