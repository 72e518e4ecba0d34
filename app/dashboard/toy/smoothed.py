"""The smoothed-objectives page: the four panels of the VSAM paper's Fig. 1 (Ujváry et al. 2022,
"Rethinking SAM as variational inference") on any 2-D problem.

Local minima are counted on the two smooth panels (A, the loss, and B, its Gaussian smoothing) by
:func:`smoothed_minima`: Newton descent from every grid-local minimum, kept when the gradient
vanishes and the exact Hessian is positive definite, duplicates merged. C (a maximum over a finite
search) and D (which follows the direction of the gradient, undefined where it vanishes) have no
Hessian to test, so their minima are not counted.

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

from ..layout import finite_range, fmt, fmt_point, grid_shape
from .endpoints import box_width
from .minima import MERGE_FRACTION, MIN_STEP_FRACTION, descend_to_minima, gaussian_smoothing
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


def _by_rows(fn, theta: torch.Tensor, report, lo: float, hi: float, what: str) -> torch.Tensor:
    """``fn`` over ``theta`` a band of rows at a time, moving the progress bar from ``lo`` to ``hi``."""
    n = theta.shape[0]
    rows = max(1, n // 10)
    parts = []
    for i in range(0, n, rows):
        report(lo + (hi - lo) * i / n, what)
        parts.append(fn(theta[i : i + rows]))
    return torch.cat(parts)


def _max_difference(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    d = (a - b).abs()[mask]
    d = d[torch.isfinite(d)]
    return float(d.max()) if d.numel() else 0.0


def smoothed_panels(
    problem: str,
    rho: float,
    resolution: int = 60,
    n_quad: int = 24,
    progress: Callable[[float, str], None] | None = None,
) -> dict[str, Any]:
    """The four panels of the VSAM paper's Fig. 1 on one grid: loss, Gaussian-smoothed loss, exact
    worst case in the ball of radius ``rho`` and SAM's first-order objective.

    B and C are estimates with an uncertainty (``panels["uncertainty"]``, ``panels["methods"]``):
    B is Gauss-Hermite quadrature with ``n_quad`` nodes per axis, checked on every third grid point
    against twice the nodes; when that changes B by more than ``QUAD_RTOL`` of its range, B is
    recomputed with ``2 n_quad`` nodes (and checked against ``4 n_quad``). C is a dense search of
    8 x 64 points of the disc, checked against 16 x 128. The uncertainty is the largest change seen
    in the check. A and D are exact (D by the autograd gradient).

    ``progress(fraction, what)`` is called as the panels are computed (the page's progress bar).
    ``panels["masked"]`` is the fraction of cells masked in B and C; ``panels["minima"]`` the local
    minima of A and B (:func:`smoothed_minima`)."""
    if not (0 < rho <= 50):
        raise ValueError(f"rho must lie in (0, 50], got {rho}")
    prob = tp.get(problem)
    xs, ys, theta = prob.grid(resolution)
    report = progress or (lambda f, what: None)
    report(0.0, "loss")
    with torch.no_grad():
        a = prob.loss(theta, check=False)

    def smooth(n: int) -> Callable:
        return lambda t: tp.gaussian_smoothed(prob, t, rho, n_quad=n)

    ball = ball_inside(prob, theta, rho)
    sub = (slice(None, None, 3), slice(None, None, 3))  # every third row and column
    what = "Gaussian smoothing (Gauss-Hermite, {} nodes per axis{})"
    n = n_quad
    b = _by_rows(smooth(n), theta, report, 0.02, 0.15, what.format(n, ""))
    while True:  # check the rule against one with twice the nodes; refine once (to 2 n_quad)
        report(0.15 if n == n_quad else 0.45, what.format(2 * n, ", check on every third grid point"))
        b_check = smooth(2 * n)(theta[sub])
        b_err = _max_difference(b[sub], b_check, ball[sub])
        finite = b[ball & torch.isfinite(b)]
        span = float(finite.max() - finite.min()) if finite.numel() else 0.0
        if b_err <= QUAD_RTOL * span or 2 * n > 2 * n_quad:
            break
        n *= 2
        b = _by_rows(smooth(n), theta, report, 0.2, 0.45, what.format(n, ""))
    c = _by_rows(
        lambda t: tp.worst_case_ball(prob, t, rho, n_radii=8, n_angles=64),
        theta, report, 0.5, 0.65, "worst case in the ball (dense search, 8 x 64 points)",
    )  # fmt: skip
    report(0.65, "worst case: check with 16 x 128 points on every third grid point")
    c_check = tp.worst_case_ball(prob, theta[sub], rho, n_radii=16, n_angles=128)
    c_err = _max_difference(c[sub], c_check, ball[sub])
    report(0.75, "SAM's first-order objective")
    d = tp.sam_first_order(prob, theta, rho)
    valid = prob.in_domain(theta)
    nan = torch.full_like(a, math.nan)
    values = {"loss": a, "gaussian_smoothed": b, "worst_case": c, "sam_first_order": d}
    masks = {"loss": valid, "gaussian_smoothed": ball, "worst_case": ball, "sam_first_order": valid}
    panels: dict[str, Any] = {k: torch.where(masks[k], v.detach(), nan).numpy() for k, v in values.items()}
    panels["xs"], panels["ys"] = xs.numpy(), ys.numpy()
    panels["masked"] = float((~ball).double().mean())
    panels["axis_labels"] = tuple(prob.axis_labels)
    panels["rho"], panels["problem"] = float(rho), problem
    panels["n_quad"] = n
    panels["uncertainty"] = {"gaussian_smoothed": b_err, "worst_case": c_err}
    panels["methods"] = {
        "gaussian_smoothed": f"Gauss-Hermite quadrature with {n} x {n} nodes; ± the largest change with "
        f"{2 * n} x {2 * n} nodes (on every third grid point)",
        "worst_case": "dense search of 8 radii x 64 directions; ± the largest change with 16 x 128 (on "
        "every third grid point; a search can only miss the maximum, so C errs low)",
    }
    panels["minima"] = {}
    for j, key in enumerate(COUNTED):
        report(0.8 + 0.1 * j, f"local minima of panel {PANEL_TITLES[key].split(':')[0]} (Newton descent)")
        panels["minima"][key] = smoothed_minima(prob, key, rho, panels[key], panels["xs"], panels["ys"], n)
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


#: B's quadrature counts as converged when twice the nodes change it by at most this fraction of its
#: range; otherwise the rule is refined (up to twice ``n_quad`` nodes per axis)
QUAD_RTOL = 1e-3
#: the panels whose local minima are counted (smooth, with exact autograd derivatives)
COUNTED = ("loss", "gaussian_smoothed")
#: a minimum of panel B counts when the quadrature with twice the nodes has one this close
STABLE_FRACTION = 1e-3


def panel_objective(prob: tp.ToyProblem, key: str, rho: float, n_quad: int = 48) -> Callable:
    """The function panel ``key`` draws, differentiable (``theta [..., 2] -> [...]``): the loss (A),
    or its Gaussian smoothing (B) by Gauss-Hermite with ``n_quad`` nodes per axis."""
    if key == "loss":
        return lambda t: prob.loss(t, check=False)
    if key != "gaussian_smoothed":
        raise ValueError(f"minima are counted on {COUNTED} only, not {key!r}")
    return gaussian_smoothing(prob, rho, n_quad)


def smoothed_minima(
    prob: tp.ToyProblem,
    key: str,
    rho: float,
    values: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    n_quad: int = 24,
) -> dict[str, Any]:
    """The local minima of panel ``key`` inside the plotted box: descent (:func:`descend_to_minima`)
    from every grid-local minimum of the panel's ``values``; a minimum that lies outside the box or
    where the panel is masked is not counted (``"outside"``)."""
    f = panel_objective(prob, key, rho, n_quad)
    if key == "loss":
        domain = prob.in_domain
    else:
        domain = lambda t: ball_inside(prob, t, rho)  # noqa: E731 - where panel B is drawn
    (x0, x1), (y0, y1) = (float(xs[0]), float(xs[-1])), (float(ys[0]), float(ys[-1]))
    w = box_width(prob)
    margin = 0.25 * w  # the descent may leave the box a little; a minimum there is not counted

    def valid(t: torch.Tensor) -> torch.Tensor:
        inside = (t[..., 0] >= x0 - margin) & (t[..., 0] <= x1 + margin)
        inside &= (t[..., 1] >= y0 - margin) & (t[..., 1] <= y1 + margin)
        return inside & domain(t)

    _, cells = tp.basins(values)
    starts = torch.tensor([(xs[j], ys[i]) for i, j in cells], dtype=prob.dtype).reshape(-1, 2)
    out: dict[str, Any] = {"candidates": len(starts), "outside": 0, "unstable": 0, "n_quad": n_quad}
    found = descend_to_minima(f, valid, starts, w)
    p = found["points"]
    keep = (p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1) & domain(p)
    out["outside"] = int((~keep).sum())
    if key == "gaussian_smoothed" and bool(keep.any()):
        # a minimum of the quadrature, not of the smoothed loss, moves when the rule is refined:
        # keep the minima that Newton descent on the rule with twice the nodes finds again
        again = descend_to_minima(panel_objective(prob, key, rho, 2 * n_quad), valid, p[keep], w)["points"]
        stable = torch.tensor(
            [bool(len(again)) and float((again - q).norm(dim=-1).min()) <= STABLE_FRACTION * w for q in p],
            dtype=torch.bool,
        )
        out["unstable"] = int((keep & ~stable).sum())
        keep &= stable
    for name in ("points", "values", "eigenvalues", "newton_steps"):
        out[name] = found[name][keep].numpy()
    return out


def _minima_phrase(m: dict[str, Any], key: str) -> str:
    n = len(m["points"])
    label = PANEL_TITLES[key].split(":")[0]
    text = f"**{label}** {n}"
    if 0 < n <= 4:
        where = "; ".join(f"{fmt_point(p, 3)}, value {fmt(v, 3)}" for p, v in zip(m["points"], m["values"]))
        text += f" ({where})"
    if m.get("unstable"):
        k = m["unstable"]
        text += (
            f", and {k} more {'minimum' if k == 1 else 'minima'} of the {m['n_quad']}-node quadrature that "
            f"{'moves' if k == 1 else 'move'} when the nodes double (quadrature error, not counted)"
        )
    return text


def _range(panels: dict[str, Any], key: str) -> float:
    v = np.asarray(panels[key], dtype=float)
    v = v[np.isfinite(v)]
    return float(v.max() - v.min()) if v.size else 0.0


def smoothed_summary(panels: dict[str, Any]) -> str:
    """The paragraph under the figure: the local minima of A and B (how they were found, where they
    are), why C and D are not counted, how B and C were estimated and how far to trust them, and
    what the white band is."""
    minima = panels["minima"]
    counts = "; ".join(_minima_phrase(minima[k], k) for k in COUNTED)
    n_start = ", ".join(f"{PANEL_TITLES[k].split(':')[0]} {minima[k]['candidates']}" for k in COUNTED)
    text = (
        f"**Local minima inside the plotted box**: {counts}. Found by Newton descent from every "
        f"grid-local minimum of the panel ({n_start} starts), kept where the Newton step ‖H⁻¹∇f‖ is "
        f"below {MIN_STEP_FRACTION:g} × the box width and the exact Hessian (autograd) is positive "
        f"definite, minima closer than {MERGE_FRACTION:g} × the width merged; a minimum of B counts only "
        f"if the quadrature with twice the nodes has one within {STABLE_FRACTION:g} × the width. C and D "
        "are not counted: C is a maximum over a finite search and D follows the direction of ∇L, "
        "undefined where ∇L = 0, so neither has a Hessian to test a minimum with."
    )
    n_a, n_b = (len(minima[k]["points"]) for k in COUNTED)
    if n_b < n_a:
        text += (
            f" So at ρ = {fmt(panels['rho'], 3)} the smoothing leaves fewer minima than the loss has "
            f"({n_b} in B against {n_a} in A)."
        )
    unc, methods = panels.get("uncertainty", {}), panels.get("methods", {})
    for key in ("gaussian_smoothed", "worst_case"):
        if key not in unc:
            continue
        label = PANEL_TITLES[key].split(":")[0]
        span = _range(panels, key)
        share = f" ({100 * unc[key] / span:.2g}% of its range)" if span > 0 else ""
        text += f"\n\n**{label}** is an estimate: {methods[key]}: ± {fmt(unc[key], 2)}{share}."
        if key == "gaussian_smoothed" and span > 0 and unc[key] > 0.01 * span:
            text += " The quadrature has not converged here, so read B's contours with that error in mind."
    if panels["masked"] > 0:
        text += (
            f"\n\nWhite in B and C ({100 * panels['masked']:.0f}% of the grid): the ball of radius ρ around "
            "the point leaves the valid region, where the worst case is unbounded and the quadrature "
            "is unreliable."
        )
    return text
