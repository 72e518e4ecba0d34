"""What every file-based loader shares: argument checks, the data directory, per-channel statistics.

Data directory: every loader takes ``root`` (a directory); ``root=None`` falls back to the
``SHARPSCAPE_DATA`` environment variable, so the directory can be given once for a whole run.
Below that directory each data set is looked for in the directory itself and in its usual
sub-directories (``cifar-10-batches-py``, ``MNIST/raw``, ``CIFAR-10-C``, ``svhn``, ...).

Per-channel statistics (mean, standard deviation of the [0, 1]-scaled pixels over all pixels of
the training images), used by ``normalize=True``:

* MNIST 0.1307 / 0.3081 and Fashion-MNIST 0.2860 / 0.3530 (the training sets' values that PyTorch
  examples use);
* CIFAR-10 mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616) and CIFAR-100 mean
  (0.5071, 0.4865, 0.4409), std (0.2673, 0.2564, 0.2762): the mean and population standard
  deviation over the 50,000 training images x 1,024 pixels per channel. (The often-copied CIFAR-10
  std (0.2023, 0.1994, 0.2010) is the average of per-image standard deviations, a different
  quantity.) CIFAR-10-C is the CIFAR-10 test set corrupted, so it uses the CIFAR-10 values;
* SVHN mean (0.4377, 0.4438, 0.4728), std (0.1980, 0.2010, 0.1970) over ``train_32x32.mat``;
* ImageNet mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225): the values torchvision's
  pretrained ImageNet models expect (its ``transforms.Normalize`` examples), used by every
  image-folder data set (:mod:`landscape.data.image_folder`).

:func:`landscape.data.transforms.channel_stats` recomputes such values from any tensor of images.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

Batch = tuple[torch.Tensor, torch.Tensor]

DATA_ENV = "SHARPSCAPE_DATA"
SPLITS = ("train", "test", "all")

CHANNEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "svhn": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}

# where the files come from (named in the messages about missing files)
SOURCES = {
    "MNIST": "http://yann.lecun.com/exdb/mnist/ (mirror: https://ossci-datasets.s3.amazonaws.com/mnist/)",
    "Fashion-MNIST": "https://github.com/zalandoresearch/fashion-mnist (data/fashion)",
    "CIFAR-10": "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-10-python.tar.gz)",
    "CIFAR-100": "https://www.cs.toronto.edu/~kriz/cifar.html (cifar-100-python.tar.gz)",
    "CIFAR-10-C": "https://zenodo.org/records/2535967 (CIFAR-10-C.tar, Hendrycks & Dietterich 2019)",
    "SVHN": "http://ufldl.stanford.edu/housenumbers/ (format 2: train_32x32.mat, test_32x32.mat)",
    "Tiny ImageNet": "http://cs231n.stanford.edu/tiny-imagenet-200.zip (extract; the layout is read as is)",
    "ImageNet": "https://image-net.org (ILSVRC2012 train and val, val/ sorted into class folders)",
    "Stanford Cars": "https://ai.stanford.edu/~jkrause/cars/car_dataset.html (sorted into class folders)",
    "Oxford Flowers": "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ (sorted into class folders)",
    "image folder": "your own files laid out as DIR/train/<class>/<image>, DIR/test/<class>/<image>",
}


def check_split(split: str, allowed: Sequence[str] = SPLITS) -> None:
    if split not in allowed:
        raise ValueError(f"split must be one of {tuple(allowed)}, got {split!r}")


def check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype (e.g. torch.float32), got {dtype!r}")


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or a positive int (number of examples to keep), got {limit!r}")


def data_root(root: str | os.PathLike | None, what: str) -> Path:
    """The data directory: ``root``, else ``$SHARPSCAPE_DATA``; it must exist.

    Raises:
        ValueError: neither is given.
        FileNotFoundError: the directory does not exist.
    """
    source = ""
    if root is None or (isinstance(root, str) and not root):
        env = os.environ.get(DATA_ENV, "")
        if not env:
            raise ValueError(
                f"{what} needs a directory: pass root=/path/to/files (data spec NAME:/path/to/files) "
                f"or set the {DATA_ENV} environment variable to the directory holding the data sets"
            )
        root, source = env, f" (from {DATA_ENV})"
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"{what}: root must be a path (str or os.PathLike), got {type(root).__name__}")
    path = Path(root).expanduser()
    if not path.is_dir():
        problem = "is a file, not a directory" if path.exists() else "does not exist"
        raise FileNotFoundError(
            f"{what}: data directory {path}{source} {problem}; nothing is downloaded: get the "
            f"files from {SOURCES.get(what, 'the data set page')} and point root there"
        )
    return path


def locate(root: Path, subdirs: Sequence[str], probes: Sequence[str]) -> Path:
    """The first of ``root`` and ``root/<subdir>`` that holds one of the files ``probes``
    (``root`` itself when none does, so that the missing-file message names it)."""
    for cand in (root, *(root / s for s in subdirs)):
        if any((cand / p).is_file() for p in probes):
            return cand
    return root


def resolve_stats(
    normalize: bool | str | tuple[Sequence[float], Sequence[float]], default: str, channels: int | None
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``normalize`` -> ``(mean, std)`` per channel or ``None``.

    ``True``: the data set's own statistics (``default``); ``False``: none; a name of
    :data:`CHANNEL_STATS` (e.g. ``"cifar10"`` to feed SVHN to a CIFAR-10 network); or an explicit
    ``(mean, std)`` pair with one value per channel (``channels``; ``None`` checks no count).
    """
    if normalize is False or normalize is None:
        return None
    if normalize is True:
        mean, std = CHANNEL_STATS[default]
    elif isinstance(normalize, str):
        key = normalize.lower().replace("_", "-").replace("cifar-", "cifar")
        if key not in CHANNEL_STATS:
            raise ValueError(
                f"normalize={normalize!r} names no known statistics; use True, False, one of "
                f"{sorted(CHANNEL_STATS)} or a (mean, std) pair"
            )
        mean, std = CHANNEL_STATS[key]
    elif isinstance(normalize, (tuple, list)) and len(normalize) == 2:
        mean, std = (tuple(float(v) for v in part) for part in normalize)
    else:
        raise TypeError(
            f"normalize must be a bool, a statistics name or a (mean, std) pair, got {normalize!r}"
        )
    if channels is not None and (len(mean) != channels or len(std) != channels):
        raise ValueError(
            f"normalize: {len(mean)} means and {len(std)} stds for images with {channels} channels"
        )
    if any(not s > 0 for s in std):
        raise ValueError(f"normalize: standard deviations must be positive, got {std}")
    return tuple(mean), tuple(std)


def to_inputs(
    images_u8, stats: tuple[tuple[float, ...], tuple[float, ...]] | None, dtype: torch.dtype
) -> torch.Tensor:
    """uint8 images ``[N, C, H, W]`` -> ``dtype`` tensor in [0, 1], standardised per channel by
    ``stats`` (computed in float64, then cast)."""
    x = torch.as_tensor(images_u8).to(torch.float64) / 255.0
    if stats is not None:
        mean, std = (torch.tensor(v, dtype=torch.float64).view(1, -1, 1, 1) for v in stats)
        x = (x - mean) / std
    return x.to(dtype)
