"""Smoothed versions of a 2-D loss (Ujváry et al. 2022, "Rethinking SAM as variational inference",
Fig. 1, rho = 8).

* ``gaussian_smoothed``: ``E_{eps ~ N(0, rho^2/p I)} L(theta + eps)`` (p = 2), the MFVI / Random-SAM
  objective with fixed ``Sigma = rho^2/p I`` (paper eq. 5 and §2), by tensor-product Gauss-Hermite
  quadrature (deterministic; ``n_quad`` nodes per axis).
* ``gaussian_smoothed_even``: the same expectation, accurate to ~1e-7 for a loss that is even in
  ``theta_2`` with an integrable singularity at ``theta_2 = 0`` (the Gaussian mixture), where the
  tensor Gauss-Hermite rule (48 nodes) is off by up to 0.035 for ``rho < sigma < 12`` (spurious
  minima).
* ``worst_case_ball``: the exact SAM objective ``max_{||eps|| <= rho} L(theta + eps)`` (paper eq. 1),
  by dense search on a polar grid covering the disc's interior and its boundary circle.
* ``worst_case_circle``: ``max_{||eps|| = rho} L(theta + eps)`` refined by Newton's method in the
  angle (equal to the ball maximum for losses without interior local maxima), with the maximiser.
* ``sam_first_order``: the objective SAM actually follows, ``L(theta + rho g/||g||)``, ``g = grad L``
  (the first-order solution of the inner max; paper eq. 3).
* ``basins``: discrete steepest-descent basins on a grid (they depend on the grid: quadrature
  error and kinks make grid-local minima; VSAM Fig. 1 uses basins of gradient flow instead,
  ``toy_problems._flow_basins``).

All evaluate ``prob.loss(..., check=False)``: for the Gaussian mixture this is the even extension in
``sigma`` (the model depends on ``sigma^2`` only), which a Gaussian with unbounded support needs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from toy_problems.base import ToyProblem

__all__ = [
    "gaussian_smoothed",
    "gaussian_smoothed_even",
    "worst_case_ball",
    "worst_case_circle",
    "sam_first_order",
    "basins",
]


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


def _gauss_legendre01(n: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    v, w = np.polynomial.legendre.leggauss(n)
    return torch.as_tensor((v + 1) / 2, dtype=dtype), torch.as_tensor(w / 2, dtype=dtype)


def gaussian_smoothed_even(
    prob: ToyProblem,
    theta: torch.Tensor,
    rho: float,
    n_quad: int = 8,
    n_far: int = 32,
    n_near: int = 12,
    split: float = 1.0,
) -> torch.Tensor:
    """``E_{eps ~ N(0, s^2 I)} L(theta + eps)``, ``s = rho/sqrt(2)``, for a loss even in ``theta_2``
    with an integrable (log) singularity at ``theta_2 = 0``; differentiable (no ``no_grad``).

    With ``theta = (mu, sigma)`` and ``L(mu, u) = L(mu, -u)``::

        B(mu, sigma) = int phi_s(x) int_0^inf L(mu + x, u) K(u) du dx,
        K(u) = phi_s(u - sigma) + phi_s(u + sigma).

    ``x``: Gauss-Hermite, ``n_quad`` nodes (``L`` is smooth in ``mu``). ``u`` in ``(0, c]``,
    ``c = split``: ``u = c v^4`` with ``n_near`` Gauss-Legendre nodes in ``v`` (``du = 4 c v^3 dv``
    turns ``log u`` into the integrable-smooth ``v^3 log v``); ``u`` in ``[c, |sigma| + 8.5 s]``:
    ``n_far`` Gauss-Legendre nodes (``K < 1e-16`` beyond). The near nodes are fixed and the far ones
    affine in ``sigma``, so the rule is a smooth function of ``theta`` (no stripes). Against a
    reference (trapezoid in ``log u``, step 0.004, x 64 Gauss-Hermite nodes) on
    ``[-40, 40] x [1, 51]`` at ``rho = 8`` the defaults are within 5e-8 (gradient 2e-8)."""
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}")
    theta = prob._as_tensor(theta)
    if prob.dim != 2:
        raise ValueError("gaussian_smoothed_even supports 2-D problems only")
    dt = theta.dtype
    s = rho / math.sqrt(2)
    xm, wm = np.polynomial.hermite_e.hermegauss(n_quad)
    xm = torch.as_tensor(xm * s, dtype=dt)
    wm = torch.as_tensor(wm / math.sqrt(2 * math.pi), dtype=dt)
    v0, w0 = _gauss_legendre01(n_near, dt)
    v1, w1 = _gauss_legendre01(n_far, dt)
    mu, sig = theta[..., 0:1], theta[..., 1:2].abs()
    hi = sig + 8.5 * s
    u = torch.cat(
        [(split * v0**4).expand_as(hi.expand(*hi.shape[:-1], n_near)), split + (hi - split) * v1], -1
    )
    wu = torch.cat([(4 * split * v0**3 * w0).expand(*hi.shape[:-1], n_near), (hi - split) * w1], -1)
    K = (torch.exp(-0.5 * ((u - sig) / s) ** 2) + torch.exp(-0.5 * ((u + sig) / s) ** 2)) / (
        s * math.sqrt(2 * math.pi)
    )
    M, U = torch.broadcast_tensors((mu + xm)[..., :, None], u[..., None, :])
    vals = prob.loss(torch.stack([M, U], -1), check=False)
    return (vals * wm[:, None] * (K * wu)[..., None, :]).sum((-1, -2))


def worst_case_circle(
    prob: ToyProblem, theta: torch.Tensor, rho: float, n_angles: int = 64, newton_steps: int = 4
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(max_phi L(theta + rho e(phi)), eps*)`` with ``e(phi) = (cos phi, sin phi)``, for ``theta
    [N, 2]`` (no autograd; ``eps*`` is the maximiser).

    ``n_angles`` equally spaced angles locate the two largest local maxima of ``f(phi) =
    L(theta + rho e(phi))``; each is refined by Newton's method ``phi <- phi - f'/f''`` with central
    differences (``f' = (f(phi+d) - f(phi-d))/2d``, ``f'' = (f(phi+d) - 2 f(phi) + f(phi-d))/d^2``,
    ``d = 1e-4``), steps clipped to the coarse spacing; the larger wins, and the result is never below
    the coarse maximum. Where ``L`` has no local maximum inside the ball (the Gaussian mixture: a
    dense search over 16 radii, ``worst_case_ball``, never beats the boundary) this is the worst case
    over the ball, SAM's objective (VSAM eq. 1); against 8192 angles it is higher by at most 3e-6 and
    never lower. By Danskin's theorem its gradient is ``grad L(theta + eps*)`` where the maximiser is
    unique."""
    theta = prob._as_tensor(theta).detach().reshape(-1, 2)
    dt = theta.dtype
    da = 2 * math.pi / n_angles
    a = torch.arange(n_angles, dtype=dt) * da

    def f(phi):
        v = prob.loss(theta[:, None, :] + rho * torch.stack([phi.cos(), phi.sin()], -1), check=False)
        return torch.where(torch.isnan(v), torch.full_like(v, math.inf), v)

    with torch.no_grad():
        V = f(a.expand(theta.shape[0], n_angles))
        is_max = (V >= V.roll(1, -1)) & (V >= V.roll(-1, -1))
        masked = torch.where(is_max, V, torch.full_like(V, -math.inf)).topk(2, dim=-1)
        phi = a[masked.indices]  # [N, 2]; a single local maximum is refined twice
        phi = torch.where(torch.isinf(masked.values) & (masked.values < 0), phi[:, :1], phi)
        d = 1e-4
        for _ in range(newton_steps):
            F = f(torch.cat([phi - d, phi, phi + d], -1))
            fm, f0, fp = F[:, :2], F[:, 2:4], F[:, 4:]
            d1 = (fp - fm) / (2 * d)
            d2 = (fp - 2 * f0 + fm) / (d * d)
            step = torch.where(d2 < 0, -d1 / d2, torch.sign(d1) * da / 4)
            phi = phi + torch.nan_to_num(step, nan=0.0, posinf=0.0, neginf=0.0).clamp(-da, da)
        fv = f(phi)
        best = fv.argmax(-1, keepdim=True)
        val = fv.gather(1, best)[:, 0]
        ph = phi.gather(1, best)[:, 0]
        coarse = V.max(-1)
        use_coarse = coarse.values > val
        val = torch.where(use_coarse, coarse.values, val)
        ph = torch.where(use_coarse, a[coarse.indices], ph)
    return val, rho * torch.stack([ph.cos(), ph.sin()], -1)


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
