"""The smoothed-objectives page: the four panels of the VSAM paper's Fig. 1 (Ujváry et al. 2022,
"Rethinking SAM as variational inference") on any 2-D problem.

Panels B and C are masked where the ball of radius rho around a point leaves the problem's valid
region (for the Gaussian mixture: ``sigma <= rho``), as ``toy_problems.figures.vsam`` does for the
command-line figure: there the worst case is unbounded (the loss is ``+inf`` at ``sigma = 0``) and
the Gauss-Hermite rule straddles the singularity (spurious stripes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import toy_problems as tp

from ..layout import finite_range, grid_shape
from .plots import log_display, log_shift, loss_label

PANEL_TITLES = {
    "loss": "A: loss L(θ)",
    "gaussian_smoothed": "B: Gaussian-smoothed loss, E L(θ + ε) with ε ~ N(0, ρ²/2 · I)",
    "worst_case": "C: worst loss within distance ρ of θ",
    "sam_first_order": "D: SAM's first-order objective, L(θ + ρ ∇L / ‖∇L‖)",
}


def ball_inside(prob: tp.ToyProblem, theta: torch.Tensor, rho: float, n_angles: int = 64) -> torch.Tensor:
    """Boolean ``[...]``: the point and the circle of radius ``rho`` around it (``n_angles`` points,
    a multiple of 4, so the axis directions are included) lie in the valid region."""
    t = torch.arange(n_angles, dtype=theta.dtype) * (2 * math.pi / n_angles)
    ring = rho * torch.stack([t.cos(), t.sin()], -1)  # [A, 2]
    ok = prob.in_domain(theta[..., None, :] + ring).all(-1)
    return ok & prob.in_domain(theta)


def smoothed_panels(
    problem: str,
    rho: float,
    resolution: int = 60,
    n_quad: int = 24,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """The four panels of the VSAM paper's Fig. 1 on one grid: loss, Gaussian-smoothed loss, exact
    worst case in the ball of radius ``rho`` and SAM's first-order objective.

    ``progress(fraction, what)`` is called as the panels are computed (the page's progress bar).
    ``panels["masked"]`` is the fraction of cells masked in B and C."""
    if not (0 < rho <= 50):
        raise ValueError(f"rho must lie in (0, 50], got {rho}")
    prob = tp.get(problem)
    xs, ys, theta = prob.grid(resolution)
    report = progress or (lambda f, what: None)
    report(0.0, "loss")
    with torch.no_grad():
        a = prob.loss(theta, check=False)
    rows = max(1, resolution // 10)
    b_parts, c_parts = [], []
    for i in range(0, resolution, rows):
        report(0.05 + 0.25 * i / resolution, "Gaussian smoothing (Gauss-Hermite)")
        b_parts.append(tp.gaussian_smoothed(prob, theta[i : i + rows], rho, n_quad=n_quad))
    for i in range(0, resolution, rows):
        report(0.3 + 0.6 * i / resolution, "worst case in the ball (dense search)")
        c_parts.append(tp.worst_case_ball(prob, theta[i : i + rows], rho, n_radii=8, n_angles=64))
    report(0.9, "SAM's first-order objective")
    d = tp.sam_first_order(prob, theta, rho)
    valid = prob.in_domain(theta)
    ball = ball_inside(prob, theta, rho)
    nan = torch.full_like(a, math.nan)
    values = {"loss": a, "gaussian_smoothed": torch.cat(b_parts), "worst_case": torch.cat(c_parts)}
    values["sam_first_order"] = d
    masks = {"loss": valid, "gaussian_smoothed": ball, "worst_case": ball, "sam_first_order": valid}
    panels: dict[str, Any] = {k: torch.where(masks[k], v.detach(), nan).numpy() for k, v in values.items()}
    panels["xs"], panels["ys"] = xs.numpy(), ys.numpy()
    panels["masked"] = float((~ball).double().mean())
    panels["axis_labels"] = tuple(prob.axis_labels)
    panels["basins"] = {k: len(tp.basins(panels[k])[1]) for k in PANEL_TITLES}
    report(1.0, "done")
    return panels


def smoothed_figure(panels: dict[str, Any], log: bool = True) -> go.Figure:
    """The four panels in a 2 x 2 grid on one colour scale (one colour bar), with axis titles.

    The scale runs from the lowest value on any panel to the 98th percentile of all of them (the
    worst case grows fast away from the minima; beyond that the colour saturates)."""
    keys = list(PANEL_TITLES)
    n_rows, n_cols = grid_shape(len(keys))
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=[PANEL_TITLES[k] for k in keys],
        horizontal_spacing=0.08,
        vertical_spacing=0.14,
    )
    shift = log_shift(np.concatenate([np.ravel(panels[k]) for k in keys]))
    shown = {k: log_display(panels[k], log, shift) for k in keys}
    zr = finite_range(*shown.values(), upper_percentile=98.0)
    label = loss_label(log, shift)
    levels: dict[str, Any] = dict(ncontours=30)
    if zr is not None:  # the same levels and colours on every panel
        levels = dict(zmin=zr[0], zmax=zr[1], autocontour=False)
        levels["contours"] = dict(start=zr[0], end=zr[1], size=(zr[1] - zr[0]) / 30)
    xl, yl = panels.get("axis_labels", ("θ₁", "θ₂"))
    for j, key in enumerate(keys):
        row, col = divmod(j, n_cols)
        fig.add_trace(
            go.Contour(
                x=panels["xs"],
                y=panels["ys"],
                z=shown[key],
                name=key,
                colorscale="Viridis",
                showscale=j == 0,
                colorbar=dict(title=dict(text=label, side="right")),
                **levels,
            ),
            row=row + 1,
            col=col + 1,
        )
        fig.update_xaxes(title_text=xl, row=row + 1, col=col + 1)
        fig.update_yaxes(title_text=yl, row=row + 1, col=col + 1)
    fig.update_annotations(font_size=12)
    fig.update_layout(height=380 * n_rows, margin=dict(l=50, r=20, t=50, b=40))
    return fig


def smoothed_summary(panels: dict[str, Any]) -> str:
    """One paragraph under the figure: local minima per panel and what the white band is."""
    counts = ", ".join(f"**{PANEL_TITLES[k].split(':')[0]}** {v}" for k, v in panels["basins"].items())
    text = f"Local minima (discrete basins) on this grid: {counts}."
    if panels["masked"] > 0:
        text += (
            f" White in B and C ({100 * panels['masked']:.0f}% of the grid): the ball of radius ρ around "
            "the point leaves the valid region, where the worst case is unbounded and the quadrature "
            "is unreliable."
        )
    return text
