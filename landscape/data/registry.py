"""Short data specs (the command lines' ``--data``) -> ``(inputs, targets)``: :func:`load_dataset`.

* ``digits`` / ``digits-image``: scikit-learn 8x8 digits, ``[N, 64]`` / ``[N, 1, 8, 8]``;
* ``mnist[:DIR]``, ``fashion-mnist[:DIR]``: IDX files;
* ``cifar10[:DIR]``, ``cifar100[:DIR]`` (fine labels), ``cifar100-coarse[:DIR]`` (20 coarse
  labels): python pickles;
* ``cifar10c:[DIR:]CORRUPTION:SEVERITY``: CIFAR-10-C, e.g. ``cifar10c:/data:gaussian_noise:3``
  (split ``test``; :func:`landscape.data.cifar10c.load_cifar10c` takes the three separately);
* ``svhn[:DIR]``: SVHN ``.mat`` files (labels 0..9; splits ``train``, ``test``, ``extra``, ``all``);
* ``boolq[:DIR]``, ``wic[:DIR]``, ``rte[:DIR]``: SuperGLUE ``.jsonl`` files tokenised into int64
  ``[N, 3, L]`` inputs (:func:`landscape.data.text.load_superglue`; kwargs ``tokenizer`` (a local
  directory, default ``$SHARPSCAPE_TEXT_MODEL``) and ``max_length`` (128); splits ``train`` and
  ``val``, the test split: SuperGLUE's test labels are hidden);
* image folders, ``DIR/<split>/<class>/<image>`` decoded with Pillow
  (:mod:`landscape.data.image_folder`; splits ``train``, ``val``, ``test``; ``size``, ``resize``,
  ``limit``, ``max_bytes`` ... as kwargs):

  ==========================  ====================  ==========  ================
  spec                        data set              size        resize
  ==========================  ====================  ==========  ================
  ``imagefolder[:DIR]``       any class folders     64          shorter_crop
  ``tinyimagenet[:DIR]``      Tiny ImageNet (also   64          direct
                              its official layout)
  ``imagenet[:DIR]``          ImageNet (ILSVRC-12)  224         shorter_crop
  ``stanford-cars[:DIR]``     Stanford Cars         224         direct
  ``oxford-flowers[:DIR]``    Oxford Flowers 102    224         shorter_crop
  ==========================  ====================  ==========  ================

``DIR`` may be left out when the ``SHARPSCAPE_DATA`` environment variable names the data
directory.
"""

from __future__ import annotations

from landscape.data.cifar import load_cifar10, load_cifar100
from landscape.data.cifar10c import load_cifar10c
from landscape.data.common import Batch, resolve_stats
from landscape.data.digits import load_digits
from landscape.data.image_folder import IMAGE_FOLDER_DATASETS, load_image_folder
from landscape.data.mnist import load_fashion_mnist, load_mnist
from landscape.data.svhn import load_svhn
from landscape.data.text import TEXT_TASKS, load_superglue  # imports transformers only when loading

DATA_SPECS = (
    "digits", "digits-image", "mnist[:DIR]", "fashion-mnist[:DIR]", "cifar10[:DIR]",
    "cifar100[:DIR]", "cifar100-coarse[:DIR]", "cifar10c:[DIR:]CORRUPTION:SEVERITY", "svhn[:DIR]",
    "boolq[:DIR]", "wic[:DIR]", "rte[:DIR]",
    "imagefolder[:DIR]", "tinyimagenet[:DIR]", "imagenet[:DIR]", "stanford-cars[:DIR]",
    "oxford-flowers[:DIR]",
)  # fmt: skip

_ALIASES = {
    "fashionmnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
    "cifar-100-coarse": "cifar100-coarse",
    "cifar-10-c": "cifar10c",
    "image-folder": "imagefolder",
    "tiny-imagenet": "tinyimagenet",
    "tiny-imagenet-200": "tinyimagenet",
    "stanfordcars": "stanford-cars",
    "cars": "stanford-cars",
    "oxfordflowers": "oxford-flowers",
    "flowers102": "oxford-flowers",
    "flowers": "oxford-flowers",
}


def _cifar10c(spec: str, rest: str, split: str, kwargs: dict) -> Batch:
    parts = rest.rsplit(":", 2) if rest else []
    if len(parts) < 2:
        raise ValueError(
            f"data spec {spec!r}: write cifar10c:DIR:CORRUPTION:SEVERITY (or "
            "cifar10c:CORRUPTION:SEVERITY with SHARPSCAPE_DATA set), e.g. cifar10c:/data:gaussian_noise:3"
        )
    where = parts[0] if len(parts) == 3 else None
    corruption, severity = parts[-2], parts[-1]
    try:
        level = int(severity)
    except ValueError:
        raise ValueError(f"data spec {spec!r}: severity {severity!r} is not an int in 1..5") from None
    if split not in ("test", "all"):
        raise ValueError(
            f"data spec {spec!r}: CIFAR-10-C holds only corrupted test images, there is no "
            f"{split!r} split; use split 'test'"
        )
    return load_cifar10c(where, corruption, level, **kwargs)


#: the channel statistics ``normalize=True`` standardises each data set with (its loader's default)
_OWN_STATS = {
    "mnist": "mnist",
    "fashion-mnist": "fashion-mnist",
    "cifar10": "cifar10",
    "cifar10c": "cifar10",
    "cifar100": "cifar100",
    "cifar100-coarse": "cifar100",
    "svhn": "svhn",
}


def _canonical(spec: str) -> str:
    name = spec.partition(":")[0].lower().replace("_", "-")
    return _ALIASES.get(name, name)


def input_stats(
    spec: str, normalize: bool | str | tuple = True
) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The per-channel ``(mean, std)`` that ``load_dataset(spec, normalize=normalize)`` standardised
    its inputs with, for undoing it (black padding, AutoAugment on [0, 1] images); ``None`` for raw
    inputs (``normalize=False``) and for data sets without channel statistics (digits, text).

    Raises:
        ValueError: ``normalize`` names no known statistics.
    """
    name = _canonical(spec)
    own = IMAGE_FOLDER_DATASETS[name].stats if name in IMAGE_FOLDER_DATASETS else _OWN_STATS.get(name)
    if normalize is True and own is None:
        return None
    return resolve_stats(normalize, own or "", None)


def load_dataset(spec: str, split: str = "train", **kwargs) -> Batch:
    """Load a data set from a short spec (table above); ``kwargs`` go to the loader
    (``dtype``, ``normalize``, ``limit``, ...)."""
    if not isinstance(spec, str):
        raise TypeError(
            f"data spec must be a string such as 'digits' or 'mnist:DIR', got {type(spec).__name__}"
        )
    name, _, rest = spec.partition(":")
    name = name.lower().replace("_", "-")
    name = _ALIASES.get(name, name)
    where = rest or None
    if name in ("digits", "digits-image"):
        return load_digits(split, image=name == "digits-image", **kwargs)
    if name == "mnist":
        return load_mnist(where, split, **kwargs)
    if name == "fashion-mnist":
        return load_fashion_mnist(where, split, **kwargs)
    if name == "cifar10":
        return load_cifar10(where, split, **kwargs)
    if name == "cifar100":
        return load_cifar100(where, split, **kwargs)
    if name == "cifar100-coarse":
        return load_cifar100(where, split, "coarse", **kwargs)
    if name == "cifar10c":
        return _cifar10c(spec, rest, split, kwargs)
    if name == "svhn":
        return load_svhn(where, split, **kwargs)
    if name in TEXT_TASKS:
        return load_superglue(name, where, split, **kwargs)
    if name in IMAGE_FOLDER_DATASETS:
        return load_image_folder(where, split, dataset=name, **kwargs)
    raise ValueError(f"unknown data spec {spec!r}: use one of {', '.join(DATA_SPECS)}")
