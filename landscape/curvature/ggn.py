"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

One product ``G V`` (``V``: ``[p, k]``) per batch ``b`` is three steps:

1. ``J_b V``: forward-mode AD (``torch.func.jvp``, the ``k`` tangents batched with ``vmap``); where
   forward mode is unsupported by some op it falls back, once and recorded, to the reverse-only
   "double vjp" (the vjp of the linear map ``u -> J_b^T u``), which costs a second backward pass;
2. ``H_out,b (J_b V)``: in closed form for cross-entropy, MSE and BCE-with-logits, by autodiff on
   the loss as a function of the output for any other loss
   (:mod:`landscape.curvature.output_hessian`);
3. ``J_b^T (w_b H_out,b J_b V)``: one vjp through the forward graph, batched over the ``k`` columns.

A single vector (``k = 1``) takes a direct path: one ``jvp``, one ``vjp`` and the per-parameter
results written into one flat vector (added in place over batches), no ``vmap`` and no
intermediate ``[k, p]`` blocks.

Everything that does not depend on ``V`` (the forward graph of step 3, the output and its Hessian
factors) is built once per batch and, for a single-batch objective, kept between products
(``cache="auto"``), as PyHessian does for Hessian products.  With ``jvp="linearize"`` step 1 reuses a
traced linearisation (``torch.func.linearize``) as well: faster per product, more memory.

:class:`OutputSpaceOperator` is this machinery for any ``sum_b J_b^T M_b J_b`` with an output-space
matrix ``M_b``; the empirical and Monte-Carlo Fisher use it with ``M_b`` built from per-example
output gradients (:mod:`landscape.curvature.fisher`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.func import jvp, linearize, vjp, vmap

from landscape.curvature.base import CurvatureOperator
from landscape.curvature.output_hessian import output_hessian
from landscape.objective import Objective

JVP_MODES = ("forward", "linearize", "double_vjp")


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
    if isinstance(cols[0], dict):
        return {n: torch.stack([c[n] for c in cols]) for n in cols[0]}
    return torch.stack(cols)


class _Linearised:
    """Everything about one batch that a product needs and that does not depend on ``V``."""

    def __init__(self, op: OutputSpaceOperator, k: int, x: Any, y: torch.Tensor, w: float) -> None:
        obj = op.objective
        bufs = obj.buffers()
        self.f = lambda sel: obj._call(op._full(sel), bufs, x)
        out, self.vjp_fn = vjp(self.f, op._theta)
        self.out = out.detach()
        self.h_apply, self.kind = op._output_matrix(k, self.out, x, y, bufs)
        self.w = op._batch_weight(w)
        self.jvp_lin = None
        if op.jvp == "linearize":
            try:
                _, self.jvp_lin = linearize(self.f, op._theta)
            except Exception as err:  # noqa: BLE001 - forward mode unsupported: the detection below
                op._state.setdefault("jvp_fallback_reason", _short_error(err))

    # ------------------------------------------------------------------ J V
    def _forward(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.jvp_lin is not None:
            return self.jvp_lin(t)
        return jvp(self.f, (op._theta,), (t,))[1]

    def _double_vjp(self) -> Callable:
        _, jvp_fn = vjp(self.vjp_fn, torch.zeros_like(self.out))
        return lambda t: jvp_fn((t,))[0]

    def _first(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """First product: find out whether forward mode works here at all (``J t`` or None)."""
        if op.jvp == "double_vjp":
            op._state["jvp_used"] = "double_vjp"
            return None
        try:
            res = self._forward(op, t)
        except Exception as err:  # noqa: BLE001 - forward-mode AD unsupported: reverse only
            op._state["jvp_used"] = "double_vjp"
            op._state["jvp_fallback_reason"] = _short_error(err)
            return None
        op._state["jvp_used"] = "linearize" if self.jvp_lin is not None else "forward"
        return res

    def _fn(self, op: OutputSpaceOperator) -> Callable:
        if op._state["jvp_used"] == "double_vjp":
            return self._double_vjp()
        return lambda t: self._forward(op, t)

    def jv_one(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """``J t`` (shape of the output) for one tangent ``t`` (dict of parameter-shaped tensors)."""
        if "jvp_used" not in op._state:
            first = self._first(op, t)
            if first is not None:
                return first
        return self._fn(op)(t)

    def jv(self, op: OutputSpaceOperator, tangents: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        """``J V`` as ``[k, *out.shape]``."""
        if "jvp_used" not in op._state:
            first = self._first(op, {n: t[0] for n, t in tangents.items()})
            if first is not None:
                if k == 1:
                    return first.unsqueeze(0)
                rest = {n: t[1:] for n, t in tangents.items()}
                fn = self._fn(op)
                return torch.cat(
                    [first.unsqueeze(0), _vmap_or_loop(fn, rest, k - 1, op.chunk_size, op._state)]
                )
        return _vmap_or_loop(self._fn(op), tangents, k, op.chunk_size, op._state)

    # ------------------------------------------------------------------ J^T M J V
    def product_one(self, op: OutputSpaceOperator, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``J^T (w M) J t`` for one tangent, as a dict of parameter-shaped tensors."""
        u = self.h_apply(self.jv_one(op, t).unsqueeze(0))[0]
        if self.w != 1.0:
            u = u * self.w
        return self.vjp_fn(u)[0]

    def product(self, op: OutputSpaceOperator, tangents: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        hjv = self.h_apply(self.jv(op, tangents, k)) * self.w
        if op._state.get("vmap", True):
            try:
                return op._join(vmap(lambda u: self.vjp_fn(u)[0], chunk_size=op.chunk_size)(hjv), k)
            except Exception as err:  # noqa: BLE001
                op._state["vmap"] = False
                op._state["vmap_error"] = _short_error(err)
        return op._join({n: torch.stack(c) for n, c in _columns(self.vjp_fn, hjv).items()}, k)


def _columns(vjp_fn: Callable, hjv: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    cols: dict[str, list[torch.Tensor]] = {}
    for u in hjv:
        for n, g in vjp_fn(u)[0].items():
            cols.setdefault(n, []).append(g)
    return cols


class OutputSpaceOperator(CurvatureOperator):
    """``A = sum_b J_b^T M_b J_b`` with ``J_b`` the Jacobian of the network output on batch ``b`` and
    ``M_b`` a matrix in output space (subclasses: :meth:`_output_matrix`, :meth:`_batch_weight`).

    Args:
        objective: the :class:`~landscape.Objective`.
        params: the point (default: the objective's current parameters).
        chunk_size: columns of ``V`` per ``vmap`` call.
        cache: keep each batch's linearisation between products; ``"auto"``: for a single-batch
            objective only (one forward graph in memory, like a cached Hessian graph).
        jvp: ``"forward"`` (forward-mode AD, default), ``"linearize"`` (traced once, fastest per
            product, more memory) or ``"double_vjp"`` (reverse mode only).
    """

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "forward",
    ) -> None:
        super().__init__(objective, params)
        if jvp not in JVP_MODES:
            raise ValueError(f"jvp must be one of {JVP_MODES}, got {jvp!r}")
        if cache not in (True, False, "auto"):
            raise ValueError(f"cache must be True, False or 'auto', got {cache!r}")
        self.chunk_size = chunk_size
        self.jvp = jvp
        self.cache = len(objective.batch_sizes) == 1 if cache == "auto" else bool(cache)
        # stochastic="fixed": every forward re-seeds, but a random op under vmap may draw its mask
        # differently from the plain forward (on CUDA), so the columns go one by one
        self._state: dict[str, Any] = {"vmap": False} if objective._fixed_rng else {}
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
        if self.cache:
            if self._linearised is None:
                self._linearised = [
                    _Linearised(self, k, x, y, w) for k, (x, y, w) in enumerate(self.objective.batches())
                ]
            yield from self._linearised
        else:
            for k, (x, y, w) in enumerate(self.objective.batches()):
                yield _Linearised(self, k, x, y, w)

    def _add_into(self, total: torch.Tensor | None, g: dict[str, torch.Tensor]) -> torch.Tensor:
        """Write (first batch) or add in place the per-parameter results ``g`` into one flat vector."""
        obj = self.objective
        first = total is None
        if first:
            total = torch.empty(obj.num_params, dtype=self.dtype, device=self.device)
        off = 0
        for n, numel in zip(obj.param_names, obj._numels):
            seg = total[off : off + numel]
            src = g[n].reshape(-1)
            if first:
                seg.copy_(src)
            else:
                seg.add_(src)
            off += numel
        return total

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        k = V.shape[1]
        tangents = self._split(V)
        if k == 1:  # one vector: no vmap, no [k, p] blocks
            t = {n: v[0] for n, v in tangents.items()}
            flat = None
            for lin in self._batches():
                flat = self._add_into(flat, lin.product_one(self, t))
                self._state["output_matrix"] = lin.kind
                del lin  # uncached: free this batch's graph before the next one is built
            return flat.unsqueeze(1)
        total = None
        for lin in self._batches():
            block = lin.product(self, tangents, k)
            total = block if total is None else total.add_(block)
            self._state["output_matrix"] = lin.kind
            del lin, block
        return total.T

    def _extra_config(self) -> dict[str, Any]:
        return {
            "chunk_size": self.chunk_size,
            "cache": self.cache,
            "jvp": self.jvp,
            "jvp_used": self._state.get("jvp_used", self.jvp),
            "jvp_fallback_reason": self._state.get("jvp_fallback_reason"),
            "vmap": self._state.get("vmap", True),
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
    jvp: str = "forward",
) -> GGNOperator:
    """The generalised Gauss-Newton matrix ``sum_b w_b J_b^T H_out,b J_b`` as an operator."""
    return GGNOperator(objective, params, chunk_size=chunk_size, cache=cache, jvp=jvp)
