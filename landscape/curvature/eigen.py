"""Extreme eigenpairs of symmetric operators: thick-restart block Lanczos and power iteration.

:func:`eigenvalues` is a *thick-restart* Lanczos method (Wu & Simon, "Thick-restart Lanczos method
for large symmetric eigenvalue problems", SIAM J. Matrix Anal. Appl. 22(2), 2000; block form as in
Zhou & Saad 2008) with full reorthogonalisation (classical Gram-Schmidt applied twice, "CGS2",
Giraud et al. 2005), in float64 whatever the operator's dtype.

Why thick restart rather than implicit restart (ARPACK): both keep the same Krylov subspace, but
thick restart works directly with Ritz vectors, needs no shifted QR sweeps, and with full
reorthogonalisation the restarted basis is exactly ``[V S_keep, Q_next]`` -- a few lines of dense
linear algebra on an ``ncv x ncv`` matrix.  The Krylov decomposition kept throughout is

    A V_d = V_n T[:n, :d],          V_n = [V_d, Q],  n = d + b                    (Wu-Simon eq. 2.3)

so for a Ritz pair ``(theta, y = V_d s)`` of ``T[:d, :d]`` the residual is available without a
matvec: ``||A y - theta y|| = ||T[d:n, :d] s||`` (eq. 2.5; ``beta_d |s_d|`` for ``b = 1``).  The loop
stops when every wanted pair satisfies ``||A y - theta y|| <= max(tol * |theta|, atol)``; then one
extra block matvec computes the *true* residuals (counted in ``matvecs``), and ``converged`` is set
from those, never from the recurrence.  If a true residual disagrees with its estimate the iteration
continues while budget is left.  No matvec is held back for that check (``true_residuals=None``, the
default): when the budget runs out first, the last products go to Lanczos steps -- a budget of
``M`` buys an ``M``-step Lanczos, as a plain Lanczos would -- and the reported residuals are the
recurrence's, with ``converged`` False (unverified); ``config["residuals"]`` says which were
reported.

Basis size.  A restart discards Krylov information, so by default none happens within the budget:
``ncv = max_matvecs`` makes a budget of ``M`` exactly an ``M``-step Lanczos (the best Krylov use of
``M`` products), capped so the float64 basis, ``8 p (ncv + b)`` bytes, fits :data:`NCV_MAX_BYTES`
(1 GiB: 133 vectors at ``p = 10^6``) and at ``p - 2b``, never below the former fixed default
``max(2k + 10, 20)``.  The basis grows by doubling as it fills (1.5x its size during the last
growth).  Cost per step: ``O(p d)`` reorthogonalisation and an ``O(d^3)`` ``eigh`` at basis size
``d`` (300 steps at ``p = 1000``: 0.56 s, 0.09 s with ``ncv=20``).

:func:`power_iteration` (with deflation by orthogonalisation against the pairs already found, as
PyHessian does) is kept for comparison; it stops on the same residual criterion.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from landscape.checks import check_budget, check_choice, check_nonnegative, check_positive, check_seed
from landscape.curvature.linop import as_linop, blocks, gaussian, make_generator, seed_config
from landscape.results import Result

__all__ = ["EigenResult", "eigenvalues", "power_iteration"]

_WHICH = ("largest", "smallest", "largest_magnitude")

NCV_MAX_BYTES = 2**30  # cap on the float64 basis, 8 p (ncv + b) bytes, of the default ncv (not a given one)


def _default_ncv(k: int, b: int, p: int, max_matvecs: int) -> int:
    """The budget, within :data:`NCV_MAX_BYTES` and ``p - 2b``; at least ``max(2k + 10, 20)``."""
    floor = max(2 * k + 10, 20)
    if p <= math.ceil(floor / b) * b + b:
        return floor
    blocks_fit = min(math.ceil(max_matvecs / b), (NCV_MAX_BYTES // (8 * p)) // b - 1, p // b - 2)
    return max(floor, blocks_fit * b)


@dataclass
class EigenResult(Result):
    """Eigenpairs with their residuals ``||A v - lambda v||`` (true ones, or the Lanczos recurrence's
    where ``config["residuals"] == "recurrence"``) and honest converged flags."""

    values: torch.Tensor | None = None
    vectors: torch.Tensor | None = None
    residuals: torch.Tensor | None = None
    converged: list[bool] = field(default_factory=list)
    matvecs: int = 0
    method: str = "lanczos"
    which: str = "largest"
    restarts: int = 0

    kind: ClassVar[str] = "eigen"
    tensor_fields: ClassVar[tuple[str, ...]] = ("values", "vectors", "residuals")

    @property
    def all_converged(self) -> bool:
        return bool(self.converged) and all(self.converged)

    def __repr__(self) -> str:
        vals = [] if self.values is None else [f"{v:.6g}" for v in self.values.tolist()]
        return (
            f"EigenResult(method={self.method!r}, which={self.which!r}, values=[{', '.join(vals)}], "
            f"converged={self.converged}, matvecs={self.matvecs})"
        )


def _order(theta: torch.Tensor, which: str) -> torch.Tensor:
    if which == "largest":
        return torch.argsort(theta, descending=True)
    if which == "smallest":
        return torch.argsort(theta)
    return torch.argsort(theta.abs(), descending=True)


def _check_args(k: Any, which: str, tol: Any, atol: Any, max_matvecs: Any, seed: Any) -> None:
    """Checks that do not need the operator (so they also run before ``per_layer`` splits it)."""
    check_choice("which", which, _WHICH)
    check_positive("k", k, integer=True)
    check_nonnegative("tol", tol)
    check_nonnegative("atol", atol)
    if tol == 0 and atol == 0:
        raise ValueError("tol and atol are both zero: no pair could ever be converged; pass tol > 0")
    if max_matvecs is not None:
        check_positive("max_matvecs", max_matvecs, integer=True)
    check_seed(seed)


def _check_dim(k: int, p: int) -> None:
    if k > p:
        raise ValueError(f"k = {k} exceeds the operator dimension p = {p}; pass k <= {p}")


def _cgs2(V: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthogonalise the columns of ``W`` against the orthonormal ``V`` twice (CGS2)."""
    C = V.T @ W
    W = W - V @ C
    C2 = V.T @ W
    return W - V @ C2, C + C2


def _progress(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="matvec")


def _dense_solve(A, k, which, tol, atol, t0, config) -> EigenResult:
    """Tiny operators: assemble the matrix column by column (p matvecs) and use eigh."""
    p = A.p
    M = A.matmat(torch.eye(p, dtype=torch.float64, device=A.device))
    M = 0.5 * (M + M.T)
    theta, S = torch.linalg.eigh(M)
    idx = _order(theta, which)[:k]
    vals, vecs = theta[idx], S[:, idx]
    res = torch.linalg.vector_norm(M @ vecs - vecs * vals, dim=0)
    config["residuals"] = "true"
    config["operator"] = A.config()  # with what the products ran on (e.g. compile="auto"'s decision)
    conv = [bool(r <= max(tol * abs(v), atol)) for r, v in zip(res.tolist(), vals.tolist())]
    return EigenResult(
        config=config,
        seconds=time.perf_counter() - t0,
        values=vals.cpu(),
        vectors=vecs.cpu(),
        residuals=res.cpu(),
        converged=conv,
        matvecs=A.matvecs,
        method="dense",
        which=which,
    )


def eigenvalues(
    op: Any,
    k: int = 5,
    which: str = "largest",
    tol: float = 1e-6,
    *,
    atol: float = 0.0,
    max_matvecs: int | None = None,
    seed: int | torch.Generator | None = 0,
    block_size: int = 1,
    ncv: int | None = None,
    restart_keep: int | None = None,
    v0: torch.Tensor | None = None,
    return_vectors: bool = True,
    per_layer: bool | Mapping[str, int] = False,
    progress: bool = False,
    true_residuals: bool | None = None,
    compile: bool | str = "auto",
) -> EigenResult | dict[str, EigenResult]:
    """The ``k`` extreme eigenpairs of a symmetric operator by thick-restart (block) Lanczos.

    Args:
        op: a linear operator (``.shape``, ``.dtype``, ``.device``, ``matmat``), a dense symmetric
            tensor, or an Objective (its Hessian).
        k: number of eigenpairs.
        which: ``"largest"`` (algebraic), ``"smallest"`` or ``"largest_magnitude"``.
        tol, atol: a pair is converged when ``||A v - lambda v|| <= max(tol * |lambda|, atol)``
            (true residual, computed with one extra block matvec at the end).
        max_matvecs: budget of matrix-vector products (columns), final check included; default
            ``max(300, 40 * k)``; at least ``block_size + k`` (a smaller one raises ``ValueError``
            before any product).  Small operators (``p <= ncv + block_size``) are assembled and
            solved densely with ``p`` products (``method="dense"``), exact whatever the budget.
        seed: int or ``torch.Generator`` for the random start block (ignored if ``v0`` is given).
        block_size: Lanczos block size ``b`` (``b`` matvecs per step, batched in one ``matmat``
            call: faster per matvec with vmapped HVPs, usually more matvecs in total).
        ncv: maximal basis size before a restart.  Default: ``max_matvecs`` (no restart within the
            budget), capped so that the basis' ``8 p (ncv + b)`` bytes stay within
            :data:`NCV_MAX_BYTES` and at ``p - 2b``, and at least ``max(2k + 10, 20)``; rounded up to
            blocks.
        restart_keep: Ritz vectors kept at a restart (default ``k + (ncv - k) // 2``).
        v0: optional start vector(s) ``[p]`` or ``[p, b]``.
        return_vectors: keep the ``[p, k]`` eigenvectors in the result.
        per_layer: ``True`` (Objective, or operator built from one) or ``{name: size}``: return a
            dict ``name -> EigenResult`` for the diagonal blocks (see
            :func:`landscape.curvature.linop.blocks`).
        progress: show a tqdm bar over matvecs.
        true_residuals: ``None`` (default): verify with one block of ``k`` products when the
            recurrence reports convergence and the budget allows it; otherwise spend the whole budget
            on Lanczos steps and report the recurrence residuals, unverified (``converged`` False).
            ``True``: keep ``k`` products back for the true residuals when they are at most a third
            of the budget (``max_matvecs >= 3k``); below that the check would cost the estimate
            more than it verifies (``k = 5`` at 10 products: a 5-step Lanczos), so ``True`` acts as
            ``None`` there (``config["true_residuals_reserved"]`` says which).  ``False``: never;
            residuals and ``converged`` from the recurrence.
        compile: ``"auto"`` (default): a Hessian or GGN operator is compiled when the budget's
            products pay for the compile (:mod:`landscape.curvature.autocompile`; the decision is in
            ``config["operator"]["autocompile"]``); ``True``: always; ``False``: never.

    Returns:
        :class:`EigenResult` with ``values`` sorted per ``which``, ``vectors`` ``[p, k]``,
        ``residuals``, ``converged`` (per pair, from true residuals), ``matvecs``, ``seconds``.
    """
    kwargs = dict(
        k=k, which=which, tol=tol, atol=atol, max_matvecs=max_matvecs, seed=seed, block_size=block_size,
        ncv=ncv, restart_keep=restart_keep, return_vectors=return_vectors, progress=progress,
        true_residuals=true_residuals, compile=compile,
    )  # fmt: skip
    _check_args(k, which, tol, atol, max_matvecs, seed)
    if true_residuals not in (None, True, False):
        raise TypeError(f"true_residuals must be None, True or False, got {true_residuals!r}")
    check_positive("block_size", block_size, integer=True)
    for name, value in (("ncv", ncv), ("restart_keep", restart_keep)):
        if value is not None:
            check_positive(name, value, integer=True)
    if v0 is not None and not isinstance(v0, torch.Tensor):
        raise TypeError(f"v0 must be a torch.Tensor of shape [p] or [p, b], got {type(v0).__name__}")
    if per_layer is not False:
        if v0 is not None:
            raise ValueError("v0 cannot be combined with per_layer (each block has its own dimension)")
        gen = make_generator(seed)
        out = {}
        for name, blk in blocks(op, per_layer).items():
            p_b = blk.shape[0]
            out[name] = eigenvalues(blk, **{**kwargs, "k": min(k, p_b), "seed": gen})
        return out

    t0 = time.perf_counter()
    A = as_linop(op, compile=compile, products=max_matvecs or max(300, 40 * k))
    p = A.p
    _check_dim(k, p)
    if v0 is not None:
        if v0.numel() == 0 or v0.numel() % p:
            raise ValueError(f"v0 must have shape [p] or [p, b] with p = {p}, got {tuple(v0.shape)}")
        if not bool(torch.isfinite(v0).all()) or not bool(v0.reshape(p, -1).abs().sum(0).gt(0).all()):
            raise ValueError("v0 must be finite and every start vector non-zero")
    b = block_size
    if max_matvecs is None:
        max_matvecs = max(300, 40 * k)
    ncv_rule = "given" if ncv is not None else "budget"
    ncv = int(math.ceil((ncv if ncv is not None else _default_ncv(k, b, p, max_matvecs)) / b) * b)
    if ncv < k + b:
        raise ValueError(f"ncv = {ncv} must be at least k + block_size = {k + b}")
    reserve = k if true_residuals and max_matvecs >= 3 * k else 0  # products held back for the check
    config = {
        "method": "thick-restart lanczos",
        "k": k,
        "which": which,
        "tol": tol,
        "atol": atol,
        "max_matvecs": max_matvecs,
        "seed": seed_config(seed),
        "block_size": b,
        "ncv": ncv,
        "ncv_rule": ncv_rule,
        "true_residuals": true_residuals,
        "true_residuals_reserved": bool(reserve),
        "operator": A.config(),
    }
    if p <= ncv + b:
        return _dense_solve(A, k, which, tol, atol, t0, config)
    keep = restart_keep if restart_keep is not None else k + (ncv - k) // 2
    keep = max(k, min(keep, ncv - b))
    config["restart_keep"] = keep
    check_budget(
        "max_matvecs",
        max_matvecs,
        b + k,
        who=f"eigenvalues with k={k}, block_size={b}",
        why=f"a Lanczos run needs block_size + k = {b + k} products to build {k} Ritz value(s)",
    )

    dev = A.device
    gen = make_generator(seed)
    V = torch.zeros(p, min(ncv, max(2 * k + 10, 20)) + b, dtype=torch.float64, device=dev)
    T = torch.zeros(ncv + b, ncv, dtype=torch.float64, device=dev)
    if v0 is not None:
        start = v0.reshape(p, -1).to(device=dev, dtype=torch.float64)
        if start.shape[1] < b:
            start = torch.cat([start, gaussian(p, b - start.shape[1], gen, dev)], 1)
        start = start[:, :b]
    else:
        start = gaussian(p, b, gen, dev)
    V[:, :b] = torch.linalg.qr(start)[0]
    d, n = 0, b
    restarts = 0
    scale = 0.0
    bar = _progress(progress, max_matvecs, "lanczos")
    inner_tol = 1.0  # tightened if the true residuals disagree with the recurrence
    theta = S = None
    wanted = None
    res_final = vals_final = Y = None
    conv: list[bool] = []

    def thresholds(vals: torch.Tensor) -> torch.Tensor:
        return torch.clamp(tol * vals.abs(), min=atol)

    try:
        while True:
            # ---- expand / restart until the recurrence says the wanted pairs converged ----
            done = False
            while A.matvecs + b + reserve <= max_matvecs:
                if d + b > ncv:  # thick restart: keep the best `keep` Ritz vectors + the next block
                    idx = _order(theta, which)[:keep]
                    Sk = S[:, idx]
                    nxt = V[:, d:n].clone()
                    V[:, :keep] = V[:, :d] @ Sk  # in place: the basis plus p x keep at the peak
                    V[:, keep : keep + b] = nxt
                    newT = torch.zeros_like(T)
                    newT[:keep, :keep] = torch.diag(theta[idx])
                    newT[keep : keep + b, :keep] = T[d:n, :d] @ Sk
                    T = newT
                    d, n = keep, keep + b
                    restarts += 1
                if n + b > V.shape[1]:  # grow the basis (doubling, up to ncv + b columns)
                    V = torch.cat([V, V.new_zeros(p, min(ncv + b, 2 * V.shape[1]) - V.shape[1])], 1)
                Q = V[:, d:n]
                AQ = A.matmat(Q)
                if bar is not None:
                    bar.update(b)
                W, C = _cgs2(V[:, :n], AQ)
                Qn, R = torch.linalg.qr(W)
                colnorm = torch.linalg.vector_norm(AQ, dim=0)
                scale = max(scale, float(colnorm.max()))
                for j in range(b):  # breakdown: an invariant subspace; continue with a random vector
                    if abs(float(R[j, j])) <= 1e-12 * max(scale, 1e-300):
                        r = gaussian(p, 1, gen, dev)
                        basis = torch.cat([V[:, :n], Qn[:, :j]], 1)
                        r, _ = _cgs2(basis, r)
                        Qn[:, j] = (r / torch.linalg.vector_norm(r))[:, 0]
                        R[j, :] = 0.0
                V[:, n : n + b] = Qn
                T[:n, d:n] = C
                T[n : n + b, d:n] = R
                d, n = n, n + b
                if d < k:
                    continue
                Tdd = 0.5 * (T[:d, :d] + T[:d, :d].T)
                theta, S = torch.linalg.eigh(Tdd)
                wanted = _order(theta, which)[:k]
                est = torch.linalg.vector_norm(T[d:n, :d] @ S[:, wanted], dim=0)
                if bool((est <= inner_tol * thresholds(theta[wanted])).all()):
                    done = True
                    break
            if wanted is None:  # budget too small to build k Ritz values
                raise ValueError(
                    f"max_matvecs = {max_matvecs} is too small to build {k} Ritz values with block size {b}"
                )
            Y = V[:, :d] @ S[:, wanted]
            if true_residuals is False or (not reserve and A.matvecs + k > max_matvecs):
                # ---- no budget (or no wish) to check: the recurrence's residuals (eq. 2.5) ----
                vals_final, res_final = theta[wanted], est
                trusted = true_residuals is False
                conv = [trusted and bool(c) for c in (res_final <= thresholds(vals_final)).tolist()]
                config["residuals"] = "recurrence"
                break
            # ---- true residuals: one extra block matvec ----
            config["residuals"] = "true"
            AY = A.matmat(Y)
            if bar is not None:
                bar.update(k)
            vals_final = (Y * AY).sum(0)  # Rayleigh quotients (||y|| = 1)
            res_final = torch.linalg.vector_norm(AY - Y * vals_final, dim=0)
            ok = res_final <= thresholds(vals_final)
            conv = [bool(c) for c in ok.tolist()]
            if all(conv) or not done or A.matvecs + b + reserve > max_matvecs:
                break
            inner_tol *= 0.1  # the recurrence was optimistic (loss of orthogonality): tighten
    finally:
        if bar is not None:
            bar.close()

    order = _order(vals_final, which)
    config["operator"] = A.config()
    return EigenResult(
        config=config,
        seconds=time.perf_counter() - t0,
        values=vals_final[order].cpu(),
        vectors=Y[:, order].cpu() if return_vectors else None,
        residuals=res_final[order].cpu(),
        converged=[conv[i] for i in order.tolist()],
        matvecs=A.matvecs,
        method="lanczos",
        which=which,
        restarts=restarts,
    )


def power_iteration(
    op: Any,
    k: int = 1,
    tol: float = 1e-6,
    *,
    atol: float = 0.0,
    max_matvecs: int | None = None,
    max_iter: int = 1000,
    seed: int | torch.Generator | None = 0,
    return_vectors: bool = True,
    progress: bool = False,
) -> EigenResult:
    """Top-``k`` eigenpairs by *largest magnitude* with power iteration and deflation.

    Pair ``i`` iterates ``v <- A v / ||A v||`` with ``v`` kept orthogonal to the pairs already found
    (deflation by projection, as in PyHessian, Yao et al. 2020, Alg. 1) until the residual of the
    current iterate ``||A v - (v^T A v) v||`` -- exact, computed from the same matvec -- is below
    ``max(tol * |lambda|, atol)`` (``tol / 10`` for all but the last pair, since a deflated pair's
    residual cannot fall below those of the pairs it is deflated against), or its share of the
    budget (or ``max_iter``) is spent. Kept as the
    baseline; :func:`eigenvalues` needs far fewer matvecs.
    """
    t0 = time.perf_counter()
    A = as_linop(op)
    _check_args(k, "largest_magnitude", tol, atol, max_matvecs, seed)
    check_positive("max_iter", max_iter, integer=True)
    p = A.p
    _check_dim(k, p)
    if max_matvecs is None:
        max_matvecs = k * max_iter
    check_budget(
        "max_matvecs", max_matvecs, k, who=f"power_iteration with k={k}", why="each pair needs a product"
    )
    config = {
        "method": "power iteration with deflation",
        "k": k,
        "tol": tol,
        "atol": atol,
        "max_matvecs": max_matvecs,
        "max_iter": max_iter,
        "seed": seed_config(seed),
        "operator": A.config(),
    }
    gen = make_generator(seed)
    dev = A.device
    vecs = torch.zeros(p, 0, dtype=torch.float64, device=dev)
    vals, res, conv = [], [], []
    bar = _progress(progress, max_matvecs, "power iteration")
    try:
        for i in range(k):
            budget = min(max_iter, (max_matvecs - A.matvecs) // (k - i))
            v = gaussian(p, 1, gen, dev)
            theta, r, ok = 0.0, math.inf, False
            current = v
            for _ in range(max(1, budget)):
                if vecs.shape[1]:
                    v, _ = _cgs2(vecs, v)
                nrm = float(torch.linalg.vector_norm(v))
                if nrm == 0.0:  # the iterate vanished after deflation: restart at random
                    v, _ = _cgs2(vecs, gaussian(p, 1, gen, dev))
                    nrm = float(torch.linalg.vector_norm(v))
                current = v / nrm
                w = A.matmat(current)
                if bar is not None:
                    bar.update(1)
                theta = float((current * w).sum())
                r = float(torch.linalg.vector_norm(w - theta * current))
                ok = r <= max(tol * abs(theta), atol)
                # earlier pairs go to tol/10: their residual is the floor of the deflated later ones
                if r <= max((tol if i == k - 1 else 0.1 * tol) * abs(theta), atol):
                    break
                v = w
            vals.append(theta)
            res.append(r)
            conv.append(ok)
            vecs = torch.cat([vecs, current], 1)
    finally:
        if bar is not None:
            bar.close()
    values = torch.tensor(vals, dtype=torch.float64)
    order = torch.argsort(values.abs(), descending=True)
    return EigenResult(
        config=config,
        seconds=time.perf_counter() - t0,
        values=values[order],
        vectors=vecs[:, order].cpu() if return_vectors else None,
        residuals=torch.tensor(res, dtype=torch.float64)[order],
        converged=[conv[i] for i in order.tolist()],
        matvecs=A.matvecs,
        method="power",
        which="largest_magnitude",
    )
