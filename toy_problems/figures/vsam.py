"""VSAM ("Rethinking SAM as variational inference") Fig. 1 A-D: the loss, its Gaussian smoothing, the
worst case in a ball and SAM's first-order objective at rho = 8, with the basins of each surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from toy_problems.figures.common import REDUCED_BELOW, contour_levels, pyplot, save_html, save_png
from toy_problems.gaussian_mixture import GaussianMixture
from toy_problems.smoothing import basins, gaussian_smoothed, sam_first_order, worst_case_ball

__all__ = ["VSAM_RHO", "VSAM_BOUNDS", "vsam_panels", "vsam_fig1"]

VSAM_RHO = 8.0
VSAM_BOUNDS = ((-40.0, 40.0), (2.0, 50.0))


def vsam_panels(resolution: int, rho: float = VSAM_RHO, n_quad: int | None = None) -> dict[str, Any]:
    """The four panels of VSAM Fig. 1 on one grid: ``{"xs", "ys", "A", "B", "C", "D"}`` (numpy).

    Panel C is masked (NaN) where the ball reaches ``sigma <= 0`` (``sigma <= rho``): the loss is
    ``+inf`` at ``sigma = 0``, so the worst case there is unbounded. Panel B is masked on the same
    band: there the smoothing Gaussian straddles the (integrable) log singularity at ``sigma = 0``
    and the Gauss-Hermite rule is inaccurate (it produces spurious stripes)."""
    prob = GaussianMixture()
    reduced = resolution < REDUCED_BELOW
    nq = n_quad if n_quad is not None else (24 if reduced else 48)
    xs, ys, T = prob.grid(resolution, VSAM_BOUNDS)
    A = prob.loss(T).numpy()
    B = gaussian_smoothed(prob, T, rho, n_quad=nq).numpy()
    C = worst_case_ball(prob, T, rho, n_radii=8 if reduced else 16, n_angles=64 if reduced else 128).numpy()
    C = np.where(T[..., 1].numpy() > rho, C, np.nan)
    # B near sigma = 0: the smoothing Gaussian (std rho/sqrt 2) reaches the log singularity of the
    # loss at sigma = 0, where Gauss-Hermite converges slowly (stripes); masked like C
    B = np.where(T[..., 1].numpy() > rho, B, np.nan)
    D = sam_first_order(prob, T, rho).detach().numpy()
    return {"xs": xs.numpy(), "ys": ys.numpy(), "A": A, "B": B, "C": C, "D": D, "n_quad": nq}


def _basin_summary(xs, ys, Z) -> list[dict]:
    labels, mins = basins(Z)
    total = int((labels >= 0).sum())
    out = []
    for k, (i, j) in enumerate(mins):
        on_edge = i in (0, len(ys) - 1) or j in (0, len(xs) - 1)
        out.append(
            {
                "theta": [float(xs[j]), float(ys[i])],
                "value": float(Z[i, j]),
                "area_fraction": float((labels == k).sum() / total),
                "on_grid_edge": bool(on_edge),
            }
        )
    return out


def _basin_stats(xs, ys, Z, prob: GaussianMixture) -> dict:
    """Basin of the grid cell nearest each minimum of the *original* loss, on surface ``Z``:
    its area fraction and its lowest value; ``sharp_minus_flat`` = lowest value in the sharp
    minimum's basin minus that in the flat one's (negative: the sharp minimum is the deeper one)."""
    labels, mins = basins(Z)
    total = int((labels >= 0).sum())
    out: dict[str, Any] = {}
    for m in prob.minima:
        i = int(np.abs(ys - m.theta[1]).argmin())
        j = int(np.abs(xs - m.theta[0]).argmin())
        k = labels[i, j]
        if k < 0:  # masked cell (C near sigma = 0): no basin
            out[m.label] = {"area_fraction": 0.0, "min_value": float("nan"), "min_theta": None}
            continue
        mi, mj = mins[k]
        out[m.label] = {
            "area_fraction": float((labels == k).sum() / total),
            "min_value": float(Z[mi, mj]),
            "min_theta": [float(xs[mj]), float(ys[mi])],
        }
    out["same_basin"] = bool(out["flat"].get("min_theta") == out["sharp"].get("min_theta"))
    out["sharp_minus_flat"] = out["sharp"]["min_value"] - out["flat"]["min_value"]
    return out


def vsam_fig1(out: Path, resolution: int) -> dict:
    plt = pyplot()
    P = vsam_panels(resolution)
    prob = GaussianMixture()
    xs, ys = P["xs"], P["ys"]
    nq = P["n_quad"]
    titles = {  # matplotlib mathtext
        "A": r"A: loss $L(\theta)$",
        "B": r"B: Gaussian-smoothed $\mathbb{E}\,L(\theta+\epsilon)$, $\epsilon\sim N(0, \rho^2/2\; I)$"
        f"\n(Gauss-Hermite {nq}x{nq}; white: " + r"$\sigma\leq\rho$)",
        "C": r"C: worst case of $L(\theta+\epsilon)$ over $\|\epsilon\|\leq\rho$"
        "\n(dense search; white: the ball reaches " + r"$\sigma\leq 0$)",
        "D": r"D: SAM's first-order objective $L(\theta + \rho\, g/\|g\|)$",
    }
    plain = {  # the interactive HTML (no TeX renderer there)
        "A": "A: loss L(θ)",
        "B": "B: Gaussian-smoothed loss, ε ~ N(0, ρ²/2 · I)",
        "C": "C: worst loss within distance ρ",
        "D": "D: SAM's first-order objective",
    }
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), sharey=True)
    numbers: dict[str, Any] = {
        "rho": VSAM_RHO,
        "bounds": VSAM_BOUNDS,
        "resolution": resolution,
        "smoothing": f"tensor-product Gauss-Hermite, {P['n_quad']} nodes per axis",
        "panels": {},
    }
    # one colour scale for the four compared surfaces (levels from all of them), one colour bar
    levels = contour_levels(np.concatenate([np.ravel(P[k]) for k in "ABCD"]))
    for ax, key in zip(axes, "ABCD"):
        Z = P[key]
        cs = ax.contourf(xs, ys, Z, levels=levels, cmap="viridis", extend="max")
        summ = _basin_summary(xs, ys, Z)
        for b in summ:
            if not b["on_grid_edge"]:
                ax.plot(*b["theta"], "r*", ms=9)
        st = _basin_stats(xs, ys, Z, prob)
        numbers["panels"][key] = {"local_minima": summ, "basins": st}
        ax.set_title(
            titles[key] + f"\nsharp basin {100 * st['sharp']['area_fraction']:.0f}% of grid, "
            f"depth vs flat {st['sharp_minus_flat']:+.3f}",
            fontsize=8,
        )
        ax.set_xlabel(r"$\mu$")
    axes[0].set_ylabel(r"$\sigma$")
    fig.colorbar(cs, ax=list(axes), fraction=0.015, pad=0.01, format="%.2f", label="value (loss units)")
    fig.suptitle(
        f"VSAM Fig. 1 ($\\rho$ = {VSAM_RHO}): red stars = local minima of each surface", fontsize=9, y=1.08
    )
    save_png(fig, out / "vsam_fig1.png")
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        pf = make_subplots(rows=1, cols=4, subplot_titles=[plain[k] for k in "ABCD"])
        for c, key in enumerate("ABCD", start=1):
            pf.add_trace(
                go.Contour(x=xs, y=ys, z=P[key], showscale=False, colorscale="Viridis"), row=1, col=c
            )
        save_html(pf, out / "vsam_fig1.html")
    except ImportError:  # pragma: no cover
        pass
    return numbers
