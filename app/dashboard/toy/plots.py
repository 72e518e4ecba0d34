"""Plotly figures of the playground: contour with paths and probe regions, 3-D surface, loss curves."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import torch

import toy_problems as tp

from .runs import Run, neighbourhood

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def loss_grid(prob: tp.ToyProblem, resolution: int = 120) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(xs, ys, Z)`` with ``Z[i, j]`` the loss at ``(xs[j], ys[i])``; NaN outside the domain."""
    xs, ys, theta = prob.grid(resolution)
    with torch.no_grad():
        z = prob.loss(theta, check=False)
        z = torch.where(prob.in_domain(theta), z, torch.full_like(z, math.nan))
    return xs.numpy(), ys.numpy(), z.numpy()


def log_display(z: np.ndarray, log: bool) -> np.ndarray:
    if not log:
        return z
    finite = z[np.isfinite(z)]
    shift = 1e-12 - min(0.0, float(finite.min())) if finite.size else 0.0
    return np.log10(z + shift + 1e-12)


def contour_figure(
    prob: tp.ToyProblem,
    runs: list[Run],
    resolution: int = 120,
    log: bool = False,
    neighbourhood_step: int | None = 0,
) -> go.Figure:
    """Contour of the loss with each run's path, its minima, and the probe region at one step."""
    xs, ys, z = loss_grid(prob, resolution)
    fig = go.Figure()
    fig.add_trace(
        go.Contour(
            x=xs,
            y=ys,
            z=log_display(z, log),
            colorscale="Viridis",
            ncontours=40,
            name="log10 loss" if log else "loss",
            showscale=True,
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
        color = COLORS[i % len(COLORS)]
        path = r.trajectory.path.numpy()
        fig.add_trace(
            go.Scatter(
                x=path[:, 0],
                y=path[:, 1],
                mode="lines+markers",
                marker=dict(size=4),
                line=dict(color=color, width=2),
                name=r.label,
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[path[-1, 0]],
                y=[path[-1, 1]],
                mode="markers",
                showlegend=False,
                marker=dict(symbol="x", size=12, color=color),
                name=f"{r.label} end",
            )
        )
        if neighbourhood_step is not None:
            region = neighbourhood(prob, r, neighbourhood_step)
            if region is not None:
                fig.add_trace(
                    go.Scatter(
                        x=region[:, 0],
                        y=region[:, 1],
                        mode="lines",
                        name=f"{r.label} neighbourhood",
                        line=dict(color=color, dash="dot"),
                    )
                )
                k = min(neighbourhood_step, len(r.trajectory.perturbations) - 1)
                if k >= 0:
                    w = path[k]
                    e = r.trajectory.perturbations[k].numpy()
                    fig.add_trace(
                        go.Scatter(
                            x=[w[0], w[0] + e[0]],
                            y=[w[1], w[1] + e[1]],
                            mode="lines+markers",
                            name=f"{r.label} probe",
                            line=dict(color=color, width=3),
                            marker=dict(symbol="arrow", angleref="previous", size=10),
                        )
                    )
    (x0, x1), (y0, y1) = prob.bounds
    fig.update_layout(
        xaxis=dict(range=[x0, x1], title=prob.axis_labels[0]),
        yaxis=dict(range=[y0, y1], title=prob.axis_labels[1]),
        height=560,
        legend=dict(orientation="h"),
        margin=dict(l=40, r=20, t=30, b=40),
    )
    return fig


def surface_figure(
    prob: tp.ToyProblem, runs: list[Run], resolution: int = 80, log: bool = False
) -> go.Figure:
    """3-D surface of the loss with each path lifted onto it."""
    xs, ys, z = loss_grid(prob, resolution)
    zd = log_display(z, log)
    fig = go.Figure(
        go.Surface(x=xs, y=ys, z=zd, colorscale="Viridis", opacity=0.9, name="loss", showscale=False)
    )
    for i, r in enumerate(runs):
        path = r.trajectory.path.numpy()
        lz = r.trajectory.losses.numpy()
        lz = log_display(lz, log) if log else lz
        fig.add_trace(
            go.Scatter3d(
                x=path[:, 0],
                y=path[:, 1],
                z=lz,
                mode="lines+markers",
                name=r.label,
                marker=dict(size=2, color=COLORS[i % len(COLORS)]),
                line=dict(color=COLORS[i % len(COLORS)], width=5),
            )
        )
    fig.update_layout(
        height=560,
        scene=dict(
            xaxis_title=prob.axis_labels[0],
            yaxis_title=prob.axis_labels[1],
            zaxis_title="log10 loss" if log else "loss",
        ),
        margin=dict(l=0, r=0, t=30, b=0),
    )
    return fig


def loss_curves_figure(runs: list[Run]) -> go.Figure:
    fig = go.Figure()
    for i, r in enumerate(runs):
        fig.add_trace(
            go.Scatter(
                y=r.trajectory.losses.numpy(),
                mode="lines",
                name=r.label,
                line=dict(color=COLORS[i % len(COLORS)]),
            )
        )
    fig.update_layout(xaxis_title="step", yaxis_title="loss", height=320, margin=dict(l=40, r=20, t=30, b=40))
    return fig
