"""The seed papers' toy figures, regenerated from code, each with a JSON of the numbers it shows.

``python -m toy_problems figures --out DIR [--only NAME] [--resolution N]``

Figures (name -> what):

* ``fsam_fig1``: Fisher SAM Fig. 1, contour of eq. 15 with both minima (loss, Hessian trace), ours and
  the paper's.
* ``fsam_fig2``: Fisher SAM Fig. 2, SAM vs FSAM (analytic Fisher) from a large-sigma start.
* ``fsam_fig3``: Fisher SAM Fig. 3, ASAM vs FSAM from a start with mu near 0.
* ``vsam_fig1``: VSAM Fig. 1 A-D at rho = 8 (loss, Gaussian-smoothed, worst case in the ball, SAM's
  first-order objective) with basin areas.
* ``bsam_fig3``: bSAM Fig. 3, predictive maps (exact, SAM, SAM + Laplace, bSAM) on logistic regression.
* ``bsam_fig5``: bSAM Fig. 5, posterior contours (exact density, MAP, SAM, SAM + Laplace, bSAM).
* ``bsam_fig6``: bSAM Fig. 6, two moons predictive uncertainty (SAM, bSAM, SAM + Laplace).

``resolution`` is the grid size of every map; below 100 the figures run in *reduced* mode (fewer
quadrature nodes, fewer epochs for two moons) so that the test suite can run them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from toy_problems.base import gradient
from toy_problems.gaussian_mixture import GaussianMixture
from toy_problems.logistic import Gaussian, LogisticRegression, predictive_distances
from toy_problems.smoothing import basins, gaussian_smoothed, sam_first_order, worst_case_ball
from toy_problems.trajectory import run_trajectory
from toy_problems.two_moons import TwoMoons

__all__ = ["FIGURES", "make_figures", "FSAM_SETTINGS", "LOGREG_SETTINGS", "MOONS_SETTINGS"]

REDUCED_BELOW = 100
DPI = 100

#: Fisher SAM Fig. 2/3: one shared setting (the paper gives none). gamma is SAM's radius, FSAM's
#: Fisher radius and ASAM's scaled radius; plain SGD base optimizer.
FSAM_SETTINGS = {
    "gamma": 0.2,
    "lr": 400.0,
    "steps": 1500,
    "steps_reduced": 200,  # the basin each method ends in is already decided after 200 steps
    "asam_eta": 0.01,
    "fig2_start": (-30.0, 45.0),
    "fig3_start": (0.0, 20.0),
}
#: bSAM Fig. 3/5 on logistic regression (full batch; the paper gives no toy settings).
LOGREG_SETTINGS = {
    "sam": {"rho": 1.0, "lr": 2.0, "steps": 1000},
    # the paper's CIFAR/two-moons values for rho, damping, lr; prior N(0, 100 I) -> precision 0.01
    "bsam": {"rho": 0.05, "lr": 0.5, "damping": 0.1, "steps": 1000, "seed": 0},
    "mfvi": {"lr": 0.01, "init_std": 0.1, "steps": 1000, "seed": 0},
    "start": (0.0, 0.0),
}
#: bSAM Fig. 6 (App. F.2): bSAM m=5, rho=0.05, gamma=0.1, delta=1e-4, lr 0.5 cosine, 250 epochs, batch 30.
MOONS_SETTINGS = {
    "epochs": 250,
    "epochs_reduced": 10,
    "batch": 30,
    "bsam": {"m": 5, "rho": 0.05, "damping": 0.1, "delta": 1e-4, "lr": 0.5},
    "sam": {"rho": 0.05, "lr": 0.1, "momentum": 0.9},
    "seed": 0,
    "samples": 32,
    # SAM+Laplace prior precision: laplace-torch's default 1.0. bSAM's delta * N = 0.01 makes the
    # diagonal-GGN posterior so wide that the linearised predictive is 0.5 everywhere.
    "laplace_prior_precision": 1.0,
}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save_png(fig, path: Path) -> None:
    from landscape.io import atomic_write

    atomic_write(path, lambda p: fig.savefig(p, dpi=DPI, format="png", bbox_inches="tight"))
    _plt().close(fig)


def _save_json(obj: dict, path: Path) -> None:
    from landscape.io import atomic_write_json

    atomic_write_json(path, obj)


def _save_html(fig, path: Path) -> None:
    from landscape.io import atomic_write_text

    atomic_write_text(path, fig.to_html(include_plotlyjs="cdn", full_html=True))


def _basin_of(prob: GaussianMixture, theta: torch.Tensor) -> str:
    """Which minimum plain gradient flow from ``theta`` reaches ("flat", "sharp" or "none")."""
    t = theta.detach().clone().double()
    if not bool(torch.isfinite(t).all()) or float(t[1]) <= 0:
        return "none"
    for _ in range(800):  # gradient descent, lr 300 < 2 / lambda_max(sharp) ~ 410
        t = t - 300.0 * gradient(prob, t, check=False)
    for m in prob.minima:
        if float((t - torch.tensor(m.theta, dtype=t.dtype)).norm()) < 2.0:
            return m.label
    return "none"


def _levels(z: np.ndarray, n: int = 30) -> np.ndarray:
    lo, hi = np.nanmin(z), np.nanpercentile(z, 98)
    return lo + (hi - lo) * np.linspace(0, 1, n) ** 2


# ------------------------------------------------------------------------------------------------
# Fisher SAM figures
# ------------------------------------------------------------------------------------------------
def fsam_fig1(out: Path, resolution: int) -> dict:
    plt = _plt()
    prob = GaussianMixture()
    xs, ys, T = prob.grid(resolution)
    Z = prob.loss(T).numpy()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    cs = ax.contourf(xs, ys, Z, levels=_levels(Z), cmap="viridis", extend="max")
    fig.colorbar(cs, ax=ax, label="loss l(mu, sigma)")
    numbers: dict[str, Any] = {"minima": {}, "paper": {}}
    for m, marker, colour in zip(prob.minima, ("*", "o"), ("tab:blue", "magenta")):
        tr = m.extra["hessian_trace"]
        ax.plot(*m.theta, marker=marker, color=colour, ms=14 if marker == "*" else 9, mec="white")
        ax.annotate(
            f"{m.label}: ({m.theta[0]:.2f}, {m.theta[1]:.2f})\nl={m.value:.3f}, tr H={tr:.4f}",
            m.theta,
            xytext=(8, 8),
            textcoords="offset points",
            color="white",
            fontsize=8,
        )
        p = m.extra["paper"]
        ax.plot(*p["theta"], marker=marker, color="none", mec=colour, ms=14 if marker == "*" else 9)
        numbers["minima"][m.label] = {
            "theta": list(m.theta),
            "loss": m.value,
            "hessian_trace": tr,
            "hessian_eigenvalues": m.extra["hessian_eigenvalues"],
        }
        numbers["paper"][m.label] = {
            "theta": list(p["theta"]),
            "loss": p["loss"],
            "hessian_trace": p["hessian_trace"],
        }
    ax.set_xlabel("mu")
    ax.set_ylabel("sigma")
    ax.set_title("Fisher SAM Fig. 1: eq. 15 as printed (hollow: paper's points)", fontsize=9)
    _save_png(fig, out / "fsam_fig1.png")
    try:
        import plotly.graph_objects as go

        pf = go.Figure(go.Contour(x=xs.numpy(), y=ys.numpy(), z=Z, colorscale="Viridis"))
        for m in prob.minima:
            pf.add_trace(go.Scatter(x=[m.theta[0]], y=[m.theta[1]], mode="markers+text", text=[m.label]))
        pf.update_layout(xaxis_title="mu", yaxis_title="sigma", title="Fisher SAM Fig. 1")
        _save_html(pf, out / "fsam_fig1.html")
    except ImportError:  # pragma: no cover - plotly is a dependency
        pass
    return numbers


def _fsam_pair(out: Path, resolution: int, name: str, start, methods) -> dict:
    plt = _plt()
    prob = GaussianMixture()
    s = dict(FSAM_SETTINGS)
    s["steps"] = s["steps_reduced"] if resolution < REDUCED_BELOW else s["steps"]
    xs, ys, T = prob.grid(resolution)
    Z = prob.loss(T).numpy()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3), sharey=True)
    numbers: dict[str, Any] = {"settings": {**s, "start": list(start)}, "runs": {}}
    start_t = torch.tensor(start, dtype=torch.float64)
    for ax, (label, factory, region) in zip(axes, methods):
        tr = run_trajectory(prob, factory, start, s["steps"])
        ax.contourf(xs, ys, Z, levels=_levels(Z), cmap="viridis", extend="max")
        path = tr.path.numpy()
        ax.plot(path[:, 0], path[:, 1], "-", color="white", lw=1.2)
        ax.plot(path[-1, 0], path[-1, 1], "x", color="red", ms=9)
        ax.plot(*start, "D", color="lime", ms=8, mec="k")
        # neighbourhood at the start, true scale
        t = np.linspace(0, 2 * np.pi, 200)
        a, b = region(start_t)
        ax.plot(start[0] + a * np.cos(t), start[1] + b * np.sin(t), color="yellow", lw=1.5)
        eps = tr.perturbations[0].numpy()
        upd = (tr.path[1] - tr.path[0]).numpy()
        ax.annotate(
            "",
            xy=(start[0] + eps[0], start[1] + eps[1]),
            xytext=start,
            arrowprops={"arrowstyle": "->", "color": "cyan", "lw": 2},
        )
        # the first update is short (the gradient is tiny far from the minima): drawn 5x
        ax.annotate(
            "",
            xy=(start[0] + 5 * upd[0], start[1] + 5 * upd[1]),
            xytext=start,
            arrowprops={"arrowstyle": "->", "color": "red", "lw": 2},
        )
        basin = _basin_of(prob, tr.path[-1])
        for m, marker in zip(prob.minima, ("*", "o")):
            ax.plot(
                *m.theta, marker=marker, color="tab:blue" if m.label == "flat" else "magenta", ms=10, mec="w"
            )
        ax.set_title(
            f"{label}: ends in the {basin} basin" + (" (diverged)" if tr.diverged else ""), fontsize=9
        )
        ax.set_xlabel("mu")
        numbers["runs"][label] = {
            "end": tr.path[-1].tolist(),
            "end_loss": float(tr.losses[-1]),
            "basin": basin,
            "diverged": tr.diverged,
            "message": tr.message,
            "first_probe": eps.tolist(),
            "first_update": upd.tolist(),
            "neighbourhood_semi_axes_at_start": [float(a), float(b)],
        }
    axes[0].set_ylabel("sigma")
    fig.suptitle(
        f"{name}: cyan = worst-case probe, red = update (x5), yellow = neighbourhood at the start "
        f"(true scale); gamma={s['gamma']}, lr={s['lr']}, {s['steps']} steps",
        fontsize=9,
    )
    _save_png(fig, out / f"{name}.png")
    return numbers


def _factories(prob: GaussianMixture):
    from optimizers import ASAM, SAM, FisherSAM

    s = FSAM_SETTINGS
    g, lr = s["gamma"], s["lr"]
    sam = ("SAM", lambda p: SAM(p, torch.optim.SGD, rho=g, lr=lr), lambda t: (g, g))
    fsam = (
        "FSAM",
        lambda p: FisherSAM(p, torch.optim.SGD, rho=g, fisher=prob.fisher, lr=lr),
        # eps^T F eps <= gamma^2 with F = diag(1/sigma^2, 2/sigma^2)
        lambda t: (g * float(t[1]), g * float(t[1]) / math.sqrt(2)),
    )
    asam = (
        "ASAM",
        lambda p: ASAM(p, torch.optim.SGD, rho=g, eta=s["asam_eta"], scale_all=True, lr=lr),
        # ||T^{-1} eps|| <= gamma with T = |theta| + eta
        lambda t: (g * (abs(float(t[0])) + s["asam_eta"]), g * (abs(float(t[1])) + s["asam_eta"])),
    )
    return sam, fsam, asam


def fsam_fig2(out: Path, resolution: int) -> dict:
    prob = GaussianMixture()
    sam, fsam, _ = _factories(prob)
    return _fsam_pair(out, resolution, "fsam_fig2", FSAM_SETTINGS["fig2_start"], [sam, fsam])


def fsam_fig3(out: Path, resolution: int) -> dict:
    prob = GaussianMixture()
    _, fsam, asam = _factories(prob)
    return _fsam_pair(out, resolution, "fsam_fig3", FSAM_SETTINGS["fig3_start"], [asam, fsam])


# ------------------------------------------------------------------------------------------------
# VSAM Fig. 1
# ------------------------------------------------------------------------------------------------
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
    plt = _plt()
    P = vsam_panels(resolution)
    prob = GaussianMixture()
    xs, ys = P["xs"], P["ys"]
    titles = {
        "A": "A: loss L",
        "B": f"B: E L(theta+eps), eps~N(0, rho^2/2 I)\n"
        f"(Gauss-Hermite {P['n_quad']}x{P['n_quad']}; white: sigma<=rho)",
        "C": "C: max_{||eps||<=rho} L(theta+eps)\n(dense search; white: ball reaches sigma<=0)",
        "D": "D: L(theta + rho g/||g||) (SAM, 1st order)",
    }
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), sharey=True)
    numbers: dict[str, Any] = {
        "rho": VSAM_RHO,
        "bounds": VSAM_BOUNDS,
        "resolution": resolution,
        "smoothing": f"tensor-product Gauss-Hermite, {P['n_quad']} nodes per axis",
        "panels": {},
    }
    for ax, key in zip(axes, "ABCD"):
        Z = P[key]
        ax.contourf(xs, ys, Z, levels=_levels(Z), cmap="viridis", extend="max")
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
        ax.set_xlabel("mu")
    axes[0].set_ylabel("sigma")
    fig.suptitle(
        f"VSAM Fig. 1 (rho = {VSAM_RHO}): red stars = local minima of each surface", fontsize=9, y=1.08
    )
    _save_png(fig, out / "vsam_fig1.png")
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        pf = make_subplots(rows=1, cols=4, subplot_titles=[titles[k].split("\n")[0] for k in "ABCD"])
        for c, key in enumerate("ABCD", start=1):
            pf.add_trace(
                go.Contour(x=xs, y=ys, z=P[key], showscale=False, colorscale="Viridis"), row=1, col=c
            )
        _save_html(pf, out / "vsam_fig1.html")
    except ImportError:  # pragma: no cover
        pass
    return numbers


# ------------------------------------------------------------------------------------------------
# bSAM Fig. 3 and 5 (logistic regression)
# ------------------------------------------------------------------------------------------------
def logistic_results(resolution: int, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Fit SAM and bSAM on the logistic-regression problem and compute every posterior / predictive
    that Fig. 3 and 5 show (cached: both figures use one run).

    ``overrides`` updates :data:`LOGREG_SETTINGS` per method, e.g. ``{"sam": {"rho": 0.5}}`` (the
    dashboard's sliders); unknown methods or keys raise ``ValueError``."""
    frozen = tuple(sorted((m, tuple(sorted(v.items()))) for m, v in (overrides or {}).items()))
    return _logistic_results(resolution, frozen)


@lru_cache(maxsize=4)
def _logistic_results(resolution: int, overrides: tuple) -> dict[str, Any]:
    from optimizers import MFVI, SAM, BayesianSAM

    prob = LogisticRegression()
    post = prob.exact_posterior()
    s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in LOGREG_SETTINGS.items()}
    for method, items in overrides:
        values = dict(items)
        if method not in s or not isinstance(s[method], dict):
            raise ValueError(f"unknown method {method!r} in overrides; choose from sam, bsam, mfvi")
        unknown = set(values) - set(s[method])
        if unknown:
            raise ValueError(f"unknown {method} settings {sorted(unknown)}; known: {sorted(s[method])}")
        s[method].update(values)
    sam_tr = run_trajectory(
        prob,
        lambda p: SAM(p, torch.optim.SGD, rho=s["sam"]["rho"], lr=s["sam"]["lr"]),
        s["start"],
        s["sam"]["steps"],
    )
    b = s["bsam"]
    bsam_tr = run_trajectory(
        prob,
        lambda p: BayesianSAM(
            p,
            lr=b["lr"],
            num_data=prob.num_data,
            rho=b["rho"],
            prior_precision=prob.prior_precision,
            damping=b["damping"],
            seed=b["seed"],
        ),
        s["start"],
        b["steps"],
        loss_fn=prob.nll,
    )
    v = s["mfvi"]
    mfvi_tr = run_trajectory(
        prob,
        lambda p: MFVI(
            p,
            lr=v["lr"],
            num_data=prob.num_data,
            prior_std=math.sqrt(prob.prior_variance),
            init_std=v["init_std"],
            seed=v["seed"],
        ),
        s["start"],
        v["steps"],
        loss_fn=prob.nll,
    )
    w_sam = sam_tr.path[-1]
    gauss = {
        "SAM+Laplace": prob.laplace(at=w_sam),
        "Laplace at MAP": prob.laplace(),
        "bSAM": Gaussian(bsam_tr.path[-1], torch.diag(bsam_tr.posterior_std**2), "bSAM"),
        "MFVI": Gaussian(mfvi_tr.path[-1], torch.diag(mfvi_tr.posterior_std**2), "MFVI"),
    }
    xs, ys, XG = prob.grid(resolution, prob.x_bounds)
    maps = {"exact": prob.exact_predictive(XG), "SAM": prob.point_predictive(w_sam, XG)}
    maps.update({k: g.predictive(XG) for k, g in gauss.items()})
    maps["MAP"] = prob.point_predictive(post.map, XG)
    dist = {k: predictive_distances(v, maps["exact"]) for k, v in maps.items() if k != "exact"}
    return {
        "prob": prob,
        "post": post,
        "w_sam": w_sam,
        "gauss": gauss,
        "xs": xs,
        "ys": ys,
        "maps": maps,
        "distances": dist,
        "traj": {"SAM": sam_tr, "bSAM": bsam_tr, "MFVI": mfvi_tr},
    }


def _logistic_numbers(R: dict) -> dict:
    post = R["post"]
    out = {
        "settings": LOGREG_SETTINGS,
        "exact": {
            "mean": post.mean.tolist(),
            "cov": post.cov.tolist(),
            "map": post.map.tolist(),
            "boundary_mass": post.boundary_mass,
            "grid": post.config,
        },
        "sam_point": R["w_sam"].tolist(),
        "posteriors": {},
        "predictive_distance_to_exact": R["distances"],
    }
    for k, g in R["gauss"].items():
        out["posteriors"][k] = {
            "mean": g.mean.tolist(),
            "cov": g.cov.tolist(),
            "mean_error": float((g.mean - post.mean).norm()),
            "cov_error_fro": float((g.cov - post.cov).norm()),
            "det_cov_ratio_to_exact": float(torch.det(g.cov) / torch.det(post.cov)),
        }
    for k, tr in R["traj"].items():
        out.setdefault("runs", {})[k] = {"diverged": tr.diverged, "message": tr.message, "steps": tr.steps}
    return out


def bsam_fig3(out: Path, resolution: int) -> dict:
    plt = _plt()
    R = logistic_results(resolution)
    X, y = R["prob"].data
    panels = ["exact", "SAM", "SAM+Laplace", "bSAM"]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2), sharey=True)
    for ax, k in zip(axes, panels):
        cs = ax.contourf(R["xs"], R["ys"], R["maps"][k].numpy(), levels=np.linspace(0, 1, 21), cmap="RdBu_r")
        ax.scatter(X[:, 0], X[:, 1], c=np.where(y.numpy() > 0.5, "red", "blue"), s=12, edgecolors="k", lw=0.4)
        t = (
            k
            if k == "exact"
            else f"{k}: TV={R['distances'][k]['tv_mean']:.3f}, KL={R['distances'][k]['kl_mean']:.3f}"
        )
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("x_1")
    axes[0].set_ylabel("x_2")
    fig.colorbar(cs, ax=axes, label="p(y=1|x)", fraction=0.02)
    fig.suptitle(
        "bSAM Fig. 3: predictive p(y=1|x); TV/KL = mean distance to the exact map on this grid", fontsize=9
    )
    _save_png(fig, out / "bsam_fig3.png")
    return _logistic_numbers(R)


def bsam_fig5(out: Path, resolution: int) -> dict:
    plt = _plt()
    R = logistic_results(resolution)
    post = R["post"]
    fig, ax = plt.subplots(figsize=(6, 5))
    ax.contourf(post.xs, post.ys, post.density.numpy(), levels=20, cmap="Greys")
    ax.plot(*post.map.tolist(), "kx", ms=10, mew=2, label="MAP", zorder=5)
    ax.plot(*R["w_sam"].tolist(), "o", color="tab:green", label="SAM")
    e = R["gauss"]["SAM+Laplace"].ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], "--", color="tab:green", label="SAM+Laplace (2 sd)")
    e = R["gauss"]["bSAM"].ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], "-", color="tab:orange", label="bSAM (2 sd)")
    ax.plot(*R["gauss"]["bSAM"].mean.tolist(), "^", color="tab:orange")
    m, c = post.mean.numpy(), post.cov.numpy()
    e = Gaussian(post.mean, post.cov).ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], ":", color="k", label="exact mean/cov (2 sd)")
    ax.set_xlim(-1, 6)
    ax.set_ylim(-1.5, 3.5)
    ax.set_xlabel("w_1")
    ax.set_ylabel("w_2")
    ax.legend(fontsize=7)
    ax.set_title(f"bSAM Fig. 5: exact posterior (grey), mean {np.round(m, 2)}", fontsize=9)
    del c
    _save_png(fig, out / "bsam_fig5.png")
    return _logistic_numbers(R)


# ------------------------------------------------------------------------------------------------
# bSAM Fig. 6 (two moons)
# ------------------------------------------------------------------------------------------------
def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_moons(prob: TwoMoons, method: str, epochs: int):
    from optimizers import SAM, BayesianSAM

    s = MOONS_SETTINGS
    model = prob.make_model(seed=s["seed"])
    X, y = prob.data
    n = prob.num_data
    steps_per_epoch = math.ceil(n / s["batch"])
    if method == "SAM":
        c = s["sam"]
        opt = SAM(model.parameters(), torch.optim.SGD, rho=c["rho"], lr=c["lr"], momentum=c["momentum"])
    else:
        c = s["bsam"]
        opt = BayesianSAM(
            model.parameters(),
            lr=c["lr"],
            num_data=n,
            rho=c["rho"],
            damping=c["damping"],
            prior_precision=c["delta"] * n,
            m=c["m"],
            seed=s["seed"],
        )
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * steps_per_epoch)
    g = torch.Generator().manual_seed(s["seed"])
    m = getattr(opt, "m", 1)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for i in range(0, n, s["batch"]):
            idx = perm[i : i + s["batch"]]
            xb, yb = X[idx], y[idx]
            xc, yc = torch.tensor_split(xb, m), torch.tensor_split(yb, m)

            def closure(chunk=None, xb=xb, yb=yb, xc=xc, yc=yc):
                opt.zero_grad()
                xx, yy = (xb, yb) if chunk is None else (xc[chunk], yc[chunk])
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xx).squeeze(-1), yy)
                loss.backward()
                return loss

            opt.step(closure)
            sched.step()
    return model, opt


def _laplace_linearised(prob: TwoMoons, model, XG: torch.Tensor, prior_precision: float) -> torch.Tensor:
    """Diagonal-GGN Laplace at the trained weights with the linearised predictive (Immer et al. 2021):
    ``prec = sum_i s_i(1-s_i) J_i^2 + prior_precision``, logit variance ``sum_j J_j(x)^2 / prec_j``,
    ``p = E sigmoid`` by Gauss-Hermite."""
    from torch.func import functional_call, jacrev, vmap

    from toy_problems.logistic import gaussian_probit_predictive

    params = {k: v.detach() for k, v in model.named_parameters()}

    def f(p, x):
        return functional_call(model, p, (x[None],)).squeeze()

    def jac(x):
        J = vmap(jacrev(f), in_dims=(None, 0))(params, x)
        return torch.cat([J[k].reshape(x.shape[0], -1) for k in params], -1)

    X, _ = prob.data
    with torch.no_grad():
        s = torch.sigmoid(model(X).squeeze(-1))
    Jtr = jac(X)
    prec = (s * (1 - s))[:, None].mul(Jtr * Jtr).sum(0) + prior_precision
    flat = XG.reshape(-1, 2)
    out = []
    for i in range(0, flat.shape[0], 512):
        xb = flat[i : i + 512]
        J = jac(xb)
        with torch.no_grad():
            mu = model(xb).squeeze(-1)
        out.append(gaussian_probit_predictive(mu, (J * J / prec).sum(-1)))
    return torch.cat(out).reshape(XG.shape[:-1])


def moons_results(resolution: int, epochs: int) -> dict[str, Any]:
    """Train SAM and bSAM on two moons for ``epochs`` epochs and compute the three predictive maps of
    Fig. 6 (SAM, bSAM model average, SAM + linearised diagonal Laplace) on a ``resolution``^2 grid."""
    s = MOONS_SETTINGS
    prob = TwoMoons()
    xs, ys, XG = _xgrid(prob, resolution)
    sam_model, _ = _train_moons(prob, "SAM", epochs)
    bsam_model, bopt = _train_moons(prob, "bSAM", epochs)
    with torch.no_grad():
        p_sam = torch.sigmoid(sam_model(XG.reshape(-1, 2)).squeeze(-1)).reshape(XG.shape[:-1])
    p_bsam = (
        bopt.bayesian_model_average(
            bsam_model, XG.reshape(-1, 2), samples=s["samples"], generator=torch.Generator().manual_seed(1)
        )
        .squeeze(-1)
        .reshape(XG.shape[:-1])
    )
    p_lap = _laplace_linearised(prob, sam_model, XG, prior_precision=s["laplace_prior_precision"])
    maps = {"SAM": p_sam, "bSAM": p_bsam, "SAM+Laplace": p_lap}
    entropy = {}
    for k, p in maps.items():
        pc = p.clamp(1e-12, 1 - 1e-12)
        entropy[k] = float((-(pc * pc.log() + (1 - pc) * (1 - pc).log())).mean())
    return {
        "prob": prob,
        "data": prob.data,
        "xs": xs,
        "ys": ys,
        "maps": maps,
        "entropy": entropy,
        "models": {"SAM": sam_model, "bSAM": bsam_model, "SAM+Laplace": sam_model},
        "epochs": epochs,
    }


def bsam_fig6(out: Path, resolution: int) -> dict:
    plt = _plt()
    s = MOONS_SETTINGS
    epochs = s["epochs_reduced"] if resolution < REDUCED_BELOW else s["epochs"]
    M = moons_results(resolution, epochs)
    xs, ys, maps = M["xs"], M["ys"], M["maps"]
    X, y = M["data"]
    sam_model, bsam_model = M["models"]["SAM"], M["models"]["bSAM"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    numbers: dict[str, Any] = {"settings": {**s, "epochs_used": epochs}, "methods": {}}
    for ax, (k, p) in zip(axes, maps.items()):
        cs = ax.contourf(xs, ys, p.numpy(), levels=np.linspace(0, 1, 21), cmap="RdBu_r")
        ax.scatter(X[:, 0], X[:, 1], c=np.where(y.numpy() > 0.5, "red", "blue"), s=10, edgecolors="k", lw=0.4)
        with torch.no_grad():
            model = sam_model if k != "bSAM" else bsam_model
            acc = float(((model(X).squeeze(-1) > 0).double() == y).double().mean())
        numbers["methods"][k] = {
            "mean_predictive_entropy": M["entropy"][k],
            "train_accuracy_of_mean": acc,
            "fraction_uncertain_0.2_0.8": float(((p > 0.2) & (p < 0.8)).double().mean()),
        }
        ax.set_title(f"{k}: mean entropy {M['entropy'][k]:.3f} nats", fontsize=9)
    fig.colorbar(cs, ax=axes, fraction=0.02, label="p(y=1|x)")
    fig.suptitle(f"bSAM Fig. 6: two moons, MLP 2-[32]x4-1 ELU, {epochs} epochs", fontsize=9)
    _save_png(fig, out / "bsam_fig6.png")
    return numbers


def _xgrid(prob: TwoMoons, resolution: int):
    (x0, x1), (y0, y1) = prob.x_bounds
    xs = torch.linspace(x0, x1, resolution, dtype=torch.float64)
    ys = torch.linspace(y0, y1, resolution, dtype=torch.float64)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return xs, ys, torch.stack([xx, yy], -1)


FIGURES: dict[str, Callable[[Path, int], dict]] = {
    "fsam_fig1": fsam_fig1,
    "fsam_fig2": fsam_fig2,
    "fsam_fig3": fsam_fig3,
    "vsam_fig1": vsam_fig1,
    "bsam_fig3": bsam_fig3,
    "bsam_fig5": bsam_fig5,
    "bsam_fig6": bsam_fig6,
}


def make_figures(
    out: str | Path, only: list[str] | None = None, resolution: int = 200, progress: bool = True
) -> dict[str, dict]:
    """Write ``NAME.png`` (+ ``NAME.html`` where interactive helps) and ``NAME.json`` for each figure."""
    if resolution < 10:
        raise ValueError(f"resolution must be >= 10, got {resolution}")
    names = list(FIGURES) if not only else list(only)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {list(FIGURES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        t0 = time.perf_counter()
        numbers = FIGURES[name](out, resolution)
        numbers = {
            "figure": name,
            "resolution": resolution,
            "reduced": resolution < REDUCED_BELOW,
            "seconds": time.perf_counter() - t0,
            **numbers,
        }
        _save_json(numbers, out / f"{name}.json")
        results[name] = numbers
        if progress:
            print(f"{name}: {numbers['seconds']:.1f} s -> {out / (name + '.png')}", flush=True)
    return results
