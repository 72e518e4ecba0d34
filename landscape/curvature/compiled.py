"""Opt-in ``torch.compile`` of Hessian and GGN products: :func:`compile_operator`.

The eager operators (:mod:`landscape.curvature.hessian`, :mod:`landscape.curvature.ggn`) run one
Python-level autograd pass per product.  :func:`compile_operator` instead hands the whole per-batch
product to ``torch.compile`` as one pure function of the parameters, the batch and the block ``V``:

* Hessian: ``H_b V = [d/dt grad l_b(theta + t v)]_{t=0}`` column by column (forward-over-reverse,
  Pearlmutter 1994, "Fast exact multiplication by the Hessian", Sec. 3), i.e.
  ``vmap(jvp(grad(l_b)))``;
* GGN: ``G_b V = J_b^T H_out,b J_b V`` (Schraudolph 2002, "Fast curvature matrix-vector products",
  eq. 8): ``vmap(jvp(f_b))``, the output Hessian of :func:`~landscape.curvature.ggn.
  output_hessian` (closed form for cross-entropy/MSE/BCE, fixed at the operator's point) and
  ``vmap(vjp(f_b))`` in one traced graph, so the compiler can share the forward pass of the ``jvp``
  and the ``vjp``.

Per-batch weights ``w_b`` multiply the compiled result outside the graph (one graph for every
batch of the same shape).  The compile happens once, at construction (``warmup=True``), and its
wall time is reported separately as ``compile_seconds`` (a new block width ``k`` recompiles; that
time is added).  The first compiled product is checked against the eager operator on a random
probe.  When anything fails -- no C compiler, an op the compiler or forward-mode AD does not
support, a graph break inside a ``torch.func`` transform with ``fullgraph=True``, dynamo's
recompile limit, a compiled product that disagrees with the eager one -- the operator falls back
to the eager operator for good and records why: ``config()["compiled"] is False`` and
``config()["compile_error"]``.  Products are always the eager operator's matrix.

Buffers (e.g. BatchNorm running statistics) are copied once at construction, like the parameters.

``max_memory`` (default: the eager operator's budget) splits blocks like every operator
(:mod:`landscape.curvature.memory`), with one difference: the calls that measure a width's peak run
the *eager* product, so that no probe width is compiled for nothing, and the compiled graph runs
the chunks planned from that fit.  The assumption is that a compiled graph of the same product
needs no more memory than the eager one (it computes the same batched tensors and the compiler
reuses buffers); on a CPU its peak cannot be checked (the compiled kernels allocate outside the
dispatcher, where the memory tracker sees nothing).
"""

from __future__ import annotations

import contextlib
import time
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.func import grad as func_grad
from torch.func import jvp, vjp, vmap

from landscape.curvature.autotune import width_class
from landscape.curvature.base import CurvatureOperator, math_attention
from landscape.curvature.ggn import GGNOperator, output_hessian
from landscape.curvature.hessian import HessianOperator
from landscape.curvature.memory import make_budget

__all__ = ["CompiledOperator", "compile_operator"]


def _fresh(fn: Callable) -> Callable:
    """A copy of ``fn`` with its own code object.

    Dynamo keeps its cache of compiled graphs (and its recompile limit) per code object; every
    operator gets its own copy so that operators on other models never evict each other."""
    code = fn.__code__.replace()
    return types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def _short(err: BaseException) -> str:
    """One line: the error, and the error inside it (dynamo wraps a backend's failure)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    text = f"{type(err).__name__}: {lines[0] if lines else ''}"
    inner = getattr(err, "inner_exception", None) or err.__cause__
    if inner is not None and inner is not err:
        text += f" <- {_short(inner)}"
    elif lines and lines[0].endswith(":") and len(lines) > 1:
        text += f" {lines[1]}"
    return text[:400]


def _dynamo_patch() -> contextlib.AbstractContextManager:
    """Make dynamo raise at its recompile limit instead of silently running the function eagerly."""
    cfg = torch._dynamo.config
    for key in ("fail_on_recompile_limit_hit", "fail_on_cache_limit_hit"):
        if hasattr(cfg, key):
            return cfg.patch(**{key: True})
    return contextlib.nullcontext()


def _graph_count() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - internal counter missing: no check
        return -1


class CompiledOperator(CurvatureOperator):
    """A Hessian or GGN operator whose per-batch product runs through ``torch.compile``.

    Same interface as every :class:`CurvatureOperator` (``shape``, ``dtype``, ``device``, ``@``,
    ``matvec``, ``matmat``, ``to_scipy``, ``to_dense``, ``matvecs``, ``config()``), same matrix as
    the eager operator ``op`` it wraps (its point, objective and data).  Build it with
    :func:`compile_operator`.
    """

    PRODUCTS = {"compiled": "_compiled"}  # per batch; "eager": the eager operator's own product

    def __init__(
        self,
        op: CurvatureOperator,
        *,
        mode: str | None = None,
        fullgraph: bool = False,
        backend: str | Callable = "inductor",
        dynamic: bool | None = False,
        chunk_size: int | None = None,
        warmup: bool = True,
        verify: bool = True,
        seed: int = 0,
        probe_width: int = 1,
        max_memory: Any = "inherit",
    ) -> None:
        if isinstance(op, CompiledOperator):
            raise TypeError("the operator is already compiled; pass the eager operator")
        if not isinstance(op, (HessianOperator, GGNOperator)):
            raise TypeError(
                "compile_operator takes a Hessian or GGN operator (landscape.hessian(obj) or "
                f"landscape.ggn(obj)), got {type(op).__name__}"
            )
        if mode is not None and not isinstance(mode, str):
            raise TypeError(f"mode must be None or a torch.compile mode string, got {mode!r}")
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        if isinstance(probe_width, bool) or not isinstance(probe_width, int) or probe_width < 1:
            raise ValueError(f"probe_width must be a positive int, got {probe_width!r}")
        # The eager operator already validated the objective and holds private copies of the point:
        # share them instead of copying again (``CurvatureOperator.__init__`` would copy).
        self.eager = op
        self.name = op.name
        self.objective = op.objective
        self._theta, self._frozen = op._theta, op._frozen
        self.shape, self.dtype, self.device = op.shape, op.dtype, op.device
        self.matvecs = 0
        self.mode, self.fullgraph, self.backend, self.dynamic = mode, fullgraph, backend, dynamic
        self.chunk_size = chunk_size if chunk_size is not None else (op.chunk_size or 32)
        self.seed, self.probe_width = seed, probe_width
        if isinstance(max_memory, str) and max_memory == "inherit":
            max_memory = None if op._budget is None else op._budget.spec
        self._budget = make_budget(max_memory, op.device, op.name)
        self.compiled = True
        self.compile_error: str | None = None
        self.compile_seconds = 0.0
        self.verify_error: float | None = None
        self._widths: set[int] = set()
        self._bufs = self.objective.buffers()
        self._keep_batches = len(self.objective.batch_sizes) == 1  # no data pass per product
        self._kept = None
        self._h: dict[int, Callable] = {}  # GGN: H_out per batch
        self.output_hessian_kind: str | None = None
        try:
            fn = self._ggn_fn() if isinstance(op, GGNOperator) else self._hessian_fn()
            self._fn = torch.compile(
                _fresh(fn), mode=mode, fullgraph=fullgraph, backend=backend, dynamic=dynamic
            )
        except Exception as err:  # noqa: BLE001 - e.g. torch.compile unavailable on this platform
            self._fail(err)
        if warmup and self.compiled:
            self._warmup(verify)

    # ------------------------------------------------------------------ traced functions
    def _hessian_fn(self) -> Callable:
        obj = self.objective

        def hessian_block(theta, frozen, bufs, x, y, V):
            def loss(th):
                return obj.loss_fn(obj.call({**frozen, **th}, bufs, x), y)

            g = func_grad(loss)
            return vmap(lambda t: jvp(g, (theta,), (t,))[1], randomness="same")(V)

        return hessian_block

    def _ggn_fn(self) -> Callable:
        obj = self.objective

        def ggn_block(theta, frozen, bufs, x, V, h_apply):
            def f(th):
                return obj.call({**frozen, **th}, bufs, x)

            JV = vmap(lambda t: jvp(f, (theta,), (t,))[1], randomness="same")(V)
            _, vjp_fn = vjp(f, theta)
            return vmap(lambda u: vjp_fn(u)[0], randomness="same")(h_apply(JV))

        return ggn_block

    def _output_hessian(self, index: int, x, y) -> Callable:
        """``H_out`` of batch ``index`` at the operator's point (closed form where known), kept."""
        if index not in self._h:
            obj = self.objective
            with torch.no_grad():
                out = obj.call(self._full(self._theta), self._bufs, x).detach()
            self._h[index], self.output_hessian_kind = output_hessian(obj.loss_fn, out, y)
        return self._h[index]

    # ------------------------------------------------------------------ products
    def _new_batch(self, index, x, y, w, bufs) -> tuple:
        return index, x, y, w  # the buffers copied once, at construction (self._bufs)

    def _compiled(self, b: tuple, V: torch.Tensor) -> torch.Tensor:
        """``w_b A_b V`` (``[p, c]``) through the compiled function (``V``: one chunk of columns)."""
        index, x, y, w = b
        tangents = self._split(V)
        with torch.no_grad(), _dynamo_patch():
            if isinstance(self.eager, GGNOperator):
                h = self._output_hessian(index, x, y)
                res = self._fn(self._theta, self._frozen, self._bufs, x, tangents, h)
            else:
                res = self._fn(self._theta, self._frozen, self._bufs, x, y, tangents)
        return (w * self._join(res, V.shape[1])).T

    def _choose(self, k: int) -> str:
        """Compiled, unless a compile failed or a width's peak is being measured (on the eager path)."""
        return (
            "compiled"
            if self.compiled and not (self._budget is not None and self._budget.measuring)
            else "eager"
        )

    def _run(self, path: str, V: torch.Tensor) -> torch.Tensor:
        if path == "compiled":
            try:
                return self._compiled_chunks(V)
            except Exception as err:  # noqa: BLE001 - e.g. recompiling for a new width failed
                self._fail(err)
        return self.eager._matmat(V)

    def _compiled_chunks(self, V: torch.Tensor) -> torch.Tensor:
        """``A V`` in chunks of ``chunk_size`` columns, each summed over the batches (the base loop);
        the first chunk of a new width compiles (its time is added to ``compile_seconds``)."""
        outs = []
        for start in range(0, V.shape[1], self.chunk_size):
            block = V[:, start : start + self.chunk_size]
            width = block.shape[1]
            if width in self._widths:
                outs.append(super()._run("compiled", block))
                continue
            before, t0 = _graph_count(), time.perf_counter()
            out = super()._run("compiled", block)
            self.compile_seconds += time.perf_counter() - t0
            if before >= 0 and _graph_count() == before and not self._widths:
                raise RuntimeError("torch.compile produced no graph (the function ran eagerly)")
            self._widths.add(width)
            outs.append(out)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _path_key(self, k: int) -> str:
        return width_class(k)  # the fits are the eager product's (measured on the eager path)

    def _fail(self, err: BaseException) -> None:
        self.compiled = False
        self.compile_error = _short(err)

    def _warmup(self, verify: bool) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        probe = torch.randn(self.shape[0], self.probe_width, generator=gen, dtype=torch.float64)
        probe = probe.to(device=self.device, dtype=self.dtype)
        with self.objective.evaluating(), math_attention():
            try:
                out = self._compiled_chunks(probe)
            except Exception as err:  # noqa: BLE001 - any compile failure: eager from now on
                self._fail(err)
                return
            if not verify:
                return
            ref = self.eager._matmat(probe)
        scale = float(ref.norm())
        self.verify_error = float((out - ref).norm()) / scale if scale > 0 else float((out - ref).norm())
        rtol = 1e-3 if self.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-8
        if not self.verify_error <= rtol:
            self.compiled = False
            self.compile_error = (
                f"the compiled product differs from the eager one by {self.verify_error:.3g} (relative) "
                f"on a random probe (tolerance {rtol:g}); using the eager operator"
            )

    def _extra_config(self) -> dict[str, Any]:
        backend = (
            self.backend if isinstance(self.backend, str) else getattr(self.backend, "__name__", "custom")
        )
        return {
            "compiled": self.compiled,
            "compile_error": self.compile_error,
            "compile_seconds": self.compile_seconds,
            "mode": self.mode,
            "fullgraph": self.fullgraph,
            "backend": backend,
            "dynamic": self.dynamic,
            "chunk_size": self.chunk_size,
            "verify_error": self.verify_error,
            "product": "forward_over_reverse" if isinstance(self.eager, HessianOperator) else "jvp_h_vjp",
            "output_hessian": self.output_hessian_kind,
            # float32 on CUDA: TF32 convolutions / matmuls round to a 10-bit mantissa, differently in
            # the eager and the compiled graph (README, "Curvature"); False for float32-exact runs
            "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
            "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
            "eager": {k: v for k, v in self.eager.config().items() if k != "objective"},
        }

    def __repr__(self) -> str:
        state = "compiled" if self.compiled else f"eager fallback ({self.compile_error})"
        return f"CompiledOperator({self.name}, shape={self.shape}, dtype={self.dtype}, {state})"


def compile_operator(
    op: CurvatureOperator,
    mode: str | None = None,
    fullgraph: bool = False,
    *,
    backend: str | Callable = "inductor",
    dynamic: bool | None = False,
    chunk_size: int | None = None,
    warmup: bool = True,
    verify: bool = True,
    seed: int = 0,
    probe_width: int = 1,
    max_memory: Any = "inherit",
) -> CompiledOperator:
    """``torch.compile`` the products of a Hessian or GGN operator (opt-in; eager fallback recorded).

    Args:
        op: ``landscape.hessian(obj)`` or ``landscape.ggn(obj)`` (any engine / jvp mode: the
            compiled product is forward-over-reverse, resp. jvp + output Hessian + vjp).
        mode, fullgraph, backend, dynamic: passed to ``torch.compile`` (``dynamic=False``: one
            static graph per block width).
        chunk_size: columns per compiled call (default: the operator's ``chunk_size``).
        warmup: compile at construction (``compile_seconds`` then holds the compile time).
        verify: compare the first compiled product with the eager one (relative tolerance
            ``1e-3`` in float32, ``1e-8`` in float64) and fall back if they disagree.
        seed: seed of the warm-up probe.
        probe_width: columns of the warm-up probe (the block width compiled first).
        max_memory: budget of a block's peak memory (:mod:`landscape.curvature.memory`): the eager
            operator's (``"inherit"``, default), ``None`` for none, or a new budget.

    Returns:
        A :class:`CompiledOperator`; ``config()["compiled"]`` says whether products run compiled,
        ``config()["compile_error"]`` why not.
    """
    return CompiledOperator(
        op,
        mode=mode,
        fullgraph=fullgraph,
        backend=backend,
        dynamic=dynamic,
        chunk_size=chunk_size,
        warmup=warmup,
        verify=verify,
        seed=seed,
        probe_width=probe_width,
        max_memory=max_memory,
    )
