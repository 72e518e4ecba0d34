"""Curvature-based sharpness: extreme Hessian eigenvalues, traces of the Hessian / GGN / Fisher, the
gradient norms behind SAM's first-order penalty and the G-TRACER trace ratio."""

from __future__ import annotations

import math
from typing import Any

import torch

from landscape.checks import check_seed
from landscape.curvature import likelihoods as L
from landscape.curvature.eigen import eigenvalues
from landscape.curvature.ggn import ggn
from landscape.curvature.hessian import hessian
from landscape.curvature.trace import trace
from landscape.sharpness.common import (
    Ctx,
    check_choice,
    check_positive,
    make_generator,
    make_scale,
    mean_and_stderr,
    per_example_gradients,
    split_data,
)


def _seed_cfg(seed: Any) -> Any:
    return "generator" if isinstance(seed, torch.Generator) else seed


def lambda_max(
    ctx: Ctx,
    *,
    k: int = 1,
    tol: float = 1e-6,
    smallest: bool = True,
    max_matvecs: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Largest Hessian eigenvalue (and, with ``smallest=True``, the smallest: negative at saddles)
    by restarted Lanczos (``landscape.eigenvalues``) on the Hessian operator. ``k > 1`` also returns
    the top-``k`` in ``extra``. A pair is converged when its true residual is below
    ``tol * |lambda|`` (the smallest: below ``tol * lambda_max``); the flags are in ``extra``."""

    check_positive("k", k, integer=True)
    check_positive("tol", tol)
    if max_matvecs is not None:
        check_positive("max_matvecs", max_matvecs, integer=True)
    check_seed(seed)
    if k > ctx.p:
        raise ValueError(f"k = {k} exceeds the number of parameters p = {ctx.p}; pass k <= {ctx.p}")
    op = hessian(ctx.obj)
    kw: dict[str, Any] = dict(tol=tol, seed=seed, return_vectors=False)
    if max_matvecs is not None:
        kw["max_matvecs"] = max_matvecs
    top = eigenvalues(op, k=k, which="largest", **kw)
    extra: dict[str, Any] = {
        "top": top.values.tolist(),
        "residuals": top.residuals.tolist(),
        "converged": list(top.converged),
    }
    if smallest:
        # converged when the residual is below tol * lambda_max (the smallest eigenvalue is often
        # ~0, where a relative tolerance on itself would never be met)
        low = eigenvalues(op, k=1, which="smallest", atol=tol * abs(float(top.values[0])), **kw)
        extra.update(
            smallest=float(low.values[0]),
            smallest_residual=float(low.residuals[0]),
            smallest_converged=bool(low.converged[0]),
        )
    ctx.counts["hvp"] += int(op.matvecs)
    cfg = dict(k=k, tol=tol, smallest=smallest, max_matvecs=max_matvecs, seed=seed, method="lanczos")
    return {"value": float(top.values[0]), "stderr": None, "config": cfg, "extra": extra}


def _trace_of(ctx: Ctx, op, method: str, rtol: float, max_matvecs: int, seed: Any) -> dict[str, Any]:

    res = trace(op, method=method, rtol=rtol, max_matvecs=max_matvecs, seed=seed)
    ctx.counts["hvp"] += int(op.matvecs)
    # trace() refuses a budget without an error bar, so a stochastic estimate always has one; only
    # the exact trace (method "exact", or a Hutch++ sketch spanning the space) is deterministic
    stderr = None if res.method == "exact" else float(res.stderr)
    extra = {
        "trace_per_param": float(res.value) / ctx.p,
        "method_used": res.method,
        "converged": res.converged,
    }
    cfg = dict(method=method, rtol=rtol, max_matvecs=max_matvecs, seed=_seed_cfg(seed))
    return {"value": float(res.value), "stderr": stderr, "config": cfg, "extra": extra}


def hessian_trace(
    ctx: Ctx, *, method: str = "hutchpp", rtol: float = 1e-2, max_matvecs: int = 100, seed: int = 0
) -> dict[str, Any]:
    """``Tr H`` with a standard error (Hutchinson / Hutch++ / XTrace, ``landscape.curvature.trace``) and the
    per-parameter average ``Tr(H)/p`` in ``extra``. ``max_matvecs`` must buy an error bar (Hutch++: at
    least 4, see :func:`landscape.curvature.trace.trace`); one whose Hutch++ sketch spans all ``p``
    parameters (``max_matvecs >= 3p``) gives the exact trace, ``stderr`` None."""

    return _trace_of(ctx, hessian(ctx.obj), method, rtol, max_matvecs, seed)


def ggn_trace(
    ctx: Ctx, *, method: str = "hutchpp", rtol: float = 1e-2, max_matvecs: int = 100, seed: int = 0
) -> dict[str, Any]:
    """``Tr G`` of the generalised Gauss-Newton matrix ``sum_k w_k J_k^T H_out J_k`` (randomised
    trace estimator with a standard error; ``method="exact"`` for ``p`` matvecs)."""

    return _trace_of(ctx, ggn(ctx.obj), method, rtol, max_matvecs, seed)


def fisher_trace(
    ctx: Ctx,
    *,
    kind: str = "empirical",
    samples: int = 10,
    likelihood: str | None = None,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Trace of a Fisher matrix, computed exactly from per-example gradients.

    ``kind="empirical"``: ``Tr F_emp = c sum_n ||grad loss(f(x_n), y_n)||^2`` (deterministic; FSAM
    paper eq. 11 summed over parameters), ``c = 1/N`` (mean reduction) or ``1`` (sum).
    ``kind="mc"``: the Monte-Carlo Fisher of the loss's own likelihood,
    ``a sum_n ||grad nll(f(x_n), y~_n)||^2`` with labels ``y~`` drawn from it
    (:mod:`landscape.curvature.likelihoods`: categorical / ``N(f, 1/2)`` for MSE / Bernoulli),
    ``nll`` summed over the example's ``m`` loss terms and ``a = 1/(N m)`` (mean) or ``1`` (sum), so
    that its expectation is ``Tr G``; averaged over ``samples`` draws, the standard error over the draws.
    """
    check_choice("kind", kind, ("empirical", "mc"))
    if kind == "empirical":
        value = float(per_example_gradients(ctx).sum())
        extra = {"trace_per_param": value / ctx.p}
        return {"value": value, "stderr": None, "config": {"kind": kind}, "extra": extra}

    check_positive("samples", samples, integer=True)
    if samples < 2:
        raise ValueError("kind='mc' needs samples >= 2 for an error bar")
    lik = L.check_likelihood(likelihood or L.infer_likelihood(ctx.obj.loss_fn))
    gen, seed_value = make_generator(seed)
    obj = ctx.obj
    x0, _, _ = next(iter(obj.batches()))
    with torch.no_grad():
        terms = L.terms_per_example(lik, obj.forward(obj.unflatten(ctx.w0), x0).shape[1:])
    a = L.fisher_term_scale(obj.reduction, obj.num_examples, terms)

    def draw(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = L.sample_targets(out, lik, 1, gen)[0]
        return t.to(device=out.device, dtype=torch.long if lik == "categorical" else out.dtype)

    def trace_once() -> float:
        return float(per_example_gradients(ctx, targets_fn=draw, loss_fn=L.nll_sum(lik), c=a).sum())

    traces = [trace_once() for _ in range(samples)]
    value, stderr = mean_and_stderr(traces)
    cfg = {"kind": kind, "samples": samples, "likelihood": lik, "seed": seed_value}
    return {"value": value, "stderr": stderr, "config": cfg, "extra": {"trace_per_param": value / ctx.p}}


def gradient_norm(
    ctx: Ctx,
    *,
    rho: float = 0.05,
    scale: str | torch.Tensor | None = None,
    adaptive: bool = False,
    eta: float = 0.0,
    fisher: str = "empirical",
) -> dict[str, Any]:
    """``||g||_2`` (value) and ``||g||_Sigma = sqrt(g^T Sigma g)`` with ``Sigma = (rho^2/p) diag(c^2)``
    (VSAM seed, eq. 1 and Prop. 1): SAM's first-order penalty ``sqrt(p) ||g||_Sigma = rho ||c g||_2``
    is in ``extra["sam_penalty"]`` (the small-``rho`` limit of the one-step worst case)."""
    check_positive("rho", rho)
    if adaptive and scale not in (None, "adaptive"):
        raise ValueError(f"adaptive=True conflicts with scale={scale!r}; pass only one of them")
    if adaptive:
        scale = "adaptive"
    c, scale_cfg = make_scale(ctx, scale, eta, fisher=fisher)
    g = ctx.gradient()
    norm_sigma = rho / math.sqrt(ctx.p) * float((c * g).norm())
    extra = {
        "norm_sigma": norm_sigma,
        "sam_penalty": math.sqrt(ctx.p) * norm_sigma,
        "norm_inf": float(g.abs().max()),
    }
    return {"value": float(g.norm()), "stderr": None, "config": dict(rho=rho, **scale_cfg), "extra": extra}


def tracer(
    ctx: Ctx,
    *,
    f_bar: torch.Tensor | dict[str, torch.Tensor] | None = None,
    delta: float = 1e-8,
    batch_size: int = 32,
) -> dict[str, Any]:
    """G-TRACER trace ratio ``T = <g^2, 1/(f_bar + delta)>`` (G-TRACER seed, Alg. 1 and eq. 58), the
    coordinate-free flatness penalty ``Tr(F F_bar^{-1})`` in its diagonal form; ``g`` is the gradient
    of the objective's loss.

    ``f_bar`` is the optimiser's exponential moving average of squared mini-batch gradients (flat
    ``[p]`` or a dict; e.g. the ``SGDTracer`` state). Without it, ``f_bar`` is the mean over
    consecutive mini-batches of ``batch_size`` examples of the squared mini-batch gradient
    ``(grad L_B)^2`` -- the stationary value of that EMA at fixed ``w`` (a sum-reduced loss uses the
    same mini-batch losses). ``T ~ p`` when the gradient noise is negligible and ``T << p`` when
    the per-batch gradients fluctuate a lot relative to their mean.
    """
    check_positive("delta", delta, allow_zero=True)
    if f_bar is None:
        check_positive("batch_size", batch_size, integer=True)
    g = ctx.gradient()
    if f_bar is None:
        batches = split_data(ctx.obj, batch_size)
        acc = torch.zeros_like(g)
        for x, y in ctx.tqdm(batches, desc="f_bar", leave=False):
            acc += ctx.child(ctx.obj.with_data([(x, y)])).gradient() ** 2
        fb = acc / len(batches)
        source = f"mean of squared gradients over {len(batches)} mini-batches of {batch_size}"
    else:
        fb = ctx.obj.flatten(f_bar) if isinstance(f_bar, dict) else torch.as_tensor(f_bar)
        fb = fb.reshape(-1).to(g)
        if fb.numel() != ctx.p:
            raise ValueError(f"f_bar has {fb.numel()} entries but the objective has {ctx.p} parameters")
        if not bool(torch.isfinite(fb).all()):
            raise ValueError("f_bar contains NaN or inf entries; pass a finite average of squared gradients")
        if bool(torch.any(fb < 0)):
            raise ValueError("f_bar must be non-negative (an average of squared gradients)")
        source = "given"
    if delta == 0 and not bool(torch.all(fb > 0)):
        raise ValueError("f_bar has zero entries: pass delta > 0")
    value = float((g**2 / (fb + delta)).sum())
    cfg = dict(delta=delta, f_bar=source, batch_size=batch_size if f_bar is None else None)
    return {"value": value, "stderr": None, "config": cfg, "extra": {"ratio_per_param": value / ctx.p}}
