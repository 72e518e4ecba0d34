"""``A = sum_b J_b^T M_b J_b``: the machinery of every curvature matrix with an output-space factor.

``J_b`` is the Jacobian of the network output on batch ``b``, ``M_b`` a matrix in output space: the
output Hessian for the generalised Gauss-Newton (:mod:`landscape.curvature.ggn`), per-example output
gradient moments for the empirical and Monte-Carlo Fisher (:mod:`landscape.curvature.fisher`).  One
product ``A V`` (``V``: ``[p, k]``) per batch ``b`` is three steps:

1. ``J_b V``: forward-mode AD (``torch.func.jvp``, the ``k`` tangents batched with ``vmap``); where
   forward mode is unsupported by some op it falls back, once and recorded, to the reverse-only
   "double vjp" (the vjp of the linear map ``u -> J_b^T u``), which costs a second backward pass;
2. ``M_b (J_b V)`` (:meth:`OutputSpaceOperator._output_matrix`, computed once per batch and kept);
3. ``J_b^T (w_b M_b J_b V)``: one backward pass through the forward graph of the batch
   (``torch.autograd.grad``, the ``k`` columns batched with ``is_grads_batched``).

A single vector (``k = 1``) takes a direct path: one ``jvp``, one backward and the per-parameter
results written into one flat column, no ``vmap`` and no intermediate ``[k, p]`` blocks.

Memory decides whether the forward graph of step 3 is kept between products.  Kept, it is alive
while step 1 runs, so a product peaks at the graph plus the forward-mode pass; rebuilt, each product
peaks at the larger of the forward-mode pass and one forward + backward (the graph is freed during
its backward), at the cost of one more forward.  On ResNet-20 (128 images, float32) the graph holds
189 MB and the forward-mode pass 115 MB: 304 MB kept, 232 MB rebuilt.  ``cache="auto"`` keeps it
for a single-batch objective when its saved tensors (counted with saved-tensor hooks while it is
built) take at most the memory of one parameter vector -- MLPs, where products are dominated by
parameter-sized vectors -- and rebuilds it otherwise; the output-space factors (output, ``M_b``)
are kept either way.  ``jvp="linearize"`` keeps a traced linearisation (``torch.func.linearize``) for
step 1 as well: faster per product, much more memory.

``jvp="auto"`` (default) is forward mode on a CPU (the fastest in ``benchmarks/bench_products.py``,
with no timing).  On any other device, or with ``calibrate=True``, the first block of each width
class (one vector / several) times forward mode against the linearisation, untimed then timed, and
keeps the faster (:class:`~landscape.curvature.autotune.PathTimer`; an H100 ran ``"linearize"``
1.5-1.7x faster on ResNet-20, WRN-16-4 and a transformer); the double vjp stays the fallback.
The path is picked in one function, :meth:`OutputSpaceOperator._choose`, and what the products
found out is kept in one record, :class:`JVPRecord` (read by ``config()``).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partialmethod
from typing import Any

import torch
from torch.func import jvp, linearize, vmap

from landscape.curvature.autotune import short_error, width_class
from landscape.curvature.base import CurvatureOperator, saved_tensor_bytes
from landscape.objective import Objective

JVP_MODES = ("auto", "forward", "linearize", "double_vjp")
# jvp="auto" times these; the double vjp (a second backward pass per column) is the fallback, never faster
JVP_CANDIDATES = ("forward", "linearize")


@dataclass
class JVPRecord:
    """The one record of an output-space operator's ``J V`` path and of what its products found out
    (``config()`` reads it)."""

    path: str  # the path without calibration: jvp= ("forward" for "auto"; "double_vjp" once it failed)
    used: str | None = None  # what the last product ran as
    checked: dict[str, str] = field(default_factory=dict)  # path -> what it resolved to (a fallback)
    fallback_reason: str | None = None
    vmap: bool | None = None  # None: no batched backward yet; False: vmap failed, columns one by one
    vmap_error: str | None = None
    graph_saved_bytes: int | None = None  # the forward graph's saved tensors (cache="auto")
    graph_cached: bool | None = None
    output_matrix: str | None = None  # the kind of M_b
    pe_vmap: bool = True  # the per-example gradients (Fisher) under vmap
    pe_vmap_error: str | None = None


# torch's own warnings while it traces or runs forward mode for us (torch 2.x), which say nothing
# about the caller's model: const-folding the traced linearisation inserts get_attr nodes before it
# registers their tensors (torch.fx), and the first forward-mode call of a process imports torch's
# jvp decompositions, which are written with torch.jit.script
_TORCH_INTERNAL_WARNINGS = (
    (r"Attempted to insert a get_attr Node with no underlying reference", UserWarning, r"torch\.fx\."),
    (r"`torch\.jit\.script` is deprecated", DeprecationWarning, r"torch\.jit\."),
)


@contextlib.contextmanager
def _quiet_forward_mode() -> Iterator[None]:
    """Forward mode and ``torch.func.linearize`` without :data:`_TORCH_INTERNAL_WARNINGS` (exactly
    those: each filter matches the message, the category and the torch module that warns); every
    other warning, the model's own included, passes through."""
    with warnings.catch_warnings():
        for message, category, module in _TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
        yield


# --------------------------------------------------------------------------------------------
def _vmap_or_loop(fn: Callable, tangents: dict[str, torch.Tensor], k: int, chunk_size: int | None, rec):
    """``vmap(fn)(tangents)``; if vmap is unsupported by some op, loop over the ``k`` columns once and
    remember it in ``rec.vmap``."""
    if rec.vmap is not False:
        try:
            return vmap(fn, chunk_size=chunk_size)(tangents)
        except Exception as err:  # noqa: BLE001 - fall back to a plain loop
            rec.vmap, rec.vmap_error = False, short_error(err)
    return torch.stack([fn({n: t[j] for n, t in tangents.items()}) for j in range(k)])


class _Graph:
    """The forward graph of one batch with the parameters as leaves: ``J^T u`` by backward passes."""

    def __init__(self, op: OutputSpaceOperator, f: Callable, x: Any, bufs: dict, measure: bool) -> None:
        names = op.objective.param_names
        self.leaves = [op._theta[n].detach().requires_grad_(True) for n in names]
        self.saved_bytes: int | None = None
        with torch.enable_grad():
            if not measure:
                self.out = f(dict(zip(names, self.leaves)))
                return
            # bytes of the tensors autograd saves for the backward, except what exists anyway
            # (parameters, inputs, buffers): the memory that keeping the graph costs
            xs = [x] if isinstance(x, torch.Tensor) else x.values() if isinstance(x, dict) else x
            have = [*self.leaves, *bufs.values(), *(t for t in xs if isinstance(t, torch.Tensor))]
            with saved_tensor_bytes(skip=have) as seen:
                self.out = f(dict(zip(names, self.leaves)))
            self.saved_bytes = sum(seen.values())

    def vjp(self, u: torch.Tensor, retain: bool) -> tuple:
        """``J^T u`` per parameter (None: no dependence)."""
        return torch.autograd.grad(self.out, self.leaves, u, retain_graph=retain, allow_unused=True)

    def vjp_block(self, op: OutputSpaceOperator, U: torch.Tensor, retain: bool) -> torch.Tensor:
        """``[k, p]``: ``J^T u`` for the ``k`` rows of ``U``, ``chunk_size`` at a time (batched)."""
        k, rec = U.shape[0], op.record
        step = op.chunk_size or k
        parts = []
        for s in range(0, k, step):
            keep = retain or s + step < k
            if rec.vmap is not False:
                try:  # a failing batched backward must not have freed the graph: keep it the 1st time
                    gs = torch.autograd.grad(
                        self.out,
                        self.leaves,
                        U[s : s + step],
                        retain_graph=keep or rec.vmap is None,
                        allow_unused=True,
                        is_grads_batched=True,
                    )
                    rec.vmap = True
                    parts.append(op._flat(gs, min(step, k - s)))
                    continue
                except Exception as err:  # noqa: BLE001 - an op without a batching rule: columns
                    rec.vmap, rec.vmap_error = False, short_error(err)
            rows = U[s : s + step]
            for j, u in enumerate(rows):
                parts.append(op._flat(self.vjp(u, keep or j < rows.shape[0] - 1), 1))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def jv_double(self, ts: list[torch.Tensor]) -> torch.Tensor:
        """``J t`` without forward mode: the vjp of the linear map ``u -> J^T u`` (keeps the graph)."""
        u = torch.zeros_like(self.out, requires_grad=True)
        with torch.enable_grad():
            gs = torch.autograd.grad(
                self.out, self.leaves, u, create_graph=True, retain_graph=True, allow_unused=True
            )
        pairs = [(g, t) for g, t in zip(gs, ts) if g is not None and g.requires_grad]
        if not pairs:
            return torch.zeros_like(self.out)
        (jv,) = torch.autograd.grad([g for g, _ in pairs], u, [t for _, t in pairs], allow_unused=True)
        return torch.zeros_like(self.out) if jv is None else jv


class _Linearised:
    """One batch: its output-space factors (kept), its forward graph (kept or rebuilt, see module),
    its traced linearisation (path ``"linearize"``) and, for the per-example Fisher, its gradients."""

    def __init__(self, op: OutputSpaceOperator, k: int, x: Any, y: torch.Tensor, w: float, bufs) -> None:
        obj = op.objective
        self.k, self.x, self.y, self.bufs = k, x, y, bufs
        self.f = lambda sel: obj.call(op._full(sel), bufs, x)
        self.w = op._batch_weight(w)
        self.h_apply: Callable | None = None  # M_b and its kind, once computed
        self.kind: str | None = None
        self.graph: _Graph | None = None  # the forward graph, when kept
        self.jvp_lin, self.lin_failed = None, False  # the traced linearisation (path "linearize")
        self.grads: torch.Tensor | None = None  # per-example gradients (Fisher, kept when they fit)

    def _linearise(self, op: OutputSpaceOperator) -> None:
        """Trace ``torch.func.linearize`` once (path ``"linearize"``); a failure falls back to plain
        forward mode (the detection below), or raises while the paths are timed."""
        if self.jvp_lin is not None or self.lin_failed:
            return
        try:
            with _quiet_forward_mode():
                out, self.jvp_lin = linearize(self.f, op._theta)
        except Exception as err:  # noqa: BLE001 - forward mode unsupported: the detection below
            if op._strict:
                raise
            self.lin_failed = True
            if op.record.fallback_reason is None:
                op.record.fallback_reason = short_error(err)
            return
        self._factors(op, out.detach())

    def _factors(self, op: OutputSpaceOperator, out: torch.Tensor) -> None:
        if self.h_apply is None:
            self.h_apply, self.kind = op._output_matrix(self.k, out, self.x, self.y, self.bufs)

    def _graph(self, op: OutputSpaceOperator) -> _Graph:
        """The kept graph, or a new one (kept when ``op`` caches this batch's graph)."""
        if self.graph is not None:
            return self.graph
        rec, auto = op.record, op.cache == "auto" and op._keep_batches
        g = _Graph(op, self.f, self.x, self.bufs, measure=auto and rec.graph_saved_bytes is None)
        if g.saved_bytes is not None:
            rec.graph_saved_bytes = g.saved_bytes
            rec.graph_cached = g.saved_bytes <= op.num_params_bytes
        if op.cache is True or (auto and rec.graph_cached):
            self.graph = g
        self._factors(op, g.out.detach())
        return g

    # ------------------------------------------------------------------ J V
    def _forward(self, op: OutputSpaceOperator, path: str, t: dict[str, torch.Tensor]):
        """``(out, J t)`` by forward mode (``out`` None with a traced linearisation)."""
        with _quiet_forward_mode():
            if self.jvp_lin is not None and path == "linearize":
                return None, self.jvp_lin(t)
            return jvp(self.f, (op._theta,), (t,))

    def _detect(self, op: OutputSpaceOperator, path: str, t: dict[str, torch.Tensor]):
        """First product on a path: does forward mode work here at all?  ``(out, J t)`` or None
        (``record.checked[path]``: what the path resolves to)."""
        rec = op.record
        if path == "double_vjp":
            rec.checked[path] = "double_vjp"
            return None
        try:
            res = self._forward(op, path, t)
        except Exception as err:  # noqa: BLE001 - forward-mode AD unsupported: reverse only
            if op._strict:  # timing the paths: this one is dropped (PathTimer)
                raise
            rec.checked[path], rec.fallback_reason = "double_vjp", short_error(err)
            return None
        rec.checked[path] = "linearize" if path == "linearize" and self.jvp_lin is not None else "forward"
        return res

    def _jv(self, op: OutputSpaceOperator, path: str, tangents: dict[str, torch.Tensor], k: int):
        """``(J V as [k, *out.shape], graph or None)``: forward mode, or the double vjp on a graph."""
        if path == "linearize":
            self._linearise(op)
        rec, first = op.record, None
        t0 = {n: t[0] for n, t in tangents.items()}
        used = rec.checked.get(path)
        if used is None:
            first = self._detect(op, path, t0)
            used = rec.checked[path]
        rec.used = used
        if used == "double_vjp":
            g = self._graph(op)
            names = op.objective.param_names
            return torch.stack([g.jv_double([tangents[n][j] for n in names]) for j in range(k)]), g
        if first is None and (k == 1 or self.h_apply is None):  # column 0 plain: the factors' output
            first = self._forward(op, path, t0)
        fwd = lambda t: self._forward(op, path, t)[1]  # noqa: E731
        if first is None:
            return _vmap_or_loop(fwd, tangents, k, op.chunk_size, rec), None
        out, jv = first
        if out is not None:
            self._factors(op, out.detach())
        if k == 1:
            return jv.unsqueeze(0), None
        rest = {n: t[1:] for n, t in tangents.items()}
        return torch.cat([jv.unsqueeze(0), _vmap_or_loop(fwd, rest, k - 1, op.chunk_size, rec)]), None


class OutputSpaceOperator(CurvatureOperator):
    """``A = sum_b J_b^T M_b J_b`` with ``J_b`` the Jacobian of the network output on batch ``b`` and
    ``M_b`` a matrix in output space (subclasses: :meth:`_output_matrix`, :meth:`_batch_weight`).

    Args:
        objective, params: the :class:`~landscape.Objective` and the point (default: its parameters).
        chunk_size: columns of ``V`` per ``vmap`` call / batched backward.
        cache: keep each batch's forward graph between products (``True``), rebuild it every product
            (``False``), or ``"auto"``: for a single-batch objective when it costs at most one
            parameter vector of memory (module docstring).
        jvp: ``"auto"`` (``"forward"`` on a CPU, timed elsewhere, see ``calibrate``), ``"forward"``,
            ``"linearize"`` (traced once, faster, more memory) or ``"double_vjp"`` (reverse mode only).
        max_memory: split blocks into chunks within this budget (:mod:`landscape.curvature.memory`).
        calibrate: with ``jvp="auto"``, time ``"forward"`` and ``"linearize"`` on the first block of
            each width class and keep the faster (:class:`~landscape.curvature.autotune.PathTimer`):
            ``True``, ``False`` (``"forward"``), or ``"auto"`` (default): on any device but the CPU.
        timer: the clock of the calibration (``time.perf_counter``; tests pass a scripted one).
    """

    PRODUCTS = {"forward": "_forward", "linearize": "_linearize", "double_vjp": "_double_vjp"}
    _passthrough: tuple[type[BaseException], ...] = ()  # a model's error, not a path's (PathTimer)

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "auto",
        max_memory: int | float | str | None = None,
        calibrate: bool | str = "auto",
        timer: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(objective, params, max_memory=max_memory)
        if jvp not in JVP_MODES:
            raise ValueError(f"jvp must be one of {JVP_MODES}, got {jvp!r}")
        if cache not in (True, False, "auto"):
            raise ValueError(f"cache must be True, False or 'auto', got {cache!r}")
        self._calibration(calibrate, "jvp", jvp, "the jvp paths", JVP_CANDIDATES, timer, self._passthrough)
        self.chunk_size = chunk_size
        self.jvp = jvp
        self.cache = cache
        # the per-batch factors are kept for one batch (or every batch with cache=True)
        self._keep_batches = cache is True or (cache == "auto" and len(objective.batch_sizes) == 1)
        self.num_params_bytes = objective.num_params * torch.empty((), dtype=self.dtype).element_size()
        # stochastic="fixed": every forward re-seeds, but a random op under vmap may draw its mask
        # differently from the plain forward (on CUDA), so the columns go one by one
        self.record = JVPRecord(path="forward" if jvp == "auto" else jvp)
        if objective.fixed_rng:
            self.record.vmap = False

    # ------------------------------------------------------------------ to implement
    def _output_matrix(
        self, k: int, out: torch.Tensor, x: Any, y: torch.Tensor, bufs: dict
    ) -> tuple[Callable, str]:
        """``(apply, kind)``: ``apply(U)`` multiplies ``U`` (``[k, *out.shape]``) by ``M_b`` of batch
        ``k`` (network output ``out``, inputs ``x``, targets ``y``)."""
        raise NotImplementedError

    def _batch_weight(self, w: float) -> float:
        """The factor of ``J_b^T M_b J_b`` given the objective's batch weight ``w``."""
        return w

    # ------------------------------------------------------------------ the choice of the product
    def _choose(self, k: int) -> str | None:
        """The ``J V`` path of a block of ``k`` columns: ``jvp=`` (``"auto"``: forward mode), the
        calibrated one of its width class (None: not timed yet), the double vjp once forward mode
        failed everywhere."""
        if self._timer is None or self.record.path == "double_vjp":
            return self.record.path
        return self._timer.choice.get(width_class(k))

    def _calibrate(self, V: torch.Tensor) -> torch.Tensor:
        try:
            return super()._calibrate(V)
        except RuntimeError:
            if set(self._timer.failed) != set(self._timer.paths):
                raise
        # forward mode fails on this model: reverse mode only from now on (as jvp="forward" does)
        rec = self.record
        rec.path = rec.checked["double_vjp"] = "double_vjp"
        rec.fallback_reason = "; ".join(f"{p}: {r}" for p, r in self._timer.failed.items())
        return self._run("double_vjp", V)

    def _calibrated(self, k: int) -> None:
        choice = self._timer.choice
        self.record.used = choice[width_class(k)]
        if self._kept is not None and "linearize" not in choice.values():
            for lin in self._kept:  # not chosen: its traces' memory is freed
                lin.jvp_lin, lin.lin_failed = None, False

    # ------------------------------------------------------------------ the per-batch products
    def _new_batch(self, index, x, y, w, bufs) -> _Linearised:
        return _Linearised(self, index, x, y, w, bufs)

    def _product(self, path: str, lin: _Linearised, V: torch.Tensor) -> torch.Tensor:
        """``J_b^T (w_b M_b) J_b V`` (``[p, k]``) with ``J_b V`` on ``path``."""
        k = V.shape[1]
        jv, g = lin._jv(self, path, self._split(V), k)
        u = lin.h_apply(jv)
        if lin.w != 1.0:
            u = u * lin.w
        del jv
        g = g if g is not None else lin._graph(self)
        keep = g is lin.graph
        self.record.output_matrix = lin.kind
        if k == 1:  # one vector: one backward, the per-parameter results in one flat column
            return self._flat(g.vjp(u[0], retain=keep), 1).T
        return g.vjp_block(self, u, retain=keep).T

    # the alternative products: the same per-batch product with J V by another path
    _forward = partialmethod(_product, "forward")
    _linearize = partialmethod(_product, "linearize")
    _double_vjp = partialmethod(_product, "double_vjp")

    def _flat(self, gs: tuple, k: int) -> torch.Tensor:
        """Per-parameter results (``[k, *shape]`` each, or ``[*shape]`` for ``k = 1``; None: zeros)
        -> ``[k, p]``."""
        zeros = lambda n: torch.zeros(k, n, dtype=self.dtype, device=self.device)  # noqa: E731
        return torch.cat(
            [zeros(n) if g is None else g.reshape(k, -1) for g, n in zip(gs, self.objective.param_numels)], 1
        )

    def _path_key(self, k: int) -> str:
        rec, cls = self.record, width_class(k)
        path = rec.used or rec.path
        if self._timer is not None and rec.path != "double_vjp":  # timed: the choice of the class
            path = self._timer.choice.get(cls, "uncalibrated")
        return f"{path}/vmap={rec.vmap is not False}/{cls}"

    def _extra_config(self) -> dict[str, Any]:
        rec = self.record
        return {
            "chunk_size": self.chunk_size,
            "cache": self.cache,
            "graph_cached": rec.graph_cached if rec.graph_cached is not None else self.cache is True,
            "graph_saved_bytes": rec.graph_saved_bytes,
            "jvp": self.jvp,
            "jvp_used": rec.used or rec.path,
            "jvp_fallback_reason": rec.fallback_reason,
            "calibrate": self.calibrate,
            "vmap": rec.vmap is not False,
            **({} if self._timer is None else self._timer.config()),
        }
