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
    "compare",
    "relation",
    "threshold_statement",
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
    """One monitored training run: the monitor's result and ``losses[s]``, the full-batch loss
    after ``s`` updates (``steps + 1`` values; a check at step ``s`` is at the same weights)."""

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
    with torch.no_grad():  # the loss at the final weights: losses[s] is the loss after s updates
        losses.append(float(loss_fn(model(x), y)))
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
    descent, with the threshold ``2 / lr`` dashed; checks whose Lanczos run did not converge are
    circled."""
    fig = run.result.to_plotly()
    for tr in fig.data:
        tr.line.color = "#555555" if tr.line.dash == "dash" else color_of("GD")
    bad = [h for h in run.result.history if h.get("lambda_max") is not None and not h.get("converged")]
    if bad:
        fig.add_trace(
            go.Scatter(
                x=[h["step"] for h in bad],
                y=[h["lambda_max"] for h in bad],
                mode="markers",
                name="check not converged (not used)",
                marker={"symbol": "circle-open", "size": 13, "color": "#d62728", "line": {"width": 2}},
            )
        )
    fig.update_layout(
        title=f"sharpness of full-batch GD, lr = {run.lr:g} (threshold 2/lr = {2 / run.lr:.4g})",
        legend=LEGEND_BELOW,
    )
    return fig


def loss_figure(run: MonitorRun) -> go.Figure:
    """The full-batch training loss after ``step`` updates (step 0: the initial weights; log
    scale): the step convention of the monitor's checks, so each check's loss is on the curve."""
    fig = go.Figure(
        go.Scatter(
            x=list(range(len(run.losses))),
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


#: |lambda_max / threshold - 1| at most this counts as "within" the threshold
BAND = 0.05


def compare(value: float, threshold: float, band: float = BAND) -> tuple[str, float]:
    """``("above" | "within" | "below", percent)``: where ``value`` lies against ``threshold``,
    ``percent = 100 (value / threshold - 1)``; "within" when ``|percent| <= 100 band``."""
    pct = 100.0 * (value / threshold - 1.0)
    if abs(pct) <= 100.0 * band:
        return "within", pct
    return ("above" if pct > 0 else "below"), pct


def relation(value: float, threshold: float, band: float = BAND) -> str:
    """``"above by 6.3 %"``, ``"below by 45.5 %"`` or ``"within 5 % (above by 2.0 %)"``."""
    kind, _ = compare(value, threshold, band)
    side = _side(value, threshold)
    return f"within {100 * band:g} % ({side})" if kind == "within" else side


def _side(value: float, threshold: float) -> str:
    pct = 100.0 * (value / threshold - 1.0)
    return f"{'above' if pct > 0 else 'below'} by {abs(pct):.1f} %"


def _usable(row: dict[str, Any]) -> bool:
    lam, thr = row.get("lambda_max"), row.get("threshold")
    numbers = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lam, thr))
    return numbers and thr > 0 and bool(row.get("converged"))


def threshold_statement(rows: list[dict[str, Any]], band: float = BAND, name: str = "2/lr") -> str:
    """What the checks of :func:`history_rows` say about lambda_max against the threshold (``name``),
    computed from the table's numbers: checks whose Lanczos run did not converge are named and not
    used; of the converged ones, how many lie above / within ``band`` of / below the threshold, the
    first within the band, the first above it, and the last."""
    measured = [r for r in rows if isinstance(r.get("lambda_max"), (int, float))]
    if not measured:
        return "No check measured λ_max."
    used = [r for r in measured if _usable(r)]
    out = []
    bad = [r for r in measured if not _usable(r)]
    if bad:
        what = "; ".join(
            f"step {r['step']}: λ_max = {r['lambda_max']:.4g}, residual {r.get('residual', math.nan):.2g} "
            f"after {r.get('matvecs')} Hessian-vector products"
            for r in bad[:5]
        )
        more = f"; {len(bad) - 5} more" if len(bad) > 5 else ""
        out.append(
            f"{len(bad)} check{'s' if len(bad) > 1 else ''} did not converge ({what}{more}): marked in "
            "the table and the plot, not used below."
        )
    if not used:
        out.append(f"No converged check: nothing is concluded about λ_max against {name}.")
        return " ".join(out)
    kinds = [compare(r["lambda_max"], r["threshold"], band)[0] for r in used]
    pct = f"{100 * band:g} %"
    out.append(
        f"Of the {len(used)} converged checks, {kinds.count('above')} lie above {name} by more than "
        f"{pct}, {kinds.count('within')} inside the ±{pct} band around it and {kinds.count('below')} "
        f"below it by more than {pct}."
    )
    first = next((r for r, k in zip(used, kinds) if k == "within"), None)
    if first is not None:
        out.append(
            f"λ_max first came within {pct} of {name} at step {first['step']} (λ_max = "
            f"{first['lambda_max']:.4g} against {first['threshold']:.4g}: "
            f"{_side(first['lambda_max'], first['threshold'])})."
        )
    else:
        near = min(used, key=lambda r: abs(r["lambda_max"] / r["threshold"] - 1))
        out.append(
            f"λ_max never entered the ±{pct} band around {name}; the closest check is step {near['step']} "
            f"(λ_max = {near['lambda_max']:.4g} against {near['threshold']:.4g}: "
            f"{relation(near['lambda_max'], near['threshold'], band)})."
        )
    above = next((r for r, k in zip(used, kinds) if k == "above"), None)
    if above is not None:
        out.append(
            f"It first lay above {name} by more than {pct} at step {above['step']} (λ_max = "
            f"{above['lambda_max']:.4g} against {above['threshold']:.4g}: "
            f"{relation(above['lambda_max'], above['threshold'], band)})."
        )
    last = used[-1]
    ratio = last["lambda_max"] / last["threshold"]
    out.append(
        f"At the last converged check (step {last['step']}) λ_max = {last['lambda_max']:.4g} = "
        f"{ratio:.3f} × {name} ({relation(last['lambda_max'], last['threshold'], band)})."
    )
    return " ".join(out)


def edge_summary(run: MonitorRun) -> str:
    """:func:`threshold_statement` of the run's checks."""
    return threshold_statement(history_rows(run))


def plot_caption(run: MonitorRun) -> str:
    """What the sharpness plot shows, with the last check's value (and whether it converged)."""
    cfg = run.config
    last = run.result.history[-1]
    lam = last.get("lambda_max")
    value = "not measured" if lam is None else f"λ_max = {lam:.4g}"
    if lam is not None and not last.get("converged"):
        value += f" (Lanczos not converged, residual {last.get('residual', math.nan):.2g})"
    return (
        f"λ_max of the Hessian of the training loss ({LOSSES[cfg['loss']]}) on the {cfg['n_train']} "
        f"training examples at each check (solid; Lanczos warm-started from the previous check, at "
        f"most {cfg['max_matvecs']} Hessian-vector products per check) and the gradient-descent "
        f"threshold 2/lr = {2 / run.lr:.4g} (dashed). Last check (step {last['step']}): {value}; "
        f"{run.result.matvecs} Hessian-vector products in all."
    )


def history_rows(run: MonitorRun, band: float = BAND) -> list[dict[str, Any]]:
    """One row per check: step, status, loss on the batch, ``lambda_max``, threshold, residual,
    converged, matvecs and ``vs threshold`` (:func:`relation`, or why the check is not used)."""
    keys = ("step", "status", "loss", "lambda_max", "threshold", "residual", "converged", "matvecs")
    rows = []
    for h in run.result.history:
        row = {k: h.get(k) for k in keys}
        if _usable(row):
            row["vs threshold"] = relation(row["lambda_max"], row["threshold"], band)
        elif isinstance(row["lambda_max"], (int, float)):
            row["vs threshold"] = "not converged: not used"
        else:
            row["vs threshold"] = "—"
        rows.append(row)
    return rows
