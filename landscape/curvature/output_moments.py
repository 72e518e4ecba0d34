"""Output-space second moments of loss gradients: the matrices ``Lambda_n`` of the Fisher products
``F v = sum_n J_n^T Lambda_n (J_n v)`` (:mod:`landscape.curvature.fisher`), built from per-example
output gradients ``r_n``, per example (``Lambda_n = c r_n r_n^T``) or per loss term (block diagonal
over the positions of the output's extra dimensions, curvlinops' convention).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import grad as func_grad
from torch.func import vmap

__all__ = ["output_gradients", "outer_apply", "term_kind", "term_outer_apply"]


def output_gradients(loss_fn: Any, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[S, B, O]``: ``r_sn = d loss_fn(f_n, t_sn) / d f_n`` for outputs ``out`` (``[B, ...]``,
    ``O`` entries per example) and ``S`` target sets ``targets`` (``[S, B, ...]``), each example's
    loss evaluated alone (``loss_fn(f_n[None], t_sn[None])``, same reduction)."""
    S, B = int(targets.shape[0]), int(out.shape[0])

    def li(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return loss_fn(o.unsqueeze(0), t.unsqueeze(0))

    g = func_grad(li)
    outs = out.unsqueeze(0).expand(S, *out.shape).reshape(S * B, *out.shape[1:])
    ts = targets.reshape(S * B, *targets.shape[2:])
    try:
        r = vmap(g)(outs, ts)
    except Exception:  # noqa: BLE001 - a loss without batching rules: one example at a time
        r = torch.stack([g(outs[i], ts[i]) for i in range(S * B)])
    return r.reshape(S, B, -1)


def outer_apply(R: torch.Tensor, scale: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``U -> (scale / S) sum_s r_s (r_s^T U_n)`` per example ``n`` (``R``: ``[S, B, O]``, ``U``:
    ``[k, B, ...]``)."""
    S, B = R.shape[0], R.shape[1]
    if S == 1:
        r = R[0]

        def apply_one(U: torch.Tensor) -> torch.Tensor:
            Uf = U.reshape(U.shape[0], B, -1)
            coef = (Uf * r).sum(dim=2, keepdim=True)
            return (coef * (scale * r)).reshape(U.shape)

        return apply_one

    def apply(U: torch.Tensor) -> torch.Tensor:
        coef = torch.einsum("kbo,sbo->ksb", U.reshape(U.shape[0], B, -1), R)
        return (scale / S * torch.einsum("ksb,sbo->kbo", coef, R)).reshape(U.shape)

    return apply


def term_kind(loss_fn: Any) -> str:
    """How a mean of ``loss_fn`` counts its loss terms (``"categorical"``: positions; ``"gaussian"``:
    every output entry, as MSE and BCE)."""
    F = nn.functional
    if isinstance(loss_fn, nn.CrossEntropyLoss) or loss_fn is F.cross_entropy:
        return "categorical"
    if isinstance(loss_fn, (nn.MSELoss, nn.BCEWithLogitsLoss)) or loss_fn in (
        F.mse_loss,
        F.binary_cross_entropy_with_logits,
    ):
        return "gaussian"
    raise ValueError(
        f"per='loss_term' knows how CrossEntropyLoss, MSELoss and BCEWithLogitsLoss count their terms, not "
        f"{type(loss_fn).__name__}; use per='example'"
    )


def term_outer_apply(R: torch.Tensor, out: torch.Tensor, kind: str, scale: float) -> Callable:
    """``U -> scale sum_l r_l (r_l^T U_l)`` per example over its loss terms ``l`` (``R``: ``[B, O]``
    output gradients of outputs ``out``).  A term is one position of the dimensions between the batch
    and the class dimension 1 (cross-entropy) or the last, feature dimension (MSE, BCE), as
    curvlinops flattens them."""
    B = int(out.shape[0])

    def terms(T: torch.Tensor) -> torch.Tensor:  # [k, B, *out.shape[1:]] -> [k, B, L, C]
        if kind == "categorical" and out.ndim > 2:
            T = T.movedim(2, -1)
        C = int(T.shape[-1]) if out.ndim > 1 else 1
        return T.reshape(T.shape[0], B, -1, C)

    def untermed(T: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        if kind == "categorical" and out.ndim > 2:
            moved = (shape[0], B, *out.shape[2:], out.shape[1])
            return T.reshape(moved).movedim(-1, 2)
        return T.reshape(shape)

    Rt = terms(R.reshape(1, *out.shape))

    def apply(U: torch.Tensor) -> torch.Tensor:
        Ut = terms(U)
        coef = (Ut * Rt).sum(dim=3, keepdim=True)
        return untermed(scale * coef * Rt, U.shape)

    return apply
