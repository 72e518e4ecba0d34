"""MNIST / Fashion-MNIST from LeCun's IDX files (optionally gzip-compressed), read and checked."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import SOURCES, Batch, to_inputs
from landscape.data.loading import prepare, read_parts

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


# flavour -> (name in messages, sub-directories searched below the data directory)
_FLAVOURS = {
    "mnist": ("MNIST", ("MNIST/raw", "MNIST", "mnist", "raw")),
    "fashion-mnist": ("Fashion-MNIST", ("FashionMNIST/raw", "FashionMNIST", "fashion-mnist", "raw")),
}


def _find(root: Path, stem: str, what: str, expected: Sequence[str]) -> Path:
    for cand in (root / stem, root / f"{stem}.gz"):
        if cand.is_file():
            return cand
    raise FileNotFoundError(
        f"{what}: no {stem}[.gz] in {root}. Expected the files {', '.join(expected)} (each "
        f"optionally gzip-compressed) in the directory or in one of its sub-directories "
        f"{', '.join(_FLAVOURS[what.lower()][1])}; nothing is downloaded automatically: get them "
        f"from {SOURCES[what]}."
    )


def _mnist_split(root: Path, split: str, flavour: str) -> tuple[np.ndarray, np.ndarray]:
    what = _FLAVOURS[flavour][0]
    expected = [f for s in ("train", "test") for f in MNIST_FILES[s]]
    img_path, lbl_path = (_find(root, name, what, expected) for name in MNIST_FILES[split])
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
    root: str | os.PathLike | None = None,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
    flavour: str = "mnist",
) -> Batch:
    """MNIST (LeCun et al. 1998), or Fashion-MNIST (Xiao et al. 2017) with
    ``flavour="fashion-mnist"``, from IDX files in ``root`` (default ``$SHARPSCAPE_DATA``).

    Expected files (optionally ``.gz``): ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``, in ``root`` or in one of its
    sub-directories ``MNIST/raw``, ``MNIST``, ``mnist``, ``raw`` (Fashion-MNIST:
    ``FashionMNIST/raw``, ``FashionMNIST``, ``fashion-mnist``, ``raw``). Inputs are
    ``[N, 1, 28, 28]`` scaled to [0, 1]; ``normalize=True`` then standardises with the usual
    data-set mean/std (MNIST 0.1307/0.3081, Fashion-MNIST 0.2860/0.3530; see
    :mod:`landscape.data.common` for the other forms of ``normalize``). ``limit`` keeps the first
    examples.
    """
    if flavour not in _FLAVOURS:
        raise ValueError(f"flavour must be one of {tuple(_FLAVOURS)}, got {flavour!r}")
    what, subdirs = _FLAVOURS[flavour]
    probes = [f + gz for f in MNIST_FILES["train"] + MNIST_FILES["test"] for gz in ("", ".gz")]
    base, stats = prepare(
        root, what, split=split, dtype=dtype, limit=limit, normalize=normalize, stats=flavour,
        channels=1, subdirs=subdirs, probes=probes,
    )  # fmt: skip
    splits = ("train", "test") if split == "all" else (split,)
    # every split is read and checked, also when the first one already holds `limit` examples
    x, y = read_parts(lambda s: _mnist_split(base, s, flavour), splits, limit, stop_at_limit=False)
    return to_inputs(x[:, None], stats, dtype), torch.as_tensor(y.astype(np.int64))


def load_fashion_mnist(root: str | os.PathLike | None = None, split: str = "train", **kwargs) -> Batch:
    """Fashion-MNIST from IDX files (same file names as MNIST); see :func:`load_mnist`."""
    return load_mnist(root, split, flavour="fashion-mnist", **kwargs)
