"""Logic of the "Curvature monitor" page: train a small digits MLP with full-batch gradient descent
and record the sharpness ``lambda_max(H)`` every few steps with
:class:`landscape.curvature.monitor.CurvatureMonitor`, against the stability threshold ``2 / lr``
(Cohen et al., "Gradient descent on neural networks typically occurs at the edge of stability",
ICLR 2021, Sec. 3). No Streamlit here, so tests call it directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import torch
from torch import nn

import landscape as ls
from landscape.curvature.monitor import CurvatureMonitor, MonitorResult

from .experiments_view import color_of
from .layout import LEGEND_BELOW

__all__ = ["MonitorRun", "initial_problem", "run_monitor", "sharpness_figure", "loss_figure", "history_rows"]


@dataclass
class MonitorRun:
    """One monitored training run: the monitor's result and the full-batch loss at every step."""

    result: MonitorResult
    losses: list[float]
    lr: float
    config: dict[str, Any]


def initial_problem(*, hidden: int, n_train: int, seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The MLP 64-``hidden``-10 (tanh, float64, initialised with ``seed``) and the first ``n_train``
    examples of the digits training split (split seeded with ``seed``)."""
    x, y = ls.data.load_digits("train", seed=seed, dtype=torch.float64)
    model = ls.models.model_factory("mlp", sizes=[64, hidden, 10], activation="tanh", seed=seed).double()
    return model, x[:n_train], y[:n_train]


def run_monitor(
    *,
    lr: float = 2.0,
    steps: int = 60,
    every: int = 10,
    hidden: int = 16,
    n_train: int = 256,
    seed: int = 0,
    max_matvecs: int = 20,
    on_step: Callable[[float], None] | None = None,
) -> MonitorRun:
    """Full-batch gradient descent (``torch.optim.SGD`` without momentum, step ``lr``) on the first
    ``n_train`` digits training examples with the MLP 64-``hidden``-10 (tanh, float64), checking
    ``lambda_max`` of the training loss's Hessian every ``every`` steps (and at step 0).

    ``on_step(fraction_done)`` is called after every step. A diverging run raises ``ValueError``
    with a hint to lower the learning rate."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning rate must be a positive number, got {lr!r}")
    for name, v, lo in (
        ("steps", steps, 1),
        ("every", every, 1),
        ("hidden", hidden, 1),
        ("n_train", n_train, 10),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    model, x, y = initial_problem(hidden=hidden, n_train=n_train, seed=seed)
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    monitor = CurvatureMonitor(
        (x, y), loss_fn, every=every, optimizer=opt, max_matvecs=max_matvecs, seed=seed
    )
    monitor.check(model, 0)
    losses: list[float] = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        if not torch.isfinite(loss):
            raise ValueError(
                f"gradient descent diverged at step {step} (loss {float(loss)}); lower the learning rate"
            )
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        monitor.step(model, step, losses[-1])
        if on_step is not None:
            on_step(step / steps)
    config = {"lr": lr, "steps": steps, "every": every, "hidden": hidden, "n_train": n_train, "seed": seed}
    return MonitorRun(monitor.result(), losses, float(lr), config)


def sharpness_figure(run: MonitorRun) -> go.Figure:
    """``lambda_max`` against step (:meth:`MonitorResult.to_plotly`) in the colour of gradient
    descent, with the threshold ``2 / lr`` dashed."""
    fig = run.result.to_plotly()
    for tr in fig.data:
        tr.line.color = "#555555" if tr.line.dash == "dash" else color_of("GD")
    fig.update_layout(
        title=f"sharpness of full-batch GD, lr = {run.lr:g} (threshold 2/lr = {2 / run.lr:.4g})",
        legend=LEGEND_BELOW,
    )
    return fig


def loss_figure(run: MonitorRun) -> go.Figure:
    """The full-batch training loss before each step (log scale)."""
    fig = go.Figure(
        go.Scatter(
            x=list(range(1, len(run.losses) + 1)),
            y=run.losses,
            mode="lines",
            name="GD",
            line={"color": color_of("GD")},
        )
    )
    fig.update_layout(xaxis_title="step", yaxis_title="training loss", yaxis_type="log", legend=LEGEND_BELOW)
    return fig


def history_rows(run: MonitorRun) -> list[dict[str, Any]]:
    """One row per check: step, status, loss on the batch, ``lambda_max``, threshold, converged."""
    keys = ("step", "status", "loss", "lambda_max", "threshold", "residual", "converged", "matvecs")
    return [{k: h.get(k) for k in keys} for h in run.result.history]
