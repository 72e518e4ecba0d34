"""Data sets to run on out of the box, from a local directory (nothing is downloaded).

One module per source; this module gathers them:

* :mod:`~landscape.data.digits`: scikit-learn 8x8 digits (embedded, the default);
* :mod:`~landscape.data.mnist`: MNIST / Fashion-MNIST IDX files;
* :mod:`~landscape.data.cifar`: CIFAR-10 / CIFAR-100 python pickles (restricted unpickler);
* :mod:`~landscape.data.cifar10c`: CIFAR-10-C ``.npy`` files (19 corruptions x 5 severities);
* :mod:`~landscape.data.svhn`: SVHN ``.mat`` files (out-of-distribution digits);
* :mod:`~landscape.data.registry`: :func:`load_dataset` for the short specs of the command lines.

The directory is given once: ``root=`` / ``NAME:DIR`` or the ``SHARPSCAPE_DATA`` environment
variable (:mod:`landscape.data.common`). Files are untrusted input: every loader checks what it
read (magic numbers, sizes, dtypes, shapes, label ranges), so a truncated, corrupt or foreign file
raises a ``ValueError`` naming the file, what is wrong and the expected format; a missing file
raises a ``FileNotFoundError`` naming the expected files and where to get them.

Every loader returns ``(inputs, targets)`` tensors: floating inputs of the requested ``dtype`` and
``int64`` class labels.
"""

from __future__ import annotations

from landscape.data.cifar import CIFAR10_FILES, CIFAR100_FILES, load_cifar10, load_cifar100
from landscape.data.cifar10c import (
    CIFAR10C_ALL_CORRUPTIONS,
    CIFAR10C_CORRUPTIONS,
    CIFAR10C_EXTRA_CORRUPTIONS,
    load_cifar10c,
)
from landscape.data.common import CHANNEL_STATS, DATA_ENV, Batch
from landscape.data.digits import load_digits
from landscape.data.mnist import MNIST_FILES, load_fashion_mnist, load_mnist, read_idx
from landscape.data.registry import DATA_SPECS, input_stats, load_dataset
from landscape.data.svhn import SVHN_FILES, load_svhn

__all__ = [
    "CHANNEL_STATS",
    "CIFAR100_FILES",
    "CIFAR10C_ALL_CORRUPTIONS",
    "CIFAR10C_CORRUPTIONS",
    "CIFAR10C_EXTRA_CORRUPTIONS",
    "CIFAR10_FILES",
    "DATA_ENV",
    "DATA_SPECS",
    "MNIST_FILES",
    "SVHN_FILES",
    "Batch",
    "load_cifar10",
    "load_cifar100",
    "load_cifar10c",
    "input_stats",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_mnist",
    "load_svhn",
    "read_idx",
]
