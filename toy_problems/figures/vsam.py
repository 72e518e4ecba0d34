"""VSAM ("Rethinking SAM as variational inference") Fig. 1 A-D: the loss, its Gaussian smoothing, the
worst case in a ball and SAM's first-order objective at rho = 8, with the basins of gradient flow.

Panels, ``theta = (mu, sigma)``, ``s = rho / sqrt(2)``:

* A: ``L(theta)``, the Gaussian mixture of Fisher SAM eq. 15.
* B: ``E L(theta + eps)``, ``eps ~ N(0, s^2 I)`` (``smoothing.gaussian_smoothed_even``: Gauss-Hermite in
  ``mu`` x a Gauss-Legendre rule in ``sigma`` split at the log singularity ``sigma = 0``; error < 1e-7.
  The tensor Gauss-Hermite rule is off by up to 0.035 for ``sigma < 12`` and made spurious minima).
* C: ``max_{||eps|| <= rho} L(theta + eps)`` (``smoothing.worst_case_circle``: Newton-refined maximum
  on the boundary circle; the loss has no local maximum inside the ball).
* D: ``L(theta + rho g / ||g||)``, ``g = grad L`` (SAM's first-order objective).

B and C are drawn where ``sigma > rho``: C is ``+inf`` where the ball reaches ``sigma <= 0``; B is
shown on the same band so that the two compare over the same region.

**Statistic** (``toy_problems._flow_basins``; no plotting grid involved): the share of a panel's
region whose gradient flow ``dtheta/dt = -grad f`` reaches the sharp minimum's basin. Local minima of
``f`` are found by the flow from an 8 x 6 pilot grid of starts, polished (Newton; gradient sampling
for the kinked C) and checked: ``||grad f|| < 1e-9`` and a positive-definite Hessian (central
differences of the autograd gradient); C's minima are kinks where two worst-case directions tie, so
there the check is that ``f`` rises on rings of radius 0.01, 0.1 and 0.5; minima closer than 0.1 are
one. Then ``N`` seeded i.i.d. uniform starts in the panel's region (A: the plotted square, and also
``sigma > rho`` for comparison; B, C: ``sigma > rho``) follow the flow (Heun steps of arc length
``FLOW_STEP``) until they enter a capture ball certified by ``(theta - m).grad f > 0``. The *sharp
basin* is the basin of the panel minimum that the flow from the loss's sharp minimiser reaches; its
share ``k/N`` is reported with standard error ``sqrt(p(1-p)/N)`` and Wilson 95 % interval, from two
independent sets of starts (``VSAM_STARTS``, seeds ``VSAM_SEEDS``) that must agree within
``1.96 sqrt(se1^2 + se2^2)``; the first set is rerun at half the step (``step_check``: how many of
its starts change basin). D has no local minima: the flow on D ends at the critical points of L,
where D jumps (``g / ||g||`` is undefined); these end points are recorded and marked x, without a
share.

The previous statistic (steepest descent between the cells of the drawing grid) counted grid-local
minima: the Gauss-Hermite error in B and the kinks of C split the sharp basin into 4-5 "minima", and
only the one nearest the loss's minimum was counted (B: 11 % at resolution 150, 4 % at 200).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

import toy_problems._flow_basins as fb
from toy_problems.figures.common import REDUCED_BELOW, contour_levels, pyplot, save_html, save_png
from toy_problems.gaussian_mixture import GaussianMixture
from toy_problems.smoothing import gaussian_smoothed_even, sam_first_order, worst_case_circle

__all__ = [
    "VSAM_RHO",
    "VSAM_BOUNDS",
    "VSAM_STARTS",
    "VSAM_STARTS_REDUCED",
    "VSAM_SEEDS",
    "FLOW_STEP",
    "vsam_objectives",
    "panel_region",
    "vsam_panels",
    "vsam_basin_stats",
    "vsam_fig1",
]

VSAM_RHO = 8.0
VSAM_BOUNDS = ((-40.0, 40.0), (2.0, 50.0))
#: numbers of starts of the two independent runs (the second is the reported estimate) and their seeds
VSAM_STARTS = (1000, 4000)
VSAM_STARTS_REDUCED = (100, 200)  # resolution < REDUCED_BELOW (the test suite)
VSAM_SEEDS = (1, 2)
#: Heun arc-length step per panel (halving it: 0 of 1000 starts change basin in A and B, 3 in C)
FLOW_STEP = {"A": 0.5, "B": 0.5, "C": 0.25}
PILOT = (8, 6)
_CHUNK = 4000


def vsam_objectives(rho: float = VSAM_RHO) -> dict[str, fb.Objective]:
    """The four panel objectives as ``_flow_basins.Objective`` (value, gradient, smoothness)."""
    prob = GaussianMixture()

    def loss(t):
        return prob.loss(t, check=False)

    def smoothed(t):
        return gaussian_smoothed_even(prob, t, rho)

    def worst(t):
        return worst_case_circle(prob, t, rho)[0]

    def worst_grad(t):  # Danskin: grad L at the maximiser
        _, eps = worst_case_circle(prob, t, rho)
        x = (t.detach() + eps).requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(prob.loss(x, check=False).sum(), x)
        return g

    def sam(t):  # differentiable version of smoothing.sam_first_order
        t = t if t.requires_grad else t.detach().clone().requires_grad_(True)
        with torch.enable_grad():
            (g,) = torch.autograd.grad(prob.loss(t, check=False).sum(), t, create_graph=True)
            return prob.loss(t + rho * g / (g.norm(dim=-1, keepdim=True) + 1e-12), check=False)

    return {
        "A": fb.Objective(loss),
        "B": fb.Objective(smoothed),
        "C": fb.Objective(worst, worst_grad, smooth=False),
        "D": fb.Objective(sam),
    }


@contextmanager
def _one_thread():
    """The flow evaluates many small batches: one intra-op thread is several times faster (and does
    not spin idle threads on a shared machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def panel_region(key: str, rho: float = VSAM_RHO):
    """Where panel ``key`` is drawn and its share is measured: B, C on ``sigma > rho``."""
    (x0, x1), (y0, y1) = VSAM_BOUNDS
    return ((x0, x1), (max(y0, rho), y1)) if key in "BC" else VSAM_BOUNDS


def _chunked(fn, T: torch.Tensor) -> np.ndarray:
    flat = T.reshape(-1, 2)
    with torch.no_grad():
        out = [fn(flat[i : i + _CHUNK]).detach() for i in range(0, flat.shape[0], _CHUNK)]
    return torch.cat(out).reshape(T.shape[:-1]).numpy()


def vsam_panels(resolution: int, rho: float = VSAM_RHO) -> dict[str, Any]:
    """The four panels on a ``resolution x resolution`` grid: ``{"xs", "ys", "A", "B", "C", "D"}``
    (numpy); B and C are NaN where ``sigma <= rho``. The grid is for drawing only."""
    prob = GaussianMixture()
    xs, ys, T = prob.grid(resolution, VSAM_BOUNDS)
    band = T[..., 1].numpy() > rho
    A = prob.loss(T).numpy()
    B = np.where(band, _chunked(lambda t: gaussian_smoothed_even(prob, t, rho), T), np.nan)
    C = np.where(band, _chunked(lambda t: worst_case_circle(prob, t, rho)[0], T), np.nan)
    D = sam_first_order(prob, T, rho).detach().numpy()
    return {"xs": xs.numpy(), "ys": ys.numpy(), "A": A, "B": B, "C": C, "D": D}


def _method(key: str, step: float) -> str:
    kind = (
        "Newton polish, positive-definite Hessian"
        if key != "C"
        else "gradient-sampling polish, f rises on rings (kink minima)"
    )
    return (
        "basins of attraction of gradient flow (toy_problems._flow_basins): minima by flow from an "
        f"{PILOT[0]}x{PILOT[1]} pilot grid, {kind}; N seeded i.i.d. uniform starts in the region, Heun "
        f"arc-length steps h = {step:g} until a certified capture ball ((theta - m).grad f > 0 on it); "
        "share k/N, se = sqrt(p(1-p)/N), Wilson 95 % interval"
    )


def vsam_basin_stats(
    key: str,
    rho: float = VSAM_RHO,
    n_starts: tuple[int, ...] = VSAM_STARTS,
    seeds: tuple[int, ...] = VSAM_SEEDS,
    region=None,
) -> dict[str, Any]:
    """Minima and basin shares of panel ``key`` (A, B or C) by gradient flow (module docstring).

    Returns ``{"method", "region", "step", "minima", "rejected", "runs", "sharp", "flat",
    "sharp_minus_flat", "same_basin", "agree", "step_check"}``: ``runs[i]`` has ``n_starts``, ``seed``,
    ``unresolved`` and ``sharp`` / ``flat`` = ``{"count", "share", "se", "wilson95"}``; ``sharp`` is
    the last (largest) run's; ``step_check`` counts the first run's starts whose basin changes when
    the step is halved. Nothing depends on a plotting grid."""
    if key not in ("A", "B", "C"):
        raise ValueError(f"panel must be A, B or C, got {key!r}")
    obj = vsam_objectives(rho)[key]
    step = FLOW_STEP[key]
    region = region or panel_region(key, rho)
    minima, rejected = fb.find_minima(obj, fb.grid_starts(region, *PILOT))
    radii = [fb.capture_radius(obj, m["theta"]) for m in minima]
    prob = GaussianMixture()
    # one flow for the loss's two minimisers (which panel minimum continues each) and all runs
    parts = [torch.tensor([m.theta for m in prob.minima], dtype=torch.float64)]
    parts += [fb.uniform_starts(region, n, seed) for n, seed in zip(n_starts, seeds)]
    S = fb.basin_shares(obj, minima, torch.cat(parts), step, int(400 / step), radii)
    minima, radii = S["minima"], S["capture_radii"]
    labels = torch.split(S["labels"], [len(p) for p in parts])
    which = {m.label: int(k) for m, k in zip(prob.minima, labels[0])}
    runs = []
    for n, seed, lab in zip(n_starts, seeds, labels[1:]):
        run = {"n_starts": n, "seed": seed, "unresolved": int((lab < 0).sum())}
        run.update({lb: (fb.share_of(lab, k) if k >= 0 else None) for lb, k in which.items()})
        runs.append(run)
    half = fb.basin_shares(obj, minima, parts[1], step / 2, int(800 / step), radii)
    for k, m in enumerate(minima):
        m["capture_radius"] = radii[k]
        m["label"] = "/".join(lb for lb, j in which.items() if j == k) or None
    ks, kf = which["sharp"], which["flat"]
    return {
        "method": _method(key, step),
        "region": [list(r) for r in region],
        "step": step,
        "minima": minima,
        "rejected": rejected,
        "runs": runs,
        "sharp": runs[-1]["sharp"],
        "flat": runs[-1]["flat"],
        "same_basin": ks == kf,
        "agree": bool(
            len(runs) > 1
            and all(r["sharp"] is not None for r in runs)
            and fb.agree(runs[0]["sharp"], runs[-1]["sharp"])
        ),
        "sharp_minus_flat": minima[ks]["value"] - minima[kf]["value"] if min(ks, kf) >= 0 else float("nan"),
        "step_check": {
            "step": step / 2,
            "n_starts": n_starts[0],
            "labels_changed": int((half["labels"] != labels[1]).sum()),
        },
    }


def _descent_limits(rho: float) -> list[dict]:
    """Panel D: where the flow from the pilot grid ends (clustered within 1), with how many starts."""
    obj = vsam_objectives(rho)["D"]
    schedule = [0.5] * 200 + [0.5 * 0.9**k for k in range(1, 61)]
    ends, _ = fb.flow(obj, fb.grid_starts(VSAM_BOUNDS, *PILOT), schedule)
    ends = ends[torch.isfinite(ends).all(1)]
    vals = obj.value(ends).detach()
    keep = fb.merge_points(ends, vals, 1.0)
    near = torch.cdist(ends, ends[keep]).argmin(1)
    return [
        {"theta": [float(v) for v in ends[i]], "value": float(vals[i]), "n_pilot": int((near == j).sum())}
        for j, i in enumerate(keep)
    ]


def _pct(s: dict | None) -> str:
    if s is None:
        return "n/a"
    lo, hi = s["wilson95"]
    return f"{100 * s['share']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"


def _inside(theta, region) -> bool:
    return all(lo <= v <= hi for v, (lo, hi) in zip(theta, region))


def vsam_fig1(out: Path, resolution: int, n_starts: tuple[int, ...] | None = None) -> dict:
    """Draw VSAM Fig. 1 and return its numbers: per panel the minima and the sharp basin's share with
    its interval (``vsam_basin_stats``). ``resolution`` sets the drawing grid only; ``n_starts``
    defaults to ``VSAM_STARTS`` (``VSAM_STARTS_REDUCED`` below ``REDUCED_BELOW``, for the tests)."""
    if n_starts is None:
        n_starts = VSAM_STARTS if resolution >= REDUCED_BELOW else VSAM_STARTS_REDUCED
    plt = pyplot()
    P = vsam_panels(resolution)
    xs, ys = P["xs"], P["ys"]
    with _one_thread():
        stats = {k: vsam_basin_stats(k, n_starts=n_starts) for k in "ABC"}
        band = vsam_basin_stats("A", n_starts=n_starts, region=panel_region("B"))
        limits = [d for d in _descent_limits(VSAM_RHO) if _inside(d["theta"], VSAM_BOUNDS)]
    titles = {  # matplotlib mathtext
        "A": r"A: loss $L(\theta)$",
        "B": r"B: Gaussian-smoothed $\mathbb{E}\,L(\theta+\epsilon)$, $\epsilon\sim N(0, \rho^2/2\; I)$"
        "\n(white: " + r"$\sigma\leq\rho$)",
        "C": r"C: worst case of $L(\theta+\epsilon)$ over $\|\epsilon\|\leq\rho$"
        "\n(white: the ball reaches " + r"$\sigma\leq 0$)",
        "D": r"D: SAM's first-order objective $L(\theta + \rho\, g/\|g\|)$",
    }
    plain = {  # the interactive HTML (no TeX renderer there)
        "A": "A: loss L(θ)",
        "B": "B: Gaussian-smoothed loss, ε ~ N(0, ρ²/2 · I)",
        "C": "C: worst loss within distance ρ",
        "D": "D: SAM's first-order objective",
    }
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8), sharey=True)
    n_main = n_starts[-1]
    numbers: dict[str, Any] = {
        "rho": VSAM_RHO,
        "bounds": VSAM_BOUNDS,
        "resolution": resolution,
        "smoothing": "gaussian_smoothed_even: Gauss-Hermite (8) in mu x Gauss-Legendre (12 + 32) in sigma "
        "split at sigma = 0 (error < 1e-7)",
        "worst_case": "worst_case_circle: 64 angles + Newton in the angle on the circle ||eps|| = rho",
        "statistic": "share of the panel's region whose gradient flow reaches the sharp minimum's basin "
        "(independent of the drawing grid)",
        "n_starts": list(n_starts),
        "seeds": list(VSAM_SEEDS[: len(n_starts)]),
        "panels": {},
    }
    levels = contour_levels(np.concatenate([np.ravel(P[k]) for k in "ABCD"]))
    for ax, key in zip(axes, "ABCD"):
        cs = ax.contourf(xs, ys, P[key], levels=levels, cmap="viridis", extend="max")
        if key == "D":
            for d in limits:
                ax.plot(*d["theta"], "wx", ms=8, mew=2)
            numbers["panels"]["D"] = {
                "minima": [],
                "descent_end_points": limits,
                "note": "no local minima: the flow on D ends at the critical points of L, where "
                "g/||g|| is undefined and D jumps (x); no share",
            }
            ax.set_title(
                titles[key] + "\nno local minima: x = where gradient descent on D ends\n(L's critical "
                "points, where D jumps)",
                fontsize=8,
            )
        else:
            st = stats[key]
            for m in st["minima"]:
                if _inside(m["theta"], VSAM_BOUNDS):
                    ax.plot(*m["theta"], "r*", ms=10)
            numbers["panels"][key] = st
            where = (
                f"square ({_pct(band['sharp'])} of " + r"$\sigma>\rho$)" if key == "A" else r"$\sigma>\rho$"
            )
            ax.set_title(
                titles[key] + f"\nsharp basin {_pct(st['sharp'])} of {where}\n"
                f"(Wilson 95 %, N = {n_main} starts); depth vs flat {st['sharp_minus_flat']:+.3f}",
                fontsize=8,
            )
        ax.set_xlabel(r"$\mu$")
    numbers["panels"]["A"]["on_band_sigma_gt_rho"] = {
        k: band[k] for k in ("region", "runs", "sharp", "agree")
    }
    axes[0].set_ylabel(r"$\sigma$")
    fig.colorbar(cs, ax=list(axes), fraction=0.015, pad=0.01, format="%.2f", label="value (loss units)")
    fig.suptitle(
        f"VSAM Fig. 1 ($\\rho$ = {VSAM_RHO}): red stars = local minima (gradient flow + Hessian / ring "
        "check); basin shares from gradient flow of seeded uniform starts, Wilson 95 % intervals",
        fontsize=9,
        y=1.12,
    )
    save_png(fig, out / "vsam_fig1.png")
    summary = ", ".join(f"{k} {_pct(stats[k]['sharp'])}" for k in "ABC")
    print(
        f"vsam_fig1: sharp basin by gradient flow (N = {n_main}, 95 %): {summary}; "
        f"A on sigma > rho {_pct(band['sharp'])}; agree at N = {list(n_starts)}: "
        f"{all(stats[k]['agree'] for k in 'ABC') and band['agree']}",
        flush=True,
    )
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
