"""Tiny data sets written in the real formats of the loaders (``landscape.data``), so that every paper
config's budget run goes through the same readers a full run uses: CIFAR-10/100 python pickles,
CIFAR-10-C ``.npy`` arrays and MNIST / Fashion-MNIST IDX files, with uniformly random pixels and
labels from a seeded generator."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np


def write_idx(path: Path, arr: np.ndarray) -> None:
    """LeCun's IDX format: magic ``00 00 08 ndim``, big-endian int32 sizes, unsigned bytes."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", s) for s in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


def cifar10(root: Path, rng: np.random.Generator, n: int = 40) -> Path:
    """``data_batch_1..5`` and ``test_batch`` of ``n`` images each (labels 0..9)."""
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, n).tolist(),
        }
        (root / name).write_bytes(pickle.dumps(batch))
    return root


def cifar100(root: Path, rng: np.random.Generator, n_train: int = 200, n_test: int = 100) -> Path:
    """``train`` and ``test`` with fine (0..99) and coarse (0..19) labels."""
    root.mkdir(parents=True, exist_ok=True)
    for name, n in (("train", n_train), ("test", n_test)):
        batch = {
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"fine_labels": rng.integers(0, 100, n).tolist(),
            b"coarse_labels": rng.integers(0, 20, n).tolist(),
        }
        (root / name).write_bytes(pickle.dumps(batch))
    return root


def cifar10c(root: Path, rng: np.random.Generator, corruptions=("gaussian_noise", "snow"), n: int = 20) -> Path:
    """``labels.npy`` and one ``<corruption>.npy`` of 5 severities x ``n`` images each."""
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / "labels.npy", np.tile(rng.integers(0, 10, n), 5))
    for c in corruptions:
        np.save(root / f"{c}.npy", rng.integers(0, 256, (5 * n, 32, 32, 3), dtype=np.uint8))
    return root


def mnist(root: Path, rng: np.random.Generator, n_train: int = 120, n_test: int = 100) -> Path:
    """The four IDX files of MNIST (and of Fashion-MNIST, which uses the same names)."""
    root.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(root / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n, dtype=np.uint8))
    return root
