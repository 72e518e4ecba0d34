"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

One product ``G V`` (``V``: ``[p, k]``) per batch ``b`` is three steps:

1. ``J_b V``: forward-mode AD (``torch.func.jvp``, the ``k`` tangents batched with ``vmap``); where
   forward mode is unsupported by some op it falls back, once and recorded, to the reverse-only
   "double vjp" (the vjp of the linear map ``u -> J_b^T u``), which costs a second backward pass;
2. ``H_out,b (J_b V)``: in closed form for cross-entropy, MSE and BCE-with-logits, by autodiff on
   the loss as a function of the output for any other loss
   (:mod:`landscape.curvature.output_hessian`);
3. ``J_b^T (w_b H_out,b J_b V)``: one vjp through the forward graph, batched over the ``k`` columns.

Everything that does not depend on ``V`` (the forward graph of step 3, the output and its Hessian
factors) is built once per batch and, for a single-batch objective, kept between products
(``cache="auto"``), as PyHessian does for Hessian products.  With ``jvp="linearize"`` step 1 reuses a
traced linearisation (``torch.func.linearize``) as well: faster per product, more memory.
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
            state["vmap_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    cols = [fn({n: t[j] for n, t in tangents.items()}) for j in range(k)]
    if isinstance(cols[0], dict):
        return {n: torch.stack([c[n] for c in cols]) for n in cols[0]}
    return torch.stack(cols)


class _Linearised:
    """Everything about one batch that a GGN product needs and that does not depend on ``V``."""

    def __init__(self, op: GGNOperator, x: Any, y: torch.Tensor, w: float) -> None:
        obj = op.objective
        bufs = obj.buffers()
        self.f = lambda sel: obj._call(op._full(sel), bufs, x)
        out, self.vjp_fn = vjp(self.f, op._theta)
        self.out = out.detach()
        self.h_apply, self.kind = output_hessian(obj.loss_fn, self.out, y)
        self.w = w
        self.jvp_lin = None
        if op.jvp == "linearize":
            _, self.jvp_lin = linearize(self.f, op._theta)

    def jv(self, op: GGNOperator, tangents: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        """``J V`` as ``[k, *out.shape]``."""
        mode = op._state.get("jvp_used", op.jvp)
        if mode == "linearize" and self.jvp_lin is not None:
            return _vmap_or_loop(self.jvp_lin, tangents, k, op.chunk_size, op._state)
        if mode in ("forward", "linearize"):
            fn = lambda t: jvp(self.f, (op._theta,), (t,))[1]  # noqa: E731
            if "jvp_used" in op._state:
                return _vmap_or_loop(fn, tangents, k, op.chunk_size, op._state)
            try:  # first product: find out whether forward mode works here at all
                first = fn({n: t[0] for n, t in tangents.items()})
                op._state["jvp_used"] = "forward"
                rest = {n: t[1:] for n, t in tangents.items()}
                if k == 1:
                    return first.unsqueeze(0)
                return torch.cat(
                    [first.unsqueeze(0), _vmap_or_loop(fn, rest, k - 1, op.chunk_size, op._state)]
                )
            except Exception as err:  # noqa: BLE001 - forward-mode AD unsupported: reverse only
                op._state["jvp_used"] = "double_vjp"
                op._state["jvp_fallback_reason"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        _, jvp_fn = vjp(self.vjp_fn, torch.zeros_like(self.out))
        return _vmap_or_loop(lambda t: jvp_fn((t,))[0], tangents, k, op.chunk_size, op._state)

    def product(self, op: GGNOperator, tangents: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        hjv = self.h_apply(self.jv(op, tangents, k)) * self.w
        if op._state.get("vmap", True):
            try:
                return op._join(vmap(lambda u: self.vjp_fn(u)[0], chunk_size=op.chunk_size)(hjv), k)
            except Exception as err:  # noqa: BLE001
                op._state["vmap"] = False
                op._state["vmap_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        return op._join({n: torch.stack(c) for n, c in _columns(self.vjp_fn, hjv).items()}, k)


def _columns(vjp_fn: Callable, hjv: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    cols: dict[str, list[torch.Tensor]] = {}
    for u in hjv:
        for n, g in vjp_fn(u)[0].items():
            cols.setdefault(n, []).append(g)
    return cols


class GGNOperator(CurvatureOperator):
    """Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

    Args:
        objective: the :class:`~landscape.Objective`.
        params: the point (default: the objective's current parameters).
        chunk_size: columns of ``V`` per ``vmap`` call.
        cache: keep each batch's linearisation between products; ``"auto"``: for a single-batch
            objective only (one forward graph in memory, like a cached Hessian graph).
        jvp: ``"forward"`` (forward-mode AD, default), ``"linearize"`` (traced once, fastest per
            product, more memory) or ``"double_vjp"`` (reverse mode only).
    """

    name = "ggn"

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

    def _batches(self):
        if self.cache:
            if self._linearised is None:
                self._linearised = [_Linearised(self, x, y, w) for x, y, w in self.objective.batches()]
            yield from self._linearised
        else:
            for x, y, w in self.objective.batches():
                yield _Linearised(self, x, y, w)

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        k = V.shape[1]
        tangents = self._split(V)
        total = torch.zeros(k, self.objective.num_params, dtype=self.dtype, device=self.device)
        for lin in self._batches():
            total += lin.product(self, tangents, k)
            self._state["output_hessian"] = lin.kind
        return total.T

    def _extra_config(self) -> dict[str, Any]:
        return {
            "chunk_size": self.chunk_size,
            "cache": self.cache,
            "jvp": self.jvp,
            "jvp_used": self._state.get("jvp_used", self.jvp),
            "jvp_fallback_reason": self._state.get("jvp_fallback_reason"),
            "output_hessian": self._state.get("output_hessian"),
            "vmap": self._state.get("vmap", True),
        }


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
