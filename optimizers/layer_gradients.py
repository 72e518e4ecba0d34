"""A layer's parameter gradients per group of examples, from one ordinary backward pass.

For a layer ``z = f(a; W)`` that acts on every example alone, the gradient of a sum of losses with
respect to ``W`` is a sum over examples of terms that need only the example's input ``a_i`` and
the gradient at its output ``d_i = dL/dz_i``; autograd sums them over the batch.  Summing them
over groups of consecutive examples instead gives the gradient of every group's loss from the same
backward pass: ``m`` groups of ``b`` examples are the m-sharpness sub-batches
(:mod:`optimizers.chunk_direct`), ``m = B`` groups of one example are the per-example gradients
(:mod:`optimizers.per_example`).  This is the "individual gradients" computation of BackPACK
(Dangel, Kunstner & Hennig 2020, "BackPACK: Packing more into backprop", Sec. 2 and App. A;
Goodfellow 2015, "Efficient per-example gradient computations", for the linear layer):

* ``nn.Linear``, input ``[N, ..., in]``: ``dW_k = sum_{i in k} d_i^T a_i`` over the group's rows
  and any extra dimensions (one ``bmm``), ``db_k = sum d_i``;
* ``nn.Conv1d`` / ``nn.Conv2d``: the group's examples go along the channels, ``[N / m, m C, ...]``,
  and the ``m`` weight gradients are one grouped weight gradient (``groups = m g``) of (input,
  ``d``) in that layout -- on one CPU thread 2-3x faster than BackPACK's unfold-and-``einsum`` for
  ``m = B`` (ResNet-20's 3x3 layers, batch 128);
* ``nn.LayerNorm`` / ``nn.GroupNorm`` / eval-mode ``_BatchNorm`` (statistics of the example, or fixed
  running statistics: the examples do not interact): ``dW_k = sum d * a_hat``, ``db_k = sum d`` with
  the normalised input ``a_hat`` recomputed from ``a``;
* ``nn.Embedding``: ``dW_k`` is ``d`` scattered into the rows the group looked up;
* :class:`~landscape.models.norms.FilterResponseNorm2d` (the bSAM paper's ResNet-20-FRN; Singh &
  Krishnan 2020): ``z = max(gamma x_hat + beta, tau)`` with ``x_hat`` the example's own
  normalisation, so ``dgamma_k = sum d_y x_hat``, ``dbeta_k = sum d_y``, ``dtau_k = sum (d - d_y)``
  with ``d_y = d`` where ``gamma x_hat + beta > tau``, ``d / 2`` at a tie (as autograd splits
  ``torch.maximum``), else 0.

For ``m = B`` :func:`squared_sums` gives ``sum_i g_i^2`` and ``||g_i||^2`` without forming the
``B`` gradients where a closed form exists: for a linear layer on ``[B, in]`` rows
``sum_i (d_i a_i^T)^2 = (d^2)^T (a^2)`` and ``||d_i a_i^T||^2 = ||d_i||^2 ||a_i||^2`` (Goodfellow
2015; BackPACK's ``SumGradSquared`` / ``BatchL2Grad`` for ``Linear``); for an embedding the rows are
combined per (example, index) pair first.

:func:`why_not` says which layers these rules do not cover (any other parametrised layer, a
train-mode batch norm, a convolution with a non-zero padding mode is covered by padding first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv1d_weight, conv2d_weight

from landscape.models.norms import FilterResponseNorm2d

__all__ = ["LAYERS", "conv_padding", "group_gradients", "squared_sums", "to_groups", "why_not"]

#: the layer classes with a rule (exact classes: a subclass may override ``forward``)
LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.LayerNorm, nn.GroupNorm, nn.Embedding, FilterResponseNorm2d)
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONV_WEIGHT = {1: conv1d_weight, 2: conv2d_weight}


def why_not(mod: nn.Module) -> str | None:
    """Why :func:`group_gradients` has no rule for ``mod``'s own parameters (``None``: it has)."""
    kind = type(mod)
    name = kind.__name__
    if kind in _BATCHNORMS:
        if mod.training or mod.running_mean is None:
            return f"{name} normalises with batch statistics (train mode): the examples interact"
        return None
    if kind not in LAYERS:
        return f"{name} has parameters and no per-example rule"
    if kind is nn.Embedding:
        if mod.max_norm is not None:
            return "Embedding with max_norm (renormalises the weight in place)"
        if mod.scale_grad_by_freq:
            return "Embedding with scale_grad_by_freq (the batch's frequencies couple the examples)"
        if mod.sparse:
            return "Embedding with sparse=True"
    return None


def to_groups(t: torch.Tensor, m: int) -> torch.Tensor:
    """``[m b, C, ...]`` -> ``[b, m C, ...]``: group ``k``'s examples as channel group ``k``."""
    n, c, *rest = t.shape
    return t.reshape(m, n // m, c, *rest).transpose(0, 1).reshape(n // m, m * c, *rest)


def conv_padding(conv: nn.Module, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``(input, padding)`` such that the convolution of ``a`` equals ``conv``'s weights applied to
    ``input`` with zero ``padding``: non-zero padding modes and an asymmetric ``"same"`` are
    applied to ``a`` first (as ``nn.Conv*._conv_forward`` does for the modes)."""
    nd = a.dim() - 2
    if conv.padding_mode != "zeros":
        return F.pad(a, conv._reversed_padding_repeated_twice, mode=conv.padding_mode), (0,) * nd
    pad = conv.padding
    if pad == "valid":
        return a, (0,) * nd
    if pad == "same":
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        if not any(t % 2 for t in total):
            return a, tuple(t // 2 for t in total)
        sides: list[int] = []
        for t in reversed(total):  # F.pad: last dimension first; the extra one on the right
            sides += [t // 2, t - t // 2]
        return F.pad(a, sides), (0,) * nd
    return a, tuple(pad)


def _flat(t: torch.Tensor, m: int, tail: int) -> torch.Tensor:
    """``[N, ..., tail...]`` -> ``[m, rows, tail...]`` (``tail`` trailing dimensions kept)."""
    return t.reshape(m, -1, *t.shape[t.dim() - tail :])


def _normalised(mod: nn.Module, a: torch.Tensor) -> torch.Tensor:
    kind = type(mod)
    if kind is nn.LayerNorm:
        return F.layer_norm(a, mod.normalized_shape, None, None, mod.eps)
    if kind is nn.GroupNorm:
        return F.group_norm(a, mod.num_groups, None, None, mod.eps)
    shape = (1, -1) + (1,) * (a.dim() - 2)  # eval-mode batch norm: the running statistics
    mean, var = mod.running_mean.to(a.dtype), mod.running_var.to(a.dtype)
    return (a - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + mod.eps)


def _filter_response(mod: FilterResponseNorm2d, a: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(x_hat, d_y, d_tau)``: the normalised input and the output gradient split between the
    affine branch and the threshold ``tau`` of ``max(gamma x_hat + beta, tau)``."""
    x_hat = a * torch.rsqrt(a.square().mean(dim=(2, 3), keepdim=True) + mod.eps)
    if mod.tau is None:
        return x_hat, d, torch.zeros_like(d)
    y = mod.weight.view(1, -1, 1, 1) * x_hat + mod.bias.view(1, -1, 1, 1)
    tau = mod.tau.view(1, -1, 1, 1)
    share = (y > tau).to(d.dtype) + 0.5 * (y == tau).to(d.dtype)
    d_y = d * share
    return x_hat, d_y, d - d_y


def _channel_sums(t: torch.Tensor, m: int) -> torch.Tensor:
    """``[N, C, ...]`` -> ``[m, C]``: sums over the group's examples and the positions."""
    return t.reshape(m, t.shape[0] // m, t.shape[1], -1).sum((1, 3))


def group_gradients(
    mod: nn.Module,
    a: torch.Tensor,
    d: torch.Tensor,
    m: int,
    names: tuple[str, ...] = ("weight", "bias"),
    a_groups: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``{name: [m, *param.shape]}``: the gradients of ``mod``'s parameters ``names`` (those it has)
    for ``m`` groups of consecutive rows of the input ``a`` (``[N, ...]``, ``N`` divisible by ``m``)
    and the output gradient ``d = dL/dz``; ``a_groups``: ``a`` in the grouped layout of
    :func:`to_groups` (convolutions), if the caller formed it already."""
    kind = type(mod)
    want = {n for n in names if getattr(mod, n, None) is not None}
    out: dict[str, torch.Tensor] = {}
    if kind is nn.Linear:
        d3 = _flat(d, m, 1)
        if "weight" in want:
            out["weight"] = torch.bmm(d3.transpose(1, 2), _flat(a, m, 1))
        if "bias" in want:
            out["bias"] = d3.sum(1)
    elif kind in (nn.Conv1d, nn.Conv2d):
        if "weight" in want:
            shape = tuple(mod.weight.shape)
            ap, pad = conv_padding(mod, a)
            ag = a_groups if a_groups is not None and ap is a else to_groups(ap, m)
            gw = _CONV_WEIGHT[a.dim() - 2](
                ag, (m * shape[0], *shape[1:]), to_groups(d, m), mod.stride, pad, mod.dilation, m * mod.groups
            )
            out["weight"] = gw.reshape(m, *shape)
        if "bias" in want:
            out["bias"] = _channel_sums(d, m)
    elif kind is nn.LayerNorm:
        k = len(mod.normalized_shape)
        if "weight" in want:
            out["weight"] = _flat(d * _normalised(mod, a), m, k).sum(1)
        if "bias" in want:
            out["bias"] = _flat(d, m, k).sum(1)
    elif kind is nn.GroupNorm or kind in _BATCHNORMS:
        if "weight" in want:
            out["weight"] = _channel_sums(d * _normalised(mod, a), m)
        if "bias" in want:
            out["bias"] = _channel_sums(d, m)
    elif kind is FilterResponseNorm2d:
        x_hat, d_y, d_tau = _filter_response(mod, a, d)
        if "weight" in want:
            out["weight"] = _channel_sums(d_y * x_hat, m)
        if "bias" in want:
            out["bias"] = _channel_sums(d_y, m)
        if "tau" in want:
            out["tau"] = _channel_sums(d_tau, m)
    elif kind is nn.Embedding:
        if "weight" in want:
            num, dim = mod.weight.shape
            idx = a.reshape(m, -1) + num * torch.arange(m, device=a.device).unsqueeze(1)
            rows = _kept(mod, a, d.reshape(-1, dim))
            gw = d.new_zeros(m * num, dim).index_add_(0, idx.reshape(-1), rows)
            out["weight"] = gw.reshape(m, num, dim)
    else:
        raise ValueError(f"no per-group gradient rule for {kind.__name__}; see why_not()")
    return out


def _kept(mod: nn.Embedding, a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Output-gradient rows of an embedding with those at ``padding_idx`` zeroed (no gradient)."""
    if mod.padding_idx is None:
        return rows
    return rows * (a.reshape(-1, 1) != mod.padding_idx).to(rows.dtype)


def squared_sums(
    mod: nn.Module, a: torch.Tensor, d: torch.Tensor, names: tuple[str, ...] = ("weight", "bias")
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{name: (sum_i g_i^2, [||g_i||^2]_i)}`` over the ``B = a.shape[0]`` examples (``g_i``: the
    gradient of example ``i``'s loss), from closed forms where the module docstring gives one,
    else from the ``B`` gradients of :func:`group_gradients`."""
    kind = type(mod)
    B = a.shape[0]
    want = tuple(n for n in names if getattr(mod, n, None) is not None)
    if kind is nn.Linear and a.dim() == 2:
        d2 = d.square()
        dn = d2.sum(1)
        out = {}
        if "weight" in want:
            a2 = a.square()
            out["weight"] = (d2.t().mm(a2), dn * a2.sum(1))
        if "bias" in want:
            out["bias"] = (d2.sum(0), dn)
        return out
    if kind is nn.Embedding and "weight" in want:
        num, dim = mod.weight.shape
        keys = (a.reshape(B, -1) + num * torch.arange(B, device=a.device).unsqueeze(1)).reshape(-1)
        pairs, inverse = torch.unique(keys, return_inverse=True)
        rows = _kept(mod, a, d.reshape(-1, dim))
        g2 = d.new_zeros(pairs.shape[0], dim).index_add_(0, inverse, rows).square()
        total = d.new_zeros(num, dim).index_add_(0, pairs % num, g2)
        norms = d.new_zeros(B).index_add_(0, torch.div(pairs, num, rounding_mode="floor"), g2.sum(1))
        return {"weight": (total, norms)}
    grads = group_gradients(mod, a, d, B, want)
    return {n: (g.square().sum(0), g.reshape(B, -1).square().sum(1)) for n, g in grads.items()}
