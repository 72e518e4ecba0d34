"""The Hessian ``H = d^2 L / d theta^2`` of the whole-dataset loss as an operator, and one-off ``H v``.

:class:`HessianOperator` has three per-batch products ``H_b V`` (``V``: ``[p, k]``; the base class
sums them over the batches of ``L = sum_b w_b l_b``, see ``objective.py``):

* ``"forward_over_reverse"``: ``H v = d/dt grad L(theta + t v)|_{t=0}``, i.e. ``torch.func.jvp``
  of ``torch.func.grad`` through ``functional_call`` (Pearlmutter 1994, "Fast exact multiplication
  by the Hessian", Sec. 3; the form used by curvlinops), the ``k`` probes batched by ``vmap`` in
  chunks of ``chunk_size``; a single probe runs with ``torch.autograd.forward_ad`` dual numbers
  through one backward pass instead (same numbers, less memory: :meth:`HessianOperator._hv_dual`).
* ``"double_backward"``: ``H v = grad_theta <grad_theta L, v>`` with ``autograd.grad(...,
  create_graph=True)`` on a *local* graph (never into ``.grad``).  For a single-batch objective the
  gradient graph is built once and reused across calls (PyHessian's trick), otherwise it is built
  once per batch per ``matmat`` call and shared by the ``k`` probes.
* ``"finite_difference"``: central differences of gradients,
  ``H v ~ (g(theta + h v) - g(theta - h v)) / (2 h)``, ``h = eps^(1/3) max(1, |theta|) / |v|``;
  error ``O(h^2)``: a cross-check, not an engine for production.

``engine="auto"`` (:meth:`HessianOperator._choose`, the one place the engine is picked) uses double
backward with a cached graph on CPU (fastest there: measured 0.9-1.0x PyHessian's per-HVP time; the
graph split by examples, below), without spending products on a calibration unless
``calibrate=True``.  On any other device it *measures*: the first block of each width (one vector /
several) runs both engines, untimed then timed, and the faster is kept
(``landscape.curvature.autotune``; timings, choice and the calibration's products in ``config()``).
For reference, an H100 in float32 gave: ResNet-20 on 128 CIFAR-shaped images, one vector, 3.1x a
gradient (double backward) vs 9.4x (forward-over-reverse); an MLP with 16 probes: 0.98x vs 0.36x a
gradient per probe; the fixed rule used before (``AUTO_BLOCK``) applies with ``calibrate=False``.
When forward-mode AD or ``vmap`` is not supported by the model/loss (e.g. ``jvp`` through
``mse_loss(reduction="mean")`` raises "ZeroTensors are immutable" in torch 2.13) the failure is
detected once and the engine falls back to double backward; ``engine_used`` and
``fallback_reason`` record what ran.

**Split graphs** (``graph_chunks``, :mod:`landscape.curvature.graph_split`): the cached graph of a
single batch kept as sub-graphs over its examples, for a lower peak at the same arithmetic.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad as func_grad
from torch.func import jvp, vmap

from landscape.curvature.autotune import short_error
from landscape.curvature.base import CurvatureOperator, saved_tensor_bytes
from landscape.curvature.graph_split import split_graph
from landscape.objective import Objective

ENGINES = ("auto", "forward_over_reverse", "double_backward", "finite_difference")
AUTO_BLOCK = 8  # on GPUs, "auto" runs forward-over-reverse from this many vectors per block
FOR, DB = "forward_over_reverse", "double_backward"


class _Batch:
    """One batch ``(x, y, w)`` with the buffers of its pass, and its gradient graphs once built."""

    __slots__ = ("x", "y", "w", "bufs", "graphs")

    def __init__(self, x: Any, y: torch.Tensor, w: float, bufs: dict[str, torch.Tensor]) -> None:
        self.x, self.y, self.w, self.bufs, self.graphs = x, y, w, bufs, None


class HessianOperator(CurvatureOperator):
    """Hessian ``H = d^2 L / d theta^2`` of the whole-dataset loss (module docstring).

    Args:
        objective, params: the objective and the point (default: its current parameters).
        engine: one of ``ENGINES``.
        chunk_size: probes per ``vmap`` call of forward-over-reverse (``None``: all at once).
        cache_graph: keep the gradient graphs between calls (double backward); ``"auto"``: when the
            objective has one batch.
        fd_eps: relative step of the finite-difference engine (default ``eps^(1/3)`` of the dtype).
        graph_chunks: keep the cached graph as this many sub-graphs over the batch's examples (same
            products, lower peak memory); ``"auto"``: on CPU, when it pays and the examples' losses
            add up; an int ``k > 1`` requires that they add up.
        calibrate: with ``engine="auto"``, time the engines on the first block of each width and
            keep the fastest: ``True``, ``False`` or ``"auto"`` (on accelerators, not on a CPU).
        max_memory: split blocks into chunks of columns whose measured peak stays within this budget.
        timer: the clock of the calibration (``time.perf_counter``; tests pass a scripted one).
    """

    name = "hessian"
    PRODUCTS = {
        FOR: "_forward_over_reverse",
        DB: "_double_backward",
        "finite_difference": "_finite_difference",
    }

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        engine: str = "auto",
        chunk_size: int | None = 32,
        cache_graph: bool | str = "auto",
        fd_eps: float | None = None,
        graph_chunks: int | str = "auto",
        calibrate: bool | str = "auto",
        max_memory: int | float | str | None = None,
        timer: Any = None,
    ) -> None:
        super().__init__(objective, params, max_memory=max_memory)
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self._calibration(calibrate, "engine", engine, "the engines", (DB, FOR), timer)
        if graph_chunks != "auto" and (
            isinstance(graph_chunks, bool) or not isinstance(graph_chunks, int) or graph_chunks < 1
        ):
            raise ValueError(f"graph_chunks must be 'auto' or a positive int, got {graph_chunks!r}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size}")
        self.engine, self.chunk_size, self.fd_eps = engine, chunk_size, fd_eps
        if cache_graph == "auto":
            cache_graph = len(objective.batch_sizes) == 1
        self.cache_graph = self._keep_batches = bool(cache_graph)
        self.graph_chunks = graph_chunks
        self.graph_chunks_used = 1
        self.graph_chunks_reason: str | None = None
        self.fallback_reason: str | None = None
        self._offsets = [0]
        for numel in objective.param_numels:
            self._offsets.append(self._offsets[-1] + numel)
        self.engine_used = engine if engine != "auto" else (DB if self.device.type == "cpu" else FOR)

    # ------------------------------------------------------------------ the choice of the product
    def _choose(self, k: int) -> str | None:
        """The engine a block of ``k`` columns runs on: the calibrated one of its width class (None:
        not timed yet); without calibration, ``engine="auto"`` on an accelerator and no fallback
        yet: forward-over-reverse from ``AUTO_BLOCK`` columns; otherwise ``engine_used``."""
        if self._timer is not None:
            return self._timer.choice.get("single" if k == 1 else "block")
        if self.engine == "auto" and self.device.type != "cpu" and self.fallback_reason is None:
            return FOR if k >= AUTO_BLOCK else DB
        return self.engine_used

    def _run(self, path: str, V: torch.Tensor) -> torch.Tensor:
        """``H V`` on ``path``; forward-over-reverse that fails falls back once (``engine="auto"``)."""
        if self._strict:  # timed: a failing engine is dropped by the timer
            return super()._run(path, V)
        self.engine_used = path
        if path != FOR:
            return super()._run(path, V)
        try:
            return super()._run(path, V)
        except Exception as err:  # noqa: BLE001 - any unsupported op: fall back once
            if self.engine != "auto":
                raise RuntimeError(
                    "the forward-over-reverse HVP engine failed on this model/loss "
                    f"({type(err).__name__}: {err}); use engine='double_backward' or 'auto'"
                ) from err
            self.engine_used = DB
            self.fallback_reason = short_error(err)
        return super()._run(DB, V)

    def _calibrated(self, k: int) -> None:
        self.engine_used = self._timer.choice["single" if k == 1 else "block"]
        self.fallback_reason = self._timer.failed.get(FOR)

    def _new_batch(self, index, x, y, w, bufs) -> _Batch:
        return _Batch(x, y, w, bufs)

    def _extra_config(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "engine_used": self.engine_used,
            "fallback_reason": self.fallback_reason,
            "chunk_size": self.chunk_size,
            "cache_graph": self.cache_graph,
            "graph_chunks": self.graph_chunks,
            "graph_chunks_used": self.graph_chunks_used,
            "graph_chunks_reason": self.graph_chunks_reason,
            "calibrate": self.calibrate,
            **({} if self._timer is None else self._timer.config()),
        }

    # ------------------------------------------------------------------ forward over reverse
    def _batch_loss(self, b: _Batch):
        return lambda sel: self.objective.batch_loss(self._full(sel), b.bufs, b.x, b.y, b.w)

    def _forward_over_reverse(self, b: _Batch, V: torch.Tensor) -> torch.Tensor:
        k, tangents = V.shape[1], self._split(V)
        if k == 1 or self.objective.fixed_rng:
            # single probes: autograd's forward AD through one backward pass (_hv_dual); for
            # stochastic="fixed" also blocks, one probe at a time: every forward re-seeds, but a
            # random op under vmap may draw its mask differently (on CUDA dropout is not the fused
            # kernel there), so the probes go one by one through the plain forward
            cols = [self._hv_dual(b, {n: t[j] for n, t in tangents.items()}) for j in range(k)]
            return torch.stack(cols, dim=1) if k > 1 else cols[0].unsqueeze(1)
        # torch.func.grad, not jacrev: jvp(jacrev(loss)) peaks lower but its LayerNorm-weight rows
        # are wrong in torch 2.13 (jvp of the vmapped layer-norm backward; 6% relative error on a
        # tiny TransformerEncoderLayer)
        g = func_grad(self._batch_loss(b))
        return self._join(
            vmap(lambda t: jvp(g, (self._theta,), (t,))[1], chunk_size=self.chunk_size)(tangents), k
        ).T

    def _hv_dual(self, b: _Batch, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """``H_b t`` as a flat ``[p]`` vector: the parameters as dual numbers ``theta + eps t``
        (``torch.autograd.forward_ad``), one backward pass, the tangents of the gradient.  The same
        numbers as ``jvp(torch.func.grad)``, but the backward frees its graph as it goes: ResNet-20
        (128 images, float32) peaks at 498 MB instead of 792 MB, 16% faster."""
        names = self.objective.param_names
        with fwAD.dual_level():
            leaves = [fwAD.make_dual(self._theta[n], t[n]).requires_grad_(True) for n in names]
            with torch.enable_grad():
                loss = self._batch_loss(b)(dict(zip(names, leaves)))
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            parts = []
            for n, g in zip(names, grads):
                tg = None if g is None else fwAD.unpack_dual(g).tangent
                parts.append(torch.zeros_like(self._theta[n]).reshape(-1) if tg is None else tg.reshape(-1))
            return torch.cat(parts)

    # ------------------------------------------------------------------ double backward
    def _double_backward(self, b: _Batch, V: torch.Tensor) -> torch.Tensor:
        """``H_b V`` by backward passes through the batch's gradient graph(s): kept (cached, split
        for a single batch) or built now and freed by the last backward as it goes (the peak of one
        product is then that of hessian-eigenthings' uncached product, not graph + backward)."""
        graphs = b.graphs
        if graphs is None:
            if not self.cache_graph:
                graphs = [self._build_graph(b.x, b.y, b.w, b.bufs)]
            elif len(self.objective.batch_sizes) == 1:
                graphs, self.graph_chunks_used, self.graph_chunks_reason = split_graph(self, b)
                b.graphs = graphs
            else:
                graphs = b.graphs = [self._build_graph(b.x, b.y, b.w, b.bufs)]
        free, k = not self.cache_graph, V.shape[1]
        if k == 1:  # one vector: one cat per graph, added in place
            flat = None
            for g in graphs:
                h = self._hv_flat(g, V[:, 0], retain=not free)
                flat = h if flat is None else flat.add_(h)
            return flat.unsqueeze(1)
        out = torch.zeros_like(V)
        for g in graphs:
            leaves, grads, idx = g
            for j in range(k if grads else 0):  # out[:, j] += H_g V[:, j]
                col = out[:, j]
                for i, h in zip(idx, self._hv(g, V[:, j], retain=not (free and j == k - 1))):
                    if h is not None:
                        col[self._offsets[i] : self._offsets[i + 1]] += h.reshape(-1)
        return out

    def _build_graph(self, x, y, w, bufs, record: dict | None = None):
        """The gradient graph of one (sub-)batch; ``record``: gets its loss and saved-tensor bytes."""
        names = self.objective.param_names
        leaves = [self._theta[n].detach().requires_grad_(True) for n in names]
        counter = saved_tensor_bytes() if record is not None else contextlib.nullcontext({})
        with torch.enable_grad(), counter as storages:
            loss = self.objective.batch_loss(self._full(dict(zip(names, leaves))), bufs, x, y, w)
            grads = torch.autograd.grad(loss, leaves, create_graph=True, allow_unused=True)
        if record is not None:
            record["loss"] = float(loss.detach())
            record["saved_bytes"] = sum(storages.values())
        idx = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        return leaves, [grads[i] for i in idx], idx

    def _hv(self, graph, v: torch.Tensor, retain: bool = True) -> tuple:
        """``H_b v`` for the parameters ``idx`` of the graph (entries may be None: no dependence)."""
        leaves, grads, idx = graph
        offsets = self._offsets
        vs = [v[offsets[i] : offsets[i + 1]].view_as(leaves[i]) for i in idx]
        return torch.autograd.grad(
            grads, [leaves[i] for i in idx], grad_outputs=vs, retain_graph=retain, allow_unused=True
        )

    def _hv_flat(self, graph, v: torch.Tensor, retain: bool = True) -> torch.Tensor:
        """``H_b v`` as one flat ``[p]`` vector: one ``cat`` (zeros where ``H_b`` has no rows)."""
        leaves, grads, idx = graph
        parts: list[torch.Tensor | None] = [None] * len(leaves)
        if grads:
            for i, h in zip(idx, self._hv(graph, v, retain)):
                parts[i] = h
        return torch.cat(
            [
                h.reshape(-1) if h is not None else torch.zeros_like(leaves[i]).reshape(-1)
                for i, h in enumerate(parts)
            ]
        )

    # ------------------------------------------------------------------ finite differences
    def _finite_difference(self, b: _Batch, V: torch.Tensor) -> torch.Tensor:
        obj = self.objective
        eps = self.fd_eps if self.fd_eps is not None else torch.finfo(self.dtype).eps ** (1.0 / 3.0)
        theta = obj.flatten(self._theta)
        scale = max(1.0, float(theta.norm()))
        grad = func_grad(self._batch_loss(b))
        out = torch.zeros_like(V)
        for j in range(V.shape[1]):
            v = V[:, j]
            vn = float(v.norm())
            if vn == 0.0 or not math.isfinite(vn):
                continue
            h = eps * scale / vn
            gp, gm = (obj.flatten(grad(obj.unflatten(theta + s * h * v))) for s in (1.0, -1.0))
            out[:, j] = (gp - gm) / (2 * h)
        return out


class HVPEngine(HessianOperator):
    """Deprecated: the Hessian's engines are the products of :class:`HessianOperator` (this name
    warns and builds one; ``copy`` is ignored, the operator always holds private copies)."""

    def __init__(self, objective: Objective, params: Any = None, *, copy: bool = True, **kwargs: Any) -> None:
        warnings.warn(
            "HVPEngine is deprecated and will be removed in the next release: use "
            "landscape.hessian(obj, engine=...) (a HessianOperator), which runs the same engines",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(objective, params, **kwargs)

    def path_key(self, k: int) -> str:
        return self._path_key(k)


# --------------------------------------------------------------------------------------------
def hessian(
    objective: Objective,
    *,
    params: Any = None,
    engine: str = "auto",
    chunk_size: int | None = 32,
    cache_graph: bool | str = "auto",
    fd_eps: float | None = None,
    graph_chunks: int | str = "auto",
    calibrate: bool | str = "auto",
    max_memory: int | float | str | None = None,
) -> HessianOperator:
    """The Hessian of the whole-dataset loss as a :class:`HessianOperator` (arguments as there;
    ``max_memory``: :mod:`landscape.curvature.memory`)."""
    kw = dict(engine=engine, chunk_size=chunk_size, cache_graph=cache_graph, fd_eps=fd_eps)
    return HessianOperator(
        objective, params, graph_chunks=graph_chunks, calibrate=calibrate, max_memory=max_memory, **kw
    )


def hvp(
    objective: Objective,
    v: torch.Tensor,
    params: Any = None,
    *,
    engine: str = "auto",
    chunk_size: int | None = 32,
    max_memory: int | float | str | None = None,
) -> torch.Tensor:
    """One-off Hessian-vector product ``H v`` (``v``: ``[p]`` or ``[p, k]``) of the whole-dataset loss
    (``max_memory``: as for :func:`hessian`).

    For repeated products build an operator once (``landscape.hessian(obj)``): it caches the graph.
    """
    op = HessianOperator(
        objective,
        params=params,
        engine=engine,
        chunk_size=chunk_size,
        cache_graph=False,
        max_memory=max_memory,
    )
    return op @ v
