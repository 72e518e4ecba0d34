"""Plotly figures of the playground: contour with paths and probe regions, 3-D surface, loss curves.

Every run is drawn in its method's colour (``toy_problems.figures.palette``); legends sit below the
axes; a run that explodes cannot stretch an axis: the axes keep to the finite range of the loss on
the plotted grid (and the runs' start points), and what lies beyond is cut off.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import torch

import toy_problems as tp
from toy_problems.figures.palette import method_color

from ..layout import LEGEND_BELOW, finite_range, fmt, padded
from .runs import Run, neighbourhood

#: per-run line dashes and marker symbols (by position in the selection): runs whose paths or loss
#: curves coincide stay distinguishable, and earlier runs are drawn wider underneath later ones
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = (
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "triangle-down",
    "cross",
    "star",
    "hexagon",
    "pentagon",
)


def run_style(i: int, n: int) -> dict:
    """Line dash, line width and marker symbol of the ``i``-th of ``n`` runs: widths fall from 6 to 2
    in drawing order, so a path drawn first shows as a border around a later one on top of it."""
    width = 2.0 if n <= 1 else 2.0 + 4.0 * (n - 1 - i) / (n - 1)
    return {"dash": DASHES[i % len(DASHES)], "width": width, "symbol": SYMBOLS[i % len(SYMBOLS)]}


def loss_grid(prob: tp.ToyProblem, resolution: int = 120) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xs, ys, Z)`` with ``Z[i, j]`` the loss at ``(xs[j], ys[i])``; NaN outside the domain."""
    xs, ys, theta = prob.grid(resolution)
    with torch.no_grad():
        z = prob.loss(theta, check=False)
        z = torch.where(prob.in_domain(theta), z, torch.full_like(z, math.nan))
    return xs.numpy(), ys.numpy(), z.numpy()


def log_shift(z: np.ndarray) -> float:
    """What :func:`log_display` adds before the logarithm: ``1e-12 - min(0, min z)`` (a loss that
    goes negative, such as the saddle's, still has a logarithm)."""
    z = np.asarray(z, dtype=float)
    finite = z[np.isfinite(z)]
    return 1e-12 - min(0.0, float(finite.min())) if finite.size else 0.0


def log_display(z: np.ndarray, log: bool, shift: float | None = None) -> np.ndarray:
    """``log10(z + shift + 1e-12)`` when ``log`` (``shift`` from :func:`log_shift` of ``z`` unless
    given, so that several arrays can share one), else ``z`` unchanged."""
    z = np.asarray(z, dtype=float)
    if not log:
        return z
    s = log_shift(z) if shift is None else shift
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.log10(z + s + 1e-12)


def loss_label(log: bool, shift: float) -> str:
    """Axis / colour-bar title for the loss as displayed."""
    if not log:
        return "loss"
    return "log10 loss" if shift <= 1e-9 else f"log10(loss + {fmt(shift, 3)})"


def contour_figure(
    prob: tp.ToyProblem,
    runs: list[Run],
    resolution: int = 120,
    log: bool = False,
    neighbourhood_step: int | None = 0,
) -> go.Figure:
    """Contour of the loss with each run's path, its minima, and the probe region at one step."""
    xs, ys, z = loss_grid(prob, resolution)
    shift = log_shift(z)
    label = loss_label(log, shift)
    fig = go.Figure()
    fig.add_trace(
        go.Contour(
            x=xs,
            y=ys,
            z=log_display(z, log, shift),
            colorscale="Viridis",
            ncontours=40,
            name=label,
            showscale=True,
            colorbar=dict(title=dict(text=label, side="right")),
            opacity=0.85,
        )
    )
    for m in prob.minima:
        fig.add_trace(
            go.Scatter(
                x=[m.theta[0]],
                y=[m.theta[1]],
                mode="markers+text",
                text=[m.label or "min"],
                textposition="top center",
                marker=dict(symbol="star", size=14, color="white", line=dict(color="black", width=1)),
                name=f"minimum {m.label}".strip(),
            )
        )
    for i, r in enumerate(runs):
        color = method_color(r.optimizer)
        style = run_style(i, len(runs))
        path = r.trajectory.path.numpy()
        fig.add_trace(
            go.Scatter(
                x=path[:, 0],
                y=path[:, 1],
                mode="lines+markers",
                marker=dict(size=6, symbol=style["symbol"], color=color),
                line=dict(color=color, width=style["width"], dash=style["dash"]),
                name=r.label,
                legendgroup=r.label,  # one legend entry per run toggles its path, region and probe
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[path[-1, 0]],
                y=[path[-1, 1]],
                mode="markers",
                showlegend=False,
                legendgroup=r.label,
                marker=dict(symbol="x", size=12, color=color),
                name=f"{r.label} end",
            )
        )
        if neighbourhood_step is not None:
            _add_neighbourhood(fig, prob, r, neighbourhood_step, color, path)
    (x0, x1), (y0, y1) = prob.bounds
    fig.update_layout(
        xaxis=dict(range=[x0, x1], title=prob.axis_labels[0]),
        yaxis=dict(range=[y0, y1], title=prob.axis_labels[1]),
        height=600,
        legend=LEGEND_BELOW,
        margin=dict(l=50, r=20, t=30, b=140),
    )
    return fig


def _add_neighbourhood(fig: go.Figure, prob, r: Run, step: int, color: str, path: np.ndarray) -> None:
    region = neighbourhood(prob, r, step)
    if region is None:
        return
    fig.add_trace(
        go.Scatter(
            x=region[:, 0],
            y=region[:, 1],
            mode="lines",
            name=f"{r.label} neighbourhood",
            legendgroup=r.label,
            showlegend=False,
            line=dict(color=color, dash="dot"),
        )
    )
    k = min(step, len(r.trajectory.perturbations) - 1)
    if k >= 0:
        w = path[k]
        e = r.trajectory.perturbations[k].numpy()
        fig.add_trace(
            go.Scatter(
                x=[w[0], w[0] + e[0]],
                y=[w[1], w[1] + e[1]],
                mode="lines+markers",
                name=f"{r.label} probe",
                legendgroup=r.label,
                showlegend=False,
                line=dict(color=color, width=3),
                marker=dict(symbol="arrow", angleref="previous", size=10),
            )
        )


#: the marker symbols Scatter3d accepts
_SYMBOLS_3D = ("circle", "square", "diamond", "cross", "x", "circle-open", "square-open", "diamond-open")


def surface_figure(
    prob: tp.ToyProblem, runs: list[Run], resolution: int = 80, log: bool = False
) -> go.Figure:
    """3-D surface of the loss with each path lifted onto it.

    The axes keep to the plotted box and to the finite range of the loss surface; path points
    outside (a diverging run) are left out of the drawing rather than stretching the view."""
    xs, ys, z = loss_grid(prob, resolution)
    shift = log_shift(z)
    zd = log_display(z, log, shift)
    zr = finite_range(zd)
    fig = go.Figure(
        go.Surface(x=xs, y=ys, z=zd, colorscale="Viridis", opacity=0.9, name="loss", showscale=False)
    )
    (x0, x1), (y0, y1) = prob.bounds
    for i, r in enumerate(runs):
        color = method_color(r.optimizer)
        style = run_style(i, len(runs))
        path = r.trajectory.path.numpy().astype(float)
        lz = log_display(r.trajectory.losses.numpy(), log, shift)
        inside = (path[:, 0] >= x0) & (path[:, 0] <= x1) & (path[:, 1] >= y0) & (path[:, 1] <= y1)
        if zr is not None:
            inside &= np.isfinite(lz) & (lz >= zr[0]) & (lz <= zr[1])
        px, py, pz = (np.where(inside, v, np.nan) for v in (path[:, 0], path[:, 1], lz))
        fig.add_trace(
            go.Scatter3d(
                x=px,
                y=py,
                z=pz,
                mode="lines+markers",
                name=r.label,
                marker=dict(size=3, color=color, symbol=_SYMBOLS_3D[i % len(_SYMBOLS_3D)]),
                line=dict(color=color, width=2 + style["width"], dash=style["dash"]),
            )
        )
    scene = dict(
        xaxis=dict(title=prob.axis_labels[0], range=[x0, x1]),
        yaxis=dict(title=prob.axis_labels[1], range=[y0, y1]),
        zaxis=dict(title=loss_label(log, shift)),
        aspectmode="cube",
        # the default eye (1.25, 1.25, 1.25) crops the axis titles at the scene's edge
        camera=dict(eye=dict(x=1.6, y=-1.6, z=1.1)),
        domain=dict(x=[0.0, 1.0], y=[0.0, 1.0]),
    )
    if zr is not None:
        scene["zaxis"]["range"] = padded(zr)
    fig.update_layout(height=600, scene=scene, legend=LEGEND_BELOW, margin=dict(l=0, r=0, t=30, b=80))
    return fig


def loss_curves_figure(
    runs: list[Run], log: bool = False, prob: tp.ToyProblem | None = None, resolution: int = 60
) -> go.Figure:
    """Loss against step for every run (log10 when ``log``, the same transform as the contour).

    The vertical axis covers the runs' start losses and, with ``prob``, the loss at every path point
    inside the plotted box (without ``prob``: the whole curves of the runs that did not diverge); a
    curve that explodes runs off the plot instead of flattening the others. The log shift also
    takes the loss on the plotted grid into account, so the curves use the contour's transform."""
    ref = [r.trajectory.losses.numpy()[:1] for r in runs]
    grid: list[np.ndarray] = []
    if prob is not None:
        (x0, x1), (y0, y1) = prob.bounds
        grid.append(loss_grid(prob, resolution)[2])
        for r in runs:
            p = r.trajectory.path.numpy()
            inside = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)
            ref.append(r.trajectory.losses.numpy()[inside])
    else:
        ref += [r.trajectory.losses.numpy() for r in runs if not r.trajectory.diverged]
    shift = log_shift(np.concatenate([np.ravel(a) for a in ref + grid])) if ref else 0.0
    fig = go.Figure()
    for i, r in enumerate(runs):
        style = run_style(i, len(runs))
        y = log_display(r.trajectory.losses.numpy(), log, shift)
        fig.add_trace(
            go.Scatter(
                y=y,
                mode="lines+markers",
                name=r.label,
                # solid (dashes turn an oscillating curve into noise); widths fall in drawing order,
                # so a curve under an identical one shows as its border, and markers tell them apart
                line=dict(color=method_color(r.optimizer), width=style["width"]),
                marker=dict(symbol=style["symbol"], size=8, maxdisplayed=12),
            )
        )
    yr = finite_range(*[log_display(a, log, shift) for a in ref]) if ref else None
    yaxis = dict(title=loss_label(log, shift))
    if yr is not None:
        yaxis["range"] = padded(yr)
    fig.update_layout(
        xaxis_title="step", yaxis=yaxis, height=380, legend=LEGEND_BELOW, margin=dict(l=50, r=20, t=30, b=110)
    )
    return fig
