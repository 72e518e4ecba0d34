"""The smoothed-objectives page: the four panels of the VSAM paper's Fig. 1 on any 2-D problem."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import toy_problems as tp

from .plots import log_display


def smoothed_panels(
    problem: str, rho: float, resolution: int = 60, n_quad: int = 24
) -> dict[str, np.ndarray]:
    """The four panels of the VSAM paper's Fig. 1 on one grid: loss, Gaussian-smoothed loss, exact
    worst case in the ball of radius ``rho`` and SAM's first-order objective."""
    if not (0 < rho <= 50):
        raise ValueError(f"rho must lie in (0, 50], got {rho}")
    prob = tp.get(problem)
    xs, ys, theta = prob.grid(resolution)
    with torch.no_grad():
        a = prob.loss(theta, check=False)
    b = tp.gaussian_smoothed(prob, theta, rho, n_quad=n_quad)
    c = tp.worst_case_ball(prob, theta, rho, n_radii=8, n_angles=64)
    d = tp.sam_first_order(prob, theta, rho)
    valid = prob.in_domain(theta)
    nan = torch.full_like(a, math.nan)
    panels = {
        k: torch.where(valid, v, nan).numpy()
        for k, v in {"loss": a, "gaussian_smoothed": b, "worst_case": c, "sam_first_order": d}.items()
    }
    panels["xs"], panels["ys"] = xs.numpy(), ys.numpy()
    panels["basins"] = {
        k: len(tp.basins(panels[k])[1])
        for k in ("loss", "gaussian_smoothed", "worst_case", "sam_first_order")
    }
    return panels


PANEL_TITLES = {
    "loss": "A: loss L(θ)",
    "gaussian_smoothed": "B: E L(θ+ε), ε~N(0, ρ²/p I)",
    "worst_case": "C: max_{‖ε‖≤ρ} L(θ+ε)",
    "sam_first_order": "D: L(θ + ρ∇L/‖∇L‖)",
}


def smoothed_figure(panels: dict[str, Any], log: bool = True) -> go.Figure:
    fig = make_subplots(
        rows=1, cols=4, subplot_titles=[PANEL_TITLES[k] for k in PANEL_TITLES], horizontal_spacing=0.04
    )
    for j, key in enumerate(PANEL_TITLES, start=1):
        fig.add_trace(
            go.Contour(
                x=panels["xs"],
                y=panels["ys"],
                z=log_display(panels[key], log),
                name=key,
                colorscale="Viridis",
                showscale=False,
                ncontours=30,
            ),
            row=1,
            col=j,
        )
    fig.update_layout(height=380, margin=dict(l=30, r=10, t=50, b=30))
    return fig
