"""Hessian-vector products of an :class:`~landscape.objective.Objective` at a fixed point.

Three engines compute ``H V`` for a block of probes ``V`` (``[p, k]``) with
``H = d^2 L / d theta^2`` of the whole-dataset loss ``L = sum_b w_b l_b`` (see ``objective.py``):

* ``"forward_over_reverse"``: ``H v = d/dt grad L(theta + t v)|_{t=0}``, i.e. ``torch.func.jvp``
  of ``torch.func.grad`` through ``functional_call`` (Pearlmutter 1994, "Fast exact multiplication
  by the Hessian", Sec. 3; the form used by curvlinops), the ``k`` probes batched by ``vmap`` in
  chunks of ``chunk_size``; a single probe runs with ``torch.autograd.forward_ad`` dual numbers
  through one backward pass instead (same numbers, less memory: ``HVPEngine._hv_dual``).
* ``"double_backward"``: ``H v = grad_theta <grad_theta L, v>`` with ``autograd.grad(...,
  create_graph=True)`` on a *local* graph (never into ``.grad``).  For a single-batch objective the
  gradient graph is built once and reused across calls (PyHessian's trick), otherwise it is built
  once per batch per ``matmat`` call and shared by the ``k`` probes.
* ``"finite_difference"``: central differences of gradients,
  ``H v ~ (g(theta + h v) - g(theta - h v)) / (2 h)``, ``h = eps^(1/3) max(1, |theta|) / |v|``;
  error ``O(h^2)``: a cross-check, not an engine for production.

``engine="auto"`` uses double backward with a cached graph on CPU (fastest there: measured 0.9-1.0x
PyHessian's per-HVP time; the graph split by examples, below), without spending products on a
calibration unless ``calibrate=True``. On any other device it *measures*: the first block of each
width (one vector / several) runs both engines, untimed then timed, and the faster is kept
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
than the adjoints saved; the 1.9M-parameter MLP keeps one graph), and
only after checking that the example losses add up: the weighted sub-batch losses must equal the
batch loss to ``8 sqrt(n) eps``; a model or loss that couples examples (train-mode BatchNorm, a
class-weighted mean, a contrastive loss) keeps one graph and ``graph_chunks_reason`` says why.  A
random forward (even ``stochastic="fixed"``: its masks depend on the batch shape) is never split.
ResNet-20, 128 CIFAR-shaped images, CPU: peak memory of a product 609 -> 472 MB at 4 sub-graphs,
and 0.85x the time of one graph (smaller working sets); WRN-16-4 on 32 images: 446 -> 405 MB at 2.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
import torch.autograd.forward_ad as fwAD
from torch.func import grad as func_grad
from torch.func import jvp, vmap

from landscape.curvature.autotune import PathTimer, width_class
from landscape.curvature.base import product_kernels, saved_tensor_bytes
from landscape.curvature.memory import make_budget
from landscape.inputs import _map_inputs
from landscape.objective import Objective

__all__ = ["HVPEngine", "ENGINES"]

ENGINES = ("auto", "forward_over_reverse", "double_backward", "finite_difference")
AUTO_BLOCK = 8  # on GPUs, "auto" runs forward-over-reverse from this many vectors per block
GRAPH_CHUNK = 16  # "auto" graph splitting: examples per sub-graph, at least
MAX_GRAPH_CHUNKS = 4


class HVPEngine:
    """Products ``H @ V`` of the objective's Hessian at ``params`` (default: the current point).

    Args:
        objective: the :class:`Objective`.
        params: the point: ``None`` (current parameters), a dict or a flat ``[p]`` vector.
        engine: one of ``ENGINES``.
        chunk_size: number of probes per ``vmap`` call of the forward-over-reverse engine
            (``None``: all at once).
        cache_graph: keep the gradient graph of a single-batch objective between calls
            (double backward); ``"auto"``: when the objective has one batch.
        graph_chunks: keep the cached graph as this many sub-graphs over the batch's examples
            (same products, lower peak memory; module docstring); ``"auto"``: on CPU, when it
            pays and the examples' losses add up; an int ``k > 1`` requires that they add up.
        fd_eps: relative step of the finite-difference engine (default ``eps^(1/3)`` of the dtype).
        copy: keep private copies of the point (``False``: use ``params`` as given, for a caller
            that holds private copies already, e.g. :class:`~landscape.curvature.HessianOperator`).
        max_memory: split blocks into chunks of columns whose measured peak stays within this budget
            (:mod:`landscape.curvature.memory`; ``None``: no limit; a ``HessianOperator`` splits
            blocks itself, before they reach its engine).

    Products run with :func:`~landscape.curvature.base.product_kernels`: attention on the math SDPA
    backend (the fused kernels have no double backward) and eval-mode batch norm as its affine map.
    """

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        engine: str = "auto",
        chunk_size: int | None = 32,
        cache_graph: bool | str = "auto",
        fd_eps: float | None = None,
        copy: bool = True,
        graph_chunks: int | str = "auto",
        calibrate: bool | str = "auto",
        timer: Any = None,
        max_memory: Any = None,
    ) -> None:
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
        objective.require_fixed("hessian")
        self._budget = make_budget(max_memory, objective.device, "hessian")
        self.objective = objective
        self.engine = engine
        self.chunk_size = chunk_size
        self.fd_eps = fd_eps
        full = objective.point(params)
        own = (lambda t: t.detach().clone()) if copy else (lambda t: t.detach())
        self._theta = {n: own(full[n]) for n in objective.param_names}
        self._frozen = {n: own(t) for n, t in full.items() if n not in self._theta}
        if cache_graph == "auto":
            cache_graph = len(objective.batch_sizes) == 1
        self.cache_graph = bool(cache_graph)
        self.graph_chunks = graph_chunks
        self.graph_chunks_used = 1
        self.graph_chunks_reason: str | None = None
        self._graph: list[tuple[list[torch.Tensor], list[torch.Tensor], list[int]]] | None = None
        self.fallback_reason: str | None = None
        self._offsets = [0]
        for numel in objective.param_numels:
            self._offsets.append(self._offsets[-1] + numel)
        if engine == "auto":
            self.engine_used = "double_backward" if objective.device.type == "cpu" else "forward_over_reverse"
        else:
            self.engine_used = engine
        # engine="auto" on an accelerator (or calibrate=True): the engines timed on the first block
        # of each width, the fastest kept (curvature.autotune); on a CPU the measured default
        # (double backward) without calibration products, unless asked
        timed = engine == "auto" and (
            calibrate is True or (calibrate == "auto" and objective.device.type != "cpu")
        )
        self.calibrate = bool(timed)
        self._paths: PathTimer | None = None
        if timed:
            clock = time.perf_counter if timer is None else timer
            self._paths = PathTimer(("double_backward", "forward_over_reverse"), objective.device, clock)

    # ------------------------------------------------------------------ helpers
    def _split(self, V: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[p, k]`` -> dict of ``[k, *shape]``."""
        obj = self.objective
        out, off = {}, 0
        for n, shape, numel in zip(obj.param_names, obj.param_shapes, obj.param_numels):
            out[n] = V[off : off + numel].T.reshape(V.shape[1], *shape)
            off += numel
        return out

    def _join(self, d: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        """dict of ``[k, *shape]`` -> ``[p, k]``."""
        return torch.cat([d[n].reshape(k, -1) for n in self.objective.param_names], dim=1).T

    def config(self) -> dict[str, Any]:
        out = {
            "engine": self.engine,
            "engine_used": self.engine_used,
            "fallback_reason": self.fallback_reason,
            "chunk_size": self.chunk_size,
            "cache_graph": self.cache_graph,
            "graph_chunks": self.graph_chunks,
            "graph_chunks_used": self.graph_chunks_used,
            "graph_chunks_reason": self.graph_chunks_reason,
            "calibrate": self.calibrate,
            "memory_budget": None if self._budget is None else self._budget.config(),
        }
        if self._paths is not None:
            out.update(self._paths.config())
        return out

    def _run_path(self, path: str, V: torch.Tensor) -> torch.Tensor:
        return self._forward_over_reverse(V) if path == "forward_over_reverse" else self._double_backward(V)

    def path_key(self, k: int) -> str:
        """The path a block of ``k`` columns runs on now, and its width class (memory fits per key)."""
        cls = width_class(k)
        if self._paths is not None:
            return f"{self._paths.choice.get(cls, 'uncalibrated')}/{cls}"
        path = self.engine_used
        if self.engine == "auto" and self.objective.device.type != "cpu" and self.fallback_reason is None:
            path = "forward_over_reverse" if k >= AUTO_BLOCK else "double_backward"
        return f"{path}/{cls}"

    # ------------------------------------------------------------------ public
    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """``H @ V`` for ``V`` of shape ``[p, k]`` (local data; no all-reduce here)."""
        if self._budget is not None:
            return self._budget.run(V, self._matmat, self.path_key)
        return self._matmat(V)

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        if self._paths is not None:
            with self.objective.evaluating(), product_kernels():
                out = self._paths.run(V, self._run_path)
            self.engine_used = self._paths.choice[width_class(int(V.shape[1]))]
            self.fallback_reason = self._paths.failed.get("forward_over_reverse")
            return out
        if self.engine == "auto" and self.objective.device.type != "cpu" and self.fallback_reason is None:
            self.engine_used = "forward_over_reverse" if V.shape[1] >= AUTO_BLOCK else "double_backward"
        with self.objective.evaluating(), product_kernels():
            if self.engine_used == "forward_over_reverse" and self.engine == "auto":
                try:
                    return self._forward_over_reverse(V)
                except Exception as err:  # noqa: BLE001 - any unsupported op: fall back once
                    self.engine_used = "double_backward"
                    self.fallback_reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            if self.engine_used == "forward_over_reverse":
                try:
                    return self._forward_over_reverse(V)
                except Exception as err:
                    raise RuntimeError(
                        "the forward-over-reverse HVP engine failed on this model/loss "
                        f"({type(err).__name__}: {err}); use engine='double_backward' or 'auto'"
                    ) from err
            if self.engine_used == "double_backward":
                return self._double_backward(V)
            return self._finite_difference(V)

    # ------------------------------------------------------------------ engines
    def _forward_over_reverse(self, V: torch.Tensor) -> torch.Tensor:
        obj = self.objective
        k = V.shape[1]
        tangents = self._split(V)
        bufs = obj.buffers()
        out = None
        for x, y, w in obj.batches():

            def batch_loss(sel, x=x, y=y, w=w):
                return w * obj.loss_fn(obj.call({**self._frozen, **sel}, bufs, x), y)

            if k == 1 or obj.fixed_rng:
                # single probes: autograd's forward AD through one backward pass (below); for
                # stochastic="fixed" also blocks, one probe at a time: every forward re-seeds, but a
                # random op under vmap may draw its mask differently (on CUDA dropout is not the fused
                # kernel there), so the probes go one by one through the plain forward
                cols = [self._hv_dual(batch_loss, {n: t[j] for n, t in tangents.items()}) for j in range(k)]
                flat = torch.stack(cols, dim=1) if k > 1 else cols[0].unsqueeze(1)
            else:
                # torch.func.grad, not jacrev: jvp(jacrev(loss)) peaks lower but its LayerNorm-weight
                # rows are wrong in torch 2.13 (jvp of the vmapped layer-norm backward; 6% relative
                # error on a tiny TransformerEncoderLayer)
                g = func_grad(batch_loss)

                def hv(t, g=g):
                    return jvp(g, (self._theta,), (t,))[1]

                flat = self._join(vmap(hv, chunk_size=self.chunk_size)(tangents), k)
            out = flat if out is None else out.add_(flat)
        return out

    def _hv_dual(self, batch_loss, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """``H_b t`` as a flat ``[p]`` vector: the parameters as dual numbers ``theta + eps t``
        (``torch.autograd.forward_ad``), one backward pass, the tangents of the gradient.  The same
        numbers as ``jvp(torch.func.grad)``, but the backward frees its graph as it goes: ResNet-20
        (128 images, float32) peaks at 498 MB instead of 792 MB, 16% faster."""
        names = self.objective.param_names
        with fwAD.dual_level():
            leaves = [fwAD.make_dual(self._theta[n], t[n]).requires_grad_(True) for n in names]
            with torch.enable_grad():
                loss = batch_loss(dict(zip(names, leaves)))
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            parts = []
            for n, g in zip(names, grads):
                tg = None if g is None else fwAD.unpack_dual(g).tangent
                parts.append(torch.zeros_like(self._theta[n]).reshape(-1) if tg is None else tg.reshape(-1))
            return torch.cat(parts)

    def _build_graph(self, bufs, x, y, w, record: dict | None = None):
        """The gradient graph of one (sub-)batch; ``record``: gets its loss and saved-tensor bytes."""
        obj = self.objective
        leaves = [self._theta[n].detach().requires_grad_(True) for n in obj.param_names]
        params = {**self._frozen, **dict(zip(obj.param_names, leaves))}
        counter = saved_tensor_bytes() if record is not None else contextlib.nullcontext({})
        with torch.enable_grad(), counter as storages:
            loss = w * obj.loss_fn(obj.call(params, bufs, x), y)
            grads = torch.autograd.grad(loss, leaves, create_graph=True, allow_unused=True)
        if record is not None:
            record["loss"] = float(loss.detach())
            record["saved_bytes"] = sum(storages.values())
        idx = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        return leaves, [grads[i] for i in idx], idx

    # ------------------------------------------------------------------ split graphs
    def _split_graphs(self, bufs, x, y, w) -> list:
        """The cached graph of the objective's one batch, as ``graph_chunks_used`` sub-graphs."""
        n = int(y.shape[0])
        k, why = self._chunks_wanted(n)
        self.graph_chunks_reason = why
        if k == 1:
            return [self._build_graph(bufs, x, y, w)]
        parts = self._sub_batches(x, y, w, k)
        records = [{} for _ in parts]
        param_bytes = sum(t.numel() * t.element_size() for t in self._theta.values())
        graphs: list = []
        fallback: str | None = None
        try:
            for part, rec in zip(parts, records):
                graphs.append(self._build_graph(bufs, *part, record=rec))
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
            fallback = self._losses_disagree(bufs, x, y, w, k, [r["loss"] for r in records])
        if fallback is not None:
            graphs.clear()  # free the sub-graphs before the whole batch's graph is built
            self.graph_chunks_reason = fallback
            return [self._build_graph(bufs, x, y, w)]
        self.graph_chunks_used = k
        return graphs

    def _losses_disagree(self, bufs, x, y, w: float, k: int, losses: list[float]) -> str | None:
        """Why the weighted sub-batch ``losses`` do not add up to the batch loss (``None``: they do, to
        ``8 sqrt(n) eps``); an explicit ``graph_chunks`` raises instead."""
        obj = self.objective
        with torch.no_grad():
            full = float(w * obj.loss_fn(obj.call({**self._frozen, **self._theta}, bufs, x), y))
        total = sum(losses)
        scale = max(abs(full), sum(abs(v) for v in losses))
        if abs(total - full) <= 8.0 * math.sqrt(int(y.shape[0])) * torch.finfo(obj.dtype).eps * scale:
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
        elif obj.device.type != "cpu":
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
        elif torch.finfo(obj.dtype).bits < 32:
            coupled = f"{obj.dtype} is too coarse to check that the example losses add up"
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

    def _apply_graph(self, graph, V: torch.Tensor, out: torch.Tensor, free: bool = False) -> None:
        """``out[:, j] += H_b V[:, j]``; ``free``: the last backward releases the graph as it goes."""
        leaves, grads, idx = graph
        if not grads:
            return
        offsets = self._offsets
        k = V.shape[1]
        for j in range(k):
            hv = self._hv(graph, V[:, j], retain=not (free and j == k - 1))
            col = out[:, j]
            for i, h in zip(idx, hv):
                if h is not None:
                    col[offsets[i] : offsets[i + 1]] += h.reshape(-1)

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

    def _graphs(self):
        obj = self.objective
        if self.cache_graph:
            if self._graph is None:
                bufs = obj.buffers()
                batches = list(obj.batches())
                if len(batches) == 1:
                    self._graph = self._split_graphs(bufs, *batches[0])
                else:
                    self._graph = [self._build_graph(bufs, x, y, w) for x, y, w in batches]
            yield from self._graph
            return
        bufs = obj.buffers()
        for x, y, w in obj.batches():
            yield self._build_graph(bufs, x, y, w)

    def _double_backward(self, V: torch.Tensor) -> torch.Tensor:
        # uncached: the last backward through each batch's graph frees it as it goes (the peak of
        # one product is then that of hessian-eigenthings' uncached product, not graph + backward)
        free = not self.cache_graph
        if V.shape[1] == 1:  # one vector: one cat per batch, added in place
            flat = None
            for graph in self._graphs():
                h = self._hv_flat(graph, V[:, 0], retain=not free)
                flat = h if flat is None else flat.add_(h)
                del graph  # uncached: free this batch's graph before the next one is built
            return flat.unsqueeze(1)
        out = torch.zeros_like(V)
        for graph in self._graphs():
            self._apply_graph(graph, V, out, free)
            del graph
        return out

    def _grad_at(self, theta: dict[str, torch.Tensor]) -> torch.Tensor:
        obj = self.objective
        bufs = obj.buffers()
        total = None
        for x, y, w in obj.batches():

            def batch_loss(sel, x=x, y=y, w=w):
                return w * obj.loss_fn(obj.call({**self._frozen, **sel}, bufs, x), y)

            g = obj.flatten(func_grad(batch_loss)(theta))
            total = g if total is None else total + g
        return total

    def _finite_difference(self, V: torch.Tensor) -> torch.Tensor:
        obj = self.objective
        eps = self.fd_eps if self.fd_eps is not None else torch.finfo(obj.dtype).eps ** (1.0 / 3.0)
        theta = obj.flatten(self._theta)
        scale = max(1.0, float(theta.norm()))
        out = torch.zeros_like(V)
        for j in range(V.shape[1]):
            v = V[:, j]
            vn = float(v.norm())
            if vn == 0.0 or not math.isfinite(vn):
                continue
            h = eps * scale / vn
            gp = self._grad_at(obj.unflatten(theta + h * v))
            gm = self._grad_at(obj.unflatten(theta - h * v))
            out[:, j] = (gp - gm) / (2 * h)
        return out
