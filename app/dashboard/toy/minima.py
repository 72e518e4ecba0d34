"""Local minima of a smooth 2-D function by descent from candidates, with a second-order test.

:func:`descend_to_minima` runs a damped saddle-free Newton method from every start (batched: all
starts in one autograd pass per iteration), then keeps the points where the Newton step is at most
:data:`MIN_STEP_FRACTION` of the box width and the exact Hessian is positive definite, and merges
points closer than :data:`MERGE_FRACTION` of the width. The smoothed-objectives page counts the
minima of its smooth panels with it (``smoothed.smoothed_minima``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import toy_problems as tp

from .endpoints import CURVATURE_RTOL

__all__ = ["MERGE_FRACTION", "MIN_STEP_FRACTION", "descend_to_minima", "gaussian_smoothing"]

#: a minimum: Newton step at most this fraction of the box width, Hessian positive definite
MIN_STEP_FRACTION = 1e-6
#: two minima closer than this fraction of the box width are one
MERGE_FRACTION = 1e-3


def gaussian_smoothing(prob: tp.ToyProblem, rho: float, n_quad: int) -> Callable:
    """``theta [..., 2] -> E L(theta + eps)``, ``eps ~ N(0, rho^2/2 I)``, by the same tensor-product
    Gauss-Hermite rule as ``toy_problems.gaussian_smoothed`` but differentiable (autograd)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_quad)
    std = rho / math.sqrt(prob.dim)
    nd = torch.as_tensor(nodes, dtype=prob.dtype) * std
    wt = torch.as_tensor(weights / math.sqrt(2 * math.pi), dtype=prob.dtype)
    e1, e2 = torch.meshgrid(nd, nd, indexing="ij")
    eps = torch.stack([e1.reshape(-1), e2.reshape(-1)], -1)
    w = (wt[:, None] * wt[None, :]).reshape(-1)
    return lambda t: (prob.loss(t[..., None, :] + eps, check=False) * w).sum(-1)


def _derivatives(f: Callable, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Values ``[K]``, gradients ``[K, 2]`` and Hessians ``[K, 2, 2]`` of ``f`` at ``t [K, 2]``."""
    with torch.enable_grad():
        x = t.detach().clone().requires_grad_(True)
        v = f(x)
        (g,) = torch.autograd.grad(v.sum(), x, create_graph=True)
        rows = [torch.autograd.grad(g[:, i].sum(), x, retain_graph=True)[0] for i in range(x.shape[1])]
    return v.detach(), g.detach(), torch.stack(rows, 1).detach()


def _newton(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(descent direction, Newton step length, eigenvalues)`` per point: saddle-free Newton
    (``|lambda|`` in place of ``lambda``: downhill at saddles and maxima too)."""
    ev, vecs = torch.linalg.eigh(h)
    big = ev.abs().amax(-1, keepdim=True).clamp_min(1e-300)
    c = torch.einsum("kji,kj->ki", vecs, g)
    direction = -torch.einsum("kij,kj->ki", vecs, c / ev.abs().clamp_min(1e-12 * big))
    safe = torch.where(ev == 0, torch.full_like(ev, 1e-300), ev)
    return direction, (c / safe).norm(dim=-1), ev


def descend_to_minima(
    f: Callable, valid: Callable, starts: torch.Tensor, width: float, iters: int = 60
) -> dict[str, Any]:
    """Damped saddle-free Newton from every start (steps at most 0.1 ``width``, backtracking until
    the value falls and the point stays ``valid``), then the points where the Newton step is at most
    ``MIN_STEP_FRACTION x width`` and the Hessian positive definite, merged within
    ``MERGE_FRACTION x width``. Returns ``{"points" [M, 2], "values", "eigenvalues", "newton_steps",
    "gradients", "rejected"}`` (``rejected``: starts whose descent ended elsewhere)."""
    t = starts.detach().clone().reshape(-1, 2)
    if len(t) == 0:
        empty = torch.zeros(0, dtype=t.dtype)
        return {"points": t, "values": empty, "eigenvalues": t.clone(), "newton_steps": empty,
                "gradients": t.clone(), "rejected": 0}  # fmt: skip
    alphas = 0.5 ** torch.arange(0, 16, dtype=t.dtype)
    active = torch.ones(len(t), dtype=torch.bool)
    for _ in range(iters):
        idx = torch.nonzero(active).squeeze(1)
        if len(idx) == 0:
            break
        x = t[idx]
        v, g, h = _derivatives(f, x)
        d, step, _ = _newton(g, h)
        d = d * (0.1 * width / d.norm(dim=-1, keepdim=True).clamp_min(1e-300)).clamp(max=1.0)
        trial = x[:, None, :] + alphas[None, :, None] * d[:, None, :]  # [K, A, 2]
        with torch.no_grad():
            ft = f(trial)
        armijo = v[:, None] + 1e-4 * alphas[None, :] * (g * d).sum(-1)[:, None]
        ok = valid(trial) & torch.isfinite(ft) & (ft <= armijo)
        moved = ok.any(1)
        first = ok.to(torch.int8).argmax(1)
        new = torch.where(moved[:, None], trial[torch.arange(len(idx)), first], x)
        t[idx] = new
        converged = (step <= 1e-2 * MIN_STEP_FRACTION * width) | ((new - x).norm(dim=-1) <= 1e-10 * width)
        active[idx[~moved | converged]] = False
    v, g, h = _derivatives(f, t)
    _, step, ev = _newton(g, h)
    is_min = (
        (step <= MIN_STEP_FRACTION * width)
        & (ev[:, 0] > CURVATURE_RTOL * ev.abs().amax(-1))
        & valid(t)
        & torch.isfinite(v)
    )
    keep: list[int] = []
    for k in torch.argsort(v).tolist():  # lowest first: a duplicate keeps the lowest value
        if bool(is_min[k]) and all(float((t[k] - t[j]).norm()) > MERGE_FRACTION * width for j in keep):
            keep.append(k)
    keep.sort(key=lambda k: (float(t[k, 0]), float(t[k, 1])))
    return {
        "points": t[keep],
        "values": v[keep],
        "eigenvalues": ev[keep],
        "newton_steps": step[keep],
        "gradients": g[keep],
        "rejected": int((~is_min).sum()),
    }
