"""``model_guard``: snapshot a model's state and restore it bit-exactly, also when the body raises.

The state is every parameter (values, ``requires_grad``, ``.grad`` object and values), every buffer,
every module's train/eval flag, and which tensor object sits in every module's parameter and buffer
slot (so ``model.lin.weight is`` the same ``Parameter`` afterwards, even if something replaced it).
A tensor is written back only if it was modified (its version counter, storage, dtype or shape
changed), so the guard costs one copy of the model.  Every analysis call of the package runs inside
one, so the caller's model is bit-identical afterwards.

:func:`tensor_slots` maps every *slot* of a model (a ``(module, attribute)`` pair, named by its
first path) to the canonical name of the tensor in it.  Tied parameters (one ``nn.Linear`` used
twice, registered under two names; an embedding whose weight is also the output layer's) are one
tensor under one canonical name (``named_parameters()``'s) but live in several slots; a functional
call must fill each slot exactly once (see ``landscape.objective``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn

__all__ = ["model_guard", "tensor_slots"]


def _sig(t: torch.Tensor) -> tuple:
    return (t._version, t.data_ptr(), t.dtype, t.shape)


def _restore(t: torch.Tensor, saved: torch.Tensor, s: tuple) -> None:
    if _sig(t) == s:
        return
    if t.dtype != saved.dtype or t.shape != saved.shape or t.data_ptr() != s[1]:
        t.data = saved
    else:
        t.copy_(saved)


def tensor_slots(model: nn.Module, kind: str = "parameters") -> dict[str, str]:
    """``slot name -> canonical name`` for every distinct ``(module, attribute)`` slot holding a
    parameter (``kind="parameters"``) or buffer (``kind="buffers"``); canonical names are those of
    ``named_parameters()`` / ``named_buffers()`` (the first path to each tensor)."""
    named = model.named_parameters() if kind == "parameters" else model.named_buffers()
    canon = {id(t): n for n, t in named}
    out: dict[str, str] = {}
    seen: set[tuple[int, str]] = set()
    for prefix, mod in model.named_modules(remove_duplicate=False):
        store = mod._parameters if kind == "parameters" else mod._buffers
        for attr, t in store.items():
            if t is None or (id(mod), attr) in seen or id(t) not in canon:
                continue
            seen.add((id(mod), attr))
            out[f"{prefix}.{attr}" if prefix else attr] = canon[id(t)]
    return out


@contextlib.contextmanager
def model_guard(
    model: nn.Module,
    params: Iterable[torch.Tensor] | None = None,
    modules: Iterable[nn.Module] | None = None,
) -> Iterator[None]:
    """Restore ``params`` (default: all of ``model``'s), its buffers, the flags of ``modules``
    (default: ``model.modules()``) and the tensor objects in every module's parameter/buffer slots
    to their state on entry when the block exits."""
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
        slots = [(m, dict(m._parameters), dict(m._buffers)) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            # slots first: the objects written back below are then the ones the model holds
            for m, ps, bs in slots:
                for store, saved in ((m._parameters, ps), (m._buffers, bs)):
                    if store.keys() != saved.keys() or any(store[k] is not v for k, v in saved.items()):
                        store.clear()
                        store.update(saved)
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


def _rng_devices(device: torch.device) -> list[int]:
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def rng_state(device: torch.device) -> list[torch.Tensor]:
    """The CPU generator's state and that of ``device``'s generator (CUDA)."""
    states = [torch.get_rng_state()]
    for i in _rng_devices(device):
        states.append(torch.cuda.get_rng_state(i))
    return states


@contextlib.contextmanager
def forked_rng(device: torch.device, seed: int | None = None):
    """Run the block on a fork of the global RNG (CPU and ``device``), re-seeded with ``seed``."""
    devs = _rng_devices(device)
    with torch.random.fork_rng(devices=devs):
        if seed is not None:
            torch.default_generator.manual_seed(seed)
            for i in devs:
                torch.cuda.default_generators[i].manual_seed(seed)
        yield
