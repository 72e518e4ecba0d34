"""Plotly figures of the "Network landscape" page: loss surfaces on one colour scale, Hessian spectra
and training curves, each optimizer in its own colour (``toy_problems.figures.palette``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

import landscape as ls
from toy_problems.figures.palette import method_color

from .layout import LEGEND_BELOW, finite_range
from .network import TrainedRun


def log_loss(s: ls.Surface) -> np.ndarray:
    """``log10(loss + 1e-12)`` of a 2-D surface, transposed for plotting (rows = y)."""
    return np.log10(np.asarray(s.loss, dtype=float).T + 1e-12)


def shared_range(surfaces: list[ls.Surface]) -> tuple[float, float] | None:
    """One colour range (log10 loss) covering every surface, so compared surfaces share colours."""
    return finite_range(*[log_loss(s) for s in surfaces])


def surface_figure(
    s: ls.Surface, path: np.ndarray | None, title: str, zrange: tuple[float, float] | None = None
) -> go.Figure:
    """Plotly contour of a 2-D surface (log10 loss) with the projected trajectory, at equal aspect
    (a unit of direction 1 as long as one of direction 2); ``zrange`` fixes the colour scale and the
    contour levels (:func:`shared_range` for surfaces side by side)."""
    levels: dict[str, Any] = dict(ncontours=30)
    if zrange is not None:
        lo, hi = zrange
        levels = dict(
            zmin=lo, zmax=hi, autocontour=False, contours=dict(start=lo, end=hi, size=(hi - lo) / 30)
        )
    fig = go.Figure(
        go.Contour(
            x=s.xs,
            y=s.ys,
            z=log_loss(s),
            colorscale="Viridis",
            name="log10 loss",
            colorbar=dict(title=dict(text="log10 loss", side="right"), thickness=12),
            **levels,
        )
    )
    if path is not None:
        fig.add_trace(
            go.Scatter(
                x=path[:, 0],
                y=path[:, 1],
                mode="lines+markers",
                name="trajectory",
                marker=dict(size=4, color="red"),
                line=dict(color="red"),
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[0.0],
            y=[0.0],
            mode="markers",
            name="final weights",
            marker=dict(symbol="star", size=14, color="white", line=dict(color="black", width=1)),
        )
    )
    fig.update_layout(
        # the title sits just above the axes, below the toolbar that shows at the top right
        title=dict(
            text=title,
            x=0.0,
            xanchor="left",
            yref="paper",
            y=1.0,
            yanchor="bottom",
            pad=dict(b=8),
            font=dict(size=13),
        ),
        height=440,
        legend=LEGEND_BELOW,
        # one unit is as long on both axes: a square plane is drawn square
        xaxis=dict(title="direction 1", constrain="domain"),
        yaxis=dict(title="direction 2", scaleanchor="x", scaleratio=1, constrain="domain"),
        margin=dict(l=40, r=10, t=60, b=90),
    )
    return fig


def spectrum_figure(spectra: dict[str, dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    for name, sp in spectra.items():
        fig.add_trace(
            go.Scatter(
                x=sp["grid"],
                y=np.maximum(sp["density"], 1e-12),
                mode="lines",
                name=name,
                line=dict(color=method_color(name)),
            )
        )
    fig.update_layout(
        yaxis_type="log",
        xaxis_title="Hessian eigenvalue",
        yaxis_title="density (SLQ)",
        height=400,
        legend=LEGEND_BELOW,
        margin=dict(l=40, r=10, t=30, b=100),
    )
    return fig


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")


def training_figure(runs: dict[str, TrainedRun]) -> go.Figure:
    """The mean training loss of each epoch (epochs counted from 1), one colour per optimizer."""
    fig = go.Figure()
    epochs = 1
    n = len(runs)
    for i, (name, run) in enumerate(runs.items()):
        epochs = max(epochs, len(run.history["epoch_loss"]))
        # curves of similar optimizers coincide: each run its own dash and marker, earlier runs
        # drawn wider, so a curve hidden under another still shows as its border
        fig.add_trace(
            go.Scatter(
                x=list(range(1, len(run.history["epoch_loss"]) + 1)),
                y=run.history["epoch_loss"],
                mode="lines+markers",
                name=name,
                line=dict(
                    color=method_color(name), dash=DASHES[i % len(DASHES)], width=2 + 1.5 * (n - 1 - i)
                ),
                marker=dict(color=method_color(name), symbol=SYMBOLS[i % len(SYMBOLS)], size=7),
            )
        )
    fig.update_layout(
        xaxis=dict(title="epoch (mean loss over its batches)", dtick=1 if epochs <= 20 else None),
        yaxis_title="training loss",
        height=360,
        legend=LEGEND_BELOW,
        margin=dict(l=40, r=10, t=30, b=100),
    )
    return fig
