"""SVHN (Netzer et al. 2011, "Reading digits in natural images with unsupervised feature
learning"), the cropped-digits "format 2", typically the out-of-distribution set for CIFAR-10
networks.

The distribution has ``train_32x32.mat`` (73,257 images), ``test_32x32.mat`` (26,032) and
``extra_32x32.mat`` (531,131), MATLAB v5 files read with :func:`scipy.io.loadmat` (plain arrays
only; nothing is executed). Each holds ``X``: uint8 ``[32, 32, 3, N]`` and ``y``: ``[N, 1]`` labels
1..10, where **10 stands for the digit 0**; the loader maps 10 -> 0, so labels are the digits
0..9.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from landscape.data.common import SOURCES, Batch, to_inputs
from landscape.data.loading import prepare, read_parts

SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat", "extra": "extra_32x32.mat"}
SVHN_SPLITS = ("train", "test", "extra", "all")
_SUBDIRS = ("svhn", "SVHN")
_FORMAT = (
    "expected a MATLAB v5 file with X: uint8 [32, 32, 3, N] and y: N integer labels in 1..10 (10 = digit 0)"
)


def _read_mat(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    try:
        d = loadmat(path, variable_names=("X", "y"))
    except (ValueError, TypeError, OSError, EOFError, NotImplementedError, MatReadError) as exc:
        raise ValueError(
            f"{path}: not a readable SVHN .mat file ({type(exc).__name__}: {exc}); {_FORMAT}; "
            f"download it again from {SOURCES['SVHN']}"
        ) from None
    missing = [k for k in ("X", "y") if k not in d]
    if missing:
        raise ValueError(f"{path}: no variable(s) {missing} in the file; {_FORMAT}")
    x, y = d["X"], d["y"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        got = f"{x.dtype} of shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"{path}: X must be uint8 of shape [32, 32, 3, N], got {got}; {_FORMAT}")
    if not isinstance(y, np.ndarray) or y.dtype.kind not in "iu" or y.size != y.shape[0]:
        got = f"{y.dtype} of shape {y.shape}" if isinstance(y, np.ndarray) else type(y).__name__
        raise ValueError(f"{path}: y must be integer labels of shape [N, 1], got {got}; {_FORMAT}")
    y = y.reshape(-1).astype(np.int64)
    if len(y) != x.shape[3]:
        raise ValueError(f"{path}: X holds {x.shape[3]} images but y holds {len(y)} labels; {_FORMAT}")
    if y.size and (int(y.min()) < 1 or int(y.max()) > 10):
        bad = int(y.min()) if int(y.min()) < 1 else int(y.max())
        raise ValueError(
            f"{path}: label {bad} outside 1..10 (SVHN's format: 1..9 are the digits, 10 the digit 0)"
        )
    return x, y


def load_svhn(
    root: str | os.PathLike | None = None,
    split: str = "train",
    *,
    dtype: torch.dtype = torch.float32,
    normalize: bool | str | tuple = True,
    limit: int | None = None,
) -> Batch:
    """SVHN cropped digits from ``root`` (default ``$SHARPSCAPE_DATA``, or its sub-directory
    ``svhn`` / ``SVHN``).

    Args:
        split: ``"train"``, ``"test"``, ``"extra"`` or ``"all"`` (train + test).
        normalize: ``True`` standardises with SVHN's own training statistics; to feed SVHN as
            out-of-distribution data to a network trained on CIFAR-10, pass ``"cifar10"`` so the
            inputs see the same transform as the training data (see
            :func:`landscape.data.common.resolve_stats`).
        limit: keep the first examples.

    Returns:
        ``(X, y)``: ``[N, 3, 32, 32]`` inputs, int64 labels 0..9 (the file's 10 mapped to 0).
    """
    base, stats = prepare(
        root, "SVHN", split=split, splits=SVHN_SPLITS, dtype=dtype, limit=limit, normalize=normalize,
        stats="svhn", channels=3, subdirs=_SUBDIRS, probes=tuple(SVHN_FILES.values()),
    )  # fmt: skip

    def read(name: str) -> tuple[np.ndarray, np.ndarray]:
        path = base / SVHN_FILES[name]
        if not path.is_file():
            raise FileNotFoundError(
                f"SVHN: no {path.name} in {base}. Expected train_32x32.mat and test_32x32.mat (and "
                f"extra_32x32.mat for split='extra') in the directory or in one of its "
                f"sub-directories {', '.join(_SUBDIRS)}; nothing is downloaded: get them from "
                f"{SOURCES['SVHN']}."
            )
        x, y = _read_mat(path)
        return x.transpose(3, 2, 0, 1), y

    x, y = read_parts(read, ("train", "test") if split == "all" else (split,), limit)
    y = np.where(y == 10, 0, y)
    return to_inputs(np.ascontiguousarray(x), stats, dtype), torch.as_tensor(y)
