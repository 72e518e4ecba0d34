"""The data forms an :class:`~landscape.Objective` accepts: a batch is ``(inputs, targets)`` where
``inputs`` is a tensor, a tuple/list of tensors (positional arguments of ``forward``) or a dict of
tensors (keyword arguments).  Helpers to recognise, map and unpack them, and to count correct
predictions of a classifier's output."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

Inputs = torch.Tensor | tuple | dict


# --------------------------------------------------------------------------------------------
# small helpers on (possibly nested) inputs
# --------------------------------------------------------------------------------------------
def _is_inputs(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, Mapping):
        return len(x) > 0 and all(isinstance(v, torch.Tensor) for v in x.values())
    if isinstance(x, (tuple, list)):
        return len(x) > 0 and all(isinstance(v, torch.Tensor) for v in x)
    return False


def _is_single_batch(data: Any) -> bool:
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[1], torch.Tensor)
        and _is_inputs(data[0])
    )


def _tensors(inputs: Inputs) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, Mapping):
        return list(inputs.values())
    return list(inputs)


def _map_inputs(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    if isinstance(inputs, Mapping):
        return {k: fn(v) for k, v in inputs.items()}
    return tuple(fn(v) for v in inputs)


def _as_args(inputs: Inputs) -> tuple:
    """Positional arguments of the forward call: a tuple of tensors is unpacked, anything else is one."""
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def _num_correct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """Number of correct predictions for class labels or 0/1 targets, ``None`` if not classification."""
    if not torch.is_floating_point(y) and out.ndim == 2 and out.shape[1] > 1 and y.ndim == 1:
        return (out.argmax(dim=1) == y).sum().to(torch.float64)
    logits = out.reshape(-1) if out.ndim >= 1 and out.numel() == y.numel() else None
    if logits is not None and (out.ndim == 1 or out.shape[-1] == 1):
        yy = y.reshape(-1)
        if bool(((yy == 0) | (yy == 1)).all()):
            return ((logits > 0).to(yy.dtype) == yy).sum().to(torch.float64)
    return None
