"""Jiang et al. 2020 ("Fantastic generalization measures and where to find them", Sec. 7 and
App. C.3-C.4): PAC-Bayes flatness and sharpness flatness found by bisection on the perturbation
scale, with their magnitude-aware versions.

``sigma`` is ALWAYS a standard deviation: the noise is ``u = sigma * xi`` with ``xi ~ N(0, I)``
(magnitude-aware: ``u_i = sqrt(sigma'^2 w_i^2 + eps^2) xi_i``, the standard deviation of
``N(0, sigma'^2 w_i^2 + eps^2)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from landscape.sharpness.common import Ctx, check_choice, check_positive, make_generator
from landscape.sharpness.worst_case import SOLVERS, _solve


def _criterion(ctx: Ctx, criterion: str) -> tuple[str, Callable[[torch.Tensor | None], float]]:
    if criterion == "auto":
        criterion = "error" if ctx.evaluate()["accuracy"] is not None else "loss"
    check_choice("criterion", criterion, ("error", "loss"))
    if criterion == "error":

        def crit(w: torch.Tensor | None) -> float:
            acc = ctx.evaluate(w)["accuracy"]
            if acc is None:
                raise ValueError("criterion='error' needs classification targets; use criterion='loss'")
            return 1.0 - acc

    else:

        def crit(w: torch.Tensor | None) -> float:
            return ctx.loss(w)

    return criterion, crit


def _bisect(
    deviation: Callable[[float], float], target: float, steps: int, start: float, max_doublings: int = 60
) -> tuple[float, list[tuple[float, float]]]:
    """Largest ``s`` with ``deviation(s) <= target``: bracket by doubling/halving from ``start``, then
    ``steps`` bisections at the geometric midpoint; returns the last feasible ``s`` (0 if even
    ``start / 2**max_doublings`` is infeasible, inf if ``start * 2**max_doublings`` is feasible)."""
    history: list[tuple[float, float]] = []

    def dev(s: float) -> float:
        d = deviation(s)
        history.append((s, d))
        return d

    # bracket: from a feasible start double until infeasible, from an infeasible one halve until feasible
    s = prev = start
    up = dev(s) <= target
    for _ in range(max_doublings):
        s = s * 2.0 if up else s / 2.0
        if (dev(s) <= target) != up:
            break
        prev = s
    else:
        return (math.inf if up else 0.0), history
    lo, hi = (prev, s) if up else (s, prev)
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        if dev(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo, history


def _inv_sq(s: float) -> float:
    return math.inf if s == 0 else 1.0 / s**2


def _flatness(
    name: str,
    plain: Callable[[float], float],
    magnitude: Callable[[float], float],
    *,
    target: float,
    steps: int,
    start: float,
    base: float,
    config: dict[str, Any],
) -> dict[str, Any]:
    """Bisect the plain and the magnitude-aware scale ``name`` (``sigma`` / ``alpha``) from ``start``;
    the value is ``1 / s*^2`` (Jiang et al. 2020, eqs. 49 and 53), the magnitude-aware one in
    ``extra`` with both bisection histories."""
    s, hist = _bisect(plain, target, steps, start)
    s_mag, hist_mag = _bisect(magnitude, target, steps, start)
    extra = {
        name: s,
        f"{name}_magnitude": s_mag,
        f"inv_{name}_magnitude_sq": _inv_sq(s_mag),
        "base": base,
        "bisection": hist,
        "bisection_magnitude": hist_mag,
    }
    return {"value": _inv_sq(s), "stderr": None, "config": config, "extra": extra}


def pacbayes_flatness(
    ctx: Ctx,
    *,
    target: float = 0.1,
    steps: int = 15,
    samples: int = 10,
    epsilon: float = 1e-3,
    criterion: str = "auto",
    start: float = 0.01,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """PAC-Bayes flatness (Jiang et al. 2020, eqs. 47-49 / measure "pacbayes.flatness"):
    ``sigma*`` is the largest standard deviation with ``E_{u ~ N(0, sigma^2 I)}[err(w + u)] - err(w)
    <= target``; value ``1 / sigma*^2``. The magnitude-aware ``sigma'*`` (measure
    "pacbayes.mag.flatness") uses ``u ~ N(0, sigma'^2 w^2 + epsilon^2)`` (elementwise variance);
    it is in ``extra`` (``sigma_magnitude``, ``inv_sigma_magnitude_sq``).

    The expectation is a mean over ``samples`` perturbations drawn as antithetic pairs
    (``xi, -xi``), the same draws for every ``sigma`` (common random numbers keep the bisection
    monotone). ``criterion``: ``"error"`` (0-1 error, classification), ``"loss"``, or ``"auto"``.
    """
    check_positive("target", target)
    check_positive("steps", steps, integer=True)
    check_positive("samples", samples, integer=True)
    if samples % 2:
        raise ValueError(f"samples must be even (antithetic pairs), got {samples}")
    check_positive("epsilon", epsilon, allow_zero=True)
    check_positive("start", start)
    gen, seed_value = make_generator(seed)
    criterion, crit = _criterion(ctx, criterion)
    base = crit(None)
    xis = [ctx.randn(gen) for _ in range(samples // 2)]
    xis = xis + [-x for x in xis]
    w_abs = ctx.w0.abs()

    def deviation_plain(sigma: float) -> float:
        return sum(crit(ctx.w0 + sigma * xi) for xi in xis) / len(xis) - base

    def deviation_mag(sigma: float) -> float:
        std = torch.sqrt(sigma**2 * w_abs**2 + epsilon**2)
        return sum(crit(ctx.w0 + std * xi) for xi in xis) / len(xis) - base

    cfg = dict(
        target=target,
        steps=steps,
        samples=samples,
        antithetic=True,
        epsilon=epsilon,
        criterion=criterion,
        start=start,
        seed=seed_value,
    )
    return _flatness(
        "sigma",
        deviation_plain,
        deviation_mag,
        target=target,
        steps=steps,
        start=start,
        base=base,
        config=cfg,
    )


def sharpness_flatness(
    ctx: Ctx,
    *,
    target: float = 0.1,
    steps: int = 15,
    epsilon: float = 1e-3,
    criterion: str = "auto",
    solver: str = "apgd",
    iterations: int = 10,
    restarts: int = 1,
    start: float = 0.01,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Sharpness flatness (Jiang et al. 2020, eqs. 50-53 / "sharpness.flatness"): ``alpha*`` is the
    largest ``alpha`` with ``max_{|u_i| <= alpha} err(w + u) - err(w) <= target``; value
    ``1 / alpha*^2``. The magnitude-aware ``alpha'*`` ("sharpness.mag.flatness") uses the box
    ``|u_i| <= alpha' |w_i| + epsilon``; it is in ``extra``. The maximisation ascends the loss
    (``worst_case`` machinery, p = inf) and evaluates the criterion at the best point found."""
    check_positive("target", target)
    check_positive("steps", steps, integer=True)
    check_positive("epsilon", epsilon, allow_zero=True)
    check_positive("start", start)
    check_choice("solver", solver, SOLVERS)
    check_positive("iterations", iterations, integer=True)
    check_positive("restarts", restarts, integer=True)
    gen, seed_value = make_generator(seed)
    criterion, crit = _criterion(ctx, criterion)
    base = crit(None)
    w_abs = ctx.w0.abs()

    def worst(c: torch.Tensor) -> float:
        _, _, u = _solve(ctx, c, 1.0, math.inf, solver, iterations, restarts, None, 0.75, gen)
        return crit(ctx.w0 + c * u) - base

    def deviation_plain(alpha: float) -> float:
        return worst(torch.full_like(ctx.w0, alpha))

    def deviation_mag(alpha: float) -> float:
        return worst(alpha * w_abs + epsilon)

    cfg = dict(
        target=target,
        steps=steps,
        epsilon=epsilon,
        criterion=criterion,
        solver=solver,
        iterations=iterations,
        restarts=restarts,
        start=start,
        seed=seed_value,
    )
    return _flatness(
        "alpha",
        deviation_plain,
        deviation_mag,
        target=target,
        steps=steps,
        start=start,
        base=base,
        config=cfg,
    )
