"""The steps every file-based loader (MNIST, CIFAR, SVHN, CIFAR-10-C) takes around its own reader.

:func:`prepare` checks the common arguments (``split``, ``dtype``, ``limit``), resolves
``normalize`` to per-channel statistics and finds the directory that holds the files;
:func:`read_parts` reads the parts of a split (files or splits, in order) with the loader's reader,
concatenates them and keeps the first ``limit`` examples.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import (
    SPLITS,
    check_dtype,
    check_limit,
    check_split,
    data_root,
    locate,
    resolve_stats,
)

__all__ = ["prepare", "read_parts"]

Stats = tuple[tuple[float, ...], tuple[float, ...]] | None


def prepare(
    root: str | os.PathLike | None,
    what: str,
    *,
    dtype: torch.dtype,
    limit: int | None,
    normalize: bool | str | tuple,
    stats: str,
    channels: int,
    subdirs: Sequence[str],
    probes: Sequence[str],
    split: str | None = None,
    splits: Sequence[str] = SPLITS,
) -> tuple[Path, Stats]:
    """Check ``split`` (if given, against ``splits``), ``dtype`` and ``limit``; return the data
    directory (``root`` or ``$SHARPSCAPE_DATA``, or the first of its ``subdirs`` holding one of the
    files ``probes``) and the statistics ``normalize`` means (``stats``: the data set's own name in
    :data:`landscape.data.common.CHANNEL_STATS`)."""
    if split is not None:
        check_split(split, splits)
    check_dtype(dtype)
    check_limit(limit)
    mean_std = resolve_stats(normalize, stats, channels)
    return locate(data_root(root, what), subdirs, probes), mean_std


def read_parts(
    read: Callable[[str], tuple[np.ndarray, np.ndarray]],
    names: Sequence[str],
    limit: int | None,
    *,
    stop_at_limit: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """``read(name)`` for each name in order, concatenated, the first ``limit`` examples kept.

    With ``stop_at_limit`` the parts after the one that reaches ``limit`` are not read (nor
    checked); without it every part is read and checked first.
    """
    xs, ys = [], []
    for name in names:
        x, y = read(name)
        xs.append(x)
        ys.append(y)
        if stop_at_limit and limit is not None and sum(len(v) for v in ys) >= limit:
            break
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return x, y
