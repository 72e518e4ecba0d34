"""CIFAR-10-C (Hendrycks & Dietterich 2019, "Benchmarking neural network robustness to common
corruptions and perturbations", ICLR): the CIFAR-10 test set under 19 corruptions x 5 severities.

The distribution (``CIFAR-10-C.tar``) holds one ``<corruption>.npy`` per corruption, a uint8 array
``[50000, 32, 32, 3]`` (HWC): rows ``(s - 1) * 10000 : s * 10000`` are severity ``s`` = 1..5, each
block the 10,000 test images in the same order; and ``labels.npy`` with the 50,000 matching labels
(the test labels repeated five times). The 15 benchmark corruptions are
:data:`CIFAR10C_CORRUPTIONS`; the 4 held-out ones of the paper's validation set are
:data:`CIFAR10C_EXTRA_CORRUPTIONS`.

Files are read with ``numpy.load(..., allow_pickle=False)`` (no code can run) and memory-mapped,
so only the requested severity is copied into memory; shapes, dtypes, label counts and label
ranges are checked. Files with another number of images per severity (``N`` divisible by 5) are
accepted, so subsets written in the same format work too.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import SOURCES, Batch, to_inputs
from landscape.data.loading import prepare

CIFAR10C_CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise",
    "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
    "snow", "frost", "fog", "brightness",
    "contrast", "elastic_transform", "pixelate", "jpeg_compression",
)  # fmt: skip
CIFAR10C_EXTRA_CORRUPTIONS: tuple[str, ...] = ("speckle_noise", "gaussian_blur", "spatter", "saturate")
CIFAR10C_ALL_CORRUPTIONS = CIFAR10C_CORRUPTIONS + CIFAR10C_EXTRA_CORRUPTIONS
CIFAR10C_SEVERITIES = (1, 2, 3, 4, 5)
_SUBDIRS = ("CIFAR-10-C", "cifar-10-c", "cifar10c")
_FORMAT = (
    "expected <corruption>.npy: uint8 [N, 32, 32, 3] with N = 5 severities x images per severity "
    "(50,000 = 5 x 10,000 in the distribution), and labels.npy: N integer labels in 0..9"
)


def check_corruption(corruption: str) -> str:
    """``corruption`` if it is one of the 19 names, else a ``ValueError`` listing them."""
    if not isinstance(corruption, str) or corruption not in CIFAR10C_ALL_CORRUPTIONS:
        close = difflib.get_close_matches(str(corruption), CIFAR10C_ALL_CORRUPTIONS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(
            f"unknown CIFAR-10-C corruption {corruption!r}; {hint}choose one of "
            f"{', '.join(CIFAR10C_ALL_CORRUPTIONS)}"
        )
    return corruption


def check_severity(severity: int) -> int:
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"CIFAR-10-C severity must be an int in 1..5, got {severity!r}")
    return int(severity)


def _load_npy(path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(
            f"CIFAR-10-C: no {path.name} in {path.parent}. Expected one <corruption>.npy per "
            f"corruption and labels.npy, in the directory or in one of its sub-directories "
            f"{', '.join(_SUBDIRS)}; nothing is downloaded: get CIFAR-10-C.tar from "
            f"{SOURCES['CIFAR-10-C']} and extract it there."
        )
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(
            f"{path}: not a readable .npy array ({type(exc).__name__}: {exc}); {_FORMAT}; the file "
            "is truncated or corrupt: extract it again"
        ) from None


def load_cifar10c(
    root: str | os.PathLike | None,
    corruption: str,
    severity: int,
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
) -> Batch:
    """The CIFAR-10 test images under ``corruption`` at ``severity`` (1..5) from ``root``
    (default ``$SHARPSCAPE_DATA``, or its sub-directory ``CIFAR-10-C``).

    Inputs are ``[n, 3, 32, 32]`` in [0, 1] (channel-major like :func:`load_cifar10`),
    standardised with the CIFAR-10 training statistics when ``normalize`` is True (the network
    under test was trained on CIFAR-10); labels int64 in 0..9. ``limit`` keeps the first images of
    the severity block.

    Raises:
        ValueError: unknown corruption, severity outside 1..5, or files of the wrong
            shape/dtype, label count or label range (the message names the file).
        FileNotFoundError: the directory or a file is missing.
    """
    check_corruption(corruption)
    severity = check_severity(severity)
    base, stats = prepare(
        root, "CIFAR-10-C", dtype=dtype, limit=limit, normalize=normalize, stats="cifar10", channels=3,
        subdirs=_SUBDIRS, probes=("labels.npy", f"{corruption}.npy"),
    )  # fmt: skip
    images = _load_npy(base / f"{corruption}.npy")
    labels = _load_npy(base / "labels.npy")
    path, lpath = base / f"{corruption}.npy", base / "labels.npy"
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ValueError(
            f"{path}: expected uint8 images of shape [N, 32, 32, 3], got {images.dtype} of shape "
            f"{images.shape}; {_FORMAT}"
        )
    n = images.shape[0]
    if n == 0 or n % 5:
        raise ValueError(
            f"{path}: {n} images cannot be split into 5 severity blocks of equal size; {_FORMAT}"
        )
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise ValueError(
            f"{lpath}: expected integer labels of shape [N], got {labels.dtype} of shape "
            f"{labels.shape}; {_FORMAT}"
        )
    if len(labels) != n:
        raise ValueError(
            f"CIFAR-10-C: {path.name} holds {n} images but {lpath.name} holds {len(labels)} labels; "
            "the files do not belong together (both should come from the same CIFAR-10-C.tar)"
        )
    per = n // 5
    start = (severity - 1) * per
    stop = start + (per if limit is None else min(per, limit))
    y = np.array(labels[start:stop], dtype=np.int64)
    if y.size and (int(y.min()) < 0 or int(y.max()) > 9):
        bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
        raise ValueError(f"{lpath}: label {bad} outside the 10 classes 0..9")
    x = np.ascontiguousarray(np.asarray(images[start:stop]).transpose(0, 3, 1, 2))
    return to_inputs(x, stats, dtype), torch.as_tensor(y)
