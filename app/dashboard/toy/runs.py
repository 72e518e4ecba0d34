"""Trajectory runs of the playground and the geometry shown with them: the neighbourhood each
SAM-type method searches and the exact Hessian where a run ended."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import toy_problems as tp

from ..layout import fmt, fmt_point
from .catalogue import OPTIMIZERS, validate_hypers
from .endpoints import KINDS, EndPoint, box_width, classify_point


@dataclass
class Run:
    label: str
    optimizer: str
    hypers: dict[str, float]
    trajectory: tp.Trajectory
    extra: dict[str, Any] = field(default_factory=dict)


class _StepTicker:
    """Stands in for a learning-rate scheduler: ``run_trajectory`` calls ``step()`` after every
    optimizer step, which moves the progress bar (the optimizer itself is untouched)."""

    def __init__(self, report: Callable[[int], None]) -> None:
        self.report, self.k = report, 0

    def step(self) -> None:
        self.k += 1
        self.report(self.k)


def run(
    problem: str,
    start: tuple[float, float],
    steps: int,
    configs: list[tuple[str, dict[str, float]]],
    progress: Callable[[float, str], None] | None = None,
) -> list[Run]:
    """Run each ``(optimizer name, hyperparameters)`` from ``start`` for ``steps`` steps.

    Bad inputs raise ``ValueError`` with a readable message (start outside the domain, unknown
    optimizer, hyperparameter out of range); a diverging run returns with ``trajectory.diverged``.
    ``progress(fraction, what)`` is called every few steps (the page's progress bar)."""
    prob = tp.get(problem)
    prob.domain_check(torch.tensor(start, dtype=prob.dtype))
    if steps < 1 or steps > 5000:
        raise ValueError(f"steps must be between 1 and 5000, got {steps}")
    runs = []
    every = max(1, steps // 20)
    for i, (name, hypers) in enumerate(configs):
        if name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {name!r}; choose from {sorted(OPTIMIZERS)}")
        h = validate_hypers(name, hypers)
        spec = OPTIMIZERS[name]
        label = name if sum(n == name for n, _ in configs) == 1 else f"{name} #{i + 1}"

        def tick(k: int, i: int = i, label: str = label) -> None:
            if progress is not None and (k % every == 0 or k == steps):
                progress((i + k / steps) / len(configs), f"{label}, step {k} of {steps}")

        traj = tp.run_trajectory(
            prob,
            lambda p, spec=spec, h=h: spec.build(p, h, prob),
            start,
            steps,
            scheduler_factory=lambda opt, tick=tick: _StepTicker(tick),
        )
        runs.append(Run(label, name, h, traj))
    if progress is not None:
        progress(1.0, "done")
    return runs


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


def run_status(prob: tp.ToyProblem, run_: Run) -> tuple[bool, str]:
    """``(diverged, status)`` of a run in words.

    Diverged: the runner stopped it (non-finite values, or it left the valid region), or its end
    lies more than ten plot widths outside the plotted box with a loss above the start's (the
    iterates explode without overflowing yet). A run that ends outside the box with a lower loss
    "left the plotted region" (an unbounded problem such as the saddle)."""
    tr = run_.trajectory
    if tr.diverged:
        return True, "diverged: " + tr.message
    end = tr.path[-1].tolist()
    loss, start = float(tr.losses[-1]), float(tr.losses[0])
    if not math.isfinite(loss):
        return True, f"diverged: the loss at the end point is {fmt(loss)}"
    (x0, x1), (y0, y1) = prob.bounds
    dx, dy = max(x0 - end[0], end[0] - x1, 0.0), max(y0 - end[1], end[1] - y1, 0.0)
    if dx > 0 or dy > 0:
        if (dx > 10 * (x1 - x0) or dy > 10 * (y1 - y0)) and loss > start:
            return True, f"diverged: the iterates ran off to {fmt_point(end)}, loss {fmt(loss)}"
        return False, f"left the plotted region (end {fmt_point(end)}, loss {fmt(loss)})"
    return False, "ok"


def divergence_messages(prob: tp.ToyProblem, runs: list[Run]) -> list[str]:
    """One sentence per diverged run, with what to change."""
    out = []
    for r in runs:
        diverged, status = run_status(prob, r)
        if diverged:
            out.append(f"{r.label} {status}. Lower its learning rate or radius.")
    return out


def end_points(prob: tp.ToyProblem, runs: list[Run]) -> list[EndPoint]:
    """Each run's end point classified (``endpoints.classify_point``; a diverged run is "diverged")."""
    return [classify_point(prob, r.trajectory.path[-1], diverged=run_status(prob, r)[0]) for r in runs]


def end_rows(
    prob: tp.ToyProblem, runs: list[Run], points: list[EndPoint] | None = None
) -> list[dict[str, Any]]:
    """One table row per run: what its end point is (minimum, near a minimum, saddle point, maximum,
    not converged, diverged: see ``endpoints``), where it is, the final loss, the gradient norm and
    the exact Hessian there (numbers in 4 significant digits; no Hessian for a diverged run).
    ``points``: :func:`end_points` of the runs, if already computed."""
    rows = []
    for r, e in zip(runs, points if points is not None else end_points(prob, runs)):
        tr = r.trajectory
        ok = e.kind != "diverged"
        status = e.kind
        if ok and run_status(prob, r)[1].startswith("left"):
            status += " (outside the plot)"
        rows.append(
            {
                "optimizer": r.label,
                "status": status,
                "end point": fmt_point(tr.path[-1].tolist()),
                "final loss": fmt(tr.losses[-1]),
                "‖∇L‖": fmt(e.grad_norm, 3) if ok else "n/a",
                "Newton step / W": fmt(e.newton_step / e.width, 2) if ok else "n/a",
                "Hessian eigenvalues": ", ".join(fmt(v, 3) for v in e.eigenvalues) if ok else "n/a",
                "Hessian trace": fmt(sum(e.eigenvalues)) if ok else "n/a",
                "steps": tr.steps,
            }
        )
    return rows


def end_summary(prob: tp.ToyProblem, runs: list[Run], points: list[EndPoint] | None = None) -> str:
    """One sentence counting the classifications, built from the same numbers as the table, and
    naming the runs whose end point is not a minimum."""
    points = points if points is not None else end_points(prob, runs)
    counts = {k: [r.label for r, e in zip(runs, points) if e.kind == k] for k in KINDS}
    words = {k: f"at a {k}" for k in ("minimum", "saddle point", "maximum", "degenerate stationary point")}
    parts = [f"{len(v)} {words.get(k, k)}" for k, v in counts.items() if v]
    text = f"Of {len(runs)} run{'s' if len(runs) != 1 else ''}: " + ", ".join(parts) + "."
    if counts["minimum"] and len(counts["minimum"]) == len(runs):
        return text + " Every run ends at a minimum of the loss."
    others = [(r.label, e) for r, e in zip(runs, points) if e.kind not in ("minimum", "near a minimum")]
    for label, e in others:
        text += f" **{label}** ends at a point that is not a minimum ({e.kind}: {e.reason()})."
    return text


def path_overlaps(prob: tp.ToyProblem, runs: list[Run], fraction: float = 0.005) -> list[list[str]]:
    """Groups of runs whose paths lie within ``fraction`` x W of each other at every step (drawn on
    top of each other: the figure cannot tell them apart)."""
    w = box_width(prob)
    groups: list[list[int]] = []
    for i, r in enumerate(runs):
        for g in groups:
            a, b = runs[g[0]].trajectory.path, r.trajectory.path
            if a.shape == b.shape and bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all()):
                if float((a - b).norm(dim=-1).max()) <= fraction * w:
                    g.append(i)
                    break
        else:
            groups.append([i])
    return [[runs[i].label for i in g] for g in groups if len(g) > 1]


def overlap_note(prob: tp.ToyProblem, runs: list[Run]) -> str:
    """A sentence naming the runs drawn on top of each other, or ``""``."""
    groups = path_overlaps(prob, runs)
    if not groups:
        return ""
    named = "; ".join(", ".join(g) for g in groups)
    return (
        f"Paths and loss curves that coincide (within 0.5% of the plot width at every step), so only the "
        f"top one is visible where they overlap: {named}."
    )
