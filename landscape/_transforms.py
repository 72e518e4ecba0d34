"""Whether code runs inside a ``torch.func`` transform, and how to step outside one.

The one place the package decides "are we inside a transform" (:func:`in_transform`).  Inside a
transform (``grad``, ``vmap``, ``jacrev``, ``jacfwd``, ``hessian``, ``jvp``, ``vjp``, any nesting) every
tensor an operation creates is wrapped for that transform's level (a ``grad`` level wraps even the
result of ``torch.cat`` of plain tensors), and ``vmap`` refuses random operations.  Work that has
nothing to do with the function being transformed -- iterating the data (a ``DataLoader`` draws a
random seed for every pass, a shuffling sampler a permutation), fingerprinting it, building a cache
that outlives the call -- therefore runs under :func:`outside_transforms`: plain eager PyTorch on
plain tensors, so nothing kept afterwards holds a wrapped tensor of a level that no longer exists
(which made every later transform fail with torch's internal assertion ``level <= current_level``).
Every pass over the data starts with :func:`data_iter`, which also keeps the caller's RNG as it was.

Private functorch API, the same torch itself uses to build fake tensors inside transforms
(``torch._subclasses.meta_utils``): ``torch._C._functorch.peek_interpreter_stack`` (non-empty
inside a transform) and ``torch._functorch.pyfunctorch.temporarily_clear_interpreter_stack`` (pops
every transform level for the block and pushes the same levels back afterwards, also on errors).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

__all__ = ["data_iter", "in_transform", "outside_transforms", "transform_tensors"]


def in_transform() -> bool:
    """True inside a ``torch.func`` transform (grad, vmap, jvp, ...), at any nesting level, and not
    inside :func:`outside_transforms`."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def outside_transforms() -> contextlib.AbstractContextManager:
    """Run the block as plain eager PyTorch even inside a transform (the identity outside one): the
    transforms' levels are set aside for its duration.  Only for code on plain tensors (data,
    caches): a tensor the transform tracks must not enter it."""
    return temporarily_clear_interpreter_stack() if in_transform() else contextlib.nullcontext()


def data_iter(data: Iterable) -> Iterator:
    """``iter(data)`` outside every transform, with the caller's global RNG left as it was: a
    ``DataLoader`` draws a base seed from the CPU generator each time it is iterated (the same seed
    on every pass, then). What the iterator draws later -- a shuffling sampler its permutation, at
    the first batch -- is the data's own randomness and is not hidden."""
    with outside_transforms(), torch.random.fork_rng(devices=[]):
        return iter(data)


def transform_tensors(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` belongs to a transform (batched by ``vmap``, tracked by ``grad``)."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return any(wrapped(t) for t in tensors)
