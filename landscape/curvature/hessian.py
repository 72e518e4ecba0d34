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

**Split graphs.** A cached graph holds the forward activations and the first backward's tensors
``S`` between products, and the second backward adds the adjoints of every forward activation at
once (about ``0.6 S`` on ResNet-20): the peak is ``1.6 S``.  When the loss is a sum over examples
that do not interact, ``H = sum_c H_c`` over sub-batches ``c`` with weights ``w |c| / |B|`` (mean
reduction) and the graph can be kept as ``k`` sub-graphs: the same saved tensors, but a product's
adjoints live for one sub-graph at a time (peak ``S (1 + 0.6 / k)``), at the same arithmetic.
``graph_chunks="auto"`` splits on CPU into sub-batches of at least ``GRAPH_CHUNK = 16`` examples
(at most ``MAX_GRAPH_CHUNKS = 4``) when the first sub-graph's saved tensors (the weights among them)
are at least three times the parameters' bytes (otherwise the ``k`` held gradients would cost more
than the adjoints saved; the 1.9M-parameter MLP keeps one graph), and only after checking that the
example losses add up: the weighted sub-batch losses must equal the batch loss to
``8 sqrt(n) eps``; a model or loss that couples examples (train-mode BatchNorm, a class-weighted
mean, a contrastive loss) keeps one graph and ``graph_chunks_reason`` says why.  A random forward
(even ``stochastic="fixed"``: its masks depend on the batch shape) is never split.  ResNet-20, 128
CIFAR-shaped images, CPU: peak memory of a product 609 -> 472 MB at 4 sub-graphs, and 0.85x the
time of one graph (smaller working sets); WRN-16-4 on 32 images: 446 -> 405 MB at 2.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad as func_grad
from torch.func import jvp, vmap

from landscape.curvature.autotune import PathTimer
from landscape.curvature.base import CurvatureOperator, saved_tensor_bytes
from landscape.inputs import _map_inputs
from landscape.objective import Objective

ENGINES = ("auto", "forward_over_reverse", "double_backward", "finite_difference")
AUTO_BLOCK = 8  # on GPUs, "auto" runs forward-over-reverse from this many vectors per block
GRAPH_CHUNK = 16  # "auto" graph splitting: examples per sub-graph, at least
MAX_GRAPH_CHUNKS = 4
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
        if calibrate not in (True, False, "auto"):
            raise ValueError(f"calibrate must be True, False or 'auto', got {calibrate!r}")
        if calibrate is True and engine != "auto":
            raise ValueError(
                f"calibrate=True times the engines against each other: use engine='auto', not {engine!r}"
            )
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
        on_cpu = self.device.type == "cpu"
        self.engine_used = engine if engine != "auto" else (DB if on_cpu else FOR)
        # engine="auto" on an accelerator (or calibrate=True): the engines timed on the first block
        # of each width (curvature.autotune); on a CPU the measured default without calibration
        self.calibrate = engine == "auto" and (calibrate is True or (calibrate == "auto" and not on_cpu))
        if self.calibrate:
            self._timer = PathTimer((DB, FOR), self.device, time.perf_counter if timer is None else timer)

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
            self.fallback_reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
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
                graphs = b.graphs = self._split_graphs(b)
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

    # ------------------------------------------------------------------ split graphs
    def _split_graphs(self, b: _Batch) -> list:
        """The cached graph of the objective's one batch, as ``graph_chunks_used`` sub-graphs."""
        x, y, w, bufs = b.x, b.y, b.w, b.bufs
        k, why = self._chunks_wanted(int(y.shape[0]))
        self.graph_chunks_reason = why
        if k == 1:
            return [self._build_graph(x, y, w, bufs)]
        parts = self._sub_batches(x, y, w, k)
        records: list[dict] = [{} for _ in parts]
        param_bytes = sum(t.numel() * t.element_size() for t in self._theta.values())
        graphs: list = []
        fallback: str | None = None
        try:
            for part, rec in zip(parts, records):
                graphs.append(self._build_graph(*part, bufs, record=rec))
                if self.graph_chunks == "auto" and rec is records[0] and rec["saved_bytes"] < 3 * param_bytes:
                    fallback = (
                        f"activations small against the parameters ({rec['saved_bytes'] / 2**20:.1f} MB "
                        f"saved per sub-graph, {param_bytes / 2**20:.1f} MB of parameters): one graph"
                    )
                    break
        except Exception as err:  # noqa: BLE001 - e.g. an input that is not batch-first
            if self.graph_chunks != "auto":
                raise
            fallback = f"a sub-batch failed ({type(err).__name__}: {str(err)[:120]}): one graph"
        if fallback is None:
            fallback = self._losses_disagree(b, k, [r["loss"] for r in records])
        if fallback is not None:
            graphs.clear()  # free the sub-graphs before the whole batch's graph is built
            self.graph_chunks_reason = fallback
            return [self._build_graph(x, y, w, bufs)]
        self.graph_chunks_used = k
        return graphs

    def _losses_disagree(self, b: _Batch, k: int, losses: list[float]) -> str | None:
        """Why the weighted sub-batch ``losses`` do not add up to the batch loss (``None``: they do, to
        ``8 sqrt(n) eps``); an explicit ``graph_chunks`` raises instead."""
        with torch.no_grad():
            full = float(self._batch_loss(b)(self._theta))
        total = sum(losses)
        scale = max(abs(full), sum(abs(v) for v in losses))
        eps = torch.finfo(self.dtype).eps
        if abs(total - full) <= 8.0 * math.sqrt(int(b.y.shape[0])) * eps * scale:
            return None
        msg = (
            f"the {k} sub-batch losses add up to {total:.9g}, the batch loss is {full:.9g}: the model or "
            "loss couples the examples of a batch (e.g. a class-weighted mean, a loss over pairs)"
        )
        if self.graph_chunks != "auto":
            raise ValueError(f"graph_chunks={self.graph_chunks}: {msg}; use graph_chunks=1")
        return msg + ": one graph"

    def _chunks_wanted(self, n: int) -> tuple[int, str | None]:
        """Number of sub-graphs to try for a batch of ``n`` examples, and why not more."""
        obj = self.objective
        if self.graph_chunks != "auto":
            k = min(int(self.graph_chunks), n)
        elif self.device.type != "cpu":
            return 1, "graph_chunks='auto' splits graphs on CPU only"
        else:
            k = min(MAX_GRAPH_CHUNKS, n // GRAPH_CHUNK)
            if k < 2:
                return 1, f"a batch of {n} examples (splitting needs {2 * GRAPH_CHUNK})"
        if k < 2:
            return 1, None
        coupled = None
        if obj.random_forward:
            coupled = "the forward draws random numbers (its masks depend on the batch shape)"
        elif obj.batch_coupled:
            coupled = f"BatchNorm layer(s) {obj.batch_coupled} use batch statistics (mode='train')"
        elif torch.finfo(self.dtype).bits < 32:
            coupled = f"{self.dtype} is too coarse to check that the example losses add up"
        if coupled is None:
            return k, None
        if self.graph_chunks != "auto":
            raise ValueError(f"graph_chunks={self.graph_chunks}: {coupled}; use graph_chunks=1")
        return 1, coupled + ": one graph"

    def _sub_batches(self, x, y, w: float, k: int) -> list[tuple]:
        """``k`` contiguous sub-batches with weights ``w |c| / n`` (mean reduction) or ``w`` (sum)."""
        n = int(y.shape[0])
        sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        out, start = [], 0
        for size in sizes:
            sl = slice(start, start + size)
            wc = w * size / n if self.objective.reduction == "mean" else w
            out.append((_map_inputs(x, lambda t, sl=sl: t[sl]), y[sl], wc))
            start += size
        return out

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
