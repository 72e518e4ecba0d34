"""CIFAR-10 / CIFAR-100 (Krizhevsky 2009) from the "python version" pickles, read by a restricted
unpickler (:mod:`landscape.data.safe_pickle`) and checked (keys, dtypes, shapes, label ranges)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import SOURCES, Batch, to_inputs
from landscape.data.loading import prepare, read_parts
from landscape.data.safe_pickle import safe_load_pickle

CIFAR10_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CIFAR100_FILES = {"train": ("train",), "test": ("test",)}
_STATS_KEY = {"CIFAR-10": "cifar10", "CIFAR-100": "cifar100"}
_CIFAR100_LABELS = {"fine": (b"fine_labels", 100), "coarse": (b"coarse_labels", 20)}


def _labels_array(raw: object, path: Path, key: bytes, n: int, num_classes: int) -> np.ndarray:
    """Check a CIFAR label list / array: ``n`` integers in ``0..num_classes-1``."""
    where = f"{path}: {key!r}"
    if isinstance(raw, np.ndarray):
        if raw.ndim != 1 or raw.dtype.kind not in "iu":
            raise ValueError(
                f"{where} must be a list of integer labels, got a {raw.dtype} array of shape {raw.shape}"
            )
        values = raw
    elif isinstance(raw, (list, tuple)):
        bad = next((v for v in raw if isinstance(v, bool) or not isinstance(v, (int, np.integer))), None)
        if bad is not None:
            raise ValueError(f"{where} must be a list of integer labels, found {type(bad).__name__} {bad!r}")
        values = raw
    else:
        raise ValueError(f"{where} must be a list of integer labels, got {type(raw).__name__}")
    if len(values) != n:
        raise ValueError(f"{where} holds {len(values)} labels for {n} images; the file is corrupt")
    if not len(values):
        lo = hi = 0
    elif isinstance(values, np.ndarray):
        lo, hi = int(values.min()), int(values.max())
    else:
        lo, hi = int(min(values)), int(max(values))
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise ValueError(
            f"{where} contains label {bad}, outside the {num_classes} classes 0..{num_classes - 1}"
        )
    return np.asarray(values, dtype=np.int64)


def _read_cifar_batch(
    path: Path, what: str, label_key: bytes, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """One python-version CIFAR batch: ``(uint8 [n, 3, 32, 32], int64 [n])``, checked."""
    d = safe_load_pickle(path, what=what)
    if not isinstance(d, dict):
        raise ValueError(
            f"{path}: expected a pickled dict (a {what} python-version batch), got {type(d).__name__}"
        )
    d = {k.encode("utf-8") if isinstance(k, str) else k: v for k, v in d.items()}
    if b"data" not in d or label_key not in d:
        hint = ""
        if what == "CIFAR-10" and b"fine_labels" in d:
            hint = "; it looks like a CIFAR-100 file: use load_cifar100 / cifar100:DIR"
        elif what == "CIFAR-100" and b"labels" in d:
            hint = "; it looks like a CIFAR-10 file: use load_cifar10 / cifar10:DIR"
        missing = [k for k in (b"data", label_key) if k not in d]
        raise ValueError(
            f"{path}: expected a pickled dict with keys b'data' and {label_key!r}, missing {missing} "
            f"(keys found: {sorted(map(repr, d))[:8]}){hint}"
        )
    data = d[b"data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = (
            f"a {data.dtype} array of shape {data.shape}"
            if isinstance(data, np.ndarray)
            else type(data).__name__
        )
        raise ValueError(
            f"{path}: b'data' must be a uint8 array of shape [n, 3072] (n images, 3x32x32 "
            f"channel-major), got {got}"
        )
    if len(data) == 0:
        raise ValueError(f"{path}: b'data' holds no images; the file is corrupt")
    labels = _labels_array(d[label_key], path, label_key, len(data), num_classes)
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(
    root: str | os.PathLike | None,
    split: str,
    what: str,
    files: dict[str, tuple[str, ...]],
    subdir: str,
    archive: str,
    label_key: bytes,
    num_classes: int,
    dtype: torch.dtype,
    normalize: bool | str | tuple,
    limit: int | None,
) -> Batch:
    expected = files["train"] + files["test"]
    base, stats = prepare(
        root, what, split=split, dtype=dtype, limit=limit, normalize=normalize,
        stats=_STATS_KEY[what], channels=3, subdirs=(subdir,), probes=expected,
    )  # fmt: skip

    def read(name: str) -> tuple[np.ndarray, np.ndarray]:
        path = base / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{what}: no {name} in {base}. Expected the python-version pickles "
                f"{', '.join(expected)} in the directory or in its sub-directory {subdir} (extract "
                f"{archive} there); nothing is downloaded: get it from {SOURCES[what]}."
            )
        return _read_cifar_batch(path, what, label_key, num_classes)

    x, y = read_parts(read, expected if split == "all" else files[split], limit)
    return to_inputs(x, stats, dtype), torch.as_tensor(y)


def load_cifar10(
    root: str | os.PathLike | None = None,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
) -> Batch:
    """CIFAR-10 (Krizhevsky 2009) from the "python version" pickles in ``root``
    (default ``$SHARPSCAPE_DATA``) or ``root/cifar-10-batches-py``.

    Expected files: ``data_batch_1`` ... ``data_batch_5`` (train) and ``test_batch`` (test), each a
    pickled dict with ``b"data"`` (uint8 ``[n, 3072]``, channel-major 32x32) and ``b"labels"``
    (``n`` ints in 0..9), read by a restricted unpickler that refuses anything else.
    Inputs are ``[N, 3, 32, 32]`` in [0, 1], standardised per channel when ``normalize``
    (:func:`landscape.data.common.resolve_stats`).
    """
    return _load_cifar(
        root, split, "CIFAR-10", CIFAR10_FILES, "cifar-10-batches-py", "cifar-10-python.tar.gz",
        b"labels", 10, dtype, normalize, limit,
    )  # fmt: skip


def load_cifar100(
    root: str | os.PathLike | None = None,
    split: str = "train",
    label_mode: str = "fine",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
) -> Batch:
    """CIFAR-100 (Krizhevsky 2009) from the "python version" pickles in ``root``
    (default ``$SHARPSCAPE_DATA``) or ``root/cifar-100-python``.

    Expected files: ``train`` and ``test``, each a pickled dict with ``b"data"`` (uint8
    ``[n, 3072]``), ``b"fine_labels"`` (0..99) and ``b"coarse_labels"`` (0..19), read by a
    restricted unpickler. ``label_mode``: ``"fine"`` (100 classes) or ``"coarse"`` (20
    superclasses). Inputs are ``[N, 3, 32, 32]`` in [0, 1], standardised per channel with the
    training-set statistics when ``normalize``.
    """
    if label_mode not in _CIFAR100_LABELS:
        raise ValueError(f"label_mode must be one of {tuple(_CIFAR100_LABELS)}, got {label_mode!r}")
    key, num_classes = _CIFAR100_LABELS[label_mode]
    return _load_cifar(
        root, split, "CIFAR-100", CIFAR100_FILES, "cifar-100-python", "cifar-100-python.tar.gz",
        key, num_classes, dtype, normalize, limit,
    )  # fmt: skip
