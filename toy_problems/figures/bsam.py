"""bSAM (Moellenhoff & Khan 2023) Fig. 3 and 5 on 2-D Bayesian logistic regression (predictive maps and
posterior contours against the exact posterior) and Fig. 6 on two moons (predictive uncertainty)."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from optimizers import MFVI, SAM, BayesianSAM
from toy_problems.figures.common import REDUCED_BELOW, pyplot, save_png
from toy_problems.figures.palette import method_color
from toy_problems.logistic import (
    Gaussian,
    LogisticRegression,
    gaussian_probit_predictive,
    predictive_distances,
)
from toy_problems.trajectory import run_trajectory
from toy_problems.two_moons import TwoMoons

__all__ = [
    "LOGREG_SETTINGS",
    "MOONS_SETTINGS",
    "logistic_results",
    "moons_results",
    "bsam_fig3",
    "bsam_fig5",
    "bsam_fig6",
    "FIG5_SAMPLES",
    "exact_posterior_samples",
]

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


def logistic_results(resolution: int, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Fit SAM and bSAM on the logistic-regression problem and compute every posterior / predictive
    that Fig. 3 and 5 show (cached: both figures use one run).

    ``overrides`` updates :data:`LOGREG_SETTINGS` per method, e.g. ``{"sam": {"rho": 0.5}}`` (the
    dashboard's sliders); unknown methods or keys raise ``ValueError``."""
    frozen = tuple(sorted((m, tuple(sorted(v.items()))) for m, v in (overrides or {}).items()))
    return _logistic_results(resolution, frozen)


@lru_cache(maxsize=4)
def _logistic_results(resolution: int, overrides: tuple) -> dict[str, Any]:
    return compute_logistic_results(resolution, logistic_settings({m: dict(v) for m, v in overrides}))


def logistic_settings(overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """:data:`LOGREG_SETTINGS` updated per method by ``overrides``; unknown methods or keys raise."""
    s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in LOGREG_SETTINGS.items()}
    for method, values in (overrides or {}).items():
        if method not in s or not isinstance(s[method], dict):
            raise ValueError(f"unknown method {method!r} in overrides; choose from sam, bsam, mfvi")
        unknown = set(values) - set(s[method])
        if unknown:
            raise ValueError(f"unknown {method} settings {sorted(unknown)}; known: {sorted(s[method])}")
        s[method].update(values)
    return s


def compute_logistic_results(
    resolution: int, s: dict[str, Any], ticks: Callable[[str, int], Any] | None = None
) -> dict[str, Any]:
    """The runs, posteriors and predictive maps of Fig. 3/5 for the settings ``s`` (uncached).

    ``ticks(method, steps)``: an optional ``scheduler_factory`` for each run (``run_trajectory``
    calls its ``step()`` after every optimizer step; e.g. a progress bar); the numbers do not depend
    on it.
    """
    tick = ticks or (lambda method, steps: None)
    prob = LogisticRegression()
    post = prob.exact_posterior()
    sam_tr = run_trajectory(
        prob,
        lambda p: SAM(p, torch.optim.SGD, rho=s["sam"]["rho"], lr=s["sam"]["lr"]),
        s["start"],
        s["sam"]["steps"],
        scheduler_factory=tick("SAM", s["sam"]["steps"]),
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
        scheduler_factory=tick("bSAM", b["steps"]),
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
        scheduler_factory=tick("MFVI", v["steps"]),
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
    plt = pyplot()
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
    save_png(fig, out / "bsam_fig3.png")
    return _logistic_numbers(R)


#: bSAM Fig. 5 (App. F.1): how many exact-posterior samples the left and middle panels show, and their seed.
FIG5_SAMPLES = {"n": 8, "seed": 0}


def exact_posterior_samples(post, n: int, seed: int) -> torch.Tensor:
    """``n`` weights drawn from the grid posterior ``post`` (a grid cell with probability
    ``density * step^2``, then uniformly inside the cell), ``[n, 2]``; ``torch.Generator`` seeded by
    ``seed``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    g = torch.Generator().manual_seed(int(seed))
    p = (post.density.double() * post.step**2).reshape(-1)
    idx = torch.multinomial(p / p.sum(), n, replacement=True, generator=g)
    W = post.grid.double().reshape(-1, 2)[idx]
    jitter = (torch.rand(n, 2, generator=g, dtype=torch.float64) - 0.5) * post.step
    return W + jitter


def bsam_fig5(out: Path, resolution: int) -> dict:
    """bSAM Fig. 5, all three panels: (a) the data with the decision boundaries ``w^T x = 0`` of the
    MAP and of exact-posterior samples, (b) the exact density with the MAP (cross) and the samples
    (triangles), (c) SAM, SAM + Laplace and bSAM against the exact posterior."""
    plt = pyplot()
    R = logistic_results(resolution)
    post = R["post"]
    prob = R["prob"]
    X, y = prob.data
    samples = exact_posterior_samples(post, FIG5_SAMPLES["n"], FIG5_SAMPLES["seed"])
    fig, (a, b, ax) = plt.subplots(1, 3, figsize=(18, 5))
    a.scatter(X[:, 0], X[:, 1], c=np.where(y.numpy() > 0.5, "red", "blue"), s=14, edgecolors="k", lw=0.4)
    (x0, x1), (y0, y1) = prob.x_bounds
    xx = np.linspace(x0, x1, 2)

    def boundary(w, **kw):  # w1 x1 + w2 x2 = 0  ->  x2 = -w1 x1 / w2
        w = np.asarray(w, dtype=float)
        a.plot(xx, -w[0] * xx / w[1], **kw)

    for i, w in enumerate(samples.tolist()):
        label = "exact-posterior samples" if i == 0 else None
        boundary(w, color=method_color("SAM+Laplace"), lw=0.8, alpha=0.7, label=label)
    boundary(post.map.tolist(), color=method_color("exact"), lw=2, label="MAP")
    a.set_xlim(x0, x1)
    a.set_ylim(y0, y1)
    a.set_xlabel("x_1")
    a.set_ylabel("x_2")
    a.legend(fontsize=7, loc="lower right")
    a.set_title("(a) data and decision boundaries w^T x = 0", fontsize=9)
    for axis in (b, ax):
        axis.contourf(post.xs, post.ys, post.density.numpy(), levels=20, cmap="Greys")
        axis.plot(*post.map.tolist(), "x", color=method_color("MAP"), ms=10, mew=2, label="MAP", zorder=5)
        axis.set_xlim(-1, 6)
        axis.set_ylim(-1.5, 3.5)
        axis.set_xlabel("w_1")
    b.plot(samples[:, 0], samples[:, 1], "^", color=method_color("SAM+Laplace"), label="samples")
    b.set_ylabel("w_2")
    b.legend(fontsize=7, loc="upper left")
    b.set_title("(b) exact posterior density (grid), MAP and samples", fontsize=9)
    ax.plot(*R["w_sam"].tolist(), "o", color=method_color("SAM"), label="SAM")
    e = R["gauss"]["SAM+Laplace"].ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], "--", color=method_color("SAM+Laplace"), label="SAM+Laplace (2 sd)")
    e = R["gauss"]["bSAM"].ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], "-", color=method_color("bSAM"), label="bSAM (2 sd)")
    ax.plot(*R["gauss"]["bSAM"].mean.tolist(), "^", color=method_color("bSAM"))
    m = post.mean.numpy()
    e = Gaussian(post.mean, post.cov).ellipse(2.0).numpy()
    ax.plot(e[:, 0], e[:, 1], ":", color=method_color("exact"), label="exact mean/cov (2 sd)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # outside
    ax.set_title(f"(c) SAM, SAM+Laplace, bSAM; exact mean {np.round(m, 2)}", fontsize=9)
    fig.suptitle(
        "bSAM Fig. 5 (App. F.1): logistic regression, exact posterior by grid integration", fontsize=9
    )
    save_png(fig, out / "bsam_fig5.png")
    numbers = _logistic_numbers(R)
    numbers["exact_posterior_samples"] = {**FIG5_SAMPLES, "weights": samples.tolist()}
    return numbers


# ------------------------------------------------------------------------------------------------
# bSAM Fig. 6 (two moons)
# ------------------------------------------------------------------------------------------------
def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _train_moons(prob: TwoMoons, method: str, epochs: int, on_epoch: Callable[[int], None] | None = None):
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
    for epoch in range(epochs):
        if on_epoch is not None:
            on_epoch(epoch)
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


def moons_results(
    resolution: int, epochs: int, progress: Callable[[float, str], None] | None = None
) -> dict[str, Any]:
    """Train SAM and bSAM on two moons for ``epochs`` epochs and compute the three predictive maps of
    Fig. 6 (SAM, bSAM model average, SAM + linearised diagonal Laplace) on a ``resolution``^2 grid.

    ``progress(fraction, what)`` is called at every epoch (bSAM's epochs, with ``m = 5`` passes per
    step, count for 5/6 of the time) and before the predictive maps."""
    s = MOONS_SETTINGS
    report = progress or (lambda f, what: None)
    prob = TwoMoons()
    xs, ys, XG = _xgrid(prob, resolution)
    sam_model, _ = _train_moons(
        prob, "SAM", epochs, lambda e: report(0.15 * e / epochs, f"training SAM, epoch {e + 1} of {epochs}")
    )
    bsam_model, bopt = _train_moons(
        prob,
        "bSAM",
        epochs,
        lambda e: report(0.15 + 0.75 * e / epochs, f"training bSAM, epoch {e + 1} of {epochs}"),
    )
    report(0.9, "predictive maps (bSAM model average, SAM + Laplace)")
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
    entropy = {k: mean_binary_entropy(p) for k, p in maps.items()}
    return {
        "prob": prob,
        "data": prob.data,
        "xs": xs,
        "ys": ys,
        "maps": maps,
        "entropy": entropy,
        "models": {"SAM": sam_model, "bSAM": bsam_model, "SAM+Laplace": sam_model},
        "bsam_optimizer": bopt,
        "epochs": epochs,
    }


def mean_binary_entropy(p: torch.Tensor) -> float:
    """Mean entropy (nats) of Bernoulli probabilities ``p`` (clamped to ``[1e-12, 1 - 1e-12]``)."""
    pc = p.clamp(1e-12, 1 - 1e-12)
    return float((-(pc * pc.log() + (1 - pc) * (1 - pc).log())).mean())


def bsam_fig6(out: Path, resolution: int) -> dict:
    plt = pyplot()
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
    save_png(fig, out / "bsam_fig6.png")
    return numbers


def _xgrid(prob: TwoMoons, resolution: int):
    (x0, x1), (y0, y1) = prob.x_bounds
    xs = torch.linspace(x0, x1, resolution, dtype=torch.float64)
    ys = torch.linspace(y0, y1, resolution, dtype=torch.float64)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return xs, ys, torch.stack([xx, yy], -1)
