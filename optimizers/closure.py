"""The closure contract of the SAM family and bSAM with m-sharpness.

``closure(chunk=None)`` zeroes the gradients, runs forward and backward on sub-batch ``chunk`` (the
whole batch for ``None``) and returns the loss. :class:`ChunkClosure` (what
:func:`optimizers.perturbation.make_closure` returns) also carries the model, loss and sub-batches,
which the vectorised m-sharpness engines (:mod:`optimizers.m_sharpness`) need.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from optimizers.step_protocol import check_dense

__all__ = ["ChunkClosure", "accepts_chunk", "check_closure_grads"]


class ChunkClosure:
    """``closure(chunk=None)`` for ``loss_fn(model(x), y)`` that also exposes what it computes.

    ``chunk=None``: the whole batch; ``chunk=k``: sub-batch ``torch.tensor_split(., m)[k]``.
    Attributes: ``optimizer``, ``model``, ``loss_fn``, ``inputs``, ``targets``, ``m``, ``x_chunks``,
    ``y_chunks``, ``batched_unavailable`` (``None``, or why the optimizer must not vectorise).
    """

    def __init__(self, optimizer, model, loss_fn, inputs, targets, m: int, batched_unavailable=None) -> None:
        self.optimizer, self.model, self.loss_fn = optimizer, model, loss_fn
        self.inputs, self.targets, self.m = inputs, targets, m
        self.x_chunks = torch.tensor_split(inputs, m)
        self.y_chunks = torch.tensor_split(targets, m)
        self.batched_unavailable = batched_unavailable

    def __call__(self, chunk: int | None = None) -> torch.Tensor:
        self.optimizer.zero_grad()
        x, y = (self.inputs, self.targets) if chunk is None else (self.x_chunks[chunk], self.y_chunks[chunk])
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach()


_ACCEPTS_CHUNK: dict[Any, bool] = {}


def accepts_chunk(closure: Callable[..., Any]) -> bool:
    """Can ``closure(0)`` be called (the m-sharpness contract)?  ``True`` where the signature
    cannot be introspected (builtins: the caller is trusted).  Cached per code object (a training
    loop builds a new closure every step from the same code: ``inspect.signature`` took 9 us)."""
    code = getattr(closure, "__code__", None)
    if code is not None:  # a function: its code and positional defaults decide
        key: Any = (code, getattr(closure, "__defaults__", None))
    else:  # an instance of a Python class with __call__ (e.g. ChunkClosure): the class decides
        call = getattr(type(closure), "__call__", None)  # noqa: B004 - the class's method, not callable()
        key = ("instance", type(closure)) if hasattr(call, "__code__") else None
    try:
        if key in _ACCEPTS_CHUNK:
            return _ACCEPTS_CHUNK[key]
    except TypeError:  # unhashable defaults: not cached
        key = None
    try:
        inspect.signature(closure).bind(0)
        ok = True
    except TypeError:
        ok = False
    except ValueError:  # signature not introspectable (builtins): trust the caller
        ok = True
    if key is not None and len(_ACCEPTS_CHUNK) < 4096:
        _ACCEPTS_CHUNK[key] = ok
    return ok


def check_closure_grads(params: Any, who: str) -> None:
    """The closure contract: its backward pass wrote a gradient (the step set every ``.grad`` to
    ``None`` before calling it); a closure without ``loss.backward()`` would give a silent no-op.
    A sparse gradient is refused too (:func:`optimizers.step_protocol.check_dense`)."""
    written = False
    for p in params:  # one pass: this runs after every closure call
        g = p.grad
        if g is not None:
            written = True
            if g.layout != torch.strided:
                check_dense([p], f"{who}.step")
    if not written:
        raise ValueError(
            f"{who}.step: the closure computed no gradient (no parameter has a .grad after it): call "
            "loss.backward() inside the closure before `return loss`; the weights were left as before "
            "the step"
        )
