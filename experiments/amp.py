"""Mixed precision for closure-based optimizers: autocast settings and a loss scaler that unscales
inside the closure.

``torch.amp.GradScaler`` cannot drive these optimizers: its ``step`` refuses closures, and a two-pass
SAM step would call ``unscale_`` twice per update. :class:`LossScaler` follows the same dynamic rule
(Micikevicius et al. 2018, "Mixed precision training", Sec. 3.2; the defaults of ``GradScaler``:
initial scale ``2**16``, halve on overflow, double after 2000 clean steps) but the closure unscales
the gradients itself right after ``backward``. Every gradient an optimizer sees, the one at ``w``
from which the SAM family computes its perturbation included, is therefore the true gradient, and
no optimizer needs to know about the scale (``FisherSAM``'s ``grad_scale`` stays 1). The scale is a
power of two, so scaling and unscaling are exact unless a value overflows or underflows.

On overflow the closure raises :class:`SkipStep`; every optimizer of the suite restores its
parameters when the closure raises (``try/finally``), so the trainer skips the update, as
``GradScaler`` does, and lowers the scale.

``precision``: ``float32`` (no autocast), ``float64`` (model and data in double, no autocast),
``bf16`` (``torch.autocast`` with bfloat16; no scaling, bfloat16 has float32's range; the choice on
CPU) or ``fp16`` (autocast with float16 and loss scaling).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["LossScaler", "SkipStep", "autocast_context", "param_dtype"]


class SkipStep(Exception):
    """A scaled gradient overflowed: the step is skipped and the scale lowered."""


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


class LossScaler:
    """Dynamic loss scale, unscaled inside the closure (see the module docstring).

    Args:
        enabled: ``False`` makes every method a no-op (scale 1).
        init_scale, growth_factor, backoff_factor, growth_interval: as ``torch.amp.GradScaler``.
    """

    def __init__(
        self,
        enabled: bool = True,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        if init_scale <= 0 or growth_factor < 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError(
                "need init_scale > 0, growth_factor >= 1, 0 < backoff_factor < 1, growth_interval >= 1"
            )
        self.enabled = bool(enabled)
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.good_steps = 0
        self.skipped = 0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    @torch.no_grad()
    def unscale_(self, params: Iterable[torch.Tensor]) -> None:
        """Divide every ``.grad`` by the scale in place; raise :class:`SkipStep` if any is not finite."""
        if not self.enabled:
            return
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        torch._foreach_mul_(grads, 1.0 / self.scale)
        finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
        if not bool(finite):
            raise SkipStep(f"gradient overflow at loss scale {self.scale:g}")

    def update(self, skipped: bool) -> None:
        """After every step: halve the scale after an overflow, double it after ``growth_interval``
        clean steps."""
        if not self.enabled:
            return
        if skipped:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped": self.skipped,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.enabled = bool(sd["enabled"])
        self.scale, self.good_steps, self.skipped = (
            float(sd["scale"]),
            int(sd["good_steps"]),
            int(sd["skipped"]),
        )
