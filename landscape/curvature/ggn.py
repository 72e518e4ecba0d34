"""Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

``J_b`` is the Jacobian of the network output on batch ``b`` and ``H_out,b = d^2 l / d f^2`` the
Hessian of the loss with respect to the output: in closed form for cross-entropy, MSE and
BCE-with-logits, by autodiff on the loss as a function of the output for any other loss
(:func:`output_hessian`, below), so any twice-differentiable loss works.  The products
(``J_b V`` by forward mode, ``H_out,b``, ``J_b^T`` by one backward pass; kept graphs, ``jvp=``
paths) are those of :class:`~landscape.curvature.output_space.OutputSpaceOperator`.

The output Hessian
------------------
The generalised Gauss-Newton product ``G v = J^T H_out J v`` needs ``H_out = d^2 l / d f^2`` at the
network output ``f``.  For the losses people train with it is known in closed form (Martens 2020,
"New insights and perspectives on the natural gradient method", Sec. 9.2; Schraudolph 2002, eq. 8):

* cross-entropy on logits ``z`` (``nn.CrossEntropyLoss``, class dimension 1, hard or soft targets,
  any ``label_smoothing``): per example ``H = diag(p) - p p^T`` with ``p = softmax(z)``, so
  ``H u = p * u - p (p^T u)``;
* ``nn.MSELoss``: ``H = 2 I``;
* ``nn.BCEWithLogitsLoss``: ``H = diag(s (1 - s))`` with ``s = sigmoid(z)``;

each times the reduction's factor (``1/B`` examples for a mean cross-entropy, ``1/numel`` for a
mean MSE/BCE, ``1`` for a sum).  Targets do not enter any of these Hessians.  Any other loss (class
weights, ``ignore_index`` present in the targets, ``pos_weight``, a plain function) is handled by
:func:`output_hessian` with reverse-over-reverse autodiff on the loss as a function of the output,
which is exact for every twice-differentiable loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import grad as func_grad
from torch.func import vjp

from landscape.curvature.output_space import OutputSpaceOperator
from landscape.objective import Objective

__all__ = ["GGNOperator", "ggn", "output_hessian", "closed_form_kind"]


def closed_form_kind(loss_fn: Any, targets: torch.Tensor) -> str | None:
    """``"cross_entropy"``, ``"mse"``, ``"bce_logits"`` when ``loss_fn`` has a closed-form output
    Hessian for these targets, else ``None`` (use autodiff)."""
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        if loss_fn.weight is not None or loss_fn.reduction not in ("mean", "sum"):
            return None
        if not torch.is_floating_point(targets) and bool((targets == loss_fn.ignore_index).any()):
            return None
        return "cross_entropy"
    if isinstance(loss_fn, nn.MSELoss) and loss_fn.reduction in ("mean", "sum"):
        return "mse"
    if isinstance(loss_fn, nn.BCEWithLogitsLoss):
        if loss_fn.weight is None and loss_fn.pos_weight is None and loss_fn.reduction in ("mean", "sum"):
            return "bce_logits"
    return None


def output_hessian(
    loss_fn: Any, output: torch.Tensor, targets: torch.Tensor
) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """``(apply, kind)``: ``apply(U)`` multiplies tangents ``U`` (shape ``[k, *output.shape]``) by
    ``H_out = d^2 loss_fn(output, targets) / d output^2``.

    ``kind`` names the closed form used, or ``"autodiff"``.  ``output`` must be detached.
    """
    kind = closed_form_kind(loss_fn, targets)
    mean = getattr(loss_fn, "reduction", "mean") == "mean"
    if kind == "cross_entropy":
        p = torch.softmax(output, dim=1 if output.ndim > 1 else 0)
        n_examples = output.numel() // output.shape[1] if output.ndim > 1 else 1
        scale = 1.0 / n_examples if mean else 1.0
        dim = 2 if output.ndim > 1 else 1  # the class dimension of U

        def apply(U: torch.Tensor) -> torch.Tensor:
            pu = p * U
            return scale * (pu - p * pu.sum(dim=dim, keepdim=True))

        return apply, kind
    if kind == "mse":
        scale = 2.0 / output.numel() if mean else 2.0
        return (lambda U: scale * U), kind
    if kind == "bce_logits":
        s = torch.sigmoid(output)
        d = s * (1 - s) * (1.0 / output.numel() if mean else 1.0)
        return (lambda U: d * U), kind

    _, hvp_fn = vjp(func_grad(lambda o: loss_fn(o, targets)), output)

    def apply_autodiff(U: torch.Tensor) -> torch.Tensor:
        try:
            return torch.vmap(lambda u: hvp_fn(u)[0])(U)
        except Exception:  # noqa: BLE001 - an op without a batching rule: one column at a time
            return torch.stack([hvp_fn(u)[0] for u in U])

    return apply_autodiff, "autodiff"


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
