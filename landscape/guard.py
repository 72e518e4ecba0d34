"""``model_guard``: snapshot a model's state and restore it bit-exactly, also when the body raises.

The state is every parameter (values, ``requires_grad``, ``.grad`` object and values), every buffer
and every module's train/eval flag.  A tensor is written back only if it was modified (its version
counter, storage, dtype or shape changed), so the guard costs one copy of the model.  Every analysis
call of the package runs inside one, so the caller's model is bit-identical afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

__all__ = ["model_guard"]


def _sig(t: torch.Tensor) -> tuple:
    return (t._version, t.data_ptr(), t.dtype, t.shape)


def _restore(t: torch.Tensor, saved: torch.Tensor, s: tuple) -> None:
    if _sig(t) == s:
        return
    if t.dtype != saved.dtype or t.shape != saved.shape or t.data_ptr() != s[1]:
        t.data = saved
    else:
        t.copy_(saved)


@contextlib.contextmanager
def model_guard(
    model: nn.Module,
    params: Iterable[torch.Tensor] | None = None,
    modules: Iterable[nn.Module] | None = None,
) -> Iterator[None]:
    """Restore ``params`` (default: all of ``model``'s), its buffers and the flags of ``modules``
    (default: ``model.modules()``) to their state on entry when the block exits."""
    params = list(model.parameters()) if params is None else list(params)
    modules = list(model.modules()) if modules is None else list(modules)
    with torch.no_grad():
        saved_params = []
        for p in params:
            g = p.grad
            saved_g = None if g is None else (g, g.detach().clone(), _sig(g))
            saved_params.append((p, p.detach().clone(), _sig(p), p.requires_grad, saved_g))
        buffers = [(b, b.detach().clone(), _sig(b)) for b in model.buffers()]
        flags = [(m, m.training) for m in modules]
    try:
        yield
    finally:
        with torch.no_grad():
            for p, saved, s, rg, saved_g in saved_params:
                if p.requires_grad != rg:
                    p.requires_grad_(rg)
                _restore(p, saved, s)
                if saved_g is None:
                    if p.grad is not None:
                        p.grad = None
                else:
                    g_obj, g_saved, gs = saved_g
                    if p.grad is not g_obj:
                        p.grad = g_obj
                    _restore(g_obj, g_saved, gs)
            for b, saved, s in buffers:
                _restore(b, saved, s)
            for m, f in flags:
                if m.training != f:
                    m.training = f
