"""Data sets, transforms, label noise and batching.

* ``datasets``: scikit-learn digits (embedded), MNIST / Fashion-MNIST (IDX files), CIFAR-10 /
  CIFAR-100 (python pickles, read by a restricted unpickler), CIFAR-10-C (``.npy``) and SVHN
  (``.mat``) from a local directory (``root=`` or ``$SHARPSCAPE_DATA``); :func:`load_dataset`
  parses the ``digits`` / ``mnist:DIR`` / ``cifar10c:DIR:gaussian_noise:3`` ... specs of the
  command lines;
* ``image_folder``: class-folder image trees (ImageNet, Tiny ImageNet, Stanford Cars, Oxford
  Flowers, ``imagefolder:DIR``) decoded safely with Pillow: :func:`load_image_folder`,
  :func:`image_folder_index` (the class list);
* ``transforms``: random crop with padding + horizontal flip on batched tensors (seeded
  ``torch.Generator``), Cutout, per-channel normalisation (published or computed statistics);
* ``autoaugment``: the AutoAugment policies (Cubuk et al. 2019) per image on a batch;
* ``label_noise``: seeded symmetric / asymmetric label noise returning the noisy labels and the
  mask of the flipped ones (:class:`NoisyLabels`, saved like any result);
* ``batching``: fixed-size batches, DataLoaders and iteration over any accepted data form.
"""

from landscape.data.autoaugment import AutoAugment, autoaugment
from landscape.data.batching import batches, iterate, make_loader
from landscape.data.datasets import (
    CHANNEL_STATS,
    CIFAR10_FILES,
    CIFAR10C_ALL_CORRUPTIONS,
    CIFAR10C_CORRUPTIONS,
    CIFAR10C_EXTRA_CORRUPTIONS,
    CIFAR100_FILES,
    DATA_ENV,
    DATA_SPECS,
    MNIST_FILES,
    SVHN_FILES,
    input_stats,
    load_cifar10,
    load_cifar10c,
    load_cifar100,
    load_dataset,
    load_digits,
    load_fashion_mnist,
    load_mnist,
    load_svhn,
    read_idx,
)
from landscape.data.image_folder import IMAGE_FOLDER_DATASETS, image_folder_index, load_image_folder
from landscape.data.label_noise import (
    CIFAR10_ASYMMETRIC,
    CIFAR10_CLASSES,
    NoisyLabels,
    asymmetric_label_noise,
    symmetric_label_noise,
)
from landscape.data.transforms import (
    RandomCropFlip,
    black_fill,
    channel_stats,
    normalize,
    random_crop,
    random_crop_flip,
    random_cutout,
    random_hflip,
)

__all__ = [
    "AutoAugment",
    "autoaugment",
    "random_cutout",
    "CHANNEL_STATS",
    "CIFAR100_FILES",
    "CIFAR10_ASYMMETRIC",
    "CIFAR10_CLASSES",
    "CIFAR10C_ALL_CORRUPTIONS",
    "CIFAR10C_CORRUPTIONS",
    "CIFAR10C_EXTRA_CORRUPTIONS",
    "CIFAR10_FILES",
    "DATA_ENV",
    "DATA_SPECS",
    "IMAGE_FOLDER_DATASETS",
    "MNIST_FILES",
    "NoisyLabels",
    "RandomCropFlip",
    "SVHN_FILES",
    "asymmetric_label_noise",
    "batches",
    "black_fill",
    "channel_stats",
    "image_folder_index",
    "iterate",
    "load_cifar10",
    "load_cifar100",
    "load_cifar10c",
    "input_stats",
    "load_dataset",
    "load_digits",
    "load_fashion_mnist",
    "load_image_folder",
    "load_mnist",
    "load_svhn",
    "make_loader",
    "normalize",
    "random_crop",
    "random_crop_flip",
    "random_hflip",
    "read_idx",
    "symmetric_label_noise",
]
