"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

``J_b`` is the Jacobian of the network output on batch ``b`` and ``H_out,b = d^2 l / d f^2`` the
Hessian of the loss with respect to the output: in closed form for cross-entropy, MSE and
BCE-with-logits, by autodiff on the loss as a function of the output for any other loss
(:mod:`landscape.curvature.output_hessian`), so any twice-differentiable loss works.  The products
(``J_b V`` by forward mode, ``H_out,b``, ``J_b^T`` by one backward pass; kept graphs, ``jvp=``
paths) are those of :class:`~landscape.curvature.output_space.OutputSpaceOperator`.
"""

from __future__ import annotations

from typing import Any

from landscape.curvature.output_hessian import output_hessian
from landscape.curvature.output_space import OutputSpaceOperator
from landscape.objective import Objective


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
        return {**super()._extra_config(), "output_hessian": self.record.output_matrix}


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
