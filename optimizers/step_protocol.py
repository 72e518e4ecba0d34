"""The split-step protocol of the SAM family and bSAM: its states, the one check of the call order,
and the rule for non-finite gradients.

:class:`optimizers.perturbation.PerturbationOptimizer` (SAM, ASAM, Fisher-SAM, ...) and
:class:`optimizers.BayesianSAM` step either with ``step(closure)`` or in halves around backward
passes the caller runs (``first_step()`` / ``second_step()``; bSAM: ``noise_step()`` first). Between
the halves the weights are *not* ``w``, so every public method is allowed in some states only
(``opt.step_state``):

* ``"idle"`` -- after construction and after a finished, cancelled or failed step: allowed are
  ``step(closure)``, ``first_step()`` (bSAM with noise: ``noise_step()``), ``state_dict()``,
  ``load_state_dict()`` and ``add_param_group()``;
* ``"noise"`` (bSAM) -- after ``noise_step()``, the weights at ``w + e``: the backward pass, then
  ``first_step()``; or ``cancel_step()``;
* ``"open"`` -- after ``first_step()``, the weights at ``w + eps``: the backward pass, then
  ``second_step()`` (or ``step()`` without a closure); or ``cancel_step()``.

``zero_grad()`` is allowed in every state; a copy (``copy.deepcopy``, pickling, ``torch.save`` of
the optimizer) in ``"idle"`` only, and it is the whole optimizer (its base optimizer, ``m``, ...).
A call out of turn raises :class:`StepOrderError` (a ``RuntimeError``) that names the call, the
state and what to call instead, and changes nothing:
weights, BatchNorm statistics, optimizer state and generator stay as they were. In particular
``step(closure)`` is refused while a split step is open (it would be lost: the open step's
``second_step`` restores the weights it saved), a state dict is never taken or loaded with the
weights at a perturbed point (the saved ``w`` is not part of it: finish or cancel the step first),
and ``second_step()`` (bSAM: ``first_step()`` after ``noise_step()``) refuses when no backward pass
wrote a gradient since the previous half -- the step then stays open, so run the backward pass and
call it again, or ``cancel_step()`` to restore ``w``.

A sparse gradient (``nn.Embedding(sparse=True)``) is refused where a step is handed one, before
anything changes (:func:`check_dense`): the perturbation's norms need dense gradients.

Non-finite gradients: a step never spreads a NaN / inf gradient into the weights. Before the update
it checks, with one host read, the norms of the first pass's gradient (which the perturbation has
computed anyway) and of the descent gradient (one fused ``foreach`` 2-norm, :func:`check_finite`); a
non-finite value
raises :class:`NonFiniteGradient` (a ``FloatingPointError``) naming the optimizer and the pass. The
weights are then bit for bit those before the step and the optimizer's state (momentum, precision,
step counts) is untouched; a split step is closed (as ``cancel_step()``). The generator has
advanced, and the BatchNorm statistics keep the pass at ``w``'s update, as after a step skipped by
:class:`optimizers.LossScaler` (whose :class:`optimizers.SkipStep`, raised inside the closure, is
not affected). The ``.grad`` tensors are left as they are, for inspection. The experiment runner
records the run as diverged (``experiments.divergence``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "IDLE",
    "NOISE",
    "OPEN",
    "NonFiniteGradient",
    "SplitProtocol",
    "StepOrderError",
    "check_dense",
    "check_finite",
    "grad_marks",
    "has_new_grads",
]

IDLE, NOISE, OPEN = "idle", "noise", "open"

_STATE = {
    IDLE: "no step is open",
    NOISE: "a step is open: noise_step() moved the weights to w + e",
    OPEN: "a step is open: first_step() moved the weights to w + eps",
}
_FIX = {
    IDLE: "begin a step with first_step() after the backward pass at w",
    NOISE: "run the backward pass at w + e and call first_step(), or undo the step with cancel_step(), first",
    OPEN: "finish the step with second_step() after the backward pass at w + eps, or undo it with "
    "cancel_step(), first",
}


class StepOrderError(RuntimeError):
    """A call out of turn in the split-step protocol (module docstring); nothing was changed."""


class NonFiniteGradient(FloatingPointError):
    """A gradient a step was to use holds NaN / inf; the step was not taken (module docstring).

    ``optimizer``: the class name; ``where``: the pass (``"at w"``, ``"at w + eps"``, ...);
    ``loss``: the step's loss (the closure's at the first pass, a float; ``None`` in a split step)."""

    def __init__(self, optimizer: str, where: str, loss: float | None = None) -> None:
        self.optimizer, self.where, self.loss = optimizer, where, loss
        super().__init__(
            f"{optimizer}: non-finite gradient (NaN or inf) {where}; the step was not taken and the "
            "weights are as before it. Lower the learning rate (or rho), use optimizers.LossScaler "
            "with float16, or check the data and the loss for NaN / inf"
        )


def grad_marks(params: Sequence[torch.Tensor]) -> list[Any]:
    """Which tensor each ``p.grad`` is now and its version (a weak reference: nothing is kept
    alive, and autograd still accumulates in place), for :func:`has_new_grads`."""
    return [None if p.grad is None else (weakref.ref(p.grad), p.grad._version) for p in params]


def has_new_grads(params: Sequence[torch.Tensor], marks: Sequence[Any]) -> bool:
    """Has some ``p.grad`` been written since :func:`grad_marks` (a backward pass accumulates in
    place, bumping the version, or sets a new tensor)?"""
    for p, mark in zip(params, marks):
        g = p.grad
        if g is not None and (mark is None or mark[0]() is not g or mark[1] != g._version):
            return True
    return False


def check_dense(params: Iterable[torch.Tensor], who: str) -> None:
    """Refuse a sparse gradient (``nn.Embedding(sparse=True)``, ...) before a step uses it: the
    perturbation's norms and updates need dense ones. Nothing is changed (the caller checks first)."""
    for p in params:
        if p.grad is not None and p.grad.layout != torch.strided:
            raise TypeError(
                f"{who}: the gradient of a parameter of shape {tuple(p.shape)} is sparse ({p.grad.layout}); "
                "the SAM family and bSAM need dense gradients: build the layer with sparse=False (e.g. "
                "nn.Embedding(..., sparse=False)), or set p.grad = p.grad.to_dense() after backward"
            )


_HALF = (torch.float16, torch.bfloat16)


def check_finite(
    optimizer: Any,
    first: Sequence[torch.Tensor],
    descent: Sequence[torch.Tensor],
    where: tuple[str, str],
    loss: Any = None,
) -> None:
    """Raise :class:`NonFiniteGradient` unless the first pass's gradient norms ``first`` (0-d or
    per-chunk tensors the step computed anyway; empty for a one-pass method) and the descent
    gradient ``descent`` are finite. ``where``: the two passes' points, e.g. ``("at w", "at w +
    eps")``; ``loss``: the step's loss (a tensor, or one per chunk: their mean), kept on the error.

    Both are checked through their per-tensor 2-norms (one fused ``foreach`` kernel: a NaN or inf
    entry makes its norm NaN or inf) and the sum of those (norms are >= 0: finite iff each is); for
    half-precision gradients the norms are accumulated in float32, so that a finite float16 gradient
    never overflows its norm. A float32 norm overflows only for entries beyond about 1e19, which
    count as non-finite, as they already do in the perturbation's norm. One host read (the sum);
    which pass failed is worked out only then."""
    tensors = [*first, *descent]
    if not tensors:
        return
    half = any(t.dtype in _HALF for t in descent)
    norms = torch._foreach_norm(tensors, 2.0, dtype=torch.float32 if half else None)
    if math.isfinite(torch.stack(norms).sum()):
        return
    first_ok = not first or bool(torch.isfinite(torch.cat([t.reshape(-1) for t in first])).all())
    at = where[1] if first_ok else where[0]
    losses = loss if isinstance(loss, (list, tuple)) else [] if loss is None else [loss]
    value = sum(float(torch.as_tensor(v).double().mean()) for v in losses) / max(len(losses), 1)
    raise NonFiniteGradient(type(optimizer).__name__, at, value if losses else None)


class SplitProtocol:
    """Mixin of the optimizers with a split step: :attr:`step_state` (from the subclass's record of
    the open step), the call-order check and ``state_dict`` / ``load_state_dict`` refused while a
    step is open. Put it before ``torch.optim.Optimizer`` in the bases."""

    @property
    def step_state(self) -> str:
        """``"idle"``, ``"noise"`` (bSAM) or ``"open"`` (module docstring)."""
        raise NotImplementedError

    def _step_fix(self, state: str) -> str:
        """What to call in ``state`` (the advice of a refusal)."""
        return _FIX[state]

    def _expect(self, call: str, *allowed: str) -> None:
        """The one check of the call order: refuse ``call`` unless the state is in ``allowed``."""
        state = self.step_state
        if state not in allowed:
            raise StepOrderError(
                f"{type(self).__name__}.{call} refused: {_STATE[state]}; {self._step_fix(state)} "
                "(nothing was changed)"
            )

    def _require_new_grads(
        self, call: str, params: Sequence[torch.Tensor], point: str, since: tuple[str, list] | None = None
    ) -> None:
        """Refuse ``call`` unless some parameter has a gradient (``since = (name, marks)``: one a
        backward pass wrote after the call ``name``, :func:`grad_marks`); nothing is changed."""
        name, marks = since if since is not None else ("", [None] * len(params))
        if has_new_grads(params, marks):
            check_dense(params, f"{type(self).__name__}.{call}")
            return
        after = f" written since {name}" if name else ""
        still = "" if self.step_state == IDLE else "; the step stays open (cancel_step() undoes it)"
        raise StepOrderError(
            f"{type(self).__name__}.{call} refused: it needs the gradient at {point} and no parameter has "
            f"a gradient{after} (no backward pass, or zero_grad() after it): run loss.backward() at "
            f"{point} and call {call} again{still}"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``torch.optim``'s ``zero_grad``; while a step is open the cleared gradients count as not
        written (``set_to_none=False`` zeroes them in place, which a backward pass's version check
        could not tell from a new gradient), so the next half still needs a backward pass."""
        super().zero_grad(set_to_none)  # type: ignore[misc]
        split = getattr(self, "_split", None)
        if split is not None and "marked" in split:
            split["marks"] = grad_marks(split["marked"])

    def __getstate__(self) -> dict[str, Any]:
        """``copy.deepcopy`` and pickling: the whole optimizer (``torch.optim`` keeps only
        ``defaults``, ``state`` and ``param_groups``, which left a copy without its base optimizer,
        ``m``, ...), less the caches rebuilt on demand; refused while a step is open (the weights are
        at a perturbed point, and a copy would take them for ``w``)."""
        self._expect("copy (copy.deepcopy, pickle, torch.save)", IDLE)
        return {**self.__dict__, "_split": None, "_flat_state": None}

    def state_dict(self) -> dict[str, Any]:
        self._expect("state_dict()", IDLE)
        return super().state_dict()  # type: ignore[misc]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._expect("load_state_dict()", IDLE)
        super().load_state_dict(state_dict)  # type: ignore[misc]
