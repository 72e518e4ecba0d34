"""Batching helpers: fixed-size batches of in-memory tensors, DataLoaders, and iterating any data form."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, TensorDataset

Batch = tuple[torch.Tensor, torch.Tensor]
# ---------------------------------------------------------------------------------------- batches


def batches(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int | None = None,
    *,
    shuffle: bool = False,
    seed: int | torch.Generator | None = 0,
) -> list[Batch]:
    """Split ``(x, y)`` into a list of ``(inputs, targets)`` batches (the last one may be smaller).

    ``batch_size=None`` gives one batch. ``shuffle`` permutes with a seeded generator first.
    """
    if len(x) != len(y):
        raise ValueError(f"inputs and targets differ in length: {len(x)} vs {len(y)}")
    n = len(x)
    if batch_size is None:
        batch_size = n
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int or None, got {batch_size!r}")
    if shuffle:
        gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed or 0))
        perm = torch.randperm(n, generator=gen)
        x, y = x[perm], y[perm]
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, n, batch_size)]


def make_loader(
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 128,
    *,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
) -> DataLoader:
    """A ``DataLoader`` over ``TensorDataset(x, y)`` whose shuffling is seeded (reproducible)."""
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(
        TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, generator=gen, drop_last=drop_last
    )


def inputs_to(x: torch.Tensor, device: torch.device | str | None, dtype: torch.dtype) -> torch.Tensor:
    """``x`` on ``device``, floating inputs cast to ``dtype`` (the model's precision); integer
    inputs (the token ids of :mod:`landscape.data.text`) keep their dtype."""
    if x.is_floating_point():
        return x.to(device=device, dtype=dtype)
    return x.to(device=device)


def iterate(data) -> Iterator[Batch]:
    """Iterate over ``data`` given as one ``(x, y)`` batch or an iterable of batches."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        if isinstance(data[1], torch.Tensor) and data[0].shape[:1] == data[1].shape[:1]:
            yield data[0], data[1]
            return
    yield from data
