"""Mixed precision settings of the runner: ``precision`` -> autocast and parameter dtype.

``precision``: ``float32`` (no autocast), ``float64`` (model and data in double, no autocast),
``bf16`` (``torch.autocast`` with bfloat16; no scaling, bfloat16 has float32's range; the choice on
CPU) or ``fp16`` (autocast with float16 and the dynamic loss scale of
:class:`optimizers.amp.LossScaler`, unscaled inside the closure).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from landscape.deprecation import moved_names

__all__ = ["autocast_context", "param_dtype"]

#: the loss scaler is :mod:`optimizers.amp`'s: importable from here, with a warning, for one release
__getattr__ = moved_names(__name__, dict.fromkeys(("LossScaler", "SkipStep"), "optimizers.amp"))


def param_dtype(precision: str) -> torch.dtype:
    """The dtype of the model's parameters and inputs for ``precision``."""
    return torch.float64 if precision == "float64" else torch.float32


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``bf16`` / ``fp16`` on ``device``'s type; a null context otherwise."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast(device_type=device.type, dtype=torch.float16)
    return contextlib.nullcontext()
