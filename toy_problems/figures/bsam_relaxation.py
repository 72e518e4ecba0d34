"""bSAM (Moellenhoff & Khan 2023) Fig. 1, 2 and 7: SAM's max-loss against the Bayes expected loss on a
1-D loss, the Fenchel biconjugate as the convex relaxation of the expected negative loss, and the
relaxed-Bayes posterior against the exact one on the logistic-regression problem of Fig. 3/5.

The mathematics is in :mod:`toy_problems.relaxed_bayes`; this module chooses the settings and draws.
Everything is float64 numpy. The paper gives neither its 1-D function nor the values of ``sigma``
(the seed text drops them, and the authors' public code, github.com/team-approx-bayes/bayesian-sam,
has only the two-moons demo), so :data:`RELAXATION_SETTINGS` states ours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from toy_problems.figures.common import REDUCED_BELOW, pyplot, save_png
from toy_problems.figures.palette import method_color
from toy_problems.logistic import Gaussian, LogisticRegression
from toy_problems.relaxed_bayes import (
    BumpLoss1D,
    gaussian_kl,
    gaussian_vi_fixed_point,
    max_loss_1d,
    relaxed_bayes_fixed_point,
    relaxed_expected_loss,
)

__all__ = [
    "RELAXATION_SETTINGS",
    "FIG7_SETTINGS",
    "fig1_numbers",
    "fig2_numbers",
    "fig7_numbers",
    "logistic_expected_loss",
    "bsam_fig1",
    "bsam_fig2",
    "bsam_fig7",
]

#: Fig. 1/2 (ours: the paper's values are not in the text): the loss of :class:`BumpLoss1D`, the
#: grid of ``theta`` over which eq. 10's supremum runs, SAM's radius and the Gaussian's standard
#: deviation of Fig. 1(a) at the point ``theta0``, the three slices of Fig. 1(b)/2(c).
RELAXATION_SETTINGS: dict[str, Any] = {
    "loss": BumpLoss1D(depths=(2.0, 0.8, 1.8)).params(),
    "theta_grid": {"lo": -8.0, "hi": 8.0, "n": 801},
    "m_range": (-4.0, 4.0),
    "rho": 0.5,
    "sigma_fig1a": 0.5,
    "theta0": -1.0,
    "sigmas": (0.1, 0.5, 1.0),
    "fig2_sigma_range": (0.0, 1.5),
}

#: Fig. 7: the grid of weights over which the biconjugate's supremum runs (its spacing must stay below
#: the relaxed posterior's standard deviation, ~0.1, or the LP has no feasible point), the Gaussian-VI
#: iteration's damping, and the starting points of the relaxed fixed point (DC algorithm: it stops at a
#: critical point, so several starts and the lowest objective are kept; reduced mode: the first only).
FIG7_SETTINGS: dict[str, Any] = {
    "box": ((-3.0, 9.0), (-2.0, 4.0)),
    "step": 0.1,
    "vi_damping": 0.5,
    "relaxed_starts": ("gaussian_vi", "exact_moments"),
}


def _loss() -> BumpLoss1D:
    p = RELAXATION_SETTINGS["loss"]
    return BumpLoss1D(
        p["slope"], tuple(p["centers"]), tuple(p["widths"]), tuple(p["depths"]), tuple(p["names"])
    )


def _theta() -> np.ndarray:
    g = RELAXATION_SETTINGS["theta_grid"]
    return np.linspace(g["lo"], g["hi"], g["n"])


def relaxed_curve(loss: BumpLoss1D, ms: np.ndarray, sigma: float) -> np.ndarray:
    """``-f**(m, sigma)`` for every ``m`` (one LP each, :func:`relaxed_expected_loss`)."""
    th = _theta()
    lv = loss(th)
    return np.array([relaxed_expected_loss(th, lv, m, sigma * sigma).value for m in ms])


def fig1_numbers(resolution: int) -> dict[str, Any]:
    """The curves of Fig. 1: loss, max-loss (radius ``rho``), expected loss (``sigma_fig1a``), and for
    each slice ``sigma`` the expected loss and its relaxation ``-f**`` over ``m``."""
    s = RELAXATION_SETTINGS
    loss = _loss()
    n = max(41, min(resolution, 201))
    ms = np.linspace(*s["m_range"], n)
    out: dict[str, Any] = {
        "settings": s,
        "m": ms.tolist(),
        "loss": loss(ms).tolist(),
        "max_loss": max_loss_1d(loss, ms, s["rho"]).tolist(),
        "expected_loss": loss.expected(ms, s["sigma_fig1a"]).tolist(),
        "minima": {k: float(c) for k, c in zip(loss.names, loss.centers)},
        "slices": {},
    }
    fine = np.linspace(*s["m_range"], 1601)
    out["argmin"] = {
        "loss": float(fine[np.argmin(loss(fine))]),
        "max_loss": float(fine[np.argmin(max_loss_1d(loss, fine, s["rho"]))]),
        "expected_loss": float(fine[np.argmin(loss.expected(fine, s["sigma_fig1a"]))]),
    }
    for sig in s["sigmas"]:
        e = loss.expected(ms, sig)
        r = relaxed_curve(loss, ms, sig)
        out["slices"][str(sig)] = {
            "sigma": sig,
            "expected_loss": e.tolist(),
            "relaxed": r.tolist(),
            "min_gap_relaxed_minus_expected": float((r - e).min()),
            "argmin_expected": float(ms[np.argmin(e)]),
            "argmin_relaxed": float(ms[np.argmin(r)]),
        }
    return out


def bsam_fig1(out: Path, resolution: int) -> dict:
    plt = pyplot()
    s = RELAXATION_SETTINGS
    loss = _loss()
    N = fig1_numbers(resolution)
    ms = np.asarray(N["m"])
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.4))
    a.plot(ms, N["loss"], "k-", lw=2, label="loss")
    a.plot(ms, N["max_loss"], color=method_color("SAM"), label=f"max-loss, rho={s['rho']}")
    a.plot(
        ms, N["expected_loss"], color=method_color("bSAM"), label=f"expected loss, sigma={s['sigma_fig1a']}"
    )
    t0 = s["theta0"]
    a.axvspan(t0 - s["rho"], t0 + s["rho"], color=method_color("SAM"), alpha=0.12)
    dens = np.exp(-((ms - t0) ** 2) / (2 * s["sigma_fig1a"] ** 2))
    lo = min(N["loss"])
    a.fill_between(ms, lo - 0.3, lo - 0.3 + 0.6 * dens, color=method_color("bSAM"), alpha=0.25)
    a.plot([t0], [float(loss(t0))], "ko")
    for k, c in N["minima"].items():
        a.annotate(k, (c, float(loss(c))), textcoords="offset points", xytext=(0, -14), ha="center")
    a.set_title("(a) max over the rho-ball (red) vs expectation under N(theta, sigma^2) (blue)", fontsize=9)
    a.set_xlabel("theta")
    a.legend(fontsize=7)
    b.plot(ms, N["loss"], "k-", lw=2, label="loss (sigma -> 0)")
    for i, (k, sl) in enumerate(N["slices"].items()):
        b.plot(
            ms,
            sl["expected_loss"],
            color=method_color("bSAM"),
            alpha=0.4 + 0.3 * i,
            label=f"E[loss], sigma={k}",
        )
        b.plot(
            ms,
            sl["relaxed"],
            "--",
            color=method_color("SAM"),
            alpha=0.4 + 0.3 * i,
            label=f"-f** (relaxed), sigma={k}",
        )
    b.set_title(
        "(b) the relaxation -f** upper-bounds the expected loss; both smooth as sigma grows", fontsize=9
    )
    b.set_xlabel("m")
    b.legend(fontsize=7)
    fig.suptitle("bSAM Fig. 1 (1-D example, our loss: sharp minima A, C and a flat minimum B)", fontsize=9)
    save_png(fig, out / "bsam_fig1.png")
    return N


def fig2_numbers(resolution: int) -> dict[str, Any]:
    """``f(mu) = -E_q[loss]`` and its biconjugate ``f**`` on a grid of ``(m, sigma)`` (Fig. 2(b)/(c)),
    with ``mu = (m, m^2 + sigma^2)``; ``sigma = 0`` is the loss itself (the boundary of ``M``)."""
    s = RELAXATION_SETTINGS
    loss = _loss()
    reduced = resolution < REDUCED_BELOW
    nm, ns = (15, 8) if reduced else (41, 21)
    ms = np.linspace(*s["m_range"], nm)
    sig = np.linspace(*s["fig2_sigma_range"], ns)
    f = -loss.expected(ms[None, :], sig[:, None])
    fss = np.empty_like(f)
    fss[0] = -loss(ms)
    for i, sg in enumerate(sig[1:], start=1):
        fss[i] = -relaxed_curve(loss, ms, float(sg))
    return {
        "settings": s,
        "m": ms.tolist(),
        "sigma": sig.tolist(),
        "mu1": ms.tolist(),
        "mu2": (ms[None, :] ** 2 + sig[:, None] ** 2).tolist(),
        "f": f.tolist(),
        "f_biconjugate": fss.tolist(),
        "max_gap_f_minus_biconjugate": float((f - fss).max()),
        "min_gap_f_minus_biconjugate": float((f - fss).min()),
    }


def bsam_fig2(out: Path, resolution: int) -> dict:
    plt = pyplot()
    N = fig2_numbers(resolution)
    ms, sig = np.asarray(N["m"]), np.asarray(N["sigma"])
    f, fss, mu2 = np.asarray(N["f"]), np.asarray(N["f_biconjugate"]), np.asarray(N["mu2"])
    M1 = np.broadcast_to(ms[None, :], f.shape)
    S = np.broadcast_to(sig[:, None], f.shape)
    fig = plt.figure(figsize=(16, 4.8))
    a = fig.add_subplot(1, 3, 1)
    x = np.linspace(-2, 2, 200)
    a.fill_between(
        x, x**2, 4.5, color=method_color("bSAM"), alpha=0.2, label="M: mu2 > mu1^2 (expectation params)"
    )
    a.plot(x, x**2, color=method_color("bSAM"))
    a.fill_between(
        x, -4.5, 0, color=method_color("SAM"), alpha=0.15, label="Omega: lambda2 < 0 (natural params)"
    )
    a.axhline(0, color="k", lw=0.5)
    a.set_xlim(-2, 2)
    a.set_ylim(-4.5, 4.5)
    a.set_xlabel("mu1 / lambda1")
    a.set_ylabel("mu2 / lambda2")
    a.legend(fontsize=7, loc="lower right")
    a.set_title("(a) the dual spaces of a 1-D Gaussian (eq. 6)", fontsize=9)
    b = fig.add_subplot(1, 3, 2, projection="3d")
    b.plot_wireframe(M1, mu2, f, color=method_color("bSAM"), lw=0.5, label="f = E_q[-loss]")
    b.plot_surface(M1, mu2, fss, color=method_color("SAM"), alpha=0.5)
    b.set_xlabel("mu1")
    b.set_ylabel("mu2")
    b.set_title("(b) f (blue mesh) and its biconjugate f** (red) over mu", fontsize=9)
    c = fig.add_subplot(1, 3, 3, projection="3d")
    c.plot_wireframe(M1, S, f, color=method_color("bSAM"), lw=0.5)
    c.plot_surface(M1, S, fss, color=method_color("SAM"), alpha=0.5)
    c.plot(ms, np.zeros_like(ms), fss[0], "k-", lw=3)
    c.set_xlabel("m")
    c.set_ylabel("sigma")
    c.set_title("(c) the same over (m, sigma); black: -loss at sigma = 0", fontsize=9)
    fig.suptitle(
        f"bSAM Fig. 2: f** <= f everywhere (largest gap {N['max_gap_f_minus_biconjugate']:.3f}), "
        "equal at sigma = 0",
        fontsize=9,
    )
    save_png(fig, out / "bsam_fig2.png")
    return N


# ------------------------------------------------------------------------------------------------
# Fig. 7: relaxed vs exact posterior on logistic regression
# ------------------------------------------------------------------------------------------------
def logistic_expected_loss(prob: LogisticRegression, n_quad: int = 64):
    """``(mean, cov) -> (E_q[L], E_q[grad L], E_q[hess L])`` for the summed negative log-likelihood
    ``L(w) = sum_i softplus(w^T x_i) - y_i w^T x_i`` under ``q = N(mean, cov)``: each term depends on
    ``w`` through the 1-D Gaussian logit ``a_i ~ N(mean^T x_i, x_i^T cov x_i)``, so 1-D Gauss-Hermite
    per data point is exact up to quadrature error (``E[sigmoid]``, ``E[sigmoid (1 - sigmoid)]``,
    ``E[softplus]``)."""
    X, y = (t.double().numpy() for t in prob.data)
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_quad)
    weights = weights / np.sqrt(2 * np.pi)

    def expected(mean: np.ndarray, cov: np.ndarray):
        am = X @ mean
        av = np.einsum("ni,ij,nj->n", X, cov, X).clip(min=0)
        a = am[:, None] + np.sqrt(av)[:, None] * nodes
        sg = 1.0 / (1.0 + np.exp(-a))
        e_sp = (np.logaddexp(0.0, a) * weights).sum(1)
        e_s = (sg * weights).sum(1)
        e_ss = (sg * (1 - sg) * weights).sum(1)
        return float((e_sp - y * am).sum()), X.T @ (e_s - y), (X.T * e_ss) @ X

    return expected


def _weight_grid() -> np.ndarray:
    s = FIG7_SETTINGS
    step = s["step"]
    (a0, a1), (b0, b1) = s["box"]
    g1 = np.arange(a0, a1 + 1e-9, step)
    g2 = np.arange(b0, b1 + 1e-9, step)
    return np.stack(np.meshgrid(g1, g2), -1).reshape(-1, 2)


def fig7_numbers(resolution: int) -> dict[str, Any]:
    """The exact posterior (grid), the full-covariance Gaussian minimising the Bayes objective (eq. 2)
    and the one minimising its relaxation (eq. 11), with both objectives at both Gaussians and the
    exact log evidence they lower-bound."""
    s = FIG7_SETTINGS
    prob = LogisticRegression()
    post = prob.exact_posterior()
    prior_cov = np.eye(2) * prob.prior_variance
    expected = logistic_expected_loss(prob)
    vi = gaussian_vi_fixed_point(expected, prior_cov, np.zeros(2), np.eye(2), damping=s["vi_damping"])
    W = _weight_grid()
    Lv = prob.num_data * prob.nll(torch.as_tensor(W)).double().numpy()
    inits = {
        "gaussian_vi": (vi.mean, vi.cov),
        "exact_moments": (post.mean.double().numpy(), post.cov.double().numpy()),
    }
    starts = s["relaxed_starts"][:1] if resolution < REDUCED_BELOW else s["relaxed_starts"]
    runs = {k: relaxed_bayes_fixed_point(W, Lv, prior_cov, *inits[k]) for k in starts}
    best = min(runs, key=lambda k: runs[k].objective)
    rel = runs[best]

    def objectives(m, S):
        kl = gaussian_kl(m, S, np.zeros(2), prior_cov)
        return {
            "bayes": expected(m, S)[0] + kl,
            "relaxed": relaxed_expected_loss(W, Lv, m, S, convex_loss=True).value + kl,
        }

    return {
        "settings": {**s, "grid_points": int(W.shape[0]), "problem": prob.params()},
        "exact": {
            "mean": post.mean.tolist(),
            "cov": post.cov.tolist(),
            "log_evidence": post.log_evidence,
            "grid": post.config,
        },
        "gaussian_vi": {
            "mean": vi.mean.tolist(),
            "cov": vi.cov.tolist(),
            "iterations": vi.iterations,
            "converged": vi.converged,
            "objectives": objectives(vi.mean, vi.cov),
        },
        "relaxed": {
            "mean": rel.mean.tolist(),
            "cov": rel.cov.tolist(),
            "start": best,
            "iterations": rel.iterations,
            "converged": rel.converged,
            "history": rel.history,
            "objectives": objectives(rel.mean, rel.cov),
            "all_starts": {
                k: {"mean": r.mean.tolist(), "cov": r.cov.tolist(), "objective": r.objective}
                for k, r in runs.items()
            },
        },
    }


def bsam_fig7(out: Path, resolution: int) -> dict:
    plt = pyplot()
    N = fig7_numbers(resolution)
    post = LogisticRegression().exact_posterior()
    fig, ax = plt.subplots(figsize=(6.5, 5))
    ax.contourf(post.xs, post.ys, post.density.numpy(), levels=20, cmap="Greys")
    for key, label, style in (
        ("gaussian_vi", "Bayes, eq. 2 (full-cov Gaussian)", "-"),
        ("relaxed", "relaxed Bayes, eq. 11", "--"),
    ):
        g = Gaussian(torch.tensor(N[key]["mean"]), torch.tensor(N[key]["cov"]))
        e = g.ellipse(2.0).numpy()
        color = method_color("MFVI") if key == "gaussian_vi" else method_color("bSAM")
        ob = N[key]["objectives"]
        ax.plot(
            e[:, 0],
            e[:, 1],
            style,
            color=color,
            label=f"{label} (2 sd): -obj {-ob['bayes']:.2f} / relaxed {-ob['relaxed']:.2f}",
        )
        ax.plot(*N[key]["mean"], "^", color=color)
    e = Gaussian(post.mean, post.cov).ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], ":", color=method_color("exact"), label="exact mean/cov (2 sd)")
    ax.set_xlim(-1, 6)
    ax.set_ylim(-1.5, 3.5)
    ax.set_xlabel("w_1")
    ax.set_ylabel("w_2")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    ax.set_title(
        f"bSAM Fig. 7: exact posterior (grey), log evidence {N['exact']['log_evidence']:.2f}", fontsize=9
    )
    save_png(fig, out / "bsam_fig7.png")
    return N
