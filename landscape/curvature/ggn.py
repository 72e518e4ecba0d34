"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

One product ``G V`` (``V``: ``[p, k]``) per batch ``b`` is three steps:

1. ``J_b V``: forward-mode AD (``torch.func.jvp``, the ``k`` tangents batched with ``vmap``); where
   forward mode is unsupported by some op it falls back, once and recorded, to the reverse-only
   "double vjp" (the vjp of the linear map ``u -> J_b^T u``), which costs a second backward pass;
2. ``H_out,b (J_b V)``: in closed form for cross-entropy, MSE and BCE-with-logits, by autodiff on
   the loss as a function of the output for any other loss
   (:mod:`landscape.curvature.output_hessian`);
3. ``J_b^T (w_b H_out,b J_b V)``: one backward pass through the forward graph of the batch
   (``torch.autograd.grad``, the ``k`` columns batched with ``is_grads_batched``).

A single vector (``k = 1``) takes a direct path: one ``jvp``, one backward and the per-parameter
results written into one flat vector (added in place over batches), no ``vmap`` and no
intermediate ``[k, p]`` blocks.

Memory decides whether the forward graph of step 3 is kept between products.  Kept, it is alive
while step 1 runs, so a product peaks at the graph plus the forward-mode pass; rebuilt, each product
peaks at the larger of the forward-mode pass and one forward + backward (the graph is freed during
its backward), at the cost of one more forward.  On ResNet-20 (128 images, float32) the graph holds
189 MB and the forward-mode pass 115 MB: 304 MB kept, 232 MB rebuilt.  ``cache="auto"`` keeps it
for a single-batch objective when its saved tensors (counted with saved-tensor hooks while it is
built) take at most the memory of one parameter vector -- MLPs, where products are dominated by
parameter-sized vectors -- and rebuilds it otherwise; the output-space factors (output, ``H_out``)
are kept either way.  ``jvp="linearize"`` keeps a traced linearisation (``torch.func.linearize``) for
step 1 as well: faster per product, much more memory.

``jvp="auto"`` (default) is forward mode on a CPU (the fastest in ``benchmarks/bench_products.py``,
with no timing).  On any other device, or with ``calibrate=True``, the first block of each width
class (one vector / several) times forward mode against the linearisation, untimed then timed, and
keeps the faster (:class:`~landscape.curvature.autotune.PathTimer`; an H100 ran ``"linearize"``
1.5-1.7x faster on ResNet-20, WRN-16-4 and a transformer); the double vjp stays the fallback.

:class:`OutputSpaceOperator` is this machinery for any ``sum_b J_b^T M_b J_b`` with an output-space
matrix ``M_b``; the empirical and Monte-Carlo Fisher use it with ``M_b`` built from per-example
output gradients (:mod:`landscape.curvature.fisher`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.func import jvp, linearize, vmap

from landscape.curvature.autotune import PathTimer, width_class
from landscape.curvature.base import CurvatureOperator, saved_tensor_bytes
from landscape.curvature.output_hessian import output_hessian
from landscape.objective import Objective

JVP_MODES = ("auto", "forward", "linearize", "double_vjp")
# jvp="auto" times these; the double vjp (a second backward pass, one column at a time) is the
# fallback where forward mode fails, never faster
JVP_CANDIDATES = ("forward", "linearize")


def _short_error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


# --------------------------------------------------------------------------------------------
def _vmap_or_loop(
    fn: Callable, tangents: dict[str, torch.Tensor], k: int, chunk_size: int | None, state: dict
):
    """``vmap(fn)(tangents)``; if vmap is unsupported by some op, loop over the ``k`` columns once and
    remember it in ``state["vmap"]``."""
    if state.get("vmap", True):
        try:
            return vmap(fn, chunk_size=chunk_size)(tangents)
        except Exception as err:  # noqa: BLE001 - fall back to a plain loop
            state["vmap"] = False
            state["vmap_error"] = _short_error(err)
    cols = [fn({n: t[j] for n, t in tangents.items()}) for j in range(k)]
    if isinstance(cols[0], tuple):
        return tuple(torch.stack([c[i] for c in cols]) for i in range(len(cols[0])))
    return torch.stack(cols)


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
            have = [*self.leaves, *bufs.values()]
            if isinstance(x, torch.Tensor):
                have.append(x)
            elif isinstance(x, dict):
                have += [t for t in x.values() if isinstance(t, torch.Tensor)]
            elif isinstance(x, (tuple, list)):
                have += [t for t in x if isinstance(t, torch.Tensor)]
            with saved_tensor_bytes(skip=have) as seen:
                self.out = f(dict(zip(names, self.leaves)))
            self.saved_bytes = sum(seen.values())

    def vjp(self, u: torch.Tensor, retain: bool) -> tuple:
        """``J^T u`` per parameter (None: no dependence)."""
        return torch.autograd.grad(self.out, self.leaves, u, retain_graph=retain, allow_unused=True)

    def vjp_block(self, op: OutputSpaceOperator, U: torch.Tensor, retain: bool) -> torch.Tensor:
        """``[k, p]``: ``J^T u`` for the ``k`` rows of ``U``, ``chunk_size`` at a time (batched)."""
        k = U.shape[0]
        step = op.chunk_size or k
        parts = []
        for s in range(0, k, step):
            last = s + step >= k
            keep = retain or not last
            if op._state.get("vmap", True):
                try:  # a failing batched backward must not have freed the graph: keep it the 1st time
                    gs = torch.autograd.grad(
                        self.out,
                        self.leaves,
                        U[s : s + step],
                        retain_graph=keep or "vmap" not in op._state,
                        allow_unused=True,
                        is_grads_batched=True,
                    )
                    op._state["vmap"] = True
                    parts.append(op._flat(gs, min(step, k - s)))
                    continue
                except Exception as err:  # noqa: BLE001 - an op without a batching rule: columns
                    op._state["vmap"] = False
                    op._state["vmap_error"] = _short_error(err)
            rows = U[s : s + step]
            for j, u in enumerate(rows):
                gs = self.vjp(u, keep or j < rows.shape[0] - 1)
                parts.append(op._flat(gs, 1))
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
    """One batch: its output-space factors (kept), its forward graph (kept or rebuilt, see module)."""

    def __init__(self, op: OutputSpaceOperator, k: int, x: Any, y: torch.Tensor, w: float) -> None:
        obj = op.objective
        self.k, self.x, self.y = k, x, y
        self.bufs = obj.buffers()
        self.f = lambda sel: obj.call(op._full(sel), self.bufs, x)
        self.w = op._batch_weight(w)
        self.h_apply: Callable | None = None
        self.kind: str | None = None
        self.graph: _Graph | None = None
        self.jvp_lin = None
        self.lin_failed = False

    def _linearise(self, op: OutputSpaceOperator) -> None:
        """Trace ``torch.func.linearize`` once (path ``"linearize"``); a failure falls back to plain
        forward mode (the detection below), or raises while the paths are timed."""
        if self.jvp_lin is not None or self.lin_failed:
            return
        try:
            out, self.jvp_lin = linearize(self.f, op._theta)
        except Exception as err:  # noqa: BLE001 - forward mode unsupported: the detection below
            if op._strict:
                raise
            self.lin_failed = True
            op._state.setdefault("jvp_fallback_reason", _short_error(err))
            return
        self._factors(op, out.detach())

    def _factors(self, op: OutputSpaceOperator, out: torch.Tensor) -> None:
        if self.h_apply is None:
            self.h_apply, self.kind = op._output_matrix(self.k, out, self.x, self.y, self.bufs)

    def _graph(self, op: OutputSpaceOperator) -> _Graph:
        """The kept graph, or a new one (kept when ``op`` caches this batch's graph)."""
        if self.graph is not None:
            return self.graph
        auto = op.cache == "auto" and op._keeps_batches
        g = _Graph(op, self.f, self.x, self.bufs, measure=auto and "graph_saved_bytes" not in op._state)
        if g.saved_bytes is not None:
            op._state["graph_saved_bytes"] = g.saved_bytes
            op._state["graph_cached"] = g.saved_bytes <= op.num_params_bytes
        if op.cache is True or (auto and op._state.get("graph_cached")):
            self.graph = g
        self._factors(op, g.out.detach())
        return g

    # ------------------------------------------------------------------ J V
    def _forward(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]):
        """``(out, J t)`` by forward mode (``out`` None with a traced linearisation)."""
        if self.jvp_lin is not None and op._path == "linearize":
            return None, self.jvp_lin(t)
        return jvp(self.f, (op._theta,), (t,))

    def _detect(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]):
        """First product on a path: does forward mode work here at all?  ``(out, J t)`` or None
        (``op._checked[path]``: what the path resolves to)."""
        path = op._path
        if path == "double_vjp":
            op._checked[path] = "double_vjp"
            return None
        try:
            res = self._forward(op, t)
        except Exception as err:  # noqa: BLE001 - forward-mode AD unsupported: reverse only
            if op._strict:  # timing the paths: this one is dropped (PathTimer)
                raise
            op._checked[path] = "double_vjp"
            op._state["jvp_fallback_reason"] = _short_error(err)
            return None
        op._checked[path] = "linearize" if path == "linearize" and self.jvp_lin is not None else "forward"
        return res

    def _jv(self, op: OutputSpaceOperator, tangents: dict[str, torch.Tensor], k: int):
        """``(J V as [k, *out.shape], graph or None)``: forward mode, or the double vjp on a graph."""
        if op._path == "linearize":
            self._linearise(op)
        first = None
        used = op._checked.get(op._path)
        if used is None:
            first = self._detect(op, {n: t[0] for n, t in tangents.items()})
            used = op._checked[op._path]
        op._state["jvp_used"] = used
        if used == "double_vjp":
            g = self._graph(op)
            names = op.objective.param_names
            cols = [g.jv_double([tangents[n][j] for n in names]) for j in range(k)]
            return torch.stack(cols), g
        if first is None and k == 1:
            first = self._forward(op, {n: t[0] for n, t in tangents.items()})
        if first is not None:
            out, jv = first
            if out is not None:
                self._factors(op, out.detach())
            if k == 1:
                return jv.unsqueeze(0), None
            rest = {n: t[1:] for n, t in tangents.items()}
            jvs = _vmap_or_loop(lambda t: self._forward(op, t)[1], rest, k - 1, op.chunk_size, op._state)
            return torch.cat([jv.unsqueeze(0), jvs]), None
        if self.h_apply is None:
            out, jv = _vmap_or_loop(lambda t: self._forward(op, t), tangents, k, op.chunk_size, op._state)
            self._factors(op, out[0].detach())
            return jv, None
        return _vmap_or_loop(lambda t: self._forward(op, t)[1], tangents, k, op.chunk_size, op._state), None

    # ------------------------------------------------------------------ J^T M J V
    def product(self, op: OutputSpaceOperator, tangents: dict[str, torch.Tensor], k: int):
        """``J^T (w M) J V``: per-parameter results (tuple, ``k = 1``) or a ``[k, p]`` block."""
        jv, g = self._jv(op, tangents, k)
        u = self.h_apply(jv)
        if self.w != 1.0:
            u = u * self.w
        del jv
        g = g if g is not None else self._graph(op)
        keep = g is self.graph
        if k == 1:
            return g.vjp(u[0], retain=keep)
        return g.vjp_block(op, u, retain=keep)


class OutputSpaceOperator(CurvatureOperator):
    """``A = sum_b J_b^T M_b J_b`` with ``J_b`` the Jacobian of the network output on batch ``b`` and
    ``M_b`` a matrix in output space (subclasses: :meth:`_output_matrix`, :meth:`_batch_weight`).

    Args:
        objective: the :class:`~landscape.Objective`.
        params: the point (default: the objective's current parameters).
        chunk_size: columns of ``V`` per ``vmap`` call / batched backward.
        cache: keep each batch's forward graph between products (``True``), rebuild it every product
            (``False``), or ``"auto"``: keep it for a single-batch objective when it costs at most
            one parameter vector of memory (module docstring).
        jvp: ``"auto"`` (default: ``"forward"`` on a CPU, timed on any other device, see
            ``calibrate``), ``"forward"`` (forward-mode AD), ``"linearize"`` (traced once, faster
            per product, more memory) or ``"double_vjp"`` (reverse mode only).
        max_memory: split blocks into chunks of columns whose measured peak stays within this budget
            (:mod:`landscape.curvature.memory`; ``None``: no limit).
        calibrate: with ``jvp="auto"``, time ``"forward"`` and ``"linearize"`` on the first block of
            each width class and keep the faster (:class:`~landscape.curvature.autotune.PathTimer`):
            ``True``, ``False`` (``"forward"``), or ``"auto"`` (default): on any device but the CPU.
        timer: the clock of the calibration (``time.perf_counter``; tests pass a scripted one).
    """

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
        if calibrate not in (True, False, "auto"):
            raise ValueError(f"calibrate must be True, False or 'auto', got {calibrate!r}")
        if calibrate is True and jvp != "auto":
            raise ValueError(
                f"calibrate=True times the jvp paths against each other: use jvp='auto', not {jvp!r}"
            )
        self.chunk_size = chunk_size
        self.jvp = jvp
        # jvp="auto": timed on the first block of each width class (any device but the CPU, or
        # calibrate=True), else forward mode -- on a CPU the measured default, with no timing at all
        timed = jvp == "auto" and (calibrate is True or (calibrate == "auto" and self.device.type != "cpu"))
        self.calibrate = timed
        self._paths: PathTimer | None = None
        if timed:
            clock = time.perf_counter if timer is None else timer
            self._paths = PathTimer(JVP_CANDIDATES, self.device, clock, passthrough=self._passthrough)
        self._path = "forward" if jvp == "auto" else jvp  # the path products run on now
        self._checked: dict[str, str] = {}  # path -> what it ran as (forward mode may fall back)
        self._strict = False  # while the paths are timed a failing path raises (and is dropped)
        self.cache = cache
        # the per-batch factors are kept for one batch (or every batch with cache=True)
        self._keeps_batches = cache is True or (cache == "auto" and len(objective.batch_sizes) == 1)
        self.num_params_bytes = objective.num_params * torch.empty((), dtype=self.dtype).element_size()
        # stochastic="fixed": every forward re-seeds, but a random op under vmap may draw its mask
        # differently from the plain forward (on CUDA), so the columns go one by one
        self._state: dict[str, Any] = {"vmap": False} if objective.fixed_rng else {}
        self._linearised: list[_Linearised] | None = None

    # ------------------------------------------------------------------ to implement
    def _output_matrix(
        self, k: int, out: torch.Tensor, x: Any, y: torch.Tensor, bufs: dict[str, torch.Tensor]
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
        """``(apply, kind)``: ``apply(U)`` multiplies ``U`` (``[k, *out.shape]``) by ``M_b`` of batch
        ``k`` (network output ``out``, inputs ``x``, targets ``y``)."""
        raise NotImplementedError

    def _batch_weight(self, w: float) -> float:
        """The factor of ``J_b^T M_b J_b`` given the objective's batch weight ``w``."""
        return w

    # ------------------------------------------------------------------ products
    def _batches(self):
        if self._keeps_batches:
            if self._linearised is None:
                self._linearised = [
                    _Linearised(self, k, x, y, w) for k, (x, y, w) in enumerate(self.objective.batches())
                ]
            yield from self._linearised
        else:
            for k, (x, y, w) in enumerate(self.objective.batches()):
                yield _Linearised(self, k, x, y, w)

    def _flat(self, gs: tuple, k: int) -> torch.Tensor:
        """Per-parameter results (``[k, *shape]`` each, or ``[*shape]`` for ``k = 1``; None: zeros)
        -> ``[k, p]``."""
        obj = self.objective
        return torch.cat(
            [
                g.reshape(k, -1) if g is not None else torch.zeros(k, n, dtype=self.dtype, device=self.device)
                for g, n in zip(gs, obj.param_numels)
            ],
            dim=1,
        )

    def _add_into(self, total: torch.Tensor | None, gs: tuple) -> torch.Tensor:
        """Write (first batch) or add in place per-parameter results into one flat vector."""
        obj = self.objective
        first = total is None
        if first:
            total = torch.empty(obj.num_params, dtype=self.dtype, device=self.device)
        off = 0
        for g, numel in zip(gs, obj.param_numels):
            seg = total[off : off + numel]
            if g is None:
                if first:
                    seg.zero_()
            elif first:
                seg.copy_(g.reshape(-1))
            else:
                seg.add_(g.reshape(-1))
            off += numel
        return total

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        timer = self._paths
        if timer is None or self._path == "double_vjp":
            return self._product(V)
        cls = width_class(int(V.shape[1]))
        self._strict = cls not in timer.choice  # a path failing while timed is dropped, not patched
        try:
            out = timer.run(V, self._run_path)
        except RuntimeError:
            if set(timer.failed) != set(timer.paths):
                raise
            # forward mode fails on this model: reverse mode only from now on (as jvp="forward" does)
            self._strict = False
            self._path = self._checked["double_vjp"] = "double_vjp"
            self._state["jvp_fallback_reason"] = "; ".join(f"{p}: {r}" for p, r in timer.failed.items())
            return self._product(V)
        finally:
            self._strict = False
        self._path = self._state["jvp_used"] = timer.choice[cls]
        if self._linearised is not None and "linearize" not in timer.choice.values():
            for lin in self._linearised:  # not chosen: its traces' memory is freed
                lin.jvp_lin, lin.lin_failed = None, False
        return out

    def _run_path(self, path: str, V: torch.Tensor) -> torch.Tensor:
        self._path = path
        return self._product(V)

    def _product(self, V: torch.Tensor) -> torch.Tensor:
        k = V.shape[1]
        tangents = self._split(V)
        total = None
        for lin in self._batches():
            res = lin.product(self, tangents, k)
            if k == 1:  # one vector: results written straight into the flat output
                total = self._add_into(total, res)
            else:
                total = res if total is None else total.add_(res)
            self._state["output_matrix"] = lin.kind
            del lin, res  # uncached: free this batch's graph before the next one is built
        return total.unsqueeze(1) if k == 1 else total.T

    def _path_key(self, k: int) -> str:
        st, cls = self._state, width_class(k)
        path = st.get("jvp_used", self._path)
        if self._paths is not None and self._path != "double_vjp":  # timed: the choice of the class
            path = self._paths.choice.get(cls, "uncalibrated")
        return f"{path}/vmap={st.get('vmap', True)}/{cls}"

    def _extra_config(self) -> dict[str, Any]:
        return {
            "chunk_size": self.chunk_size,
            "cache": self.cache,
            "graph_cached": self._state.get("graph_cached", self.cache is True),
            "graph_saved_bytes": self._state.get("graph_saved_bytes"),
            "jvp": self.jvp,
            "jvp_used": self._state.get("jvp_used", self._path),
            "jvp_fallback_reason": self._state.get("jvp_fallback_reason"),
            "calibrate": self.calibrate,
            "vmap": self._state.get("vmap", True),
            **({} if self._paths is None else self._paths.config()),
        }


class GGNOperator(OutputSpaceOperator):
    """Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

    ``H_out,b`` is the Hessian of the loss with respect to the network output (closed form for
    cross-entropy, MSE and BCE-with-logits, autodiff otherwise); arguments as
    :class:`OutputSpaceOperator`.
    """

    name = "ggn"

    def _output_matrix(self, k, out, x, y, bufs):
        return output_hessian(self.objective.loss_fn, out, y)

    def _extra_config(self) -> dict[str, Any]:
        return {**super()._extra_config(), "output_hessian": self._state.get("output_matrix")}


def ggn(
    objective: Objective,
    *,
    params: Any = None,
    chunk_size: int | None = 32,
    cache: bool | str = "auto",
    jvp: str = "auto",
    max_memory: int | float | str | None = None,
    calibrate: bool | str = "auto",
) -> GGNOperator:
    """The generalised Gauss-Newton matrix ``sum_b w_b J_b^T H_out,b J_b`` as an operator
    (``max_memory``: blocks split into chunks within this budget, :mod:`landscape.curvature.memory`;
    ``jvp``, ``calibrate``: the ``J V`` path, see :class:`OutputSpaceOperator`)."""
    kw = dict(chunk_size=chunk_size, cache=cache, jvp=jvp, max_memory=max_memory, calibrate=calibrate)
    return GGNOperator(objective, params, **kw)
