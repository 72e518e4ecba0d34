"""``first_step`` / ``second_step``: a SAM-family step in two halves, around the caller's own passes.

``step(closure)`` runs both forward/backward passes itself. Loops that run them elsewhere -- mixed
precision with a loss scaler, gradient clipping of the descent gradient, Lightning's or the
HuggingFace ``Trainer``'s training step -- call the two halves instead (the interface of the
widely used one-file PyTorch SAM)::

    loss_fn(model(x), y).backward()          # gradient at w
    opt.first_step(zero_grad=True)           # w <- w + eps(g); the gradients are cleared
    loss_fn(model(x), y).backward()          # gradient at w + eps
    opt.second_step(zero_grad=True)          # w restored, base optimizer steps with that gradient

The update equals ``step(closure)``'s bit for bit (same operations in the same order:
``tests/test_split_step.py``). With ``model=`` the BatchNorm running statistics are those of the
first pass (snapshotted in ``first_step``, restored in ``second_step``). ``step()`` without a
closure after ``first_step`` is ``second_step()`` (so a trainer that calls ``optimizer.step()``
after the training step finishes a step begun there); :meth:`SplitStep.cancel_step` restores
``w`` without an update (e.g. after a loss-scale overflow in the second pass).
One perturbation per step: ``m > 1`` (m-sharpness) needs ``step(closure)``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from optimizers.bn_state import bn_restore, bn_snapshot

__all__ = ["SplitStep"]


class SplitStep:
    """Mixin of :class:`optimizers.perturbation.PerturbationOptimizer` (see the module docstring)."""

    _split: tuple[list[torch.Tensor], list[torch.Tensor], list, dict[str, Any]] | None = None
    #: the ``step`` whose two halves these are (set by ``PerturbationOptimizer``); a subclass that
    #: overrides ``step`` does more per step, and the split step refuses it
    _two_halves_of: Any = None

    def _check_split(self, name: str) -> None:
        # torch.optim wraps every subclass's step (profiling hooks): compare the functions inside
        if inspect.unwrap(type(self).step) is not inspect.unwrap(type(self)._two_halves_of):
            # e.g. FlatSGLD's noise after the update, FlatSGVB's KL bookkeeping
            raise NotImplementedError(
                f"{type(self).__name__}.{name}: this optimizer does more in step() than the two halves "
                "can reproduce; use step(closure)"
            )
        if self.m != 1:
            raise ValueError(
                f"{type(self).__name__}.{name}: first_step/second_step take one perturbation per step; "
                f"with m={self.m} (m-sharpness) use step(closure) with closure(chunk)"
            )

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """``w <- w + eps`` from the gradients in ``p.grad`` (those at ``w``; single-pass methods
        need none); ``zero_grad=True`` then clears them for the pass at ``w + eps``."""
        self._check_split("first_step")
        if self._split is not None:
            raise RuntimeError(
                f"{type(self).__name__}.first_step called twice; finish the step with second_step() "
                "(or cancel_step()) first"
            )
        self._begin_step()
        if self.passes == 2:
            pairs = [(g, p) for g in self.param_groups for p in g["params"] if p.grad is not None]
            if not pairs:
                raise RuntimeError(
                    f"{type(self).__name__}.first_step needs the gradient at w: call loss.backward() "
                    "before it (no parameter has a .grad)"
                )
        else:
            pairs = self._all_pairs()
        eps, diag = self._perturbation(pairs)
        params = [p for _, p in pairs]
        saved = [p.detach().clone() for p in params]
        snap = bn_snapshot(self.model) if self.passes == 2 else []
        if params:
            torch._foreach_add_(params, eps)
        self._split = (params, saved, snap, diag)
        self.perturbed = True
        if zero_grad:
            self.zero_grad()

    def _restore_split(self, name: str) -> dict[str, Any]:
        if self._split is None:
            raise RuntimeError(f"{type(self).__name__}.{name} without first_step(): call first_step() first")
        params, saved, snap, diag = self._split
        self._split = None
        self.perturbed = False
        if params:
            torch._foreach_copy_(params, saved)
        bn_restore(snap)
        return diag

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Restore ``w`` (and the BatchNorm statistics) and let the base optimizer step with the
        gradients in ``p.grad`` (those at ``w + eps``; clip them before this call if you clip)."""
        diag = self._restore_split("second_step")
        self.last = dict(diag)
        self._adjust_descent()
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def cancel_step(self, zero_grad: bool = True) -> None:
        """Undo :meth:`first_step` without an update: ``w`` and the BatchNorm statistics restored."""
        self._restore_split("cancel_step")
        if zero_grad:
            self.zero_grad()
