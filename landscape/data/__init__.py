"""Data sets and batching.

* ``datasets``: scikit-learn digits (embedded), MNIST / Fashion-MNIST (IDX files) and CIFAR-10
  (python pickles, read by a restricted unpickler) from a local directory; :func:`load_dataset`
  parses the ``digits`` / ``mnist:DIR`` / ... specs of the command lines;
* ``batching``: fixed-size batches, DataLoaders and iteration over any accepted data form.
"""

from landscape.data.batching import batches, iterate, make_loader
from landscape.data.datasets import (
    CIFAR10_FILES,
    MNIST_FILES,
    load_cifar10,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    read_idx,
)

__all__ = [
    "CIFAR10_FILES",
    "MNIST_FILES",
    "batches",
    "iterate",
    "load_cifar10",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_mnist",
    "make_loader",
    "read_idx",
]
