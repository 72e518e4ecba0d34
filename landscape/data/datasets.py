"""Data sets to run on out of the box: scikit-learn digits (embedded), MNIST / Fashion-MNIST (IDX
files) and CIFAR-10 (python pickles) from a local directory.

Nothing is downloaded: digits ship with scikit-learn; the other loaders read the files their
official distributions contain and name the expected files when they are missing.

Every loader returns ``(inputs, targets)`` tensors: floating inputs of the requested ``dtype`` and
``int64`` class labels.
"""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

Batch = tuple[torch.Tensor, torch.Tensor]

_SPLITS = ("train", "test", "all")


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")


# ----------------------------------------------------------------------------------------- digits


def load_digits(
    split: str = "all",
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    dtype: torch.dtype = torch.float32,
    image: bool = False,
    standardize: bool = True,
) -> Batch:
    """The 1,797 8x8 handwritten digits of scikit-learn (UCI optdigits test set), standardised.

    Args:
        split: ``"train"``, ``"test"`` or ``"all"``. The train/test split is a seeded random
            permutation (``seed``) with ``round(test_fraction * 1797)`` test examples.
        test_fraction: share of the examples in the test split, in (0, 1).
        dtype: floating dtype of the inputs.
        image: ``False`` -> inputs ``[N, 64]``; ``True`` -> ``[N, 1, 8, 8]`` (for LeNet-5/ResNet).
        standardize: subtract the per-pixel mean and divide by the per-pixel standard deviation,
            both computed on the TRAIN split (constant pixels keep scale 1), so train and test use
            the same transform.

    Returns:
        ``(X, y)`` with ``y`` int64 labels in 0..9.
    """
    _check_split(split)
    _check_dtype(dtype)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_digits as _sk_digits

    bunch = _sk_digits()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    n = len(y)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(test_fraction * n))
    test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    if standardize:
        mean = x[train_idx].mean(axis=0)
        std = x[train_idx].std(axis=0)
        std[std == 0] = 1.0
        x = (x - mean) / std
    idx = {"train": train_idx, "test": test_idx, "all": np.arange(n)}[split]
    xs = torch.as_tensor(x[idx]).to(dtype)
    if image:
        xs = xs.reshape(-1, 1, 8, 8)
    return xs, torch.as_tensor(y[idx])


# ------------------------------------------------------------------------------------------ MNIST

# IDX type codes (third byte of the magic number) -> big-endian numpy dtype
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_MNIST_STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (LeCun's MNIST format), gzip-compressed or not.

    Format: magic number ``0x00 0x00 <type> <ndim>``, then ``ndim`` big-endian int32 sizes, then
    the data in big-endian order (type 0x08 = unsigned byte, 0x09 signed byte, 0x0B int16,
    0x0C int32, 0x0D float32, 0x0E float64).
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int(s) for s in np.frombuffer(raw[4:header], dtype=">i4"))
    dt = np.dtype(_IDX_DTYPES[raw[2]])
    count = int(np.prod(shape)) if shape else 1
    if len(raw) - header != count * dt.itemsize:
        raise ValueError(
            f"{path}: header announces shape {shape} ({count * dt.itemsize} bytes of data) "
            f"but the file holds {len(raw) - header} bytes"
        )
    return np.frombuffer(raw[header:], dtype=dt).reshape(shape).astype(dt.newbyteorder("="))


def _find(root: Path, stem: str, what: str, expected: Sequence[str]) -> Path:
    for cand in (root / stem, root / f"{stem}.gz", root / "raw" / stem, root / "raw" / f"{stem}.gz"):
        if cand.is_file():
            return cand
    raise FileNotFoundError(
        f"{what}: no {stem}[.gz] in {root} (or {root / 'raw'}). Expected the files "
        f"{', '.join(expected)} (each optionally gzip-compressed, as distributed on the {what} page); "
        "nothing is downloaded automatically."
    )


def load_mnist(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    limit: int | None = None,
    flavour: str = "mnist",
) -> Batch:
    """MNIST (or Fashion-MNIST with ``flavour="fashion-mnist"``) from IDX files in ``root``.

    Expected files (optionally ``.gz``): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``. Inputs are ``[N, 1, 28, 28]`` scaled
    to [0, 1]; ``normalize=True`` then standardises with the usual data-set mean/std
    (MNIST 0.1307/0.3081, Fashion-MNIST 0.2860/0.3530). ``limit`` keeps the first examples.
    """
    _check_split(split)
    _check_dtype(dtype)
    if flavour not in _MNIST_STATS:
        raise ValueError(f"flavour must be one of {tuple(_MNIST_STATS)}, got {flavour!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{flavour}: data directory {root} does not exist")
    splits = ("train", "test") if split == "all" else (split,)
    expected = [f for s in ("train", "test") for f in MNIST_FILES[s]]
    xs, ys = [], []
    for s in splits:
        img_name, lbl_name = MNIST_FILES[s]
        images = read_idx(_find(root, img_name, flavour, expected))
        labels = read_idx(_find(root, lbl_name, flavour, expected))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"{flavour} {s}: images of shape {images.shape} and labels of shape {labels.shape} "
                "do not match (expected [N, H, W] and [N])"
            )
        xs.append(images)
        ys.append(labels)
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    xt = torch.as_tensor(x.astype(np.float64) / 255.0).unsqueeze(1)
    if normalize:
        mean, std = _MNIST_STATS[flavour]
        xt = (xt - mean) / std
    return xt.to(dtype), torch.as_tensor(y.astype(np.int64))


def load_fashion_mnist(root: str | os.PathLike, split: str = "train", **kwargs) -> Batch:
    """Fashion-MNIST from IDX files (same file names as MNIST); see :func:`load_mnist`."""
    return load_mnist(root, split, flavour="fashion-mnist", **kwargs)


# --------------------------------------------------------------------------------------- CIFAR-10

CIFAR10_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
_CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
_CIFAR_STD = (0.2470, 0.2435, 0.2616)


def load_cifar10(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    limit: int | None = None,
) -> Batch:
    """CIFAR-10 from the "python version" pickles in ``root`` (or ``root/cifar-10-batches-py``).

    Expected files: ``data_batch_1`` ... ``data_batch_5`` (train) and ``test_batch`` (test), each a
    pickled dict with ``b"data"`` (uint8 ``[n, 3072]``, channel-major 32x32) and ``b"labels"``.
    Inputs are ``[N, 3, 32, 32]`` in [0, 1], standardised per channel when ``normalize``.
    """
    _check_split(split)
    _check_dtype(dtype)
    root = Path(root)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    names = CIFAR10_FILES["train"] + CIFAR10_FILES["test"] if split == "all" else CIFAR10_FILES[split]
    expected = CIFAR10_FILES["train"] + CIFAR10_FILES["test"]
    xs, ys = [], []
    for name in names:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(
                f"CIFAR-10: no {name} in {root}. Expected the python-version pickles "
                f"{', '.join(expected)} (extract cifar-10-python.tar.gz there); nothing is downloaded."
            )
        with open(path, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        if not isinstance(d, dict) or b"data" not in d or (b"labels" not in d and b"fine_labels" not in d):
            raise ValueError(f"{path}: expected a pickled dict with keys b'data' and b'labels'")
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d.get(b"labels", d.get(b"fine_labels")), dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
            raise ValueError(
                f"{path}: data of shape {data.shape} with {len(labels)} labels, expected [n, 3072]"
            )
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
        if limit is not None and sum(len(v) for v in ys) >= limit:
            break
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    xt = torch.as_tensor(x.astype(np.float64) / 255.0)
    if normalize:
        mean = torch.tensor(_CIFAR_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
        std = torch.tensor(_CIFAR_STD, dtype=torch.float64).view(1, 3, 1, 1)
        xt = (xt - mean) / std
    return xt.to(dtype), torch.as_tensor(y)


# ------------------------------------------------------------------------------------ dispatching


def load_dataset(spec: str, split: str = "train", **kwargs) -> Batch:
    """Load a data set from a short spec: ``digits``, ``digits-image``, ``mnist:DIR``,
    ``fashion-mnist:DIR`` or ``cifar10:DIR`` (the command line's ``--data``)."""
    name, _, where = spec.partition(":")
    name = name.lower().replace("_", "-")
    if name in ("digits", "digits-image"):
        return load_digits(split, image=name == "digits-image", **kwargs)
    if not where and name in ("mnist", "fashion-mnist", "fashionmnist", "cifar10", "cifar-10"):
        raise ValueError(f"data spec {spec!r} needs a directory: write {name}:/path/to/files")
    if name == "mnist":
        return load_mnist(where, split, **kwargs)
    if name in ("fashion-mnist", "fashionmnist"):
        return load_fashion_mnist(where, split, **kwargs)
    if name in ("cifar10", "cifar-10"):
        return load_cifar10(where, split, **kwargs)
    raise ValueError(
        f"unknown data spec {spec!r}: use digits, digits-image, mnist:DIR, fashion-mnist:DIR or cifar10:DIR"
    )
