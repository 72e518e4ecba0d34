"""Logic of the "Network landscape" page: train a small digits network with several optimizers,
then compare their loss surfaces (with the trajectory), Hessian spectra and sharpness tables.

Built directly on ``landscape`` (Objective, surface, directions, eigenvalues, spectral_density,
sharpness_report, models.train) and ``optimizers``; no Streamlit here, so tests call it directly.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from torch import nn

import landscape as ls
import optimizers as opt_suite
from landscape import metrics

from .network_plots import log_loss, shared_range, spectrum_figure, surface_figure, training_figure

__all__ = [
    "NETWORK_OPTIMIZERS",
    "TrainedRun",
    "train_network",
    "surface_of",
    "spectrum_of",
    "sharpness_rows",
    "metric_rows",
    "spectrum_rows",
    "surface_caption",
    "log_loss",
    "shared_range",
    "surface_figure",
    "spectrum_figure",
    "training_figure",
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

SHARPNESS_MEASURES: list[tuple[str, dict[str, Any]]] = [
    ("lambda_max", {}),
    ("hessian_trace", {}),
    ("gradient_norm", {}),
    ("worst_case", {"rho": 0.05, "solver": "one_step"}),
    ("average_case", {"rho": 0.05}),
]


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


def make_model(hidden: int, seed: int) -> nn.Module:
    return ls.models.model_factory("mlp", sizes=[64, hidden, 10], activation="tanh", seed=seed)


def digits(seed: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return ls.data.load_digits("train", seed=seed), ls.data.load_digits("test", seed=seed)


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
    on_step: Callable[[float], None] | None = None,
) -> TrainedRun:
    """Train the MLP 64-hidden-10 (same initialisation for every optimizer) on the digits train split.

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
    (xtr, ytr), (xte, yte) = digits(seed)
    model = make_model(hidden, seed)
    initial = copy.deepcopy(model.state_dict())
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
        raise ValueError(f"{name} diverged ({exc}); lower its learning rate") from exc
    model.eval()
    with torch.no_grad():
        probs = torch.softmax(model(xte), dim=1)
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
        config={
            "optimizer": name,
            "lr": lr,
            "rho": rho,
            "epochs": epochs,
            "hidden": hidden,
            "batch_size": batch_size,
            "seed": seed,
            "record_every": record_every,
        },
    )


def model_of(run: TrainedRun) -> nn.Module:
    model = make_model(run.config["hidden"], run.config["seed"])
    model.load_state_dict(run.state_dict)
    return model.eval()


def objective_of(run: TrainedRun, split: str = "train") -> ls.Objective:
    data = ls.data.load_digits(split, seed=run.config["seed"])
    return ls.Objective(model_of(run), nn.CrossEntropyLoss(), data)


def surface_of(
    run: TrainedRun,
    *,
    kind: str = "pca",
    resolution: int = 21,
    extent: float = 1.0,
    progress: Callable[[float], None] | None = None,
) -> tuple[ls.Surface, np.ndarray | None]:
    """2-D loss surface around the final weights.

    ``kind="pca"``: the plane of the first two principal directions of the recorded trajectory
    (Li et al. 2018 Sec. 7) with the projected trajectory returned as ``[T, 2]`` coordinates;
    ``kind="random"``: two filter-normalised Gaussian directions (seeds 0 and 1), no trajectory.
    ``extent`` scales the coordinate range: PCA ranges cover the projected path with a margin.
    """
    if resolution < 3 or resolution > 101:
        raise ValueError(f"resolution must be between 3 and 101, got {resolution}")
    obj = objective_of(run)
    model = obj.model
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    path = None
    if kind == "pca":
        dirs = ls.directions.pca(SimpleNamespace(weights=run.trajectory, names=names, shapes=shapes), k=2)
        final = run.trajectory[-1]
        mat = torch.stack([torch.cat([d[n].reshape(-1).double() for n in names]) for d in dirs])
        path = ((run.trajectory - final) @ mat.T).numpy()
        span = np.abs(path).max(axis=0) * 1.25 * extent + 1e-3
        xs = np.linspace(-span[0], span[0], resolution)
        ys = np.linspace(-span[1], span[1], resolution)
    elif kind == "random":
        dirs = [ls.directions.random(model, "filter", seed=s) for s in (0, 1)]
        xs = ys = np.linspace(-extent, extent, resolution)
    else:
        raise ValueError(f"kind must be 'pca' or 'random', got {kind!r}")
    xs = np.unique(np.concatenate([xs, [0.0]]))  # the centre is on the grid
    ys = np.unique(np.concatenate([ys, [0.0]]))
    s = ls.surface(obj, directions=list(dirs), coords=[xs, ys], metrics=("loss", "accuracy"))
    return s, path


def spectrum_of(
    run: TrainedRun, *, k: int = 5, runs: int = 5, lanczos_steps: int = 40, seed: int = 0
) -> dict[str, Any]:
    """Top-k Hessian eigenvalues (restarted Lanczos, with residuals) and the SLQ spectral density."""
    obj = objective_of(run)
    H = ls.hessian(obj)
    eig = ls.eigenvalues(H, k=k, which="largest", seed=seed)
    dens = ls.spectral_density(H, runs=runs, lanczos_steps=lanczos_steps, seed=seed)
    return {
        "eigenvalues": [float(v) for v in eig.values],
        "residuals": [float(v) for v in eig.residuals],
        "converged": [bool(v) for v in eig.converged],
        "grid": np.asarray(dens.grid, dtype=float),
        "density": np.asarray(dens.density, dtype=float),
        "trace": float(dens.trace),
        "trace_stderr": float(dens.trace_stderr),
        "matvecs": int(eig.matvecs + dens.matvecs),
    }


def sharpness_rows(runs: dict[str, TrainedRun], measures=None) -> list[dict[str, Any]]:
    """One row per (measure, optimizer): value and standard error, from ``ls.sharpness_report``."""
    measures = measures or SHARPNESS_MEASURES
    rows = []
    for name, run in runs.items():
        report = ls.sharpness_report(objective_of(run), measures)
        for row in report.table_rows():
            rows.append(
                {
                    "optimizer": name,
                    "measure": row["measure"],
                    "value": row["value"],
                    "stderr": row["stderr"],
                    "options": row["options"],
                }
            )
    return rows


def metric_rows(runs: dict[str, TrainedRun]) -> list[dict[str, Any]]:
    """One row per optimizer with its test metrics (rounded to 4 decimals)."""
    return [{"optimizer": n, **{k: round(v, 4) for k, v in r.test.items()}} for n, r in runs.items()]


def spectrum_rows(spectra: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per optimizer: top eigenvalues, whether all converged, the SLQ trace with its error."""
    return [
        {
            "optimizer": n,
            "top eigenvalues": ", ".join(f"{v:.4g}" for v in sp["eigenvalues"]),
            "all converged": all(sp["converged"]),
            "trace (SLQ)": f"{sp['trace']:.4g} ± {sp['trace_stderr']:.2g}",
        }
        for n, sp in spectra.items()
    ]


def surface_caption(s: ls.Surface) -> str:
    """The loss at the surface's centre (the trained weights) and what computing it cost."""
    centre = float(s.loss[np.argmin(np.abs(s.xs)), np.argmin(np.abs(s.ys))])
    return f"centre loss {centre:.4g}; {s.evaluations} evaluations in {s.seconds:.1f} s ({s.strategy})"
