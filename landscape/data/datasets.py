"""Data sets to run on out of the box: scikit-learn digits (embedded), MNIST / Fashion-MNIST (IDX
files) and CIFAR-10 / CIFAR-100 (python pickles) from a local directory.

Nothing is downloaded: digits ship with scikit-learn; the other loaders read the files their
official distributions contain and name the expected files when they are missing.

Files are untrusted input: CIFAR pickles are read by a restricted unpickler
(:mod:`landscape.data.safe_pickle`) that never imports or calls anything but builtin containers and
numpy array reconstruction, and every loader checks what it read (magic numbers, sizes, dtypes,
shapes, label ranges), so a truncated, corrupt or foreign file raises a ``ValueError`` naming the
file, what is wrong and the expected format.

Every loader returns ``(inputs, targets)`` tensors: floating inputs of the requested ``dtype`` and
``int64`` class labels.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from landscape.data.safe_pickle import safe_load_pickle

Batch = tuple[torch.Tensor, torch.Tensor]

_SPLITS = ("train", "test", "all")


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or a positive int (number of examples to keep), got {limit!r}")


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
_IDX_FORMAT = (
    "expected an IDX file (optionally gzip-compressed): magic number 00 00 <type 08/09/0B/0C/0D/0E> "
    "<ndim>, ndim big-endian int32 sizes, then the data"
)
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 24

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_MNIST_STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}


def _read_upto(fh, n: int) -> bytes:
    """Read at most ``n`` bytes in chunks (a lying header cannot make us allocate ``n`` up front)."""
    parts, left = [], n
    while left > 0:
        chunk = fh.read(min(left, _CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (LeCun's MNIST format), gzip-compressed or not (told apart by content).

    Format: magic number ``0x00 0x00 <type> <ndim>``, then ``ndim`` big-endian int32 sizes, then
    the data in big-endian order (type 0x08 = unsigned byte, 0x09 signed byte, 0x0B int16,
    0x0C int32, 0x0D float32, 0x0E float64).

    Raises:
        ValueError: bad magic number, truncated header or data, trailing bytes, or corrupt gzip
            data; the message names the file and the expected format.
    """
    path = Path(path)
    with open(path, "rb") as probe:
        compressed = probe.read(2) == _GZIP_MAGIC
    fh = gzip.open(path, "rb") if compressed else open(path, "rb")
    try:
        with fh:
            head = _read_upto(fh, 4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES or head[3] == 0:
                shown = head.hex(" ") if head else "an empty file"
                raise ValueError(f"{path} is not an IDX file (bad magic number: {shown}); {_IDX_FORMAT}")
            ndim = head[3]
            sizes = _read_upto(fh, 4 * ndim)
            if len(sizes) < 4 * ndim:
                raise ValueError(
                    f"{path}: truncated IDX header ({ndim} dimensions need {4 * ndim} size bytes, "
                    f"found {len(sizes)}); {_IDX_FORMAT}"
                )
            shape = tuple(int(s) for s in np.frombuffer(sizes, dtype=">i4"))
            if any(s < 0 for s in shape):
                raise ValueError(f"{path}: IDX header has negative sizes {shape}; the file is corrupt")
            dt = np.dtype(_IDX_DTYPES[head[2]])
            nbytes = math.prod(shape) * dt.itemsize
            data = _read_upto(fh, nbytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        if not compressed or isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise ValueError(
            f"{path}: corrupt or truncated gzip data ({type(exc).__name__}: {exc}); {_IDX_FORMAT}; "
            "download the file again"
        ) from None
    if len(data) != nbytes:
        problem = "truncated" if len(data) < nbytes else "has trailing bytes"
        raise ValueError(
            f"{path}: {problem}: the header announces shape {shape} ({nbytes} bytes of data) but "
            f"{'only ' + str(len(data)) if len(data) < nbytes else 'more'} bytes follow; {_IDX_FORMAT}"
        )
    return np.frombuffer(data, dtype=dt).reshape(shape).astype(dt.newbyteorder("="))


def _find(root: Path, stem: str, what: str, expected: Sequence[str]) -> Path:
    for cand in (root / stem, root / f"{stem}.gz", root / "raw" / stem, root / "raw" / f"{stem}.gz"):
        if cand.is_file():
            return cand
    raise FileNotFoundError(
        f"{what}: no {stem}[.gz] in {root} (or {root / 'raw'}). Expected the files "
        f"{', '.join(expected)} (each optionally gzip-compressed, as distributed on the {what} page); "
        "nothing is downloaded automatically."
    )


def _mnist_split(root: Path, split: str, flavour: str) -> tuple[np.ndarray, np.ndarray]:
    expected = [f for s in ("train", "test") for f in MNIST_FILES[s]]
    img_path, lbl_path = (_find(root, name, flavour, expected) for name in MNIST_FILES[split])
    images, labels = read_idx(img_path), read_idx(lbl_path)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{img_path}: expected unsigned-byte {flavour} images of shape [N, 28, 28], got "
            f"{images.dtype} of shape {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{lbl_path}: expected unsigned-byte {flavour} labels of shape [N], got {labels.dtype} "
            f"of shape {labels.shape}"
        )
    if len(images) != len(labels):
        raise ValueError(
            f"{flavour} {split}: {img_path.name} holds {len(images)} images but {lbl_path.name} "
            f"holds {len(labels)} labels; the files do not belong together"
        )
    if labels.size and int(labels.max()) > 9:
        raise ValueError(f"{lbl_path}: label {int(labels.max())} outside the 10 classes 0..9")
    return images, labels


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
    _check_limit(limit)
    if flavour not in _MNIST_STATS:
        raise ValueError(f"flavour must be one of {tuple(_MNIST_STATS)}, got {flavour!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{flavour}: data directory {root} does not exist")
    splits = ("train", "test") if split == "all" else (split,)
    parts = [_mnist_split(root, s, flavour) for s in splits]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
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


# ------------------------------------------------------------------------------ CIFAR-10 / CIFAR-100

CIFAR10_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CIFAR100_FILES = {"train": ("train",), "test": ("test",)}
# per-channel mean / std of the training images (CIFAR-100: as in weiaicunzai/pytorch-cifar100)
_CIFAR_STATS = {
    "CIFAR-10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "CIFAR-100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
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
    root: str | os.PathLike,
    split: str,
    what: str,
    files: dict[str, tuple[str, ...]],
    subdir: str,
    archive: str,
    label_key: bytes,
    num_classes: int,
    dtype: torch.dtype,
    normalize: bool,
    limit: int | None,
) -> Batch:
    _check_split(split)
    _check_dtype(dtype)
    _check_limit(limit)
    root = Path(root)
    if (root / subdir).is_dir():
        root = root / subdir
    names = files["train"] + files["test"] if split == "all" else files[split]
    expected = files["train"] + files["test"]
    xs, ys = [], []
    for name in names:
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(
                f"{what}: no {name} in {root}. Expected the python-version pickles "
                f"{', '.join(expected)} (extract {archive} there); nothing is downloaded."
            )
        x, y = _read_cifar_batch(path, what, label_key, num_classes)
        xs.append(x)
        ys.append(y)
        if limit is not None and sum(len(v) for v in ys) >= limit:
            break
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    xt = torch.as_tensor(x.astype(np.float64) / 255.0)
    if normalize:
        mean, std = _CIFAR_STATS[what]
        xt = (xt - torch.tensor(mean, dtype=torch.float64).view(1, 3, 1, 1)) / torch.tensor(
            std, dtype=torch.float64
        ).view(1, 3, 1, 1)
    return xt.to(dtype), torch.as_tensor(y)


def load_cifar10(
    root: str | os.PathLike,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    limit: int | None = None,
) -> Batch:
    """CIFAR-10 (Krizhevsky 2009) from the "python version" pickles in ``root`` (or
    ``root/cifar-10-batches-py``).

    Expected files: ``data_batch_1`` ... ``data_batch_5`` (train) and ``test_batch`` (test), each a
    pickled dict with ``b"data"`` (uint8 ``[n, 3072]``, channel-major 32x32) and ``b"labels"``
    (``n`` ints in 0..9), read by a restricted unpickler that refuses anything else.
    Inputs are ``[N, 3, 32, 32]`` in [0, 1], standardised per channel when ``normalize``.
    """
    return _load_cifar(
        root, split, "CIFAR-10", CIFAR10_FILES, "cifar-10-batches-py", "cifar-10-python.tar.gz",
        b"labels", 10, dtype, normalize, limit,
    )  # fmt: skip


def load_cifar100(
    root: str | os.PathLike,
    split: str = "train",
    label_mode: str = "fine",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool = True,
    limit: int | None = None,
) -> Batch:
    """CIFAR-100 (Krizhevsky 2009) from the "python version" pickles in ``root`` (or
    ``root/cifar-100-python``).

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


# ------------------------------------------------------------------------------------ dispatching

_NEEDS_DIR = ("mnist", "fashion-mnist", "fashionmnist", "cifar10", "cifar-10", "cifar100", "cifar-100")


def load_dataset(spec: str, split: str = "train", **kwargs) -> Batch:
    """Load a data set from a short spec: ``digits``, ``digits-image``, ``mnist:DIR``,
    ``fashion-mnist:DIR``, ``cifar10:DIR`` or ``cifar100:DIR`` (the command line's ``--data``)."""
    if not isinstance(spec, str):
        raise TypeError(
            f"data spec must be a string such as 'digits' or 'mnist:DIR', got {type(spec).__name__}"
        )
    name, _, where = spec.partition(":")
    name = name.lower().replace("_", "-")
    if name in ("digits", "digits-image"):
        return load_digits(split, image=name == "digits-image", **kwargs)
    if not where and name in _NEEDS_DIR:
        raise ValueError(f"data spec {spec!r} needs a directory: write {name}:/path/to/files")
    if name == "mnist":
        return load_mnist(where, split, **kwargs)
    if name in ("fashion-mnist", "fashionmnist"):
        return load_fashion_mnist(where, split, **kwargs)
    if name in ("cifar10", "cifar-10"):
        return load_cifar10(where, split, **kwargs)
    if name in ("cifar100", "cifar-100"):
        return load_cifar100(where, split, **kwargs)
    raise ValueError(
        f"unknown data spec {spec!r}: use digits, digits-image, mnist:DIR, fashion-mnist:DIR, "
        "cifar10:DIR or cifar100:DIR"
    )
