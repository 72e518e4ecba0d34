"""``landscape.data.input_stats``: the channel statistics each loader standardised with, checked by
loading the same files raw and standardised (tiny files in the real formats), and the black padding
and AutoAugment of the runner using them for every image data set."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape.data import input_stats, load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))

import synthetic_files  # noqa: E402

CASES = [
    ("cifar10", synthetic_files.cifar10),
    ("cifar100", synthetic_files.cifar100),
    ("cifar100-coarse", synthetic_files.cifar100),
    ("mnist", synthetic_files.mnist),
    ("fashion-mnist", synthetic_files.mnist),
    ("fashionmnist", synthetic_files.mnist),
    ("tinyimagenet", synthetic_files.tiny_imagenet),
    ("imagefolder", synthetic_files.image_folder),
    ("stanford-cars", synthetic_files.image_folder),
]


@pytest.mark.parametrize("name,writer", CASES, ids=[c[0] for c in CASES])
def test_the_statistics_are_those_the_loader_standardised_with(name, writer, tmp_path):
    root = writer(tmp_path / "d", np.random.default_rng(0))
    kw = {"size": 16} if writer is not synthetic_files.cifar10 and "image" in writer.__name__ else {}
    raw, _ = load_dataset(f"{name}:{root}", "train", normalize=False, **kw)
    std_x, _ = load_dataset(f"{name}:{root}", "train", **kw)
    mean, std = (torch.tensor(v, dtype=raw.dtype).view(-1, 1, 1) for v in input_stats(name))
    raw = raw.view(std_x.shape)
    torch.testing.assert_close(std_x, ((raw - mean) / std).view(std_x.shape), rtol=1e-5, atol=1e-5)


def test_no_statistics_for_raw_inputs_digits_and_text_and_a_clear_error_for_an_unknown_name():
    assert input_stats("cifar10:/x", False) is None
    assert input_stats("digits") is None and input_stats("rte:/x") is None
    assert input_stats("mnist", "cifar10") == input_stats("cifar10")
    assert input_stats("svhn", ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))) == ((0.5,) * 3, (0.25,) * 3)
    with pytest.raises(ValueError, match="names no known statistics"):
        input_stats("cifar10", "places365")


def test_black_padding_on_an_image_folder_is_black(tmp_path):
    """The runner's crop_fill = "black" on Tiny ImageNet (ImageNet statistics) pads with the value a
    black pixel takes after standardisation."""
    from experiments.train import _crop_fill

    cfg = {
        "data": {"name": "tinyimagenet:X", "augmentation": "crop_flip", "crop_fill": "black", "kwargs": {}}
    }
    fill = _crop_fill(cfg, torch.zeros(2, 3, 8, 8))
    mean, std = input_stats("tinyimagenet")
    assert fill == pytest.approx(tuple(-m / s for m, s in zip(mean, std)))
