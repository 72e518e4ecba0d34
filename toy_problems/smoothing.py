"""Smoothed versions of a 2-D loss (Ujváry et al. 2022, "Rethinking SAM as variational inference",
Fig. 1, rho = 8).

* ``gaussian_smoothed``: ``E_{eps ~ N(0, rho^2/p I)} L(theta + eps)`` (p = 2), the MFVI / Random-SAM
  objective with fixed ``Sigma = rho^2/p I`` (paper eq. 5 and §2), by tensor-product Gauss-Hermite
  quadrature (deterministic; ``n_quad`` nodes per axis).
* ``worst_case_ball``: the exact SAM objective ``max_{||eps|| <= rho} L(theta + eps)`` (paper eq. 1),
  by dense search on a polar grid covering the disc's interior and its boundary circle.
* ``sam_first_order``: the objective SAM actually follows, ``L(theta + rho g/||g||)``, ``g = grad L``
  (the first-order solution of the inner max; paper eq. 3).
* ``basins``: discrete steepest-descent basins of attraction on a grid, used to measure that the
  sharp minimum's basin shrinks (the paper's Fig. 1 claim).

All evaluate ``prob.loss(..., check=False)``: for the Gaussian mixture this is the even extension in
``sigma`` (the model depends on ``sigma^2`` only), which a Gaussian with unbounded support needs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from toy_problems.base import ToyProblem

__all__ = ["gaussian_smoothed", "worst_case_ball", "sam_first_order", "basins"]


def _chunks(theta: torch.Tensor, per_point: int, budget: int = 4_000_000):
    flat = theta.reshape(-1, theta.shape[-1])
    size = max(1, budget // max(per_point, 1))
    for i in range(0, flat.shape[0], size):
        yield flat[i : i + size]


@torch.no_grad()
def gaussian_smoothed(prob: ToyProblem, theta: torch.Tensor, rho: float, n_quad: int = 48) -> torch.Tensor:
    """``E_{eps ~ N(0, (rho^2/p) I)} L(theta + eps)`` by ``n_quad x n_quad`` Gauss-Hermite quadrature.

    ``p = prob.dim`` (2), so ``||eps||`` has root-mean-square ``rho`` (VSAM seed §2: RandomSAM with
    ``Sigma = rho^2/p I``)."""
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if n_quad < 1:
        raise ValueError(f"n_quad must be >= 1, got {n_quad}")
    theta = prob._as_tensor(theta)
    if prob.dim != 2:
        raise ValueError("gaussian_smoothed supports 2-D problems only")
    nodes, weights = np.polynomial.hermite_e.hermegauss(n_quad)
    std = rho / math.sqrt(prob.dim)
    nd = torch.as_tensor(nodes, dtype=theta.dtype, device=theta.device) * std
    wt = torch.as_tensor(weights / math.sqrt(2 * math.pi), dtype=theta.dtype, device=theta.device)
    e1, e2 = torch.meshgrid(nd, nd, indexing="ij")
    eps = torch.stack([e1.reshape(-1), e2.reshape(-1)], -1)  # [Q, 2]
    w = (wt[:, None] * wt[None, :]).reshape(-1)  # [Q]
    out = [(prob.loss(c[:, None, :] + eps, check=False) * w).sum(-1) for c in _chunks(theta, eps.shape[0])]
    return torch.cat(out).reshape(theta.shape[:-1])


@torch.no_grad()
def worst_case_ball(
    prob: ToyProblem, theta: torch.Tensor, rho: float, n_radii: int = 16, n_angles: int = 128
) -> torch.Tensor:
    """``max_{||eps||_2 <= rho} L(theta + eps)`` by dense search over ``n_radii`` circles (the last the
    boundary ``||eps|| = rho``) x ``n_angles`` directions, plus the centre."""
    if rho < 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    theta = prob._as_tensor(theta)
    r = torch.linspace(0, rho, n_radii + 1, dtype=theta.dtype, device=theta.device)[1:]
    a = torch.linspace(0, 2 * math.pi, n_angles + 1, dtype=theta.dtype, device=theta.device)[:-1]
    rr, aa = torch.meshgrid(r, a, indexing="ij")
    eps = torch.cat(
        [torch.zeros(1, 2, dtype=theta.dtype), torch.stack([rr * aa.cos(), rr * aa.sin()], -1).reshape(-1, 2)]
    )
    out = []
    for c in _chunks(theta, eps.shape[0]):
        v = prob.loss(c[:, None, :] + eps, check=False)
        v = torch.where(torch.isnan(v), torch.full_like(v, math.inf), v)
        out.append(v.amax(-1))
    return torch.cat(out).reshape(theta.shape[:-1])


def sam_first_order(prob: ToyProblem, theta: torch.Tensor, rho: float) -> torch.Tensor:
    """``L(theta + rho g / ||g||)`` with ``g = grad L(theta)`` (SAM's first-order inner solution,
    Foret et al. 2021 eq. 2; ``1e-12`` added to the norm as in the optimizer)."""
    theta = prob._as_tensor(theta).detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(prob.loss(theta, check=False).sum(), theta)
    with torch.no_grad():
        eps = rho * g / (g.norm(dim=-1, keepdim=True) + 1e-12)
        return prob.loss(theta.detach() + eps, check=False)


def basins(values: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Discrete steepest-descent basins on a 2-D grid of loss values.

    Each cell points to the lowest of itself and its 8 neighbours (NaN/inf count as +inf); following
    the pointers to a fixed point gives the local minimum it drains to. Returns ``(labels [n, m],
    minima)``: ``labels[i, j]`` indexes ``minima`` (list of ``(i, j)`` fixed points), -1 where the cell
    is not finite."""
    v = np.asarray(values, dtype=float)
    v = np.where(np.isfinite(v), v, np.inf)
    n, m = v.shape
    pad = np.pad(v, 1, constant_values=np.inf)
    idx = np.arange(n * m).reshape(n, m)
    pad_idx = np.pad(idx, 1, constant_values=-1)
    best = v.copy()
    ptr = idx.copy()
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if di == 0 and dj == 0:
                continue
            nb = pad[1 + di : 1 + di + n, 1 + dj : 1 + dj + m]
            nb_idx = pad_idx[1 + di : 1 + di + n, 1 + dj : 1 + dj + m]
            better = nb < best
            best = np.where(better, nb, best)
            ptr = np.where(better, nb_idx, ptr)
    ptr = ptr.reshape(-1)
    for _ in range(n * m):
        nxt = ptr[ptr]
        if np.array_equal(nxt, ptr):
            break
        ptr = nxt
    finite = np.isfinite(v).reshape(-1)
    roots = sorted(set(ptr[finite].tolist()))
    lookup = {r: k for k, r in enumerate(roots)}
    labels = np.array([lookup[p] if f else -1 for p, f in zip(ptr.tolist(), finite)]).reshape(n, m)
    return labels, [divmod(r, m) for r in roots]
