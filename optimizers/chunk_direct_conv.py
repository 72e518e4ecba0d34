"""``nn.Conv2d`` and spatial pooling for :mod:`optimizers.chunk_direct` (no ``vmap``).

The ``m`` chunks (``b`` examples each, rows ``[k b, (k + 1) b)`` of ``[m b, C, H, W]``) go along
the channels: ``[b, m C, H, W]``, chunk ``k``'s examples as channel group ``k``.  Then

* per-chunk weights ``[m, O, C / g, kh, kw]`` are one grouped convolution: weight ``[m O, C / g,
  kh, kw]``, ``groups = m g`` (output ``[b, m O, H', W']`` back to ``[m b, O, H', W']``);
* the ``m`` weight gradients are one grouped weight gradient of ``(input, delta = dL/dz)`` in that
  layout (``aten.convolution_backward``, weight only; the per-group rule of
  :func:`optimizers.layer_gradients.group_gradients`, shared with the per-example gradients); their
  sum is the plain weight gradient over all ``m b`` rows; bias gradients are sums of ``delta`` over
  examples and positions.

These are the products autograd forms for ``F.conv2d`` chunk by chunk.  Only zero padding (numeric,
``"valid"``, or a symmetric ``"same"``) is handled; anything else stays with ``vmap``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.grad import conv2d_weight

from optimizers.layer_gradients import group_gradients, to_groups

__all__ = ["SPATIAL", "conv_forward", "conv_grads", "conv_why_not", "spatial_why_not"]

#: parameter-free modules that act on every example ``[C, H, W]`` of a 4-d batch alone
SPATIAL = frozenset((nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d))


def _padding(conv: nn.Conv2d) -> tuple[int, int] | None:
    """The numeric zero padding of ``conv`` (``None``: an asymmetric ``"same"``)."""
    pad = conv.padding
    if pad == "valid":
        return (0, 0)
    if pad == "same":
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return None if any(t % 2 for t in total) else (total[0] // 2, total[1] // 2)
    return tuple(pad)


def conv_why_not(conv: nn.Conv2d) -> str | None:
    """Why the direct engine cannot handle this ``nn.Conv2d`` (``None``: it can)."""
    if conv.padding_mode != "zeros":
        return f"Conv2d with padding_mode={conv.padding_mode!r}"
    if _padding(conv) is None:
        return "Conv2d with an asymmetric 'same' padding"
    return None


def spatial_why_not(mod: nn.Module) -> str | None:
    if getattr(mod, "return_indices", False):
        return f"{type(mod).__name__} with return_indices=True"
    return None


def _from_groups(t: torch.Tensor, m: int) -> torch.Tensor:
    """``[b, m O, H, W]`` -> ``[m b, O, H, W]``."""
    b, mo, *hw = t.shape
    return t.reshape(b, m, mo // m, *hw).transpose(0, 1).reshape(m * b, mo // m, *hw)


def conv_forward(
    conv: nn.Conv2d, h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, m: int, per_chunk: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(z [m b, O, H', W'], the input in grouped layout or None)``; ``per_chunk``: ``w`` and ``b``
    are (or are expanded to) ``[m, ...]``, one per chunk."""
    pad = _padding(conv)
    if not per_chunk:
        return F.conv2d(h, w, b, conv.stride, pad, conv.dilation, conv.groups), None
    w5 = w if w.dim() == 5 else w.expand(m, *w.shape)
    if b is not None:
        b = (b if b.dim() == 2 else b.expand(m, *b.shape)).reshape(-1)
    hg = to_groups(h, m)
    z = F.conv2d(hg, w5.reshape(-1, *w5.shape[2:]), b, conv.stride, pad, conv.dilation, m * conv.groups)
    return _from_groups(z, m), hg


@torch.no_grad()
def conv_grads(
    conv: nn.Conv2d,
    a: torch.Tensor,
    a_groups: torch.Tensor | None,
    d: torch.Tensor,
    m: int,
    reduce: bool,
    want_w: bool,
    want_b: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(dW, db)`` of ``conv`` from its input ``a`` and ``d = dL/dz``: per chunk ``[m, ...]``, or
    with ``reduce`` their sum (``a_groups``: ``a`` in grouped layout, if the forward formed it)."""
    pad, shape = _padding(conv), tuple(conv.weight.shape)
    gw = gb = None
    if reduce:  # the plain weight gradient over all m b rows (a full SAM step: faster than the
        # grouped one summed, LeNet-5 on digits, one CPU thread)
        if want_w:
            gw = conv2d_weight(a, shape, d, conv.stride, pad, conv.dilation, conv.groups)
        if want_b:
            gb = d.sum((0, 2, 3))
        return gw, gb
    names = tuple(n for n, want in (("weight", want_w), ("bias", want_b)) if want)
    grads = group_gradients(conv, a, d, m, names, a_groups=a_groups)  # the shared per-group rule
    return grads.get("weight"), grads.get("bias")
