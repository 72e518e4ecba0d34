"""Logic of the "Curvature monitor" page: train a small digits MLP with full-batch gradient descent
and record the sharpness ``lambda_max(H)`` every few steps with
:class:`landscape.curvature.monitor.CurvatureMonitor`, against the stability threshold ``2 / lr``
(Cohen et al., "Gradient descent on neural networks typically occurs at the edge of stability",
ICLR 2021, Sec. 3). No Streamlit here, so tests call it directly.

Two presets (:data:`PRESETS`): the cross-entropy default, where lambda_max stays well below 2/lr in
a short run, and the edge-of-stability setting of ``docs/make_eos_figure.py`` (MSE on one-hot
targets, tanh MLP 64-32-32-10, 500 examples, lr 2), where lambda_max rises to 2/lr by about step 200,
overshoots and then stays within a few per cent of it (Cohen et al. 2021, Fig. 1 uses MSE likewise).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import torch
from torch import nn

import landscape as ls
from landscape.curvature.monitor import CurvatureMonitor, MonitorResult

from .experiments_view import color_of
from .layout import LEGEND_BELOW

__all__ = [
    "LOSSES",
    "PRESETS",
    "MonitorRun",
    "initial_problem",
    "loss_function",
    "run_monitor",
    "sharpness_figure",
    "loss_figure",
    "history_rows",
    "edge_summary",
]

#: loss name -> what the page calls it
LOSSES: dict[str, str] = {"cross_entropy": "cross-entropy", "mse": "MSE (one-hot targets)"}

#: preset name -> (label, settings of :func:`run_monitor`)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "cross_entropy": (
        "cross-entropy, short run",
        {
            "loss": "cross_entropy",
            "lr": 2.0,
            "steps": 60,
            "every": 10,
            "hidden": 16,
            "layers": 1,
            "n_train": 256,
        },
    ),
    "edge_of_stability": (
        "edge of stability (MSE, 800 steps)",
        {"loss": "mse", "lr": 2.0, "steps": 800, "every": 10, "hidden": 32, "layers": 2, "n_train": 500},
    ),
}


@dataclass
class MonitorRun:
    """One monitored training run: the monitor's result and the full-batch loss at every step."""

    result: MonitorResult
    losses: list[float]
    lr: float
    config: dict[str, Any]


_THREADS_LOCK = threading.Lock()
_THREADS_STATE = {"users": 0, "saved": 1}


@contextlib.contextmanager
def intra_op_threads(n: int | None) -> Iterator[None]:
    """Run with ``torch.set_num_threads(n)`` and restore the previous setting afterwards (``None``:
    leave it). The setting is global to the process: overlapping users (two dashboard sessions)
    share one count and the last one out restores the original value."""
    if n is None:
        yield
        return
    with _THREADS_LOCK:
        if _THREADS_STATE["users"] == 0:
            _THREADS_STATE["saved"] = torch.get_num_threads()
            torch.set_num_threads(n)
        _THREADS_STATE["users"] += 1
    try:
        yield
    finally:
        with _THREADS_LOCK:
            _THREADS_STATE["users"] -= 1
            if _THREADS_STATE["users"] == 0:
                torch.set_num_threads(_THREADS_STATE["saved"])


def _check_loss(loss: str) -> None:
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; choose from {list(LOSSES)}")


def initial_problem(
    *, hidden: int, n_train: int, seed: int, layers: int = 1, loss: str = "cross_entropy"
) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The MLP 64-``hidden``-...-10 with ``layers`` hidden layers (tanh, float64, initialised with
    ``seed``) and the first ``n_train`` examples of the digits training split (split seeded with
    ``seed``); the targets are the labels for cross-entropy and their one-hot vectors for MSE."""
    _check_loss(loss)
    x, y = ls.data.load_digits("train", seed=seed, dtype=torch.float64)
    sizes = [64] + [hidden] * layers + [10]
    model = ls.models.model_factory("mlp", sizes=sizes, activation="tanh", seed=seed).double()
    y = y[:n_train]
    if loss == "mse":
        y = nn.functional.one_hot(y, 10).to(torch.float64)
    return model, x[:n_train], y


def loss_function(loss: str) -> nn.Module:
    """``nn.CrossEntropyLoss()`` or ``nn.MSELoss()`` (mean over the examples and the 10 outputs)."""
    _check_loss(loss)
    return nn.CrossEntropyLoss() if loss == "cross_entropy" else nn.MSELoss()


def run_monitor(
    *,
    lr: float = 2.0,
    steps: int = 60,
    every: int = 10,
    hidden: int = 16,
    n_train: int = 256,
    seed: int = 0,
    layers: int = 1,
    loss: str = "cross_entropy",
    max_matvecs: int = 20,
    threads: int | None = 1,
    on_step: Callable[[float], None] | None = None,
) -> MonitorRun:
    """Full-batch gradient descent (``torch.optim.SGD`` without momentum, step ``lr``) on the first
    ``n_train`` digits training examples with the tanh MLP of :func:`initial_problem` (float64) and
    ``loss`` (``"cross_entropy"`` or ``"mse"``), checking ``lambda_max`` of the training loss's
    Hessian every ``every`` steps (and at step 0).

    ``threads``: torch's intra-op threads while it runs (:func:`intra_op_threads`). The networks
    have a few thousand parameters, so more threads only add synchronisation: the edge-of-stability
    preset took 7-17 s with one thread and 197 s with two on two cores busy with other work (the
    numbers are bit-identical). ``None`` keeps torch's setting.

    ``on_step(fraction_done)`` is called after every step. A diverging run raises ``ValueError``
    with a hint to lower the learning rate."""
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning rate must be a positive number, got {lr!r}")
    for name, v, lo in (
        ("steps", steps, 1),
        ("every", every, 1),
        ("hidden", hidden, 1),
        ("layers", layers, 1),
        ("n_train", n_train, 10),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    with intra_op_threads(threads):
        return _train(lr, steps, every, hidden, n_train, seed, layers, loss, max_matvecs, on_step)


def _train(
    lr: float,
    steps: int,
    every: int,
    hidden: int,
    n_train: int,
    seed: int,
    layers: int,
    loss: str,
    max_matvecs: int,
    on_step: Callable[[float], None] | None,
) -> MonitorRun:
    model, x, y = initial_problem(hidden=hidden, n_train=n_train, seed=seed, layers=layers, loss=loss)
    loss_fn = loss_function(loss)
    opt = torch.optim.SGD(model.parameters(), lr=float(lr))
    monitor = CurvatureMonitor(
        (x, y), loss_fn, every=every, optimizer=opt, max_matvecs=max_matvecs, seed=seed
    )
    monitor.check(model, 0)
    losses: list[float] = []
    for step in range(1, steps + 1):
        opt.zero_grad()
        value = loss_fn(model(x), y)
        if not torch.isfinite(value):
            raise ValueError(
                f"gradient descent diverged at step {step} (loss {float(value.detach())}); "
                "lower the learning rate"
            )
        value.backward()
        opt.step()
        losses.append(float(value.detach()))
        monitor.step(model, step, losses[-1])
        if on_step is not None:
            on_step(step / steps)
    config = {
        "lr": lr,
        "steps": steps,
        "every": every,
        "hidden": hidden,
        "layers": layers,
        "n_train": n_train,
        "seed": seed,
        "loss": loss,
        "max_matvecs": max_matvecs,
    }
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
    yaxis: dict[str, Any] = {"title": "training loss", "type": "log"}
    finite = [v for v in run.losses if math.isfinite(v) and v > 0]
    if finite and math.log10(max(finite) / min(finite)) >= 1:
        yaxis["dtick"] = 1  # labels at the decades only: minor-tick labels crowd a log axis
    fig.update_layout(xaxis_title="step", yaxis=yaxis, legend=LEGEND_BELOW)
    return fig


def edge_summary(run: MonitorRun) -> str:
    """One sentence: the last lambda_max as a multiple of 2/lr, and the first check at 95 % of it."""
    checked = [h for h in run.result.history if h.get("lambda_max") is not None]
    if not checked:
        return "No check measured lambda_max."
    threshold = 2.0 / run.lr
    last = checked[-1]
    ratio = last["lambda_max"] / threshold
    reached = next((h["step"] for h in checked if h["lambda_max"] >= 0.95 * threshold), None)
    where = (
        f"λ_max first came within 5 % of 2/lr at step {reached}"
        if reached is not None
        else "λ_max never came within 5 % of 2/lr"
    )
    return f"{where}; at the last check (step {last['step']}) it is {ratio:.3f} × 2/lr."


def history_rows(run: MonitorRun) -> list[dict[str, Any]]:
    """One row per check: step, status, loss on the batch, ``lambda_max``, threshold, converged."""
    keys = ("step", "status", "loss", "lambda_max", "threshold", "residual", "converged", "matvecs")
    return [{k: h.get(k) for k in keys} for h in run.result.history]
