"""Trace and diagonal estimation with error bars, stopping on the error bar.

Estimators (all with Rademacher probes, all reporting a standard error):

* ``"hutchinson"`` -- ``tr(A) ~ (1/n) sum_i z_i^T A z_i`` (Hutchinson 1990; Avron & Toledo 2011).
  Standard error: sample standard deviation of the ``z_i^T A z_i`` over ``sqrt(n)``.
* ``"hutchpp"`` -- Hutch++ (Meyer, Musco, Musco & Woodruff, SOSA 2021, Alg. 1): a sketch
  ``Q = orth(A S)`` is fixed first, ``tr(Q^T A Q)`` is computed exactly, and Hutchinson runs on the
  deflated remainder ``B = (I - QQ^T) A (I - QQ^T)``.  Standard error: sample standard deviation of
  the remainder samples ``z_i^T B z_i`` over ``sqrt(n)``.  Given ``Q`` they are i.i.d. (variance
  ``2 (||B||_F^2 - sum_j B_jj^2)`` for Rademacher ``z``) and the low-rank part is exact, so this is
  the conditional standard error; the sketch adds no further term, since ``E[estimate | Q] = tr(A)``
  for every ``Q`` (``tr(Q^T A Q) + tr(B) = tr(A)``), hence ``Var = E_Q[Var(. | Q)]``.  Over 50
  seeds ``sqrt(mean se^2) / rms(error)`` is 0.85-1.23 (eigenvalues uniform in [1, 2], ``i^-1`` and
  ``i^-2``; 30-100 products); the bound ``2 ||B||_F^2`` used before gave 2.6-3.3 on the flat
  spectrum (``tests/test_lanczos_budget.py``).  Samples are added until the tolerance is met or
  the budget is spent.
* ``"xtrace"`` -- XTrace (Epperly, Tropp & Webber, SIAM J. Matrix Anal. Appl. 2024, Alg. 2 and
  eq. (2.6)): the exchangeable leave-one-out estimator ``tr_i = tr(Q_(i)^T A Q_(i)) +
  w_i^T (I - P_(i)) A (I - P_(i)) w_i`` averaged over ``i``, with its jackknife-style error estimate
  ``std(tr_i) / sqrt(m)``.  ``m`` probes cost ``2m`` matvecs; ``m`` is doubled (re-using all previous
  products) until the tolerance is met or the budget is spent.
* ``"auto"`` -- a pilot of ``m0 = 8`` Rademacher probes, ``Y = A Omega``.  The stable rank
  ``||Y||_F^2 / ||Y||_2^2`` (between 1 and ``m0``) measures how much of ``||A||_F^2`` -- which sets
  Hutchinson's variance, ``2 (||A||_F^2 - sum_i A_ii^2)`` -- sits in a few directions.  If it is
  ``<= m0 / 2`` the spectrum decays and the low-rank part dominates: XTrace continues from the pilot
  (its ``Omega, Y`` are re-used); otherwise Hutchinson continues with the pilot's ``m0`` samples.
  Either way no pilot matvec is wasted.  Operators with ``p <= 2 m0`` (and ``p <= max_matvecs``) are
  traced exactly.  XTrace is chosen only with ``m0 >= 3`` (its error bar needs three probes).
* ``"exact"`` -- ``p`` unit-vector products, zero error, whatever ``max_matvecs`` is.

Budgets.  Every stochastic estimate comes with an error bar, and :func:`trace` refuses, before any
product, a ``max_matvecs`` too small for one (``ValueError`` naming the smallest budget that works):
``"hutchinson"`` and ``"auto"`` need 2 (two samples); ``"hutchpp"`` needs ``2 * sketch + 2`` (the
sketch costs ``2 * sketch`` products and the remainder two samples; 4 with the default sketch
``max_matvecs // 3``); ``"xtrace"`` needs 6 (the jackknife needs three probes, two products each).
A Hutch++ sketch of ``p`` or more columns spans the whole space, so the sketch alone would give the
exact trace, for ``2p`` products: the trace is then computed exactly with ``p`` unit-vector
products instead (``method="exact"``, the reason in ``config["exact_because"]``).

The stopping rule is always ``t_{n-1, level} * stderr <= max(rtol * |estimate|, atol)`` -- the
half-width of the confidence interval -- never the change of the running mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from landscape.checks import (
    check_budget,
    check_choice,
    check_nonnegative,
    check_number,
    check_positive,
    check_seed,
)
from landscape.curvature.linop import as_linop, blocks, make_generator, rademacher, seed_config
from landscape.curvature.xtrace import XTraceState
from landscape.results import Result

__all__ = ["TraceResult", "DiagonalResult", "trace", "diagonal"]

_METHODS = ("auto", "hutchinson", "hutchpp", "xtrace", "exact")


def _tq(level: float, dof: int) -> float:
    """Two-sided Student-t quantile (normal for ``dof`` = 0 / infinite)."""
    check_number("level", level)
    if not 0.0 < level < 1.0:  # NaN fails too
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from scipy import stats

    q = 0.5 + level / 2
    return float(stats.t.ppf(q, dof)) if dof and dof > 0 else float(stats.norm.ppf(q))


@dataclass
class TraceResult(Result):
    """A trace estimate with its standard error (``ci`` uses a Student-t quantile with ``dof``)."""

    value: float = math.nan
    stderr: float = math.nan
    matvecs: int = 0
    method: str = ""
    samples: list[float] = field(default_factory=list)
    dof: int = 0
    converged: bool = False
    exact_part: float = 0.0

    kind: ClassVar[str] = "trace"

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Two-sided confidence interval ``value +- t_{dof}(level) * stderr``."""
        half = _tq(level, self.dof) * self.stderr
        return self.value - half, self.value + half

    def __repr__(self) -> str:
        return (
            f"TraceResult(method={self.method!r}, value={self.value:.6g}, stderr={self.stderr:.3g}, "
            f"matvecs={self.matvecs}, converged={self.converged})"
        )


@dataclass
class DiagonalResult(Result):
    """A diagonal estimate with per-entry standard errors."""

    values: torch.Tensor | None = None
    stderr: torch.Tensor | None = None
    matvecs: int = 0
    method: str = ""
    samples: int = 0

    kind: ClassVar[str] = "diagonal"
    tensor_fields: ClassVar[tuple[str, ...]] = ("values", "stderr")


def _met(value: float, stderr: float, dof: int, rtol: float, atol: float, level: float) -> bool:
    return _tq(level, dof) * stderr <= max(rtol * abs(value), atol)


#: probes XTrace's jackknife error bar needs (:meth:`XTraceState.estimate` gives none below 3); each
#: costs 2 products (``A omega`` and ``A q`` of the basis vector it adds)
_XTRACE_MIN_PROBES = 3


def _check_budget(method: str, max_matvecs: int, sketch: int | None) -> None:
    """Refuse a ``max_matvecs`` too small for ``method`` to return an estimate with an error bar."""
    if method == "exact":  # p unit-vector products whatever the budget
        return
    if method == "hutchpp":
        s = 1 if sketch is None else sketch
        fix = f"pass max_matvecs >= {2 * s + 2}"
        if sketch is not None and max_matvecs >= 4:
            fix += f" or sketch <= {(max_matvecs - 2) // 2}"
        fix += " (or method='hutchinson', which needs 2)"
        check_budget(
            "max_matvecs",
            max_matvecs,
            2 * s + 2,
            who="hutchpp" if sketch is None else f"hutchpp with sketch={sketch}",
            why=f"its sketch of {s} vector{'s' if s > 1 else ''} costs {2 * s} products and the error "
            "bar of the remainder needs 2 samples of one product each",
            fix=fix,
        )
    elif method == "xtrace":
        m = _XTRACE_MIN_PROBES
        check_budget(
            "max_matvecs",
            max_matvecs,
            2 * m,
            who="xtrace",
            why=f"its jackknife error bar needs {m} probes of 2 products each",
            fix=f"pass max_matvecs >= {2 * m} (or method='hutchinson', which needs 2)",
        )
    else:  # hutchinson, auto (its fallback is Hutchinson on the pilot's samples)
        check_budget(
            "max_matvecs", max_matvecs, 2, who=method, why="an error bar needs 2 samples of one product each"
        )


def _mean_se(x: torch.Tensor) -> tuple[float, float]:
    n = x.numel()
    mean = float(x.mean())
    # n >= 2 wherever trace() calls this (its budget check); inf marks "no error bar" otherwise
    se = float(x.std(unbiased=True)) / math.sqrt(n) if n > 1 else math.inf
    return mean, se


class _Hutch:
    """Hutchinson samples on ``(I - QQ^T) A (I - QQ^T)`` (``Q`` empty: plain Hutchinson).

    The standard error is the samples' standard deviation over ``sqrt(n)`` in both cases: given
    ``Q`` the remainder samples are i.i.d. and ``E[tr(Q^T A Q) + mean | Q] = tr(A)``, so the sketch
    adds no variance of its own (see the module docstring)."""

    def __init__(self, A, gen, Q: torch.Tensor | None = None):
        self.A, self.gen, self.Q = A, gen, Q
        self.samples = torch.zeros(0, dtype=torch.float64)

    def add(self, n: int) -> None:
        Z = rademacher(self.A.p, n, self.gen, self.A.device)
        if self.Q is not None and self.Q.shape[1]:
            Z = Z - self.Q @ (self.Q.T @ Z)
        AZ = self.A.matmat(Z)
        s = (Z * AZ).sum(0).cpu()
        self.samples = torch.cat([self.samples, s])

    def mean_se(self) -> tuple[float, float]:
        return _mean_se(self.samples)


def _exact(A) -> tuple[float, torch.Tensor]:
    diag = torch.empty(A.p, dtype=torch.float64)
    chunk = 256
    for s in range(0, A.p, chunk):
        E = torch.zeros(A.p, min(chunk, A.p - s), dtype=torch.float64, device=A.device)
        E[s : s + E.shape[1]].fill_diagonal_(1.0)
        diag[s : s + E.shape[1]] = torch.diagonal(A.matmat(E)[s : s + E.shape[1]]).cpu()
    return float(diag.sum()), diag


def trace(
    op: Any,
    method: str = "auto",
    rtol: float = 1e-3,
    atol: float = 0.0,
    max_matvecs: int = 100,
    *,
    level: float = 0.95,
    seed: int | torch.Generator | None = 0,
    block: int = 10,
    min_samples: int = 10,
    sketch: int | None = None,
    pilot: int = 8,
    per_layer: bool | Mapping[str, int] = False,
    progress: bool = False,
    compile: bool | str = "auto",
) -> TraceResult | dict[str, TraceResult]:
    """Estimate ``tr(A)`` with a standard error, stopping when the ``level`` confidence interval's
    half-width is below ``max(rtol * |estimate|, atol)`` or ``max_matvecs`` is spent.

    Args:
        op: linear operator, dense symmetric tensor or Objective (its Hessian).
        method: ``"auto"``, ``"hutchinson"``, ``"hutchpp"``, ``"xtrace"`` or ``"exact"`` (see the
            module docstring).
        rtol, atol: tolerance on the confidence half-width.
        max_matvecs: budget of matrix-vector products; the smallest accepted is the one that buys an
            error bar (2 for ``"hutchinson"`` / ``"auto"``, ``2 * sketch + 2`` for ``"hutchpp"``, 6
            for ``"xtrace"``; see the module docstring); ``"exact"`` costs ``p`` whatever it is.
        level: confidence level of the stopping rule (and the default of ``.ci``).
        seed: int or ``torch.Generator``.
        block: probes multiplied per ``matmat`` call (Hutchinson / remainder samples).
        min_samples: smallest number of samples before the error bar is trusted (Hutchinson).
        sketch: Hutch++ sketch size (default ``max_matvecs // 3``; costs ``2 * sketch`` matvecs; at
            least ``p``: the exact trace, for ``p`` matvecs).
        pilot: XTrace pilot size ``m0`` for ``"auto"`` and the first XTrace stage.
        per_layer: ``True`` or ``{name: size}``: a dict ``name -> TraceResult`` per diagonal block.
        progress: tqdm bar over matvecs.
        compile: ``"auto"`` (default), ``True`` or ``False``: compile a Hessian or GGN operator's
            products when ``max_matvecs`` of them pay for it (:mod:`landscape.curvature.autocompile`).
    """
    check_choice("method", method, _METHODS)
    check_nonnegative("rtol", rtol)
    check_nonnegative("atol", atol)
    check_positive("max_matvecs", max_matvecs, integer=True)
    _tq(level, 0)
    check_seed(seed)
    check_positive("block", block, integer=True)
    check_nonnegative("min_samples", min_samples, integer=True)
    check_positive("pilot", pilot, integer=True)
    if sketch is not None:
        check_positive("sketch", sketch, integer=True)
    _check_budget(method, max_matvecs, sketch)
    kwargs = dict(
        method=method,
        rtol=rtol,
        atol=atol,
        max_matvecs=max_matvecs,
        level=level,
        block=block,
        min_samples=min_samples,
        sketch=sketch,
        pilot=pilot,
        progress=progress,
        compile=compile,
    )
    if per_layer is not False:
        gen = make_generator(seed)
        return {name: trace(blk, seed=gen, **kwargs) for name, blk in blocks(op, per_layer).items()}

    t0 = time.perf_counter()
    A = as_linop(op, compile=compile, products=max_matvecs)
    start = A.matvecs  # a LinOp passed in may have counted products already
    gen = make_generator(seed)
    config = {**kwargs, "seed": seed_config(seed), "operator": A.config()}
    config.pop("progress")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_matvecs, desc=f"trace ({method})", unit="matvec")

    def used() -> int:
        return A.matvecs - start

    def tick():
        if bar is not None:
            bar.n = used()
            bar.refresh()

    def budget() -> int:
        return max_matvecs - used()

    def exact() -> TraceResult:
        value, _ = _exact(A)
        config["operator"] = A.config()
        return TraceResult(
            config=config,
            seconds=time.perf_counter() - t0,
            value=value,
            stderr=0.0,
            matvecs=used(),
            method="exact",
            samples=[value],
            dof=0,
            converged=True,
        )

    chosen = method
    exact_part = 0.0
    try:
        if method == "exact" or (method == "auto" and A.p <= 2 * pilot and A.p <= max_matvecs):
            return exact()
        if method == "hutchpp":
            s = sketch if sketch is not None else max(1, max_matvecs // 3)
            config["sketch"] = s
            if s >= A.p:  # the sketch spans the space: exact, for p products rather than 2p
                config["exact_because"] = (
                    f"a Hutch++ sketch of {s} >= p = {A.p} vectors spans the whole space: the trace is "
                    f"computed exactly with p = {A.p} unit-vector products"
                )
                return exact()
        xt = None
        hut = None
        if method == "auto":
            # pilot: m0 Hutchinson probes; the stable rank of Y = A Omega decides (no extra matvec)
            m0 = min(pilot, budget())
            Om = rademacher(A.p, m0, gen, A.device)
            Y = A.matmat(Om)
            tick()
            sv = torch.linalg.svdvals(Y)
            srank = float((sv**2).sum() / sv[0] ** 2) if float(sv[0]) > 0 else float(m0)
            config["pilot_stable_rank"] = srank
            if srank <= m0 / 2 and m0 >= _XTRACE_MIN_PROBES and budget() >= m0:
                chosen = "xtrace"
                xt = XTraceState(A, gen)
                xt.add(Om=Om, Y=Y)
            else:
                chosen = "hutchinson"
                hut = _Hutch(A, gen)
                hut.samples = (Om * Y).sum(0).cpu()
            config["chosen"] = chosen
        elif method == "xtrace":
            xt = XTraceState(A, gen)
            xt.add(min(pilot, max(1, budget() // 2)))
            tick()
        if chosen == "xtrace":
            while True:
                n_new = min(xt.m, budget() // 2)
                # the cheap error estimate is (nearly always) below the jackknife one: only when it
                # meets the tolerance, or the budget is spent, is the jackknife worth computing
                value, se, est = xt.estimate(jackknife=False)
                if n_new < 1 or (math.isfinite(se) and _met(value, se, xt.m - 1, rtol, atol, level)):
                    value, se, est = xt.estimate()
                    ok = math.isfinite(se) and _met(value, se, xt.m - 1, rtol, atol, level)
                    if ok or n_new < 1:
                        break
                xt.add(n_new)
                tick()
            samples, dof = est, xt.m - 1
        else:
            if chosen == "hutchpp":  # s < p; 2 s + 2 <= max_matvecs (_check_budget)
                Y = A.matmat(rademacher(A.p, s, gen, A.device))
                Q, _ = torch.linalg.qr(Y)
                exact_part = float((Q * A.matmat(Q)).sum())
                hut = _Hutch(A, gen, Q)
                tick()
            elif hut is None:
                hut = _Hutch(A, gen)
            while True:
                n = hut.samples.numel()
                if n >= max(2, min_samples):
                    value, se = hut.mean_se()
                    if _met(exact_part + value, se, n - 1, rtol, atol, level):
                        break
                add = min(block, budget())
                if add < 1:
                    break
                hut.add(add)
                tick()
            value, se = hut.mean_se()
            value = exact_part + value
            samples, dof = hut.samples, hut.samples.numel() - 1
        converged = bool(math.isfinite(se) and _met(value, se, dof, rtol, atol, level))
    finally:
        if bar is not None:
            bar.close()
    config["operator"] = A.config()  # with what the products ran on (compile="auto"'s decision)
    return TraceResult(
        config=config,
        seconds=time.perf_counter() - t0,
        value=value,
        stderr=se,
        matvecs=used(),
        method=chosen,
        samples=[float(x) for x in samples],
        dof=dof,
        converged=converged,
        exact_part=exact_part,
    )


def diagonal(
    op: Any,
    method: str = "hutchinson",
    samples: int = 100,
    *,
    seed: int | torch.Generator | None = 0,
    block: int = 10,
    progress: bool = False,
) -> DiagonalResult:
    """Estimate ``diag(A)`` with per-entry standard errors.

    ``"hutchinson"``: ``diag(A) ~ (1/n) sum_k z_k * (A z_k)`` with Rademacher ``z_k`` (Bekas,
    Kokiopoulou & Saad, Appl. Numer. Math. 57, 2007, eq. (3); with Rademacher probes the
    normalisation ``sum_k z_k * z_k`` equals ``n``).  The standard error of entry ``j`` is the sample
    standard deviation of ``z_kj (A z_k)_j`` over ``sqrt(n)``; its variance is
    ``sum_{i != j} A_ji^2`` per sample.  ``"exact"``: ``p`` unit-vector matvecs, zero error.
    """
    check_choice("method", method, ("hutchinson", "exact"))
    check_budget("samples", samples, 2, who="diagonal", why="the per-entry standard errors need 2 samples")
    check_seed(seed)
    check_positive("block", block, integer=True)
    t0 = time.perf_counter()
    A = as_linop(op)
    config = {"method": method, "samples": samples, "seed": seed_config(seed), "operator": A.config()}
    if method == "exact":
        _, d = _exact(A)
        return DiagonalResult(
            config=config,
            seconds=time.perf_counter() - t0,
            values=d,
            stderr=torch.zeros_like(d),
            matvecs=A.matvecs,
            method="exact",
            samples=0,
        )
    gen = make_generator(seed)
    s1 = torch.zeros(A.p, dtype=torch.float64, device=A.device)
    s2 = torch.zeros_like(s1)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=samples, desc="diagonal", unit="matvec")
    n = 0
    try:
        while n < samples:
            k = min(block, samples - n)
            Z = rademacher(A.p, k, gen, A.device)
            X = Z * A.matmat(Z)
            s1 += X.sum(1)
            s2 += (X * X).sum(1)
            n += k
            if bar is not None:
                bar.update(k)
    finally:
        if bar is not None:
            bar.close()
    mean = s1 / n
    var = torch.clamp((s2 - n * mean * mean) / (n - 1), min=0.0)
    return DiagonalResult(
        config=config,
        seconds=time.perf_counter() - t0,
        values=mean.cpu(),
        stderr=(var / n).sqrt().cpu(),
        matvecs=A.matvecs,
        method="hutchinson",
        samples=n,
    )
