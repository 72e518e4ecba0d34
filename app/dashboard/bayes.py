"""Logic of the "Bayesian view" page: Bayesian logistic regression (exact posterior vs Laplace vs
MFVI vs bSAM, predictive maps, sampled decision boundaries) and two moons (bSAM paper Fig. 3, 5, 6).

The fitting is done by ``toy_problems.figures`` (the same code that draws the reproduced figures),
so the page and the committed figures can never disagree; this module turns the results into
Plotly figures and tables.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from toy_problems import figures
from toy_problems.figures.palette import method_color

from .layout import LEGEND_BELOW, fmt, grid_shape


def logistic(resolution: int = 60, overrides: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Every posterior and predictive map of the logistic-regression problem (see
    ``toy_problems.figures.logistic_results``), with optional hyperparameter ``overrides`` such as
    ``{"sam": {"rho": 0.5}, "bsam": {"rho": 0.1}}``."""
    if not 10 <= resolution <= 200:
        raise ValueError(f"resolution must be between 10 and 200, got {resolution}")
    return figures.logistic_results(resolution, overrides=overrides)


def distance_rows(R: dict[str, Any]) -> list[dict[str, Any]]:
    post = R["post"]
    rows = []
    for name, d in R["distances"].items():
        row: dict[str, Any] = {
            "method": name,
            "mean |p - p_exact|": d["tv_mean"],
            "max |p - p_exact|": d["tv_max"],
            "mean KL(exact || method)": d["kl_mean"],
        }
        g = R["gauss"].get(name)
        if g is not None:
            row["‖mean − exact mean‖"] = float((g.mean - post.mean).norm())
            row["det Σ / det Σ_exact"] = float(torch.det(g.cov) / torch.det(post.cov))
        rows.append(row)
    return rows


def posterior_figure(R: dict[str, Any], n_std: float = 2.0) -> go.Figure:
    """Exact posterior density (contours) with MAP, SAM point and the Gaussian approximations'
    ``n_std`` ellipses (bSAM paper Fig. 5)."""
    post = R["post"]
    fig = go.Figure(
        go.Contour(
            x=post.xs.numpy(),
            y=post.ys.numpy(),
            z=post.density.numpy(),
            name="exact posterior",
            colorscale=[[0, "white"], [1, "#505050"]],
            showscale=False,
            ncontours=15,
            line=dict(width=0.5),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[float(post.map[0])],
            y=[float(post.map[1])],
            mode="markers",
            name="MAP",
            marker=dict(symbol="x", size=12, color=method_color("MAP")),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[float(post.mean[0])],
            y=[float(post.mean[1])],
            mode="markers",
            name="exact mean",
            marker=dict(symbol="circle", size=9, color=method_color("exact")),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[float(R["w_sam"][0])],
            y=[float(R["w_sam"][1])],
            mode="markers",
            name="SAM",
            marker=dict(symbol="star", size=13, color=method_color("SAM")),
        )
    )
    for name, g in R["gauss"].items():
        ell = g.ellipse(n_std=n_std).numpy()
        fig.add_trace(
            go.Scatter(
                x=ell[:, 0],
                y=ell[:, 1],
                mode="lines",
                name=f"{name} ({n_std:g}σ)",
                line=dict(color=method_color(name), width=2),
            )
        )
    fig.update_layout(
        xaxis_title="w₁",
        yaxis_title="w₂",
        height=560,
        legend=LEGEND_BELOW,
        margin=dict(l=40, r=10, t=30, b=130),
        xaxis=dict(range=[-2, 8]),
        yaxis=dict(range=[-2, 5]),
    )
    return fig


def _maps_figure(xs, ys, maps: dict[str, torch.Tensor], data, titles: list[str], height: int) -> go.Figure:
    """Predictive maps ``p(y=1|x)`` at most three per row, each with the training data on top, on one
    colour scale (0 to 1) with one colour bar."""
    n_rows, n_cols = grid_shape(len(maps))
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=titles,
        horizontal_spacing=0.05,
        vertical_spacing=0.12,
        shared_xaxes=True,
        shared_yaxes=True,
    )
    X, y = data
    colors = np.where(y.numpy() > 0.5, "red", "blue")
    for j, (m, p) in enumerate(maps.items()):
        row, col = divmod(j, n_cols)
        fig.add_trace(
            go.Contour(
                x=xs.numpy(),
                y=ys.numpy(),
                z=p.numpy(),
                name=m,
                colorscale="RdBu_r",
                zmin=0,
                zmax=1,
                showscale=j == 0,
                colorbar=dict(title=dict(text="p(y=1|x)", side="right")),
                contours=dict(start=0, end=1, size=0.1),
            ),
            row=row + 1,
            col=col + 1,
        )
        fig.add_trace(
            go.Scatter(
                x=X[:, 0].numpy(),
                y=X[:, 1].numpy(),
                mode="markers",
                showlegend=False,
                name="data",
                marker=dict(size=5, color=colors, line=dict(color="black", width=0.5)),
            ),
            row=row + 1,
            col=col + 1,
        )
        fig.update_xaxes(title_text="x₁", row=row + 1, col=col + 1)
        if col == 0:
            fig.update_yaxes(title_text="x₂", row=row + 1, col=col + 1)
    fig.update_layout(height=height * n_rows, margin=dict(l=40, r=10, t=70, b=40))
    return fig


def predictive_figure(
    R: dict[str, Any], methods=("exact", "SAM", "SAM+Laplace", "bSAM", "MFVI")
) -> go.Figure:
    """Predictive maps ``p(y=1|x)`` side by side with the data (bSAM paper Fig. 3)."""
    maps = {m: R["maps"][m] for m in methods if m in R["maps"]}
    return _maps_figure(R["xs"], R["ys"], maps, R["prob"].data, list(maps), height=330)


def decision_boundaries_figure(R: dict[str, Any], samples: int = 20, seed: int = 0) -> go.Figure:
    """Decision boundaries ``w^T x = 0`` (lines through the origin; the model has no bias) of
    ``samples`` weights drawn from each Gaussian posterior and from the exact one (grid sampling)."""
    g = torch.Generator().manual_seed(seed)
    post = R["post"]
    X, y = R["prob"].data
    (x0, x1), _ = R["prob"].x_bounds
    t = torch.tensor([x0, x1], dtype=torch.float64)
    fig = go.Figure(
        go.Scatter(
            x=X[:, 0].numpy(),
            y=X[:, 1].numpy(),
            mode="markers",
            name="data",
            marker=dict(size=6, color=np.where(y.numpy() > 0.5, "red", "blue")),
        )
    )
    draws: dict[str, torch.Tensor] = {}
    flat = (post.density * post.step**2).reshape(-1).double()
    idx = torch.multinomial(flat / flat.sum(), samples, replacement=True, generator=g)
    draws["exact"] = post.grid.reshape(-1, 2)[idx].double()
    for name in ("bSAM", "MFVI", "SAM+Laplace"):
        gauss = R["gauss"][name]
        chol = torch.linalg.cholesky(gauss.cov.double())
        z = torch.randn(samples, 2, generator=g, dtype=torch.float64)
        draws[name] = gauss.mean.double() + z @ chol.T
    for name, ws in draws.items():
        xs_all, ys_all = [], []
        for w in ws:
            if abs(float(w[1])) < 1e-9:
                continue
            xs_all += [float(t[0]), float(t[1]), None]
            ys_all += [float(-w[0] * t[0] / w[1]), float(-w[0] * t[1] / w[1]), None]
        fig.add_trace(
            go.Scatter(
                x=xs_all,
                y=ys_all,
                mode="lines",
                name=f"{name} samples",
                line=dict(color=method_color(name), width=1),
                opacity=0.5,
            )
        )
    (ax0, ax1), (ay0, ay1) = R["prob"].x_bounds
    fig.update_layout(
        xaxis=dict(range=[ax0, ax1], title="x₁"),
        yaxis=dict(range=[ay0, ay1], title="x₂"),
        height=520,
        legend=LEGEND_BELOW,
        margin=dict(l=40, r=10, t=30, b=110),
    )
    return fig


def two_moons(resolution: int = 40, epochs: int = 40, progress=None) -> dict[str, Any]:
    """Train SAM and bSAM on two moons and compute the three predictive maps of the paper's Fig. 6
    (``progress(fraction, what)`` as in ``toy_problems.figures.moons_results``)."""
    if not 1 <= epochs <= 500:
        raise ValueError(f"epochs must be between 1 and 500, got {epochs}")
    return figures.moons_results(resolution, epochs, progress=progress)


def moons_figure(M: dict[str, Any]) -> go.Figure:
    titles = [f"{m}: mean entropy {M['entropy'][m]:.3f}" for m in M["maps"]]
    return _maps_figure(M["xs"], M["ys"], M["maps"], M["data"], titles, height=340)


def _spread(ratio: float) -> str:
    """det Σ / det Σ_exact in words."""
    if ratio > 1.25:
        return "wider than the exact posterior"
    if ratio < 0.8:
        return "narrower than the exact posterior"
    return "about as wide as the exact posterior"


def logistic_findings(R: dict[str, Any]) -> str:
    """What the table shows, in sentences built from its own numbers (so the text cannot claim more
    than the numbers do): distance of each predictive map to the exact one, and the spread of each
    Gaussian posterior against the exact posterior's (``det Σ / det Σ_exact``)."""
    rows = {r["method"]: r for r in distance_rows(R)}
    methods = [m for m in ("bSAM", "SAM", "SAM+Laplace", "MFVI", "Laplace at MAP") if m in rows]
    tv = {m: rows[m]["mean |p - p_exact|"] for m in methods}
    best = min(tv, key=tv.get)
    text = (
        "**What the numbers show.** Mean |p − p_exact| over the map: "
        + ", ".join(f"{m} {fmt(tv[m], 2)}" for m in methods)
        + f"; the closest predictive to the exact one is **{best}**."
    )
    ratios = {m: rows[m]["det Σ / det Σ_exact"] for m in methods if "det Σ / det Σ_exact" in rows[m]}
    if ratios:
        text += (
            " Spread of the Gaussian posteriors (det Σ / det Σ_exact, 1 = the exact spread): "
            + "; ".join(f"{m} {fmt(r, 2)} ({_spread(r)})" for m, r in ratios.items())
        )
        text += "."
    if "bSAM" in ratios and not 0.8 <= ratios["bSAM"] <= 1.25:
        area = 100 * ratios["bSAM"] ** 0.5
        text += (
            f" So bSAM's Gaussian does not match the exact posterior: its ellipses enclose {area:.0f}% of "
            "the area of those of a Gaussian with the exact covariance"
            + (", although its predictive map is the closest to the exact one." if best == "bSAM" else ".")
        )
    return text


def moons_findings(M: dict[str, Any]) -> str:
    """Mean predictive entropy of each two-moons map (higher: more uncertain), in words."""
    ent = M["entropy"]
    text = "Mean predictive entropy over the map (nats; higher = more uncertain): " + ", ".join(
        f"{m} {fmt(v, 3)}" for m, v in ent.items()
    )
    if "bSAM" in ent and "SAM" in ent:
        more = "more" if ent["bSAM"] > ent["SAM"] else "less"
        text += f". After {M['epochs']} epochs bSAM's model average is {more} uncertain than SAM's point"
        text += " estimate."
    return text
