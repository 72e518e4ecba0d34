"""BatchNorm running statistics of a sampled network (Maddox et al. 2019, ``bn_update``).

A weight sample from a posterior (SWAG, a Gaussian, an ensemble member) needs BatchNorm statistics
computed with its own weights; :func:`bn_update` recomputes them on training inputs as the authors'
``swag/utils.py`` does, leaving parameters, modes and momenta as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from optimizers.perturbation import bn_restore, bn_snapshot

__all__ = ["bn_update", "has_batchnorm"]


def _bn_layers(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.running_mean is not None]


def has_batchnorm(model: nn.Module) -> bool:
    """Whether ``model`` has a BatchNorm layer that tracks running statistics."""
    return bool(_bn_layers(model))


def _batches(data: Any) -> Iterator[Any]:
    """Inputs of each batch: ``data`` is a tensor (one batch) or an iterable of tensors / tuples."""
    if isinstance(data, torch.Tensor):
        yield data
        return
    if not isinstance(data, Iterable):
        raise TypeError(
            f"bn_data must be a tensor of inputs or an iterable of batches (a DataLoader), got "
            f"{type(data).__name__}"
        )
    for batch in data:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"each batch must be a tensor or a tuple (inputs, ...), got {type(x).__name__}")
        yield x


@torch.no_grad()
def bn_update(model: nn.Module, data: Any, progress: bool = False) -> int:
    """Recompute the BatchNorm running statistics of ``model`` on ``data`` (Maddox et al. 2019).

    The statistics are reset (mean 0, variance 1, batch count 0) and ``data`` is run through the
    model in train mode with the momentum of every BatchNorm layer set to ``b / (n + b)`` for a
    batch of ``b`` inputs after ``n`` earlier ones, so that the running mean and variance end up as
    the batch-size-weighted averages of the per-batch means and (unbiased) variances -- the
    authors' ``bn_update`` (swa_gaussian, ``swag/utils.py``); with equal batches this is
    ``momentum=None`` (cumulative averaging).  With the whole data set as one batch the running
    statistics are the exact mean and unbiased variance of the pre-BatchNorm activations.

    The layers' ``momentum`` and the train/eval mode of every module are restored afterwards (the
    authors' version leaves the model in train mode); parameters are not touched; if the data
    raise or hold no inputs the old statistics are put back.  Returns the number of inputs seen
    (0 and nothing changed for a model without BatchNorm).

    Args:
        model: the network.
        data: a tensor of inputs (one batch) or an iterable of batches, each a tensor or a tuple
            whose first entry is the inputs (a ``DataLoader`` of the training data).
        progress: tqdm progress bar over the batches.
    """
    layers = _bn_layers(model)
    if not layers:
        return 0
    modes = {m: m.training for m in model.modules()}
    momenta = {m: m.momentum for m in layers}
    snap = bn_snapshot(model)
    n = 0
    ok = False
    try:
        for m in layers:
            m.reset_running_stats()
        model.train()
        from tqdm.auto import tqdm

        for x in tqdm(_batches(data), desc="bn_update", disable=not progress, leave=False):
            b = x.shape[0]
            if b == 0:
                continue
            for m in layers:
                m.momentum = b / (n + b)
            model(x)
            n += b
        if n == 0:
            raise ValueError("bn_data holds no inputs: pass the training inputs (a tensor or a DataLoader)")
        ok = True
    finally:
        for m, mom in momenta.items():
            m.momentum = mom
        for m, mode in modes.items():
            m.training = mode
        if not ok:  # an error: leave the statistics as they were
            bn_restore(snap)
    return n
