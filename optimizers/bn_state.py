"""BatchNorm running statistics saved and restored bit-exactly around a perturbed forward pass.

A two-pass optimizer must not let the pass at ``w + eps`` update the running statistics (the
statistics after a step equal those of one train-mode pass at ``w``); snapshot/restore is bit exact
and also covers ``momentum=None`` (cumulative averages, driven by ``num_batches_tracked``), unlike
setting the momentum to 0. Re-exported by :mod:`optimizers.perturbation`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["bn_restore", "bn_snapshot", "bn_update_disabled"]

_BN_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def bn_snapshot(model: nn.Module | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Clones of the running statistics of every BatchNorm layer in ``model`` (empty if none)."""
    if model is None:
        return []
    snap: list[tuple[torch.Tensor, torch.Tensor]] = []
    for mod in model.modules():
        if isinstance(mod, _BatchNorm):
            for name in _BN_BUFFERS:
                buf = getattr(mod, name, None)
                if isinstance(buf, torch.Tensor):
                    snap.append((buf, buf.detach().clone()))
    return snap


def bn_restore(snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Write a :func:`bn_snapshot` back in place (bit exact)."""
    with torch.no_grad():
        for buf, saved in snapshot:
            buf.copy_(saved)


@contextlib.contextmanager
def bn_update_disabled(model: nn.Module) -> Iterator[None]:
    """Forward passes inside this block leave BatchNorm running statistics unchanged.

    The statistics are snapshotted on entry and restored bit-exactly on exit (also on error).  Use
    it in a closure for the pass at the perturbed point when the optimizer was built without
    ``model=``; keep ``backward()`` inside the block (autograd saved the BN buffers for the
    backward pass and checks that they were not modified in place before it ran)::

        def closure():
            opt.zero_grad()
            with bn_update_disabled(model) if opt.perturbed else contextlib.nullcontext():
                loss = loss_fn(model(x), y)
                loss.backward()
            return loss
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"bn_update_disabled expects an nn.Module, got {type(model).__name__}")
    snap = bn_snapshot(model)
    try:
        yield
    finally:
        bn_restore(snap)
