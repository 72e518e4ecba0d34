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
        max_memory: int | float | str | None = None,
    ) -> None:
        super().__init__(objective, params, max_memory=max_memory)
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
        )  # max_memory stays with the operator: it splits blocks before they reach the engine

    @property
    def engine_used(self) -> str:
        return self.engine.engine_used

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        return self.engine.matmat(V)

    def _path_key(self, k: int) -> str:
        return self.engine.path_key(k)

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
    max_memory: int | float | str | None = None,
) -> HessianOperator:
    """The Hessian of the whole-dataset loss as a :class:`CurvatureOperator` (see ``curvature.engines``;
    ``graph_chunks``: the cached graph as sub-graphs over the examples, for lower peak memory;
    ``calibrate``: with ``engine="auto"``, time the engines on the first blocks and keep the fastest
    -- ``"auto"``: on accelerators, not on a CPU; ``max_memory``: blocks split into chunks of columns
    whose measured peak stays within this budget, :mod:`landscape.curvature.memory`)."""
    return HessianOperator(
        objective,
        params,
        engine=engine,
        chunk_size=chunk_size,
        cache_graph=cache_graph,
        fd_eps=fd_eps,
        graph_chunks=graph_chunks,
        calibrate=calibrate,
        max_memory=max_memory,
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
