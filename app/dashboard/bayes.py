"""Logic of the "Bayesian view" page: Bayesian logistic regression (exact posterior vs Laplace vs
MFVI vs bSAM, predictive maps, sampled decision boundaries) and two moons (bSAM paper Fig. 3, 5, 6).

The fitting is ``dashboard.toy.posteriors``: the steps, settings and seeds of ``toy_problems.figures``
(the code that draws the reproduced figures; the tests check the numbers agree bit for bit) with a
progress bar, plus what the page needs to judge the results (training fit, end points, Monte-Carlo
error). This module turns the results into Plotly figures, tables and sentences built from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from toy_problems.figures.palette import method_color

from .layout import LEGEND_BELOW, fmt, grid_shape
from .toy import posteriors
from .toy.endpoints import network_thresholds_text, thresholds_text

#: what a missing cell of the distance table means
NO_COVARIANCE = "—"


def logistic(
    resolution: int = 60, overrides: dict[str, dict[str, float]] | None = None, progress=None
) -> dict[str, Any]:
    """Every posterior and predictive map of the logistic-regression problem (the numbers of
    ``toy_problems.figures.logistic_results``), with optional hyperparameter ``overrides`` such as
    ``{"sam": {"rho": 0.5}, "bsam": {"rho": 0.1}}``, ``progress(fraction, what)`` for the page's
    progress bar, and each run's end point classified (``R["end_points"]``)."""
    if not 10 <= resolution <= 200:
        raise ValueError(f"resolution must be between 10 and 200, got {resolution}")
    return posteriors.logistic_results(resolution, overrides=overrides, progress=progress)


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


def distance_table(R: dict[str, Any]) -> list[dict[str, str]]:
    """:func:`distance_rows` for display: 4 significant digits, and ``NO_COVARIANCE`` where a method
    has no Gaussian posterior (see :func:`distance_footnote`)."""
    rows = distance_rows(R)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    return [{k: (row[k] if k == "method" else fmt(row[k])) if k in row else NO_COVARIANCE for k in columns}
            for row in rows]  # fmt: skip


def distance_footnote(R: dict[str, Any]) -> str:
    """Why some cells are ``NO_COVARIANCE``, and how the numbers were computed."""
    rows = distance_rows(R)
    points = [r["method"] for r in rows if "det Σ / det Σ_exact" not in r]
    post = R["post"]
    text = ""
    if points:
        text += (
            f"{NO_COVARIANCE}: {' and '.join(points)} "
            f"{'is a point estimate' if len(points) == 1 else 'are point estimates'} without a covariance, "
            "so there is no posterior mean or spread to compare. "
        )
    n = len(R["xs"])
    text += (
        f"Distances are means and maxima over the plotted {n} x {n} grid of inputs x. The exact posterior "
        f"is numerical integration on a grid of step {fmt(post.step, 2)} over "
        f"[−{fmt(post.config['extent'], 2)}, {fmt(post.config['extent'], 2)}]²; the probability it "
        f"leaves in the outermost ring of that grid, {fmt(post.boundary_mass, 2)}, bounds the truncation "
        "error. Every method is run once from a fixed seed (deterministic: no sampling error)."
    )
    return text


def end_point_rows(R: dict[str, Any]) -> list[dict[str, str]]:
    """SAM's point and the bSAM / MFVI means classified on the loss (negative log joint / N): what
    the point is, the gradient norm, the Hessian eigenvalues, and how far the run moved over its last
    tenth of steps."""
    rows = []
    for name, e in R["end_points"].items():
        rows.append(
            {
                "run": name,
                "end point is": e.kind,
                "point": "(" + ", ".join(fmt(v) for v in e.point) + ")",
                "‖∇L‖": fmt(e.grad_norm, 3),
                "Hessian eigenvalues": ", ".join(fmt(v, 3) for v in e.eigenvalues),
                "moved over the last steps": f"{fmt(e.extra['moved'], 2)} ({e.extra['tail_steps']} steps)",
            }
        )
    return rows


def end_point_note(R: dict[str, Any]) -> str:
    """The classification rule, and what it means for the variational methods."""
    (x0, x1), (y0, y1) = R["prob"].bounds
    return (
        thresholds_text(max(x1 - x0, y1 - y0))
        + " bSAM and MFVI minimise a variational objective (expected loss plus a KL term), not the loss, "
        "so their means need not be minima of it; SAM's point is its own fixed point, near a minimum at "
        "best."
    )


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


def two_moons(resolution: int = 40, epochs: int = 250, progress=None) -> dict[str, Any]:
    """Train SAM and bSAM on two moons and compute the three predictive maps of the paper's Fig. 6
    (``toy_problems.figures.moons_results``), with the training accuracy and loss of each predictive,
    each network's end point classified, and the Monte-Carlo error of bSAM's map
    (``dashboard.toy.posteriors.moons_results``)."""
    if not 1 <= epochs <= 500:
        raise ValueError(f"epochs must be between 1 and 500, got {epochs}")
    return posteriors.moons_results(resolution, epochs, progress=progress)


def moons_rows(M: dict[str, Any]) -> list[dict[str, str]]:
    """One row per predictive: training accuracy and loss, mean predictive entropy over the map (bSAM
    with its Monte-Carlo error), and what the network's end point is, with its numbers."""
    mc = M["entropy_mc"]
    rows = []
    for name in M["maps"]:
        acc, nll = M["fit"][name]
        ent = fmt(M["entropy"][name], 3)
        if name == "bSAM":
            ent += f" ± {fmt(mc['std'], 1)}"
        e = M["end_points"]["SAM" if name == "SAM+Laplace" else name]
        drop = e.predicted_drop / max(abs(e.loss), 1e-300)
        rows.append(
            {
                "method": name,
                "training accuracy": f"{100 * acc:.1f}%",
                "training loss (NLL)": fmt(nll, 3),
                "mean entropy (nats)": ent,
                "network end point": e.kind,
                "‖∇L‖": fmt(e.grad_norm, 2),
                "gradient step lowers L by": f"{fmt(100 * drop, 2)}%",
                "λ_min": fmt(e.lambda_min, 2),
                "λ_max": fmt(e.lambda_max, 3),
            }
        )
    return rows


def moons_note(M: dict[str, Any]) -> str:
    mc = M["entropy_mc"]
    return (
        f"Each predictive is evaluated on the 100 training points (accuracy: p > 0.5 on the right side). "
        f"bSAM's map is an average over {mc['samples']} posterior samples; ± is the standard deviation "
        f"of the mean entropy over {len(mc['values'])} independent re-draws of those samples (the "
        "Monte-Carlo error); SAM's map and the linearised Laplace predictive are deterministic. "
        "SAM+Laplace uses SAM's network. End points on the training loss (binary cross-entropy): "
        + network_thresholds_text()
    )


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
    """The two-moons conclusion, printed only when its conditions hold: every predictive fits the
    training set (accuracy >= ``posteriors.MOONS_FIT_ACCURACY``), and bSAM's entropy differs from
    SAM's by more than twice its Monte-Carlo error. Otherwise the page says which condition fails."""
    ent, fit, mc = M["entropy"], M["fit"], M["entropy_mc"]
    text = "Mean predictive entropy over the map (nats; higher = more uncertain): " + ", ".join(
        f"{m} {fmt(v, 3)}" + (f" ± {fmt(mc['std'], 1)}" if m == "bSAM" else "") for m, v in ent.items()
    )
    text += "."
    need = posteriors.MOONS_FIT_ACCURACY
    underfit = {m: a for m, (a, _) in fit.items() if a < need}
    if underfit:
        return text + (
            f" **No conclusion about bSAM yet**: after {M['epochs']} epochs "
            + ", ".join(f"{m} fits {100 * a:.1f}%" for m, a in underfit.items())
            + f" of the training points (below {100 * need:.0f}%), so the maps compare networks that have "
            "not learned the moons. Train longer (the paper's figure uses 250 epochs)."
        )
    if "bSAM" in ent and "SAM" in ent:
        diff = ent["bSAM"] - ent["SAM"]
        if abs(diff) <= 2 * mc["std"]:
            return text + (
                f" After {M['epochs']} epochs every predictive fits at least {100 * need:.0f}% of the "
                "training points, and bSAM's model average and SAM's point estimate are equally uncertain "
                f"within bSAM's Monte-Carlo error (difference {fmt(diff, 2)}, 2σ = {fmt(2 * mc['std'], 2)})."
            )
        more = "more" if diff > 0 else "less"
        text += (
            f" After {M['epochs']} epochs every predictive fits at least {100 * need:.0f}% of the training "
            f"points, and bSAM's model average is {more} uncertain than SAM's point estimate (difference "
            f"{fmt(diff, 2)}, more than twice bSAM's Monte-Carlo error {fmt(mc['std'], 1)})."
        )
    return text
