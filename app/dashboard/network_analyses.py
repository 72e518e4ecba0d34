"""The analyses of the "Network landscape" page on a trained run (:class:`network.TrainedRun`):
loss surfaces in the PCA plane of the trajectory (one sign convention, one span for all panels) or
a random filter-normalised plane, the Hessian spectrum (eigenvalues, trace, SLQ density) and the
sharpness table, each with a progress callback that reports the fraction of the work done: the
surface by strips of grid rows, the spectrum by Hessian-vector products against each stage's
budget, the sharpness measure by measure. The library's estimators run unchanged. No Streamlit.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

import landscape as ls

from .network import SHARPNESS_MEASURES, TrainedRun, make_model, objective_of
from .network_text import TRACE_OPTIONS, cell, measure_explanation, sharpness_measures

__all__ = [
    "n_params",
    "pca_plane",
    "pca_span",
    "sharpness_details",
    "sharpness_rows",
    "spectrum_of",
    "surface_of",
]


def pca_plane(run: TrainedRun) -> tuple[list[dict[str, torch.Tensor]], np.ndarray]:
    """The first two principal directions of the run's recorded trajectory (Li et al. 2018 Sec. 7;
    unit vectors) and the trajectory projected on them (``[T, 2]``, the final weights at 0). Each
    direction's sign puts the initialisation at negative coordinates, so panels of different
    optimizers are not mirrored versions of one another by the SVD's sign choice."""
    model = make_model(run.config["hidden"], run.config["seed"], run.config.get("arch", "MLP"))
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    dirs = ls.directions.pca(SimpleNamespace(weights=run.trajectory, names=names, shapes=shapes), k=2)
    mat = torch.stack([torch.cat([d[n].reshape(-1).double() for n in names]) for d in dirs])
    path = ((run.trajectory - run.trajectory[-1]) @ mat.T).numpy()
    signs = np.where(path[0] > 0, -1.0, 1.0)
    flipped = [{n: t * float(sg) for n, t in d.items()} for d, sg in zip(dirs, signs)]
    return flipped, path * signs


def pca_span(runs: list[TrainedRun], margin: float = 1.25) -> float:
    """One half-width for the PCA panels of all ``runs``: ``margin`` times the largest coordinate of
    any projected trajectory, so every panel has the same axes."""
    return max(float(np.abs(pca_plane(r)[1]).max()) for r in runs) * margin + 1e-3


def _strips(
    obj: ls.Objective, dirs: list, xs: np.ndarray, ys: np.ndarray, progress, strips: int
) -> ls.Surface:
    """``ls.surface`` over the grid in strips of rows (each point is evaluated as in one call: the
    values are the same), calling ``progress(fraction, text)`` after each strip; the strips are
    joined into one :class:`landscape.Surface`."""
    k = max(1, min(strips, len(xs) // 2))
    pieces = []
    for i, idx in enumerate(np.array_split(np.arange(len(xs)), k)):
        pieces.append(ls.surface(obj, directions=dirs, coords=[xs[idx], ys], metrics=("loss", "accuracy")))
        if progress is not None:
            done = sum(p.loss.shape[0] for p in pieces) * len(ys)
            progress((i + 1) / k, f"{done} of {len(xs) * len(ys)} grid points")
    if k == 1:
        return pieces[0]
    first = pieces[0]
    config = {
        **first.config,
        "shape": [len(xs), len(ys)],
        "ranges": [[float(xs.min()), float(xs.max())], [float(ys.min()), float(ys.max())]],
        "strips": k,
    }
    return ls.Surface(
        config=config,
        seconds=sum(p.seconds for p in pieces),
        coords=[np.concatenate([np.asarray(p.coords[0]) for p in pieces]), np.asarray(first.coords[1])],
        values={m: np.concatenate([p.values[m] for p in pieces]) for m in first.values},
        mask=np.concatenate([np.asarray(p.mask) for p in pieces]),
        directions=first.directions,
        evaluations=sum(p.evaluations for p in pieces),
        strategy=first.strategy,
    )


def surface_of(
    run: TrainedRun,
    *,
    kind: str = "pca",
    resolution: int = 21,
    extent: float = 1.0,
    span: float | None = None,
    progress: Callable[[float, str], None] | None = None,
    strips: int = 8,
) -> tuple[ls.Surface, np.ndarray | None]:
    """2-D loss surface around the final weights.

    ``kind="pca"``: the plane of :func:`pca_plane` with the projected trajectory returned as
    ``[T, 2]`` coordinates, over the square ``[-span, span]²`` (default: 1.25 times the largest
    projected coordinate, times ``extent``; :func:`pca_span` gives one span for several runs);
    ``kind="random"``: two filter-normalised Gaussian directions (seeds 0 and 1) over
    ``[-extent, extent]²``, no trajectory. ``progress(fraction, text)`` is called after each of
    about ``strips`` strips of grid rows.
    """
    if resolution < 3 or resolution > 101:
        raise ValueError(f"resolution must be between 3 and 101, got {resolution}")
    obj = objective_of(run)
    path = None
    if kind == "pca":
        dirs, path = pca_plane(run)
        half = float(span) if span is not None else float(np.abs(path).max()) * 1.25 * extent + 1e-3
        xs = ys = np.linspace(-half, half, resolution)
    elif kind == "random":
        dirs = [ls.directions.random(obj.model, "filter", seed=s) for s in (0, 1)]
        xs = ys = np.linspace(-extent, extent, resolution)
    else:
        raise ValueError(f"kind must be 'pca' or 'random', got {kind!r}")
    xs = np.unique(np.concatenate([xs, [0.0]]))  # the centre is on the grid
    ys = np.unique(np.concatenate([ys, [0.0]]))
    return _strips(obj, list(dirs), xs, ys, progress, strips), path


class _Counted:
    """A curvature operator whose products also move a progress bar; the estimators see the same
    products (``landscape.curvature.linop.as_linop`` wraps any object with ``shape``, ``dtype``,
    ``device`` and ``matmat``)."""

    def __init__(self, op: Any, tick: Callable[[int], None]):
        self.op, self.tick = op, tick
        self.shape, self.dtype, self.device = op.shape, op.dtype, op.device

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        out = self.op.matmat(V)
        self.tick(1 if V.ndim == 1 else int(V.shape[1]))
        return out

    def config(self) -> dict[str, Any]:
        return self.op.config()


def spectrum_of(
    run: TrainedRun,
    *,
    k: int = 5,
    runs: int = 5,
    lanczos_steps: int = 40,
    seed: int = 0,
    tol: float = 1e-6,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """Top-k and smallest Hessian eigenvalues (restarted Lanczos, with residuals; the smallest is
    converged when its residual is below ``tol * lambda_max``, as ``landscape``'s ``lambda_max``
    measure decides), the Hessian trace (:data:`network_text.TRACE_OPTIONS`: ``landscape.trace``
    "auto") with its stopping rule's outcome, and the SLQ spectral density (Ghorbani et al. 2019).

    ``progress(fraction, text)``: the fraction of the four stages' product budgets done (each
    stage counts as its budget once finished)."""
    obj = objective_of(run)
    H = ls.hessian(obj)
    eig_budget = max(300, 40 * k)
    stages = [
        ("top eigenvalues (Lanczos)", eig_budget),
        ("smallest eigenvalue (Lanczos)", eig_budget),
        ("trace", int(TRACE_OPTIONS["max_matvecs"])),
        ("density (SLQ)", runs * lanczos_steps),
    ]
    total = sum(b for _, b in stages)
    state = {"stage": 0, "done": 0, "before": 0}

    def tick(n: int) -> None:
        state["done"] += n
        if progress is not None:
            name, budget = stages[state["stage"]]
            frac = (state["before"] + min(state["done"], budget)) / total
            progress(frac, f"{name}: {state['done']} of at most {budget} Hessian-vector products")

    def next_stage() -> None:
        state["before"] += stages[state["stage"]][1]
        state["stage"] = min(state["stage"] + 1, len(stages) - 1)
        state["done"] = 0

    op = _Counted(H, tick)
    eig = ls.eigenvalues(op, k=k, which="largest", tol=tol, max_matvecs=eig_budget, seed=seed)
    next_stage()
    atol = tol * abs(float(eig.values[0]))
    low = ls.eigenvalues(op, k=1, which="smallest", tol=tol, atol=atol, max_matvecs=eig_budget, seed=seed)
    next_stage()
    tr = ls.trace(op, **{**TRACE_OPTIONS, "seed": seed})
    next_stage()
    dens = ls.spectral_density(op, runs=runs, lanczos_steps=lanczos_steps, seed=seed)
    level = float(tr.config.get("level", 0.95))
    half = tr.ci(level)
    return {
        "smallest": float(low.values[0]),
        "smallest_converged": bool(low.converged[0]),
        "smallest_residual": float(low.residuals[0]),
        "smallest_tolerance": max(tol * abs(float(low.values[0])), atol),
        "hutchinson_trace": float(tr.value),
        "hutchinson_stderr": float(tr.stderr),
        "trace_method": tr.method,
        "trace_converged": bool(tr.converged),
        "trace_matvecs": int(tr.matvecs),
        "trace_budget": int(TRACE_OPTIONS["max_matvecs"]),
        "trace_rtol": float(TRACE_OPTIONS["rtol"]),
        "trace_level": level,
        "trace_halfwidth": float(half[1] - tr.value),
        "eigenvalues": [float(v) for v in eig.values],
        "residuals": [float(v) for v in eig.residuals],
        "converged": [bool(v) for v in eig.converged],
        "lanczos_matvecs": int(eig.matvecs + low.matvecs),
        "grid": np.asarray(dens.grid, dtype=float),
        "density": np.asarray(dens.density, dtype=float),
        "trace": float(dens.trace),
        "trace_stderr": float(dens.trace_stderr),
        "slq_runs": runs,
        "slq_steps": lanczos_steps,
        "matvecs": int(eig.matvecs + low.matvecs + tr.matvecs + dens.matvecs),
    }


def sharpness_rows(
    runs: dict[str, TrainedRun],
    measures: list[tuple[str, dict[str, Any]]] | None = None,
    split: str = "train",
    report: Callable[[float, str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (optimizer, measure) from ``ls.sharpness_report`` on ``split`` (one measure at a
    time, which is what one report of them all computes): value, standard error ("—" where a
    measure is deterministic), ``options`` (what the page set) and ``as run`` (every option the
    measure ran with). ``report(fraction, text)`` is called before each measure."""
    measures = measures or SHARPNESS_MEASURES
    rows = []
    n = len(runs) * len(measures)
    for i, (name, run) in enumerate(runs.items()):
        obj = objective_of(run, split)
        for j, (measure, opts) in enumerate(measures):
            if report is not None:
                report((i * len(measures) + j) / n, f"{measure} of {name}")
            (row,) = ls.sharpness_report(obj, [(measure, opts)]).table_rows()
            rows.append(
                {
                    "optimizer": name,
                    "measure": row["measure"],
                    "value": row["value"],
                    "stderr": cell(row["stderr"], ".2g"),
                    "options": " ".join(
                        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in opts.items()
                    )
                    or "defaults",  # fmt: skip
                    "as run": row["options"] or "—",
                }
            )
    return rows


def sharpness_details(rows: list[dict[str, Any]], n_params: int) -> list[dict[str, Any]]:
    """One row per measure of ``rows``: what it computes and how it perturbs the weights
    (:func:`network_text.measure_explanation`), and every option it ran with."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["measure"] not in out:
            opts = dict(sharpness_measures([r["measure"]], _rho(r["options"]))[0][1])
            out[r["measure"]] = {
                "measure": r["measure"],
                "how it perturbs the weights w": measure_explanation(r["measure"], opts, n_params),
                "options as run": r["as run"],
            }
    return list(out.values())


def _rho(options: str) -> float:
    for part in options.split():
        if part.startswith("rho="):
            return float(part[4:])
    return 0.05


def n_params(run: TrainedRun) -> int:
    """The number of weights of the run's network."""
    return int(run.trajectory.shape[1])
