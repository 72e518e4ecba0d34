"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.func import grad as func_grad
from torch.func import vjp, vmap

from landscape.curvature.base import CurvatureOperator
from landscape.objective import Objective


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
    return {n: torch.stack([c[n] for c in cols]) for n in cols[0]}


class GGNOperator(CurvatureOperator):
    """Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

    ``J_b v`` is obtained reverse-only as the vjp of the (linear) map ``u -> J_b^T u``, ``H_out,b``
    by reverse-over-reverse on the loss as a function of the outputs (exact for any loss, no
    forward-mode AD needed), then ``J_b^T (w_b H_out,b J_b v)`` by one more vjp; the probes are
    batched with ``vmap``.
    """

    name = "ggn"

    def __init__(self, objective: Objective, params: Any = None, *, chunk_size: int | None = 32) -> None:
        super().__init__(objective, params)
        self.chunk_size = chunk_size
        self._state: dict[str, Any] = {}

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        obj = self.objective
        k = V.shape[1]
        tangents = self._split(V)
        bufs = obj.buffers()
        total = torch.zeros(k, obj.num_params, dtype=self.dtype, device=self.device)
        for x, y, w in obj.batches():
            out, vjp_fn = vjp(lambda sel, x=x: obj._call(self._full(sel), bufs, x), self._theta)
            out = out.detach()
            _, hout_fn = vjp(func_grad(lambda o, y=y: obj.loss_fn(o, y)), out)
            _, jvp_fn = vjp(vjp_fn, torch.zeros_like(out))

            def col(t, w=w, vjp_fn=vjp_fn, hout_fn=hout_fn, jvp_fn=jvp_fn):
                (jv,) = jvp_fn((t,))
                (hjv,) = hout_fn(jv)
                return vjp_fn(w * hjv)[0]

            total += self._join(_vmap_or_loop(col, tangents, k, self.chunk_size, self._state), k)
        return total.T

    def _extra_config(self) -> dict[str, Any]:
        return {"chunk_size": self.chunk_size, "vmap": self._state.get("vmap", True)}


def ggn(objective: Objective, *, params: Any = None, chunk_size: int | None = 32) -> GGNOperator:
    """The generalised Gauss-Newton matrix ``sum_b w_b J_b^T H_out,b J_b`` as an operator."""
    return GGNOperator(objective, params, chunk_size=chunk_size)
