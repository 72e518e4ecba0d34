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
``GradScaler`` does, and lowers the scale. Unlike ``GradScaler`` the scale has bounds: a backoff
below ``min_scale`` (default 1) raises :class:`ScaleUnderflow` -- gradients non-finite at every
scale come from a NaN/inf loss or a diverged model, and skipping would go on forever (the runner
records the run as diverged) -- and growth stops at ``2**127``. Settings and loaded state dicts are
validated (a NaN, infinite or zero scale is refused; the scale and its factors must be powers of
two), and so is what ``forward`` returns (the loss, a 0-d tensor with grad; no backward of its
own). Usage::

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
import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from landscape.checks import ArgumentTypeError, check_bool, check_int, check_range

__all__ = ["MAX_SCALE", "LossScaler", "ScaleUnderflow", "SkipStep"]


#: The largest loss scale: the largest power of two below the float32 maximum.
MAX_SCALE = 2.0**127


def _power_of_two(name: str, value: Any, low: float, high: float, **ends: bool) -> float:
    """A number in the interval (:func:`landscape.checks.check_range`) that is a power of two: the
    scale is one (scaling and unscaling exact), so its initial value and factors must be."""
    v = check_range(name, value, low, high, **ends)
    if math.frexp(v)[0] != 0.5:
        near = 2.0 ** round(math.log2(v))
        raise ValueError(
            f"{name} must be a power of two (e.g. {near:g}), got {value!r}: with another scale, "
            "unscaling the gradients is not exact"
        )
    return v


def _check_loss(loss: Any) -> torch.Tensor:
    """What ``forward()`` returned, refused unless it is the loss :meth:`LossScaler.step` can scale
    and differentiate: a 0-d floating tensor that requires grad."""
    fix = "forward must return the batch's loss (a 0-d tensor, forward only: the scaler calls backward)"
    if not isinstance(loss, torch.Tensor):
        raise ArgumentTypeError(
            f"LossScaler.step: forward returned a {type(loss).__name__}, not a tensor; {fix}, e.g. "
            "`return loss_fn(model(x), y)` (not loss.item())"
        )
    if loss.numel() != 1 or not loss.is_floating_point():
        raise ValueError(
            f"LossScaler.step: forward returned a {loss.dtype} tensor of shape {list(loss.shape)}; {fix} "
            "(a loss with reduction='none' needs .mean() or .sum())"
        )
    if not loss.requires_grad:
        raise ValueError(
            f"LossScaler.step: the loss forward returned does not require grad (computed under "
            f"torch.no_grad(), or detached); {fix}, computed from the model's output with grad enabled"
        )
    return loss


class SkipStep(Exception):
    """A scaled gradient overflowed: the step is skipped and the scale lowered."""


class ScaleUnderflow(FloatingPointError):
    """The scale would fall below ``min_scale``: the gradients are non-finite at every scale."""


class LossScaler:
    """Dynamic loss scale, unscaled inside the closure (see the module docstring).

    Args:
        enabled: ``False`` makes every method a no-op (scale 1).
        init_scale, growth_factor, backoff_factor, growth_interval: as ``torch.amp.GradScaler``
            (finite; the scale and the factors are powers of two; the scale stays in
            ``[min_scale, 2**127]``).
        min_scale: the smallest scale a backoff may reach; below it :meth:`update` raises
            :class:`ScaleUnderflow` instead of skipping forever (default 1: float16 gradients that
            overflow unscaled mean a NaN/inf loss or a diverged model).
    """

    def __init__(
        self,
        enabled: bool = True,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
    ) -> None:
        self.enabled = enabled = check_bool("LossScaler: enabled", enabled)
        self.growth_factor = _power_of_two("LossScaler: growth_factor", growth_factor, 1.0, MAX_SCALE)
        self.backoff_factor = _power_of_two(
            "LossScaler: backoff_factor", backoff_factor, 0.0, 1.0, low_open=True, high_open=True
        )
        self.growth_interval = check_int("LossScaler: growth_interval", growth_interval, minimum=1)
        self.min_scale = check_range("LossScaler: min_scale", min_scale, 0.0, MAX_SCALE, low_open=True)
        init = _power_of_two("LossScaler: init_scale", init_scale, 0.0, MAX_SCALE, low_open=True)
        if enabled and init < self.min_scale:
            raise ValueError(
                f"LossScaler: init_scale ({init:g}) is below min_scale ({self.min_scale:g}); "
                "raise init_scale or lower min_scale"
            )
        self.scale = init if enabled else 1.0
        self.good_steps = 0
        self.skipped = 0
        self._warned_ceiling = False

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale if self.enabled else loss

    def unscale_(self, params: Iterable[torch.Tensor], *, raise_on_overflow: bool = True) -> bool:
        """Divide every ``.grad`` by the scale in place; ``True`` if all are finite. A non-finite
        gradient raises :class:`SkipStep` (or returns ``False`` with ``raise_on_overflow=False``)."""
        if isinstance(params, torch.Tensor):  # iterating one tensor would give its rows, without .grad
            raise ArgumentTypeError(
                "LossScaler.unscale_: params must be an iterable of parameters (model.parameters(), a "
                "list), got a single tensor; pass [p]"
            )
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
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ArgumentTypeError(
                f"LossScaler.step: optimizer must be a torch.optim.Optimizer (e.g. optimizers.SAM), got "
                f"{type(optimizer).__name__}; call it as scaler.step(opt, forward)"
            )
        if not callable(forward):
            raise ArgumentTypeError(
                f"LossScaler.step: forward must be a function returning the batch's loss (forward only, "
                f"no backward), got {type(forward).__name__}"
            )
        params = [p for group in optimizer.param_groups for p in group["params"]]
        chunked = int(getattr(optimizer, "m", 1)) > 1

        def closure(chunk: int | None = None) -> torch.Tensor:
            for p in params:
                p.grad = None
            loss = _check_loss(forward(chunk) if chunked else forward())
            if any(p.grad is not None for p in params):  # the step cleared them: forward ran backward
                raise ValueError(
                    "LossScaler.step: forward ran a backward pass itself (a parameter has a .grad after "
                    "it), which adds an unscaled gradient to the scaled one; forward must only compute "
                    "the loss: the scaler scales it and calls backward"
                )
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
        after ``growth_interval`` clean steps.

        A backoff below ``min_scale`` raises :class:`ScaleUnderflow` (the scale is left as it was):
        gradients that are non-finite at every scale down to ``min_scale`` come from a NaN/inf
        loss or model, not from float16 overflow, and skipping would go on forever. Growth stops
        at :data:`MAX_SCALE` (``2**127``, the largest power of two below the float32 maximum) with
        one warning."""
        skipped = check_bool("LossScaler.update: skipped", skipped)
        if not self.enabled:
            return
        if skipped:
            lowered = self.scale * self.backoff_factor
            if lowered < self.min_scale:
                raise ScaleUnderflow(
                    f"loss scale would fall to {lowered:g}, below min_scale={self.min_scale:g} "
                    f"({self.skipped + 1} skipped steps in all): the gradients are non-finite at "
                    "every scale tried, so the loss or the model produces NaN/inf (check the data "
                    "and lower the learning rate); pass a smaller min_scale only if the float16 "
                    "gradients really need a scale this small"
                )
            self.scale = lowered
            self.good_steps = 0
            self.skipped += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.good_steps = 0
            grown = self.scale * self.growth_factor
            if grown > MAX_SCALE:
                if not self._warned_ceiling:
                    warnings.warn(
                        f"LossScaler: the loss scale stays at {self.scale:g}: growing it by "
                        f"growth_factor={self.growth_factor:g} would pass the ceiling 2**127 "
                        "(a larger scale overflows every float32 loss)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    self._warned_ceiling = True
                return
            self.scale = grown

    def state_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "scale": self.scale,
            "good_steps": self.good_steps,
            "skipped": self.skipped,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; a dict that is not one (missing or unknown keys, a scale
        that is not a finite number in ``[min_scale, 2**127]``, negative counters) is refused and
        the scaler left unchanged."""
        keys = {"enabled", "scale", "good_steps", "skipped"}
        if not isinstance(sd, Mapping) or set(sd) != keys:
            got = sorted(sd) if isinstance(sd, Mapping) else type(sd).__name__
            raise ValueError(
                f"LossScaler.load_state_dict: expected a dict with keys {sorted(keys)} (from "
                f"LossScaler.state_dict()), got {got}"
            )
        enabled = check_bool("LossScaler.load_state_dict: 'enabled'", sd["enabled"])
        scale = _power_of_two(
            "LossScaler.load_state_dict: 'scale'", sd["scale"], 0.0, MAX_SCALE, low_open=True
        )
        if enabled and scale < self.min_scale:
            raise ValueError(
                f"LossScaler.load_state_dict: 'scale' {scale:g} is below this scaler's min_scale "
                f"{self.min_scale:g}; construct the scaler with a smaller min_scale to load it"
            )
        good = check_int("LossScaler.load_state_dict: 'good_steps'", sd["good_steps"], minimum=0)
        skipped = check_int("LossScaler.load_state_dict: 'skipped'", sd["skipped"], minimum=0)
        self.enabled, self.scale, self.good_steps, self.skipped = enabled, scale, good, skipped
