"""The Bayesian view's computations with a progress bar: the logistic-regression posteriors of bSAM
Fig. 3/5 (the same steps, settings and seeds as ``toy_problems.figures.logistic_results``, which
the tests check bit for bit) and the two-moons networks of Fig. 6 with their training accuracy,
training loss, end-point classification and the Monte-Carlo error of bSAM's model average.

``progress(fraction, what)`` moves the page's bar; runs report every few optimizer steps through a
stand-in scheduler (``run_trajectory`` calls its ``step()`` after every step; the optimizer itself is
untouched, so the numbers are those of the figures)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from toy_problems.figures import bsam as fig_bsam

from .endpoints import classify_network_point, classify_point

__all__ = ["MOONS_FIT_ACCURACY", "logistic_results", "moons_results"]

#: the two-moons comparison is drawn only when every network fits the training set this well
MOONS_FIT_ACCURACY = 0.97
#: independent re-draws of bSAM's 32 posterior samples, for the Monte-Carlo error of its map
MC_REPEATS = 5

Report = Callable[[float, str], None]


class _Ticker:
    def __init__(self, report: Callable[[int], None]) -> None:
        self.report, self.k = report, 0

    def step(self) -> None:
        self.k += 1
        self.report(self.k)


def _ticks(report: Report, lo: float, hi: float, steps: int, what: str):
    every = max(1, steps // 25)

    def tick(k: int) -> None:
        if k % every == 0 or k == steps:
            report(lo + (hi - lo) * k / steps, f"{what}, step {k} of {steps}")

    return lambda opt: _Ticker(tick)


def logistic_results(
    resolution: int, overrides: dict[str, dict[str, Any]] | None = None, progress: Report | None = None
) -> dict[str, Any]:
    """``toy_problems.figures.logistic_results(resolution, overrides)`` computed step by step with a
    progress bar, plus ``"end_points"``: SAM's point and the bSAM / MFVI means classified on the
    loss (exact gradient and Hessian), and how far each run moved over its last tenth of steps."""
    report = progress or (lambda f, what: None)
    s = fig_bsam.logistic_settings(overrides)
    report(0.0, "exact posterior (numerical integration)")
    spans = {"SAM": (0.05, 0.3), "bSAM": (0.3, 0.6), "MFVI": (0.6, 0.85)}
    R = fig_bsam.compute_logistic_results(
        resolution, s, ticks=lambda method, steps: _ticks(report, *spans[method], steps, method)
    )
    report(0.85, "end points")
    prob, traj = R["prob"], R["traj"]
    ends = {}
    for name, tr in traj.items():
        e = classify_point(prob, tr.path[-1], diverged=tr.diverged)
        tail = max(1, len(tr.path) // 10)
        e.extra["moved"] = (
            float((tr.path[-1] - tr.path[-1 - tail]).norm()) if len(tr.path) > tail else math.nan
        )
        e.extra["tail_steps"] = tail
        ends[name] = e
    report(1.0, "done")
    return {**R, "end_points": ends}


def _fit(p: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Training accuracy and mean negative log-likelihood of predicted probabilities ``p``."""
    pc = p.clamp(1e-12, 1 - 1e-12)
    acc = float(((p > 0.5).double() == y).double().mean())
    return acc, float(-(y * pc.log() + (1 - y) * (1 - pc).log()).mean())


def moons_results(resolution: int, epochs: int, progress: Report | None = None) -> dict[str, Any]:
    """``toy_problems.figures.moons_results(resolution, epochs)`` (the same training runs, seeds and
    maps) plus what the page needs to judge it: per method the training accuracy and loss of the
    predictive it draws (``"fit"``), each network's end point classified on the training loss
    (``"end_points"``), and the mean entropy of bSAM's model average redrawn ``MC_REPEATS`` times
    (``"entropy_mc"``: the values and their standard deviation, the Monte-Carlo error)."""
    s = fig_bsam.MOONS_SETTINGS
    report = progress or (lambda f, what: None)
    # the figure's runs and maps (its progress scaled to the first 88 % of the bar)
    M = fig_bsam.moons_results(resolution, epochs, progress=lambda f, what: report(0.88 * f, what))
    prob, bopt = M["prob"], M["bsam_optimizer"]
    sam_model, bsam_model = M["models"]["SAM"], M["models"]["bSAM"]
    X, y = prob.data
    flat = fig_bsam._xgrid(prob, resolution)[2].reshape(-1, 2)
    lap = s["laplace_prior_precision"]

    def average(inputs: torch.Tensor, seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return bopt.bayesian_model_average(bsam_model, inputs, samples=s["samples"], generator=gen).squeeze(
            -1
        )

    report(0.88, "training accuracy and loss of each predictive")
    with torch.no_grad():
        train_sam = torch.sigmoid(sam_model(X).squeeze(-1))
    fit = {
        "SAM": _fit(train_sam, y),
        "bSAM": _fit(average(X, 1), y),
        "SAM+Laplace": _fit(fig_bsam._laplace_linearised(prob, sam_model, X, prior_precision=lap), y),
    }
    report(0.9, "Monte-Carlo error of bSAM's model average")
    values = [fig_bsam.mean_binary_entropy(average(flat, 2 + r)) for r in range(MC_REPEATS)]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    report(0.95, "end points: gradient and Hessian of the training loss")
    ends = {
        name: classify_network_point(
            model, lambda out, t: F.binary_cross_entropy_with_logits(out.squeeze(-1), t), (X, y)
        )
        for name, model in (("SAM", sam_model), ("bSAM", bsam_model))
    }
    report(1.0, "done")
    return {
        **M,
        "fit": fit,
        "end_points": ends,
        "entropy_mc": {"values": values, "std": std, "samples": s["samples"]},
    }
