"""``compile="auto"``: compile an operator's products only when the saving pays for the compile.

:func:`~landscape.curvature.compiled.compile_operator` runs a Hessian or GGN product as one
``torch.compile`` graph: faster per product on some models and devices (the GGN on an H100: 0.49-0.59x
the eager product's time), slower on others (the Hessian on CNNs, every CPU model in
``benchmarks/results/products_cpu*.json``), and always a one-time compile of seconds to a minute.
Estimators that know how many products they will run (Lanczos' budget, SLQ's ``runs x steps``, a
trace's budget) wrap their operator in :class:`AutoCompiledOperator`, which decides by measurement:

1. The first block runs eagerly, untimed (it pays one-time costs: building and caching graphs, lazy
   imports); the second block runs eagerly and is timed (device synchronised): ``t_e`` seconds per
   product.  Both are real products of the estimator: nothing is spent on the decision.
2. With ``n`` products left, compiling is expected to save ``n t_e (1 - r)`` seconds and to cost
   ``C``, where ``r`` is the compiled/eager time ratio and ``C`` the compile time.  Both come from
   a measurement on the same operator signature (kind, model parameter shapes, batch shapes, dtype,
   device, block width) earlier in this process when there is one, otherwise from the priors
   :data:`PRIOR_RATIO` and :data:`PRIOR_COMPILE_SECONDS`: the *largest* ratio and compile time
   measured by the product benchmark on that device type (pessimistic: a prior never makes us
   compile where the benchmark saw compiling lose).  The operator compiles when
   ``n t_e (1 - r) > C``.
3. After compiling, the compiled product is checked against the eager one on a probe
   (:class:`~landscape.curvature.compiled.CompiledOperator`) and the next compiled block is timed:
   if it is not faster than ``t_e`` the remaining products run eagerly.  The measured ``C`` and
   ``r`` are kept for later decisions in this process.

Only blocks of the width that was compiled run compiled (another width would compile again); the
others run eagerly.  ``config()["autocompile"]`` records every number of the decision and why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from landscape.curvature.autotune import _sync
from landscape.curvature.base import CurvatureOperator
from landscape.curvature.compiled import CompiledOperator, compile_operator
from landscape.curvature.ggn import GGNOperator
from landscape.curvature.hessian import HessianOperator

__all__ = [
    "PRIOR_COMPILE_SECONDS",
    "PRIOR_RATIO",
    "AutoCompiledOperator",
    "auto_compile",
    "measured",
]

# The largest compiled/eager time ratio per product the benchmark measured (rounded up to 0.01), per
# (kind, device type):
# CPU, benchmarks/results/products_cpu*.json (ResNet-20, MLP, transformer, WRN-16-4; eager = the
# default path: Hessian "auto", GGN "forward"), checked against the JSON by
# tests/test_autocompile.py; CUDA, the H100 table of issue 27 (eager = the GPU default path:
# Hessian "auto", GGN "linearize"; ResNet-20, transformer, WRN-16-4), not re-measured here.
PRIOR_RATIO: dict[tuple[str, str], float] = {
    ("hessian", "cpu"): 1.62,
    ("ggn", "cpu"): 1.16,
    ("hessian", "cuda"): 3.14,
    ("ggn", "cuda"): 0.59,
}
# The longest compile the benchmark measured per device type (seconds, rounded up to 0.1; same sources).
PRIOR_COMPILE_SECONDS: dict[str, float] = {"cpu": 24.9, "cuda": 48.0}

_MEASURED: dict[tuple, dict[str, float]] = {}


def _kind(op: CurvatureOperator) -> str:
    return "ggn" if isinstance(op, GGNOperator) else "hessian"


def _signature(op: CurvatureOperator, width: int) -> tuple:
    """What a compiled graph depends on: the same signature compiles (and runs) alike."""
    obj = op.objective
    leaves = [t for x, y, _ in obj.batches() for t in tree_flatten((x, y))[0]]
    batches = tuple(tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor))
    return (
        _kind(op),
        type(obj.model).__qualname__,
        tuple(tuple(s) for s in obj.param_shapes),
        batches,
        str(op.dtype),
        op.device.type,
        int(width),
    )


def measured() -> dict[tuple, dict[str, float]]:
    """The compile times and ratios measured in this process, per operator signature (a copy)."""
    return {k: dict(v) for k, v in _MEASURED.items()}


class AutoCompiledOperator(CurvatureOperator):
    """A Hessian or GGN operator that compiles itself when the products left pay for it.

    Args:
        op: the eager operator (``landscape.hessian(obj)`` or ``landscape.ggn(obj)``).
        products: how many products the caller will run (an upper bound, e.g. a Lanczos budget).
        timer: the clock (tests pass a scripted one).
        compile_fn: builds the compiled operator (default :func:`compile_operator`; tests may pass a
            stand-in).
        **compile_kwargs: passed to ``compile_fn`` (``mode``, ``backend``, ...).

    Same matrix, interface and ``config()`` keys as ``op``, plus ``config()["autocompile"]``.
    """

    def __init__(
        self,
        op: CurvatureOperator,
        products: int,
        *,
        timer: Callable[[], float] = time.perf_counter,
        compile_fn: Callable[..., CompiledOperator] = compile_operator,
        **compile_kwargs: Any,
    ) -> None:
        if not isinstance(op, (HessianOperator, GGNOperator)):
            raise TypeError(
                "compile='auto' applies to Hessian and GGN operators (landscape.hessian(obj), "
                f"landscape.ggn(obj)), got {type(op).__name__}"
            )
        if isinstance(products, bool) or not isinstance(products, int) or products < 0:
            raise ValueError(f"products must be a non-negative int, got {products!r}")
        self.eager, self.name, self.objective = op, op.name, op.objective
        self.shape, self.dtype, self.device = op.shape, op.dtype, op.device
        self.matvecs = 0
        self.products, self.timer = products, timer
        self.compile_fn, self.compile_kwargs = compile_fn, compile_kwargs
        self.compiled: CompiledOperator | None = None
        self.width: int | None = None
        self._sig: tuple | None = None  # the signature measured (set by the decision)
        self.state = "warming"  # -> "measuring" -> "compiled" | "eager"
        self.record: dict[str, Any] = {"products_planned": products, "decision": None}

    # ------------------------------------------------------------------ timing
    def _timed(
        self, fn: Callable[[torch.Tensor], torch.Tensor], V: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        _sync(self.device)
        start = self.timer()
        out = fn(V)
        _sync(self.device)
        return out, self.timer() - start

    # ------------------------------------------------------------------ the decision
    def _decide(self, k: int, seconds: float) -> None:
        """After the second (eager, timed) block of ``k`` products that took ``seconds``."""
        kind, dev = _kind(self.eager), self.device.type
        left = max(0, self.products - self.matvecs - k)  # this block counted
        t_e = seconds / k
        self._sig = sig = _signature(self.eager, k)  # the key of what this operator measures
        known = _MEASURED.get(sig, {})
        ratio = known.get("ratio", PRIOR_RATIO.get((kind, dev)))
        cost = known.get("compile_seconds", PRIOR_COMPILE_SECONDS.get(dev))
        source = {
            "ratio": "measured in this process" if "ratio" in known else "prior",
            "compile_seconds": "measured in this process" if "compile_seconds" in known else "prior",
        }
        rec = self.record
        rec.update(
            width=k,
            eager_seconds_per_product=t_e,
            products_left=left,
            predicted_ratio=ratio,
            predicted_compile_seconds=cost,
            prediction_source=source,
        )
        if ratio is None or cost is None:
            rec.update(decision="eager", reason=f"no measurement or prior for a {kind} on {dev}")
            self.state = "eager"
            return
        saving = left * t_e * (1.0 - ratio)
        rec["predicted_saving_seconds"] = saving
        if saving <= cost:
            rec.update(
                decision="eager",
                reason=(
                    f"expected saving {saving:.3g} s ({left} products x {t_e:.3g} s x (1 - {ratio:.3g})) "
                    f"<= expected compile time {cost:.3g} s"
                ),
            )
            self.state = "eager"
            return
        rec.update(decision="compile", reason=f"expected saving {saving:.3g} s > compile {cost:.3g} s")
        kwargs = {"chunk_size": k, "probe_width": k, **self.compile_kwargs}
        self.compiled = self.compile_fn(self.eager, **kwargs)
        cfg = self.compiled.config()
        rec.update(compile_seconds=cfg["compile_seconds"], verify_error=cfg["verify_error"])
        _MEASURED.setdefault(sig, {})["compile_seconds"] = float(cfg["compile_seconds"])
        if not cfg["compiled"]:
            rec.update(decision="eager", reason=f"compile failed: {cfg['compile_error']}")
            self.state = "eager"
            return
        self.state, self.width = "compiled", k

    def _check_speed(self, k: int, seconds: float) -> None:
        """After the first compiled block: keep compiling only where it is faster."""
        t_c, t_e = seconds / k, self.record["eager_seconds_per_product"]
        ratio = t_c / t_e if t_e > 0 else float("inf")
        self.record.update(compiled_seconds_per_product=t_c, measured_ratio=ratio)
        _MEASURED.setdefault(self._sig, {})["ratio"] = ratio
        if ratio >= 1.0:
            self.state = "eager"
            self.record.update(
                decision="compiled, then eager",
                reason=f"the compiled product took {ratio:.3g}x the eager one's time; eager from now on",
            )

    # ------------------------------------------------------------------ products
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """The block on the eager or the compiled product (each within its own ``max_memory``)."""
        k = int(V.shape[1])
        self.eager.matvecs += k  # the caller's operator counts every product made for it
        if self.state == "warming":
            self.state = "measuring"
            return self.eager._chunked(V)
        if self.state == "measuring":
            out, seconds = self._timed(self.eager._chunked, V)
            self._decide(k, seconds)
            return out
        if self.state == "compiled" and k == self.width:
            self.compiled.matvecs += k
            self.record["compiled_products"] = self.record.get("compiled_products", 0) + k
            if "compiled_seconds_per_product" in self.record:
                return self.compiled._chunked(V)
            out, seconds = self._timed(self.compiled._chunked, V)
            self._check_speed(k, seconds)
            return out
        return self.eager._chunked(V)

    def config(self) -> dict[str, Any]:
        base = (
            self.compiled if self.compiled is not None and self.state == "compiled" else self.eager
        ).config()
        return {**base, "autocompile": dict(self.record, state=self.state)}

    def __repr__(self) -> str:
        return f"AutoCompiledOperator({self.name}, shape={self.shape}, {self.state})"


def auto_compile(op: Any, products: int, compile: bool | str = "auto", **compile_kwargs: Any) -> Any:
    """``op`` as the estimators use it under ``compile=``: ``False`` as it is; ``True``
    :func:`compile_operator` now; ``"auto"`` an :class:`AutoCompiledOperator` for an eager Hessian or
    GGN operator (anything else, including an already compiled operator, as it is)."""
    if compile not in (True, False, "auto"):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    if compile is False or isinstance(op, (CompiledOperator, AutoCompiledOperator)):
        return op
    if not isinstance(op, (HessianOperator, GGNOperator)):
        if compile is True:
            raise TypeError(
                "compile=True needs a Hessian or GGN operator (landscape.hessian(obj), landscape.ggn(obj)) "
                f"or an Objective, got {type(op).__name__}; pass compile=False"
            )
        return op
    if compile is True:
        return compile_operator(op, **compile_kwargs)
    return AutoCompiledOperator(op, products, **compile_kwargs)
