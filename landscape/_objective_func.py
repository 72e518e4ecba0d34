"""The :class:`~landscape.Objective` as a differentiable function of the parameters passed to it.

Differentiable evaluation
-------------------------
``obj.loss(w)`` is the whole-dataset loss

.. math::  L(w) = \\sum_k w_k \\, \\ell\\big(f(X_k; \\theta(w)), y_k\\big),

where ``theta(w)`` is the model's parameters with the selected ones replaced by ``w``'s entries
(``obj.unflatten``; the others and the buffers are the model's current values, as constants).
The default (eager) evaluation runs under ``torch.no_grad()``: no graph is built.  When the
evaluation has to be differentiable, i.e.

* inside a ``torch.func`` transform (``grad``, ``vmap``, ``jacrev``, ``jacfwd``, ``hessian``,
  ``jvp``, ``vjp``; any level of nesting), or
* eagerly, with grad mode on and a parameter tensor passed that requires grad (autograd,
  ``torch.autograd.functional.hessian``),

the functions here compute the same sum through ``torch.func.functional_call`` on the tensors
passed in (nothing is detached, nothing written in place), so ``torch.func.grad(obj.loss)(w)``,
``torch.func.hessian(obj.loss)(w)`` and ``torch.func.vmap(obj.loss)(W)`` are the gradient,
Hessian and batched values of ``L``.  A data set of several batches is still one function (the sum
above); its graph spans every batch, so for large data prefer ``obj.gradient`` and the curvature
operators.  ``obj.gradient(w)`` is ``sum_k grad_w L_k(w)`` by ``torch.func.grad_and_value`` per
batch, itself differentiable (``torch.func.jacrev(obj.gradient)`` is the Hessian).

The data is a constant of these functions: ``obj.batches()`` iterates, fingerprints and converts
it outside any transform (``landscape._transforms``, which also decides whether code runs inside
one), so a ``DataLoader`` drawing its per-pass seed does not meet ``vmap``'s randomness check and
nothing the objective keeps is a tensor of a transform's level: any sequence of transforms and
eager calls works.  What a transform cannot do with the model raises naming the fix (a random
forward under ``vmap``, ``hessian`` or ``jacfwd``; BatchNorm's in-place statistics under ``vmap``).

Under a transform, values cannot be inspected (``vmap`` forbids data-dependent control flow), so
the non-finite checks of the eager path are replaced by the data check made at construction (a
batch whose inputs/targets hold NaN/inf raises); NaN/inf parameters give NaN values.  Every call
runs inside ``obj.guard()``: the caller's model is bit-identical afterwards, also when it raises.
Cannot be differentiated: ``evaluate`` (Python floats) and a ``DistributedObjective`` (the
all-reduce across ranks detaches); both raise naming the alternative.
The functions read the objective through its public protocol (``guard``, ``point``, ``buffers``,
``batches``, ``batch_loss``) and take the scan's record of non-finite batches as a value; they set
nothing on it (its state lives in ``landscape.objective``).  How a batch's inputs reach the forward
(``input_mode``) is ``landscape.inputs``'s.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from landscape import validation as V
from landscape._transforms import in_transform
from landscape.inputs import data_issue_message

__all__ = [
    "tracked",
    "loss",
    "loss_and_gradient",
    "refuse_transform",
    "not_differentiable",
]


def tracked(params: Any) -> bool:
    """Whether an evaluation at ``params`` must be differentiable (see the module docstring)."""
    if in_transform():
        return True
    if not torch.is_grad_enabled():
        return False
    if isinstance(params, torch.Tensor):
        return params.requires_grad
    if isinstance(params, Mapping):
        return any(isinstance(t, torch.Tensor) and t.requires_grad for t in params.values())
    return False


def refuse_transform(what: str, fix: str) -> None:
    """Raise for a method that cannot run inside a ``torch.func`` transform."""
    if in_transform():
        raise RuntimeError(
            f"Objective.{what} cannot run inside a torch.func transform (grad/vmap/jacrev/...): {fix}"
        )


def not_differentiable(owner: str, what: str) -> RuntimeError:
    """The error for differentiating an objective whose ``all_reduce`` sums across ranks."""
    return RuntimeError(
        f"{owner}.{what} cannot be differentiated (torch.func transform, or a parameter "
        "tensor that requires grad): the sum across ranks (torch.distributed.all_reduce) detaches "
        "its input. For values pass a tensor that does not require grad; for derivatives call "
        "obj.gradient() outside any transform, or the curvature operators (ls.hessian(obj), ...), "
        "which reduce across ranks themselves; or differentiate a plain landscape.Objective"
    )


def _check_data(issues: Mapping[int, str], k: int) -> None:
    """Batch ``k``'s inputs/targets are finite (``issues``: recorded by the construction scan)."""
    issue = issues.get(k)
    if issue:
        raise ValueError(data_issue_message(k, issue))


@contextlib.contextmanager
def _explain_transform_errors(mode: str) -> Iterator[None]:
    """Turn torch's errors for what a transform cannot do with this objective into ones naming the
    problem and the fix (the data never causes them: it is iterated outside the transforms)."""
    try:
        yield
    except RuntimeError as err:
        text = str(err)
        if "running_mean or running_var" in text:
            raise RuntimeError(
                f"vmap over the parameters of a model with BatchNorm in mode={mode!r} is not supported: "
                "BatchNorm updates its running statistics in place (in copies here), which vmap refuses "
                "for batched parameters; use Objective(..., mode='eval'), or evaluate the parameter "
                "vectors one by one (torch.func.grad, jacrev(obj.gradient) and jacfwd(grad(obj.loss)) "
                "work in train mode)"
            ) from err
        if "randomness error mode" in text:
            raise RuntimeError(
                f"the model's forward (or the loss) draws random numbers in mode={mode!r} (dropout or "
                "other randomness), which torch.func.vmap refuses by default (torch.func.hessian and "
                "jacfwd run the function under vmap): use Objective(..., mode='eval'); or, for one "
                "fixed dropout mask, Objective(..., stochastic='fixed') with "
                "torch.func.vmap(f, randomness='same') or, for the Hessian, "
                "torch.func.jacrev(obj.gradient) (its forward runs outside vmap)"
            ) from err
        raise


def loss(obj: Any, params: Any, issues: Mapping[int, str]) -> torch.Tensor:
    """``sum_k w_k loss_fn(f(X_k; theta(params)), y_k)`` on this process's data, differentiable in
    ``params`` (the objective runs it under ``torch.no_grad()`` and sums across ranks when it need
    not be).  Eagerly every batch loss is checked to be finite; under a transform (values cannot be
    read) batches whose data is not finite (``issues``, from the scan) are refused instead."""
    eager = not in_transform()
    with obj.guard(), _explain_transform_errors(obj.mode):
        full, bufs = obj.point(params), obj.buffers()
        total = torch.zeros((), dtype=obj.dtype, device=obj.device)
        for k, (x, y, w) in enumerate(obj.batches()):
            if not eager:
                _check_data(issues, k)
            lk = obj.batch_loss(full, bufs, x, y, w)
            if eager:
                V.check_loss_finite(lk, k, full, issues.get(k))
            total = total + lk
        return total


def loss_and_gradient(obj: Any, params: Any, issues: Mapping[int, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, grad L)`` at ``params`` with ``grad L = sum_k grad L_k`` (``torch.func.grad_and_value``
    per batch), both differentiable in ``params``."""
    eager = not in_transform()
    with obj.guard(), _explain_transform_errors(obj.mode):
        full, bufs = obj.point(params), obj.buffers()
        vec = obj.flatten(full)  # the selected entries, as a function of what was passed

        def batch_loss(v: torch.Tensor, x: Any, y: torch.Tensor, w: float) -> torch.Tensor:
            return obj.batch_loss({**full, **obj.unflatten(v)}, bufs, x, y, w)

        total = torch.zeros((), dtype=obj.dtype, device=obj.device)
        grad = torch.zeros(obj.num_params, dtype=obj.dtype, device=obj.device)
        for k, (x, y, w) in enumerate(obj.batches()):
            if not eager:
                _check_data(issues, k)
            gk, lk = torch.func.grad_and_value(batch_loss)(vec, x, y, w)
            if eager:
                V.check_loss_finite(lk, k, full, issues.get(k))
                V.check_gradient(obj.param_names, list(obj.unflatten(gk).values()), k, lk)
            total = total + lk
            grad = grad + gk
        return total, grad
