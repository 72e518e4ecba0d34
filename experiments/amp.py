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

__all__ = ["autocast_context", "param_dtype", "slow_autocast_warning"]

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


def _native_cpu_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX-512 BF16 or AMX), as oneDNN reports it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN: no fast bfloat16 either
        return False


def slow_autocast_warning(precision: str, device: torch.device) -> str | None:
    """Why ``precision`` will be slow on ``device`` (``None``: it will not): ``bf16`` on a CPU without
    bfloat16 instructions emulates every autocast convolution and matrix product (an order of
    magnitude slower than float32 for a ResNet on an AVX2 CPU: ``tests/test_paper_configs_run.py``
    runs Fisher-SAM Fig. 4's config in float32 on the CPU for that reason)."""
    if precision != "bf16" or device.type != "cpu" or _native_cpu_bfloat16():
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f'precision = "bf16" on a CPU without bfloat16 instructions ({capability}): autocast convolutions '
        'and matrix products are emulated and much slower than float32; set precision = "float32" '
        "for CPU runs (the numbers differ from a bf16 run's by rounding only)"
    )
