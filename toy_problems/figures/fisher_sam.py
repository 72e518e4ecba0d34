"""Fisher SAM (Kim et al. 2022) Fig. 1-3 on the Gaussian KL-mixture of its eq. 15: the contour with both
minima, SAM vs FSAM from a large-sigma start, ASAM vs FSAM from a start with mu near 0."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from optimizers import ASAM, SAM, FisherSAM
from toy_problems.base import gradient, hessian
from toy_problems.figures.common import REDUCED_BELOW, contour_levels, pyplot, save_html, save_png
from toy_problems.gaussian_mixture import GaussianMixture
from toy_problems.trajectory import run_trajectory

__all__ = ["FSAM_SETTINGS", "fsam_fig1", "fsam_fig2", "fsam_fig2_small_gamma", "fsam_fig3", "method_settings"]

#: Fisher SAM Fig. 2/3 settings (the paper gives none), plain SGD base optimizer. ``gamma`` is SAM's
#: radius and FSAM's Fisher radius; ASAM has its own scaled radius ``asam_rho`` (with ``gamma`` = 1 it
#: is not drawn into the sharp basin). From (0, 20) SAM and ASAM end in the sharp basin and FSAM in
#: the flat one, each at a point with a positive-definite Hessian. ``small_gamma`` is the second case
#: (``fsam_fig2_small_gamma``): with gamma = 0.2 from (-30, 45) FSAM stalls on the ridge between the
#: basins, where the Hessian has a negative eigenvalue.
FSAM_SETTINGS = {
    "gamma": 1.0,
    "lr": 400.0,
    "steps": 1500,
    "steps_reduced": 200,  # the basin each method ends in (and its positive curvature) is decided by 200
    "asam_rho": 0.1,
    "asam_eta": 0.01,
    "fig2_start": (0.0, 20.0),
    "fig3_start": (0.0, 20.0),
    "small_gamma": 0.2,
    "small_gamma_start": (-30.0, 45.0),
}


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


def fsam_fig1(out: Path, resolution: int) -> dict:
    plt = pyplot()
    prob = GaussianMixture()
    xs, ys, T = prob.grid(resolution)
    Z = prob.loss(T).numpy()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    cs = ax.contourf(xs, ys, Z, levels=contour_levels(Z), cmap="viridis", extend="max")
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
    save_png(fig, out / "fsam_fig1.png")
    try:
        import plotly.graph_objects as go

        pf = go.Figure(go.Contour(x=xs.numpy(), y=ys.numpy(), z=Z, colorscale="Viridis"))
        for m in prob.minima:
            pf.add_trace(go.Scatter(x=[m.theta[0]], y=[m.theta[1]], mode="markers+text", text=[m.label]))
        pf.update_layout(xaxis_title="mu", yaxis_title="sigma", title="Fisher SAM Fig. 1")
        save_html(pf, out / "fsam_fig1.html")
    except ImportError:  # pragma: no cover - plotly is a dependency
        pass
    return numbers


def _fsam_pair(out: Path, resolution: int, name: str, start, methods, headline: str) -> dict:
    plt = pyplot()
    prob = GaussianMixture()
    s = dict(FSAM_SETTINGS)
    s["steps"] = s["steps_reduced"] if resolution < REDUCED_BELOW else s["steps"]
    xs, ys, T = prob.grid(resolution)
    Z = prob.loss(T).numpy()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    numbers: dict[str, Any] = {"settings": {**s, "start": list(start)}, "runs": {}}
    start_t = torch.tensor(start, dtype=torch.float64)
    for ax, (label, factory, region, setting) in zip(axes, methods):
        tr = run_trajectory(prob, factory, start, s["steps"])
        ax.contourf(xs, ys, Z, levels=contour_levels(Z), cmap="viridis", extend="max")
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
        end = tr.path[-1]
        basin = _basin_of(prob, end)
        eig = torch.linalg.eigvalsh(hessian(prob, end)).tolist() if not tr.diverged else [math.nan] * 2
        # how far the end point lies from the minimum of the basin it flows to (a constant step
        # settles at a stationary point of the method's own perturbed objective, not at that minimum)
        reached = [m for m in prob.minima if m.label == basin]
        distance = (
            float((end.double() - torch.tensor(reached[0].theta, dtype=torch.float64)).norm())
            if reached
            else math.nan
        )
        for m, marker in zip(prob.minima, ("*", "o")):
            ax.plot(
                *m.theta, marker=marker, color="tab:blue" if m.label == "flat" else "magenta", ms=10, mec="w"
            )
        ax.set_title(
            f"{label} ({setting})\nends at ({end[0]:.2f}, {end[1]:.2f}) "
            + (
                f"in the {basin} basin"
                if eig[0] > 0
                else f"on the ridge (saddle; flows to the {basin} basin)"
            )
            + f", min eig H = {eig[0]:+.2g}"
            + (" (diverged)" if tr.diverged else ""),
            fontsize=9,
        )
        ax.set_xlabel("mu")
        numbers["runs"][label] = {
            "settings": setting,
            "end": end.tolist(),
            "end_loss": float(tr.losses[-1]),
            "basin": basin,
            "distance_to_basin_minimum": distance,
            "end_hessian_eigenvalues": eig,
            "diverged": tr.diverged,
            "message": tr.message,
            "first_probe": eps.tolist(),
            "first_update": upd.tolist(),
            "neighbourhood_semi_axes_at_start": [float(a), float(b)],
        }
    axes[0].set_ylabel("sigma")
    fig.suptitle(
        f"{headline}\nSGD base, lr={s['lr']}, {s['steps']} steps from {tuple(start)}; cyan = worst-case "
        "probe, red = update (x5), yellow = neighbourhood at the start (true scale)",
        fontsize=9,
        y=1.07,  # above the two-line panel titles
    )
    save_png(fig, out / f"{name}.png")
    return numbers


def method_settings(gamma: float | None = None) -> dict[str, str]:
    """How each method of Fig. 2/3 is set, as the figures print it (``gamma`` overrides SAM's radius
    and FSAM's Fisher radius)."""
    s = FSAM_SETTINGS
    g = s["gamma"] if gamma is None else gamma
    return {
        "SAM": f"rho = {g:g}",
        "FSAM": f"gamma = {g:g}, analytic Fisher",
        "ASAM": f"rho = {s['asam_rho']:g}, eta = {s['asam_eta']:g}",
    }


def _factories(prob: GaussianMixture, gamma: float | None = None):
    """(label, optimizer factory, neighbourhood semi-axes at a point, settings text) for SAM, FSAM and
    ASAM with :data:`FSAM_SETTINGS` (``gamma`` overrides SAM's radius and FSAM's Fisher radius)."""
    s = FSAM_SETTINGS
    g = s["gamma"] if gamma is None else gamma
    lr, ra, eta = s["lr"], s["asam_rho"], s["asam_eta"]
    text = method_settings(g)
    sam = ("SAM", lambda p: SAM(p, torch.optim.SGD, rho=g, lr=lr), lambda t: (g, g), text["SAM"])
    fsam = (
        "FSAM",
        lambda p: FisherSAM(p, torch.optim.SGD, rho=g, fisher=prob.fisher, lr=lr),
        # eps^T F eps <= gamma^2 with F = diag(1/sigma^2, 2/sigma^2)
        lambda t: (g * float(t[1]), g * float(t[1]) / math.sqrt(2)),
        text["FSAM"],
    )
    asam = (
        "ASAM",
        lambda p: ASAM(p, torch.optim.SGD, rho=ra, eta=eta, scale_all=True, lr=lr),
        # ||T^{-1} eps|| <= rho with T = |theta| + eta
        lambda t: (ra * (abs(float(t[0])) + eta), ra * (abs(float(t[1])) + eta)),
        text["ASAM"],
    )
    return sam, fsam, asam


def fsam_fig2(out: Path, resolution: int) -> dict:
    prob = GaussianMixture()
    sam, fsam, _ = _factories(prob)
    head = "Fisher SAM Fig. 2: SAM ends in the sharp basin, Fisher-SAM in the flat one"
    return _fsam_pair(out, resolution, "fsam_fig2", FSAM_SETTINGS["fig2_start"], [sam, fsam], head)


def fsam_fig2_small_gamma(out: Path, resolution: int) -> dict:
    """The second case: a small radius (``FSAM_SETTINGS['small_gamma']``) from a large-sigma start."""
    prob = GaussianMixture()
    g = FSAM_SETTINGS["small_gamma"]
    sam, fsam, _ = _factories(prob, gamma=g)
    head = f"Fisher SAM Fig. 2, second case: gamma = {g:g}: Fisher-SAM stalls on the ridge"
    start = FSAM_SETTINGS["small_gamma_start"]
    return _fsam_pair(out, resolution, "fsam_fig2_small_gamma", start, [sam, fsam], head)


def fsam_fig3(out: Path, resolution: int) -> dict:
    prob = GaussianMixture()
    _, fsam, asam = _factories(prob)
    head = "Fisher SAM Fig. 3: ASAM ends in the sharp basin, Fisher-SAM in the flat one"
    return _fsam_pair(out, resolution, "fsam_fig3", FSAM_SETTINGS["fig3_start"], [asam, fsam], head)
