"""Mixed precision for the closure-based optimizers: a dynamic loss scaler that unscales inside the
closure (or between the halves of a split step).

``torch.amp.GradScaler`` cannot drive a two-pass optimizer: its ``step`` refuses closures, and it
allows one ``unscale_`` per optimizer and update, while SAM takes two gradients per update.
:class:`LossScaler` follows the same dynamic rule (Micikevicius et al. 2018, "Mixed precision
training", Sec. 3.2; ``GradScaler``'s defaults: initial scale ``2**16``, halve on overflow, double
after 2000 clean steps) but unscales each pass's gradients right after its ``backward``. Every
gradient an optimizer sees, the one at ``w`` from which the SAM family computes its perturbation
included, is the true gradient, so no optimizer needs to know the scale. The scale is a power of
two: scaling and unscaling are exact unless a value overflows or underflows (a float32 run with
the scaler moves the weights exactly as one without it: ``tests/test_amp_public.py``).

On overflow :meth:`LossScaler.unscale_` raises :class:`SkipStep`; every optimizer of the suite
restores its parameters when the closure raises, so :meth:`LossScaler.step` skips the update, as
``GradScaler`` does, and lowers the scale. Usage::

    scaler = LossScaler()
    def forward():                       # the loss of the batch, forward only
        with torch.autocast("cuda", dtype=torch.float16):
            return loss_fn(model(x), y)
    loss = scaler.step(opt, forward)     # None if the step was skipped

For loops that run the passes themselves (gradient clipping, other trainers), see the recipe with
``first_step`` / ``second_step`` in ``docs/recipes.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["LossScaler", "SkipStep"]


class SkipStep(Exception):
    """A scaled gradient overflowed: the step is skipped and the scale lowered."""


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

    def unscale_(self, params: Iterable[torch.Tensor], *, raise_on_overflow: bool = True) -> bool:
        """Divide every ``.grad`` by the scale in place; ``True`` if all are finite. A non-finite
        gradient raises :class:`SkipStep` (or returns ``False`` with ``raise_on_overflow=False``)."""
        if not self.enabled:  # before no_grad: nothing to pay per step when scaling is off
            return True
        with torch.no_grad():
            return self._unscale(params, raise_on_overflow)

    def _unscale(self, params: Iterable[torch.Tensor], raise_on_overflow: bool) -> bool:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return True
        torch._foreach_mul_(grads, 1.0 / self.scale)
        finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        if not finite and raise_on_overflow:
            raise SkipStep(f"gradient overflow at loss scale {self.scale:g}")
        return finite

    def step(
        self, optimizer: torch.optim.Optimizer, forward: Callable[..., torch.Tensor]
    ) -> torch.Tensor | None:
        """One ``optimizer.step(closure)`` with the loss ``forward()`` scaled for ``backward`` and
        every pass's gradients unscaled; returns the step's loss, or ``None`` when a gradient
        overflowed (the step is skipped, the weights untouched) -- then :meth:`update` is called.

        ``forward(chunk)`` is called with the sub-batch index when the optimizer runs m-sharpness
        (``m > 1``); otherwise ``forward()``.
        """
        params = [p for group in optimizer.param_groups for p in group["params"]]
        chunked = int(getattr(optimizer, "m", 1)) > 1

        def closure(chunk: int | None = None) -> torch.Tensor:
            for p in params:
                p.grad = None
            loss = forward(chunk) if chunked else forward()
            self.scale_loss(loss).backward()
            self.unscale_(params)
            return loss.detach()

        if chunked:
            try:
                inspect.signature(forward).bind(0)
            except TypeError:
                raise TypeError(
                    f"the optimizer runs m-sharpness (m={optimizer.m}): forward must accept a sub-batch "
                    "index, forward(chunk), and return the loss of that sub-batch"
                ) from None
        try:
            loss = optimizer.step(closure)
        except SkipStep:
            self.update(True)
            return None
        self.update(False)
        return loss

    def update(self, skipped: bool) -> None:
        """After every step (:meth:`step` calls it): halve the scale after an overflow, double it
        after ``growth_interval`` clean steps."""
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
