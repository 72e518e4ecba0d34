"""AutoAugment and Cutout (landscape.data.autoaugment, landscape.data.random_cutout) and their
place in the runner's training path (data.autoaugment, data.cutout)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from experiments.config import ConfigError, resolve_config
from experiments.run_identity import fingerprint
from landscape.data import CHANNEL_STATS, random_cutout
from landscape.data.autoaugment import (
    OPERATIONS,
    POLICIES,
    AutoAugment,
    apply_operation,
    autoaugment,
    standardised_autoaugment,
)

# ------------------------------------------------------------------------ the published tables
# Cubuk et al. 2019, appendix: sub-policies "(operation, probability, magnitude)"; the magnitudes
# of AutoContrast / Equalize / Invert play no part (written None), as in torchvision and kornia.
PAPER_CIFAR10 = """
Invert 0.1 - Contrast 0.2 6 | Rotate 0.7 2 TranslateX 0.3 9 | Sharpness 0.8 1 Sharpness 0.9 3 |
ShearY 0.5 8 TranslateY 0.7 9 | AutoContrast 0.5 - Equalize 0.9 - | ShearY 0.2 7 Posterize 0.3 7 |
Color 0.4 3 Brightness 0.6 7 | Sharpness 0.3 9 Brightness 0.7 9 | Equalize 0.6 - Equalize 0.5 - |
Contrast 0.6 7 Sharpness 0.6 5 | Color 0.7 7 TranslateX 0.5 8 | Equalize 0.3 - AutoContrast 0.4 - |
TranslateY 0.4 3 Sharpness 0.2 6 | Brightness 0.9 6 Color 0.2 8 | Solarize 0.5 2 Invert 0.0 - |
Equalize 0.2 - AutoContrast 0.6 - | Equalize 0.2 - Equalize 0.6 - | Color 0.9 9 Equalize 0.6 - |
AutoContrast 0.8 - Solarize 0.2 8 | Brightness 0.1 3 Color 0.7 0 | Solarize 0.4 5 AutoContrast 0.9 - |
TranslateY 0.9 9 TranslateY 0.7 9 | AutoContrast 0.9 - Solarize 0.8 3 | Equalize 0.8 - Invert 0.1 - |
TranslateY 0.7 9 AutoContrast 0.9 -
"""
PAPER_IMAGENET = """
Posterize 0.4 8 Rotate 0.6 9 | Solarize 0.6 5 AutoContrast 0.6 - | Equalize 0.8 - Equalize 0.6 - |
Posterize 0.6 7 Posterize 0.6 6 | Equalize 0.4 - Solarize 0.2 4 | Equalize 0.4 - Rotate 0.8 8 |
Solarize 0.6 3 Equalize 0.6 - | Posterize 0.8 5 Equalize 1.0 - | Rotate 0.2 3 Solarize 0.6 8 |
Equalize 0.6 - Posterize 0.4 6 | Rotate 0.8 8 Color 0.4 0 | Rotate 0.4 9 Equalize 0.6 - |
Equalize 0.0 - Equalize 0.8 - | Invert 0.6 - Equalize 1.0 - | Color 0.6 4 Contrast 1.0 8 |
Rotate 0.8 8 Color 1.0 2 | Color 0.8 8 Solarize 0.8 7 | Sharpness 0.4 7 Invert 0.6 - |
ShearX 0.6 5 Equalize 1.0 - | Color 0.4 0 Equalize 0.6 - | Equalize 0.4 - Solarize 0.2 4 |
Solarize 0.6 5 AutoContrast 0.6 - | Invert 0.6 - Equalize 1.0 - | Color 0.6 4 Contrast 1.0 8 |
Equalize 0.8 - Equalize 0.6 -
"""
PAPER_SVHN = """
ShearX 0.9 4 Invert 0.2 - | ShearY 0.9 8 Invert 0.7 - | Equalize 0.6 - Solarize 0.6 6 |
Invert 0.9 - Equalize 0.6 - | Equalize 0.6 - Rotate 0.9 3 | ShearX 0.9 4 AutoContrast 0.8 - |
ShearY 0.9 8 Invert 0.4 - | ShearY 0.9 5 Solarize 0.2 6 | Invert 0.9 - AutoContrast 0.8 - |
Equalize 0.6 - Rotate 0.9 3 | ShearX 0.9 4 Solarize 0.3 3 | ShearY 0.8 8 Invert 0.7 - |
Equalize 0.9 - TranslateY 0.6 6 | Invert 0.9 - Equalize 0.6 - | Contrast 0.3 3 Rotate 0.8 4 |
Invert 0.8 - TranslateY 0.0 2 | ShearY 0.7 6 Solarize 0.4 8 | Invert 0.6 - Rotate 0.8 4 |
ShearY 0.3 7 TranslateX 0.9 3 | ShearX 0.1 6 Invert 0.6 - | Solarize 0.7 2 TranslateY 0.6 7 |
ShearY 0.8 4 Invert 0.8 - | ShearX 0.7 9 TranslateY 0.8 3 | ShearY 0.8 5 AutoContrast 0.7 - |
ShearX 0.7 2 Invert 0.1 -
"""


def _parse(text: str) -> tuple:
    subs = []
    for chunk in " ".join(text.split()).split("|"):
        t = chunk.split()
        assert len(t) == 6, chunk
        subs.append(
            tuple((t[j], float(t[j + 1]), None if t[j + 2] == "-" else int(t[j + 2])) for j in (0, 3))
        )
    return tuple(subs)


@pytest.mark.parametrize(
    ("policy", "text"), [("cifar10", PAPER_CIFAR10), ("imagenet", PAPER_IMAGENET), ("svhn", PAPER_SVHN)]
)
def test_policy_tables_equal_the_published_ones(policy, text):
    paper = _parse(text)
    assert len(paper) == 25
    assert POLICIES[policy] == paper
    used = {op for sub in paper for op, _, _ in sub}
    assert used <= set(OPERATIONS)


def test_all_14_operations_appear_in_the_published_policies():
    used = {op for table in POLICIES.values() for sub in table for op, _, _ in sub}
    assert used == set(OPERATIONS) and len(OPERATIONS) == 14


# ------------------------------------------------------------------------ each operation vs PIL
P = 10  # the authors' PARAMETER_MAX (tensorflow/models research/autoaugment)


def _image(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # a smooth gradient plus noise, not spanning all of 0..255 (so AutoContrast has work)
    yy, xx = np.mgrid[0:32, 0:32]
    base = 40 + 3 * xx[..., None] + 2 * yy[..., None] + np.array([0, 20, 40])
    return np.clip(base + rng.integers(-30, 30, (32, 32, 3)), 0, 255).astype(np.uint8)


def _ours(img: np.ndarray, name: str, level: int, sign: float = 1.0) -> np.ndarray:
    v = torch.tensor(img).permute(2, 0, 1)[None].to(torch.float32)
    return apply_operation(v, name, level, sign)[0].permute(1, 2, 0).numpy()


def _pil_reference(pil: Image.Image, name: str, level: int, sign: int) -> Image.Image:
    """The authors' ``augmentation_transforms.py`` operations, written out with PIL."""
    f = level * 1.8 / P + 0.1
    table = {
        "Invert": lambda: ImageOps.invert(pil),
        "AutoContrast": lambda: ImageOps.autocontrast(pil),
        "Equalize": lambda: ImageOps.equalize(pil),
        "Solarize": lambda: ImageOps.solarize(pil, 256 - int(level * 256 / P)),
        "Posterize": lambda: ImageOps.posterize(pil, 4 - int(level * 4 / P)),
        "Brightness": lambda: ImageEnhance.Brightness(pil).enhance(f),
        "Color": lambda: ImageEnhance.Color(pil).enhance(f),
        "Contrast": lambda: ImageEnhance.Contrast(pil).enhance(f),
        "Sharpness": lambda: ImageEnhance.Sharpness(pil).enhance(f),
        "ShearX": lambda: pil.transform((32, 32), Image.AFFINE, (1, sign * level * 0.3 / P, 0, 0, 1, 0)),
        "ShearY": lambda: pil.transform((32, 32), Image.AFFINE, (1, 0, 0, sign * level * 0.3 / P, 1, 0)),
        "TranslateX": lambda: pil.transform(
            (32, 32), Image.AFFINE, (1, 0, sign * int(level * 10 / P), 0, 1, 0)
        ),
        "TranslateY": lambda: pil.transform(
            (32, 32), Image.AFFINE, (1, 0, 0, 0, 1, sign * int(level * 10 / P))
        ),
        "Rotate": lambda: pil.rotate(sign * int(level * 30 / P)),
    }
    return table[name]()


EXACT = ("Invert", "AutoContrast", "Equalize", "Solarize", "Posterize")
GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
BLENDS = ("Brightness", "Color", "Contrast", "Sharpness")


@pytest.mark.parametrize("name", EXACT + GEOMETRIC + BLENDS)
@pytest.mark.parametrize(("level", "sign"), [(2, 1), (5, -1), (9, 1)])
def test_operation_matches_pil(name, level, sign):
    img = _image(level)
    ours = _ours(img, name, level, float(sign))
    ref = np.asarray(_pil_reference(Image.fromarray(img), name, level, sign)).astype(np.float32)
    diff = np.abs(ours - ref)
    if name in BLENDS:  # PIL rounds its float32 products itself: at most one level, rarely
        assert diff.max() <= 1 and (diff > 0).mean() < 0.02
    else:
        assert diff.max() == 0
    if name not in ("Invert",) and level == 9:
        assert np.abs(ref - img).max() > 0  # the reference did change the image


def test_operation_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown AutoAugment operation 'Cutout'"):
        apply_operation(torch.zeros(1, 3, 4, 4), "Cutout", 1)
    with pytest.raises(ValueError, match="unknown AutoAugment policy 'cifar100'"):
        autoaugment(torch.zeros(1, 3, 4, 4), "cifar100")


# ------------------------------------------------------------------------ the policy on a batch
def test_autoaugment_per_image_matches_applying_its_subpolicy_by_hand():
    """Replay the generator's draws (sub-policy, coins, signs) and apply the operations one image
    at a time with PIL: the batch result must agree."""
    n = 24
    imgs = np.stack([_image(s) for s in range(n)])
    x = torch.tensor(imgs).permute(0, 3, 1, 2).float() / 255.0
    out = autoaugment(x, "cifar10", generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    sub = torch.randint(0, 25, (n,), generator=g)
    coins = torch.rand(n, 2, generator=g, dtype=torch.float64)
    signs = torch.rand(n, 2, generator=g)
    distinct = set()
    for i in range(n):
        pil = Image.fromarray(imgs[i])
        for slot in range(2):
            name, prob, level = PAPER_TABLE_CIFAR10[int(sub[i])][slot]
            if coins[i, slot] < prob:
                sign = -1 if signs[i, slot] > 0.5 else 1
                pil = _pil_reference(pil, name, level or 0, sign)
        ref = np.asarray(pil).astype(np.float32)
        ours = (out[i].permute(1, 2, 0) * 255).round().numpy()
        assert np.abs(ours - ref).max() <= 2 and (np.abs(ours - ref) > 0).mean() < 0.05
        distinct.add(int(sub[i]))
    assert len(distinct) > 10  # one sub-policy per image, not one per batch


PAPER_TABLE_CIFAR10 = _parse(PAPER_CIFAR10)


def test_generator_determinism_and_standardised_round_trip():
    x = torch.rand(8, 3, 32, 32)
    a = autoaugment(x, "svhn", generator=torch.Generator().manual_seed(1))
    b = autoaugment(x, "svhn", generator=torch.Generator().manual_seed(1))
    c = autoaugment(x, "svhn", generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    mean, std = CHANNEL_STATS["cifar10"]
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    z = standardised_autoaugment((x - m) / s, "svhn", mean, std, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(z * s + m, a, atol=1e-5, rtol=0)
    aug = AutoAugment("svhn", seed=1, mean=mean, std=std)
    torch.testing.assert_close(aug((x - m) / s), z)
    # quantised to 8-bit levels, in [0, 1]
    assert torch.allclose(a * 255, (a * 255).round(), atol=1e-4) and a.min() >= 0 and a.max() <= 1


# ------------------------------------------------------------------------ Cutout
def test_cutout_zeroes_the_clipped_square():
    x = torch.ones(400, 2, 32, 32)
    out, centres = random_cutout(x, 16, generator=7, return_centres=True)
    for i in range(400):
        cy, cx = centres[i].tolist()
        rows = min(32, cy + 8) - max(0, cy - 8)  # DeVries & Taylor: np.clip(y -+ length // 2, 0, h)
        cols = min(32, cx + 8) - max(0, cx - 8)
        zero = out[i] == 0
        assert int(zero.sum()) == 2 * rows * cols
        assert bool(zero[:, max(0, cy - 8) : cy + 8, max(0, cx - 8) : cx + 8].all())
    assert int((out[0] == 0).sum()) <= 2 * 256
    # centres uniform over the 32 x 32 pixels: corners and the middle both occur
    assert centres.min() == 0 and centres.max() == 31
    full = (out == 0).flatten(1).sum(1) == 2 * 256
    assert 0.2 < full.float().mean() < 0.4  # P(centre in [8, 24]^2) = (16/32)^2 = 0.25
    assert torch.equal(random_cutout(x, 0, generator=1), x)
    with pytest.raises(ValueError, match="cutout size must be a non-negative int"):
        random_cutout(x, -1)


# ------------------------------------------------------------------------ configuration and runs
def test_config_keys_validate_and_keep_old_fingerprints():
    base = {"data": {"name": "digits-image"}, "methods": [{"name": "sgd", "optimizer": "sgd"}]}
    cfg = resolve_config(base)
    assert cfg["data"]["autoaugment"] == "none" and cfg["data"]["cutout"] == 0
    old = dict(cfg, data={k: v for k, v in cfg["data"].items() if k not in ("autoaugment", "cutout")})
    assert fingerprint(cfg, training_only=True) == fingerprint(old, training_only=True)
    on = resolve_config({**base, "data": {"name": "digits-image", "autoaugment": "cifar10", "cutout": 4}})
    assert fingerprint(on, training_only=True) != fingerprint(cfg, training_only=True)
    with pytest.raises(ConfigError, match="autoaugment"):
        resolve_config({**base, "data": {"name": "digits", "autoaugment": "cifar100"}})
    with pytest.raises(ConfigError, match="data.cutout must be >= 0"):
        resolve_config({**base, "data": {"name": "digits", "cutout": -2}})


def _synthetic_cifar10(root) -> None:
    rng = np.random.default_rng(0)
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, 8).tolist(),
        }
        (d / name).write_bytes(pickle.dumps(batch, protocol=2))


def test_train_path_applies_autoaugment_and_cutout_to_training_batches_only(tmp_path, monkeypatch):
    from experiments import train as train_mod

    _synthetic_cifar10(tmp_path / "data")
    cfg_text = f"""
name = "aug"
seeds = [0]
out_dir = "{tmp_path / "runs"}"
progress = false
[data]
name = "cifar10:{tmp_path / "data"}"
augmentation = "crop_flip"
autoaugment = "cifar10"
cutout = 16
[model]
name = "mlp"
kwargs = {{ sizes = [3072, 8, 10] }}
[train]
epochs = 1
batch_size = 10
[evaluation]
metrics = ["accuracy"]
sharpness = []
[[methods]]
name = "sgd"
optimizer = "sgd"
"""
    seen: list[torch.Tensor] = []
    original = train_mod.random_cutout

    def spy(x, size, **kw):
        out = original(x, size, **kw)
        seen.append(out)
        return out

    monkeypatch.setattr(train_mod, "random_cutout", spy)
    path = tmp_path / "aug.toml"
    path.write_text(cfg_text)
    from experiments.cli import main

    assert main(["run", str(path)]) == 0
    # 40 training images in batches of 10: four training batches, each with one 16 x 16 hole
    # (clipped) per image; evaluation went through no augmentation
    assert len(seen) == 4
    for out in seen:
        zero_pixels = (out == 0).all(dim=1).flatten(1).sum(1)
        assert bool((zero_pixels >= 64).all()) and bool((zero_pixels <= 256 + 32).all())


@pytest.mark.parametrize("policy", ["cifar10", "imagenet", "svhn"])
def test_whole_batch_path_equals_subset_path(policy):
    """The accelerator's path (every operation on the whole batch, then torch.where) gives the
    same images as the CPU's (only the images that drew an operation)."""
    x = torch.rand(12, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    subset = autoaugment(x, policy, generator=torch.Generator().manual_seed(3), subsets=True)
    whole = autoaugment(x, policy, generator=torch.Generator().manual_seed(3), subsets=False)
    torch.testing.assert_close(whole, subset, atol=0, rtol=0)
    assert not torch.equal(subset, torch.round(x * 255) / 255)  # something was applied
