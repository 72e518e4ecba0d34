"""Trajectory runs of the playground and the geometry shown with them: the neighbourhood each
SAM-type method searches and the exact Hessian where a run ended."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import toy_problems as tp

from ..layout import fmt, fmt_point
from .catalogue import OPTIMIZERS, validate_hypers


@dataclass
class Run:
    label: str
    optimizer: str
    hypers: dict[str, float]
    trajectory: tp.Trajectory
    extra: dict[str, Any] = field(default_factory=dict)


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


def end_rows(prob: tp.ToyProblem, runs: list[Run]) -> list[dict[str, Any]]:
    """One table row per run: its status, where it ended, its final loss and the exact Hessian
    there (numbers in 4 significant digits; no Hessian for a diverged run)."""
    rows = []
    for r in runs:
        tr = r.trajectory
        diverged, status = run_status(prob, r)
        end = tr.path[-1]
        ok = not diverged and bool(torch.isfinite(end).all()) and bool(prob.in_domain(end))
        info = hessian_summary(prob, end.tolist()) if ok else None
        rows.append(
            {
                "optimizer": r.label,
                "status": "diverged" if diverged else status.split(" (")[0],
                "end point": fmt_point(end.tolist()),
                "final loss": fmt(tr.losses[-1]),
                "steps": tr.steps,
                "Hessian eigenvalues": ", ".join(fmt(v, 3) for v in info["eigenvalues"]) if info else "n/a",
                "Hessian trace": fmt(info["trace"]) if info else "n/a",
            }
        )
    return rows
