"""Spectral density by stochastic Lanczos quadrature (SLQ).

For a unit start vector ``v``, ``m`` Lanczos steps give a tridiagonal ``T_m`` whose eigenpairs
``(theta_j, u_j)`` define the ``m``-point Gauss quadrature rule of the spectral measure
``mu_v = sum_i (v^T q_i)^2 delta_{lambda_i}``: nodes ``theta_j``, weights ``tau_j = (e_1^T u_j)^2``,
exact for polynomials of degree ``<= 2m - 1`` (Golub & Meurant, "Matrices, moments and
quadrature", 1994, Thm. 6.2).  Averaging over Rademacher start vectors ``v = z / sqrt(p)`` estimates
the spectral density ``phi(t) = (1/p) sum_i delta(t - lambda_i)``; Gaussian broadening gives

    phi_sigma(t) = (1/n_v) sum_l sum_j tau_j^l N(t; theta_j^l, sigma^2)

(Lin, Saad & Yang, SIAM Review 58(1), 2016, Sec. 3.2 and eq. (3.10); Ubaru, Chen & Saad, SIAM J.
Matrix Anal. Appl. 38(4), 2017; Ghorbani, Krishnan & Xiao, ICML 2019, Sec. 2).  Each run also
gives a Hutchinson sample of the trace, ``p sum_j tau_j theta_j = z^T A z``, whose spread gives
``trace_stderr``.

Budget.  At least one run and two Lanczos steps (a one-step run is a single node at the Rayleigh
quotient: no density); smaller values raise ``ValueError`` before any product.  Steps beyond ``p``
are not taken (``p`` steps already integrate exactly).  One run has no spread: ``trace_stderr`` is
then NaN and ``trace_stderr_reason`` says why (it is empty whenever ``trace_stderr`` is a number).

All runs advance in lock step, so each Lanczos step is one ``matmat`` with ``runs`` columns.  With
``reorth=True`` every new vector is orthogonalised twice against all previous ones of its run (full
reorthogonalisation; memory ``runs * steps * p`` floats); with ``reorth=False`` the plain three-term
recurrence is used (Paige 1976), which keeps the quadrature weights accurate but may produce
spurious copies ("ghosts") of converged extreme nodes.  The tridiagonal eigenproblems are solved
with ``scipy.linalg.eigh_tridiagonal``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from landscape.checks import check_budget, check_int, check_positive, check_seed
from landscape.curvature.linop import as_linop, make_generator, rademacher, seed_config
from landscape.results import Result

__all__ = ["DensityResult", "spectral_density"]


@dataclass
class DensityResult(Result):
    """A broadened spectral density with the quadrature nodes/weights of every run."""

    grid: torch.Tensor | None = None
    density: torch.Tensor | None = None
    nodes: list[list[float]] = field(default_factory=list)
    weights: list[list[float]] = field(default_factory=list)
    trace: float = math.nan
    trace_stderr: float = math.nan
    trace_stderr_reason: str = ""
    matvecs: int = 0
    sigma: float = 0.0
    p: int = 0

    kind: ClassVar[str] = "density"
    tensor_fields: ClassVar[tuple[str, ...]] = ("grid", "density")

    def moments(self, k: int) -> float:
        """Quadrature estimate of ``tr(A^k) / p`` (average over runs of ``sum_j tau_j theta_j^k``)."""
        vals = [
            float(np.sum(np.asarray(w) * np.asarray(n, dtype=np.float64) ** k))
            for n, w in zip(self.nodes, self.weights)
        ]
        return float(np.mean(vals))

    def plot(self, ax=None, log: bool = False, **kwargs):
        """Plot the density on ``ax`` (a new figure if None); ``log=True`` uses a log density axis."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.2))
        x = self.grid.numpy()
        y = self.density.numpy()
        if log:
            y = np.maximum(y, np.max(y) * 1e-12 if np.max(y) > 0 else 1e-300)
            ax.semilogy(x, y, **kwargs)
        else:
            ax.plot(x, y, **kwargs)
        ax.set_xlabel("eigenvalue")
        ax.set_ylabel("density" + (" (log)" if log else ""))
        ax.set_title(f"SLQ: {len(self.nodes)} runs, sigma={self.sigma:.3g}")
        return ax


def _lanczos_lockstep(A, V0: torch.Tensor, steps: int, reorth: bool):
    """Run ``V0.shape[1]`` independent Lanczos processes in lock step; returns alphas/betas per run."""
    p, runs = V0.shape
    dev = A.device
    V = V0 / torch.linalg.vector_norm(V0, dim=0)
    alphas = torch.zeros(runs, steps, dtype=torch.float64)
    betas = torch.zeros(runs, steps, dtype=torch.float64)
    lengths = torch.full((runs,), steps, dtype=torch.long)
    active = torch.ones(runs, dtype=torch.bool)
    basis = torch.zeros(runs, steps, p, dtype=torch.float64, device=dev) if reorth else None
    prev = torch.zeros_like(V)
    beta_prev = torch.zeros(runs, dtype=torch.float64, device=dev)
    scale = torch.zeros(runs, dtype=torch.float64, device=dev)
    for j in range(steps):
        idx = torch.nonzero(active).flatten()
        if idx.numel() == 0:
            break
        Vi = V[:, idx]
        W = A.matmat(Vi)
        scale[idx] = torch.maximum(scale[idx], torch.linalg.vector_norm(W, dim=0))
        a = (Vi * W).sum(0)
        W = W - Vi * a - prev[:, idx] * beta_prev[idx]
        if reorth:
            basis[idx, j] = Vi.T
            Bk = basis[idx, : j + 1]  # [r, j+1, p]
            for _ in range(2):
                W = W - torch.einsum("rjp,rj->pr", Bk, torch.einsum("rjp,pr->rj", Bk, W))
        b = torch.linalg.vector_norm(W, dim=0)
        alphas[idx, j] = a.cpu()
        betas[idx, j] = b.cpu()
        broke = b <= 1e-12 * torch.clamp(scale[idx], min=1e-300)
        for r_local, r in enumerate(idx.tolist()):
            if bool(broke[r_local]):  # invariant Krylov subspace: the quadrature is already exact
                lengths[r] = j + 1
                active[r] = False
        prev[:, idx] = Vi
        beta_prev[idx] = b
        V[:, idx] = W / torch.clamp(b, min=1e-300)
    return alphas, betas, lengths


def spectral_density(
    op: Any,
    runs: int = 10,
    lanczos_steps: int = 80,
    *,
    reorth: bool = True,
    sigma: float | None = None,
    grid: int | torch.Tensor | None = None,
    seed: int | torch.Generator | None = 0,
    probes: torch.Tensor | None = None,
    progress: bool = False,
    compile: bool | str = "auto",
) -> DensityResult:
    """Spectral density of a symmetric operator by stochastic Lanczos quadrature.

    Args:
        op: linear operator, dense symmetric tensor or Objective (its Hessian).
        runs: number of random start vectors (Rademacher, normalised), at least 1 (2 for
            ``trace_stderr``).
        lanczos_steps: Lanczos steps per run, at least 2 (capped at ``p``); a run stops early on
            breakdown.
        reorth: full reorthogonalisation (default) or the plain three-term recurrence.
        sigma: Gaussian broadening width; default 1 % of the range of the nodes.
        grid: number of grid points (an integer, default 1000) spanning the nodes +- 5 sigma, or
            the grid itself (a 1-D tensor or sequence of values).
        seed: int or ``torch.Generator``.
        probes: optional ``[p, runs]`` start vectors (normalised internally) instead of random ones.
        progress: accepted for API symmetry (the lock-step runs show no per-step bar).
        compile: ``"auto"`` (default), ``True`` or ``False``: compile a Hessian or GGN operator's
            products when the ``runs x lanczos_steps`` of them pay for it
            (:mod:`landscape.curvature.autocompile`).

    Returns:
        :class:`DensityResult`: ``grid``, ``density`` (integrates to 1), per-run ``nodes`` and
        ``weights``, ``trace`` (mean over runs of ``p sum_j tau_j theta_j``) and ``trace_stderr``
        (NaN for one run, with ``trace_stderr_reason``).
    """
    from scipy.linalg import eigh_tridiagonal

    t0 = time.perf_counter()
    check_budget(
        "runs", runs, 1, who="spectral_density", why="the density is an average over random start vectors"
    )
    check_budget(
        "lanczos_steps",
        lanczos_steps,
        2,
        who="spectral_density",
        why="one Lanczos step gives a single quadrature node per run (the Rayleigh quotient), no density",
    )
    if sigma is not None:
        check_positive("sigma", sigma)
    check_seed(seed)
    g_given = None
    if grid is None or np.ndim(grid) == 0:  # a count (a float, a 0-d tensor: refused, not a grid)
        npts = 1000 if grid is None else check_int("grid", grid, minimum=2)
    else:
        g_given = torch.as_tensor(grid, dtype=torch.float64).flatten()
        if g_given.numel() == 0 or not bool(torch.isfinite(g_given).all()):
            raise ValueError(
                "grid must be a number of points (int >= 2) or a non-empty tensor of finite values"
            )
    n_runs = probes.shape[-1] if isinstance(probes, torch.Tensor) and probes.ndim == 2 else runs
    A = as_linop(op, compile=compile, products=n_runs * lanczos_steps)
    p = A.p
    steps = min(lanczos_steps, p)
    gen = make_generator(seed)
    if probes is not None:
        if not isinstance(probes, torch.Tensor) or probes.numel() == 0 or probes.numel() % p:
            got = tuple(probes.shape) if isinstance(probes, torch.Tensor) else type(probes).__name__
            raise ValueError(f"probes must be a tensor of shape [p, runs] with p = {p}, got {got}")
        V0 = probes.reshape(p, -1).to(device=A.device, dtype=torch.float64)
        runs = V0.shape[1]
        if not bool(torch.isfinite(V0).all()):
            raise ValueError("probes contain NaN or inf entries; pass finite start vectors")
        if bool((torch.linalg.vector_norm(V0, dim=0) == 0).any()):
            raise ValueError("probes must be non-zero vectors")
    else:
        V0 = rademacher(p, runs, gen, A.device)
    alphas, betas, lengths = _lanczos_lockstep(A, V0, steps, reorth)
    nodes, weights, traces = [], [], []
    for r in range(runs):
        m = int(lengths[r])
        a = alphas[r, :m].numpy()
        b = betas[r, : m - 1].numpy()
        if m == 1:
            th, U = a.copy(), np.ones((1, 1))
        else:
            th, U = eigh_tridiagonal(a, b)
        w = U[0, :] ** 2
        nodes.append(th.tolist())
        weights.append(w.tolist())
        traces.append(p * float(np.sum(w * th)))
    all_nodes = np.concatenate([np.asarray(n) for n in nodes])
    lo, hi = float(all_nodes.min()), float(all_nodes.max())
    if sigma is None:
        sigma = 0.01 * (hi - lo) if hi > lo else 1e-3 * max(abs(hi), 1.0)
    if g_given is None:
        g = torch.linspace(lo - 5 * sigma, hi + 5 * sigma, npts, dtype=torch.float64)
    else:
        g = g_given
    gn = g.numpy()[:, None]
    dens = np.zeros(gn.shape[0])
    for th, w in zip(nodes, weights):
        th, w = np.asarray(th)[None, :], np.asarray(w)[None, :]
        dens += (w * np.exp(-0.5 * ((gn - th) / sigma) ** 2)).sum(1) / (sigma * math.sqrt(2 * math.pi))
    dens /= runs
    tr = np.asarray(traces)
    stderr, reason = math.nan, ""
    if runs > 1:
        stderr = float(tr.std(ddof=1) / math.sqrt(runs))
    else:
        reason = "one run: no spread over start vectors to estimate an error from; pass runs >= 2"
    config = {
        "method": "stochastic lanczos quadrature",
        "runs": runs,
        "lanczos_steps": steps,
        "reorth": reorth,
        "sigma": sigma,
        "seed": seed_config(seed) if probes is None else "probes",
        "operator": A.config(),
    }
    return DensityResult(
        config=config,
        seconds=time.perf_counter() - t0,
        grid=g,
        density=torch.as_tensor(dens, dtype=torch.float64),
        nodes=nodes,
        weights=weights,
        trace=float(tr.mean()),
        trace_stderr=stderr,
        trace_stderr_reason=reason,
        matvecs=A.matvecs,
        sigma=float(sigma),
        p=p,
    )
