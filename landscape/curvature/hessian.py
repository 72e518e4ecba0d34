"""The Hessian ``H = d^2 L / d theta^2`` of the whole-dataset loss as an operator, and one-off ``H v``."""

from __future__ import annotations

from typing import Any

import torch

from landscape.curvature.base import CurvatureOperator
from landscape.curvature.engines import HVPEngine
from landscape.objective import Objective


# --------------------------------------------------------------------------------------------
class HessianOperator(CurvatureOperator):
    """Hessian ``H = d^2 L / d theta^2`` of the whole-dataset loss (engines: ``curvature.engines``)."""

    name = "hessian"

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
    ) -> None:
        super().__init__(objective, params)
        self.engine = HVPEngine(
            objective,
            self._full(self._theta),
            engine=engine,
            chunk_size=chunk_size,
            cache_graph=cache_graph,
            fd_eps=fd_eps,
            graph_chunks=graph_chunks,
            calibrate=calibrate,
            copy=False,  # the operator's own private copies: no second copy of the point
        )

    @property
    def engine_used(self) -> str:
        return self.engine.engine_used

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        return self.engine.matmat(V)

    def _extra_config(self) -> dict[str, Any]:
        return self.engine.config()


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
) -> HessianOperator:
    """The Hessian of the whole-dataset loss as a :class:`CurvatureOperator` (see ``curvature.engines``;
    ``graph_chunks``: the cached graph as sub-graphs over the examples, for lower peak memory;
    ``calibrate``: with ``engine="auto"``, time the engines on the first blocks and keep the fastest
    -- ``"auto"``: on accelerators, not on a CPU)."""
    return HessianOperator(
        objective,
        params,
        engine=engine,
        chunk_size=chunk_size,
        cache_graph=cache_graph,
        fd_eps=fd_eps,
        graph_chunks=graph_chunks,
        calibrate=calibrate,
    )


def hvp(
    objective: Objective,
    v: torch.Tensor,
    params: Any = None,
    *,
    engine: str = "auto",
    chunk_size: int | None = 32,
) -> torch.Tensor:
    """One-off Hessian-vector product ``H v`` (``v``: ``[p]`` or ``[p, k]``) of the whole-dataset loss.

    For repeated products build an operator once (``landscape.hessian(obj)``): it caches the graph.
    """
    op = HessianOperator(objective, params=params, engine=engine, chunk_size=chunk_size, cache_graph=False)
    return op @ v
