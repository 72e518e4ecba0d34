"""Average-case sharpness (Gaussian/uniform noise in the perturbation scale) and sharpness along
filter-normalised random directions (Li et al. 2018)."""

from __future__ import annotations

from typing import Any

import torch

from landscape.sharpness.common import (
    Ctx,
    check_choice,
    check_positive,
    make_generator,
    make_scale,
    mean_and_stderr,
)
from landscape.surface.directions import random as random_direction


# --------------------------------------------------------------------------------------------
# average case
# --------------------------------------------------------------------------------------------
def average_case(
    ctx: Ctx,
    *,
    rho: float = 0.01,
    scale: str | torch.Tensor | None = None,
    adaptive: bool = False,
    eta: float = 0.0,
    fisher: str = "empirical",
    noise: str = "gaussian",
    samples: int = 100,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Average-case sharpness ``E_delta L(w + delta) - L(w)`` with ``delta = rho * c * xi``.

    ``noise="gaussian"``: ``xi ~ N(0, I)``, i.e. ``delta ~ N(0, rho^2 diag(c^2))`` (``rho`` is a
    standard deviation; MFVI / RandomSAM, VSAM paper eq. 17, Prop. 3: ``~ 1/2 rho^2 Tr(diag(c^2) H)``).
    ``noise="uniform"``: ``xi ~ U[-1, 1]^p``, uniform in the L-inf ball of radius ``rho`` (in ``u``).
    Estimated with ``samples`` antithetic pairs ``(xi, -xi)``: each pair gives
    ``(L(w+delta) + L(w-delta))/2 - L(w)`` (the first-order term cancels exactly); ``stderr`` is the
    standard deviation of the pair values over ``sqrt(samples)``. The default (100 pairs) keeps the
    standard error below 10 % of the value for a well-conditioned Hessian (``H ~ lambda I``:
    relative std of one pair ``sqrt(2/p)``, so ``<= 10 %`` for every ``p >= 2``).
    """
    check_positive("rho", rho)
    check_positive("samples", samples, integer=True)
    if samples < 2:
        raise ValueError("samples must be >= 2 antithetic pairs for an error bar")
    check_choice("noise", noise, ("gaussian", "uniform"))
    if adaptive and scale not in (None, "adaptive"):
        raise ValueError(f"adaptive=True conflicts with scale={scale!r}; pass only one of them")
    if adaptive:
        scale = "adaptive"
    gen, seed_value = make_generator(seed)
    c, scale_cfg = make_scale(ctx, scale, eta, fisher=fisher)
    loss0 = ctx.loss()
    values = []
    for _ in ctx.tqdm(range(samples), desc="average case", leave=False):
        xi = ctx.randn(gen) if noise == "gaussian" else 2 * ctx.rand(gen) - 1
        delta = rho * c * xi
        values.append(0.5 * (ctx.loss(ctx.w0 + delta) + ctx.loss(ctx.w0 - delta)) - loss0)
    value, stderr = mean_and_stderr(values)
    cfg = dict(rho=rho, **scale_cfg, noise=noise, samples=samples, antithetic=True, seed=seed_value)
    return {"value": value, "stderr": stderr, "config": cfg, "extra": {"loss": loss0, "pair_values": values}}


# --------------------------------------------------------------------------------------------
# filter-normalised random directions (Li et al. 2018)
# --------------------------------------------------------------------------------------------
def filter_normalized_direction(
    obj, w: torch.Tensor, gen: torch.Generator, *, ignore_bias_bn: bool = True
) -> torch.Tensor:
    """A flat Gaussian direction with every filter rescaled to the norm of the matching filter of
    ``w`` (Li et al. 2018, Sec. 4, eq. 1: ``d_{i,j} <- d_{i,j} / ||d_{i,j}|| * ||theta_{i,j}||``; a
    filter is a slice along dim 0 of a parameter with >= 2 dims), drawn by
    :func:`landscape.surface.directions.random`. 1-D parameters (biases, BN) get a zero direction
    (``ignore_bias_bn=True``, Li et al.'s default) or the weights themselves."""

    d = random_direction(obj.unflatten(w), "filter", ignore_1d=True if ignore_bias_bn else "weight", seed=gen)
    return obj.flatten(d).to(w)


def directional(
    ctx: Ctx,
    *,
    directions: int | list[torch.Tensor] = 10,
    radius: float = 0.1,
    ignore_bias_bn: bool = True,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Mean (value, with its standard error) and max (``extra``) loss rise ``L(w + r d) - L(w)`` over
    ``K`` filter-normalised Gaussian directions ``d`` (Li et al. 2018, eq. 1). ``directions`` may be
    a list of flat vectors (used as given, e.g. for a fixed comparison)."""
    check_positive("radius", radius)
    gen, seed_value = make_generator(seed)
    if isinstance(directions, int):
        check_positive("directions", directions, integer=True)
        if directions < 2:
            raise ValueError("directions must be >= 2 for an error bar")
        ds = [
            filter_normalized_direction(ctx.obj, ctx.w0, gen, ignore_bias_bn=ignore_bias_bn)
            for _ in range(directions)
        ]
        given = False
    else:
        ds = [torch.as_tensor(d).reshape(-1).to(ctx.w0) for d in directions]
        if len(ds) < 2 or any(d.numel() != ctx.p for d in ds):
            raise ValueError(f"directions must be an int or a list of >= 2 flat vectors of length {ctx.p}")
        for i, d in enumerate(ds):
            if not bool(torch.isfinite(d).all()):
                raise ValueError(f"directions[{i}] contains NaN or inf entries; pass finite vectors")
            if not bool(d.any()):
                raise ValueError(f"directions[{i}] is all zero: the loss rise along it is 0 by construction")
        given = True
    loss0 = ctx.loss()
    rises = [ctx.loss(ctx.w0 + radius * d) - loss0 for d in ctx.tqdm(ds, desc="directions", leave=False)]
    value, stderr = mean_and_stderr(rises)
    cfg = dict(
        directions=len(ds),
        radius=radius,
        normalization="given" if given else "filter",
        ignore_bias_bn=ignore_bias_bn,
        seed=seed_value,
    )
    return {"value": value, "stderr": stderr, "config": cfg, "extra": {"max": max(rises), "rises": rises}}
