"""CIFAR-10-C, SVHN, the data directory (SHARPSCAPE_DATA), data specs; transforms; label noise.

Files are written in their real formats (``.npy`` by numpy, ``.mat`` by ``scipy.io.savemat``,
CIFAR pickles, IDX) and read back; references are built independently (numpy slicing, loops).
"""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
import torch
from scipy.io import savemat

from landscape.data import (
    CIFAR10C_ALL_CORRUPTIONS,
    CIFAR10C_CORRUPTIONS,
    CIFAR10C_EXTRA_CORRUPTIONS,
    CIFAR100_FILES,
    DATA_ENV,
    load_cifar10,
    load_cifar10c,
    load_cifar100,
    load_dataset,
    load_mnist,
    load_svhn,
)
from landscape.data.label_noise import (
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
    random_hflip,
)

C10_MEAN = np.array([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
C10_STD = np.array([0.2470, 0.2435, 0.2616]).reshape(1, 3, 1, 1)
SVHN_MEAN = np.array([0.4377, 0.4438, 0.4728]).reshape(1, 3, 1, 1)
SVHN_STD = np.array([0.1980, 0.2010, 0.1970]).reshape(1, 3, 1, 1)


@pytest.fixture(autouse=True)
def _no_data_env(monkeypatch):
    monkeypatch.delenv(DATA_ENV, raising=False)


# ---------------------------------------------------------------------------------------- CIFAR-10-C


def write_cifar10c(root, corruption="gaussian_noise", per=4, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(5 * per, 32, 32, 3), dtype=np.uint8)
    labels = np.tile(rng.integers(0, 10, size=per), 5).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    np.save(root / f"{corruption}.npy", images)
    np.save(root / "labels.npy", labels)
    return images, labels


def test_cifar10c_names_are_the_papers_15_plus_4():
    # Hendrycks & Dietterich 2019, Fig. 1 (15 benchmark corruptions) and the 4 held-out ones
    assert len(CIFAR10C_CORRUPTIONS) == 15 and len(set(CIFAR10C_CORRUPTIONS)) == 15
    assert set(CIFAR10C_EXTRA_CORRUPTIONS) == {"speckle_noise", "gaussian_blur", "spatter", "saturate"}
    assert {"gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
            "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform",
            "pixelate", "jpeg_compression"} == set(CIFAR10C_CORRUPTIONS)  # fmt: skip
    assert CIFAR10C_ALL_CORRUPTIONS == CIFAR10C_CORRUPTIONS + CIFAR10C_EXTRA_CORRUPTIONS


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_cifar10c_severity_block_round_trip(tmp_path, severity):
    images, labels = write_cifar10c(tmp_path, "fog", per=4)
    x, y = load_cifar10c(tmp_path, "fog", severity, normalize=False, dtype=torch.float64)
    rows = range((severity - 1) * 4, severity * 4)
    ref = np.stack([np.stack([images[r, :, :, c] for c in range(3)]) for r in rows]) / 255.0
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float64
    assert torch.equal(x, torch.as_tensor(ref))
    assert y.dtype == torch.int64 and y.tolist() == [int(labels[r]) for r in rows]
    # the spec, CIFAR-10 statistics by default (CIFAR-10-C is the CIFAR-10 test set)
    xn, yn = load_dataset(f"cifar10c:{tmp_path}:fog:{severity}", "test", dtype=torch.float64)
    np.testing.assert_allclose(xn.numpy(), (ref - C10_MEAN) / C10_STD, rtol=1e-13)
    assert torch.equal(yn, y)
    xl, _ = load_cifar10c(tmp_path, "fog", severity, limit=3, normalize=False, dtype=torch.float64)
    assert torch.equal(xl, x[:3])


def test_cifar10c_from_the_data_directory(tmp_path, monkeypatch):
    images, labels = write_cifar10c(tmp_path / "CIFAR-10-C", "saturate", per=2)
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    x, y = load_dataset("cifar10c:saturate:2", "test", normalize=False, dtype=torch.float64)
    assert torch.equal(x, torch.as_tensor(images[2:4].transpose(0, 3, 1, 2) / 255.0))
    assert y.tolist() == labels[2:4].tolist()


def _npy_bytes(arr) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


CIFAR10C_BAD = {
    "float_images": (lambda im, lb: (im.astype(np.float32), lb), r"\[N, 32, 32, 3\], got float32"),
    "chw_images": (lambda im, lb: (im.transpose(0, 3, 1, 2), lb), r"got uint8 of shape \(10, 3, 32, 32\)"),
    "not_5_blocks": (lambda im, lb: (im[:7], lb[:7]), "7 images cannot be split into 5 severity blocks"),
    "label_count": (lambda im, lb: (im, lb[:9]), "holds 10 images but labels.npy holds 9 labels"),
    "float_labels": (lambda im, lb: (im, lb.astype(np.float32)), "expected integer labels of shape"),
    "label_range": (lambda im, lb: (im, np.full_like(lb, 10)), "label 10 outside the 10 classes"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CIFAR10C_BAD))
def test_cifar10c_refuses_malformed_arrays(tmp_path, case):
    images, labels = write_cifar10c(tmp_path, per=2)
    make, fragment = CIFAR10C_BAD[case]
    im, lb = make(images, labels)
    np.save(tmp_path / "gaussian_noise.npy", im)
    np.save(tmp_path / "labels.npy", lb)
    with pytest.raises(ValueError, match=fragment):
        load_cifar10c(tmp_path, "gaussian_noise", 1)


def test_cifar10c_refuses_corrupt_files_bad_names_and_severities(tmp_path):
    write_cifar10c(tmp_path, per=2)
    raw = (tmp_path / "gaussian_noise.npy").read_bytes()
    (tmp_path / "gaussian_noise.npy").write_bytes(raw[:-100])  # truncated data
    with pytest.raises(ValueError, match="gaussian_noise.npy: not a readable .npy array"):
        load_cifar10c(tmp_path, "gaussian_noise", 1)
    (tmp_path / "gaussian_noise.npy").write_bytes(_npy_bytes(np.array([{"a": 1}], dtype=object)))
    with pytest.raises(ValueError, match="not a readable .npy array.*Python objects"):
        load_cifar10c(tmp_path, "gaussian_noise", 1)
    with pytest.raises(ValueError, match="did you mean 'gaussian_noise'"):
        load_cifar10c(tmp_path, "gausian_noise", 1)
    for bad in (0, 6, True, 2.0):
        with pytest.raises(ValueError, match=r"severity must be an int in 1..5"):
            load_cifar10c(tmp_path, "gaussian_noise", bad)
    with pytest.raises(FileNotFoundError, match="no shot_noise.npy.*zenodo"):
        load_cifar10c(tmp_path, "shot_noise", 1)
    with pytest.raises(ValueError, match="only corrupted test images"):
        load_dataset(f"cifar10c:{tmp_path}:gaussian_noise:1", "train")
    with pytest.raises(ValueError, match="write cifar10c:DIR:CORRUPTION:SEVERITY"):
        load_dataset("cifar10c:gaussian_noise", "test")
    with pytest.raises(ValueError, match="severity 'x' is not an int"):
        load_dataset(f"cifar10c:{tmp_path}:gaussian_noise:x", "test")


# --------------------------------------------------------------------------------------------- SVHN


def write_svhn(path, n, seed, labels=None):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    y = rng.integers(1, 11, size=(n, 1)).astype(np.uint8) if labels is None else labels
    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, {"X": x, "y": y})
    return x, y


def test_svhn_round_trip_maps_label_10_to_digit_0(tmp_path):
    labels = np.array([[10], [1], [9], [10], [5]], dtype=np.uint8)
    xw, _ = write_svhn(tmp_path / "test_32x32.mat", 5, seed=1, labels=labels)
    x, y = load_svhn(tmp_path, "test", normalize=False, dtype=torch.float64)
    ref = np.stack([np.stack([xw[:, :, c, i] for c in range(3)]) for i in range(5)]) / 255.0
    assert x.shape == (5, 3, 32, 32) and torch.equal(x, torch.as_tensor(ref))
    assert y.tolist() == [0, 1, 9, 0, 5]
    xs, _ = load_svhn(tmp_path, "test", dtype=torch.float64)  # SVHN's own statistics
    np.testing.assert_allclose(xs.numpy(), (ref - SVHN_MEAN) / SVHN_STD, rtol=1e-13)
    xc, _ = load_dataset(f"svhn:{tmp_path}", "test", normalize="cifar10", dtype=torch.float64)
    np.testing.assert_allclose(xc.numpy(), (ref - C10_MEAN) / C10_STD, rtol=1e-13)
    xtr, ytr = write_svhn(tmp_path / "train_32x32.mat", 3, seed=2)
    xa, ya = load_svhn(tmp_path, "all", normalize=False, limit=4)
    assert ya.tolist() == [v % 10 for v in ytr[:, 0].tolist()] + [0]
    assert torch.equal(xa[:3].double(), torch.as_tensor(xtr.transpose(3, 2, 0, 1) / 255.0).float().double())


_X2, _Y2 = np.zeros((32, 32, 3, 2), np.uint8), np.ones((2, 1), np.uint8)
SVHN_BAD = {
    "float_x": ({"X": _X2.astype(np.float32), "y": _Y2}, "X must be uint8 of shape"),
    "nchw_x": ({"X": _X2.transpose(3, 2, 0, 1), "y": _Y2}, r"got uint8 of shape \(2, 3, 32, 32\)"),
    "label_zero": ({"X": _X2, "y": np.array([[0], [3]], np.uint8)}, "label 0 outside 1..10"),
    "label_11": ({"X": _X2, "y": np.array([[11], [3]], np.uint8)}, "label 11 outside 1..10"),
    "count": ({"X": _X2, "y": np.ones((3, 1), np.uint8)}, "X holds 2 images but y holds 3"),
    "float_y": ({"X": _X2, "y": _Y2.astype(np.float64)}, "y must be integer labels"),
    "no_y": ({"X": _X2}, r"no variable\(s\) \['y'\]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SVHN_BAD))
def test_svhn_refuses_malformed_content(tmp_path, case):
    content, fragment = SVHN_BAD[case]
    savemat(tmp_path / "train_32x32.mat", content)
    with pytest.raises(ValueError, match=fragment) as info:
        load_svhn(tmp_path, "train")
    assert str(tmp_path / "train_32x32.mat") in str(info.value)


def test_svhn_refuses_foreign_files_and_names_missing_ones(tmp_path):
    (tmp_path / "test_32x32.mat").write_bytes(b"this is not a MATLAB file at all" * 10)
    with pytest.raises(ValueError, match="not a readable SVHN .mat file"):
        load_svhn(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="no train_32x32.mat.*ufldl.stanford.edu"):
        load_svhn(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be one of"):
        load_svhn(tmp_path, "validation")


# ------------------------------------------------------------------------ the data directory, specs


def _write_idx(path, arr):
    codes = {np.dtype(np.uint8): 0x08}
    path.parent.mkdir(parents=True, exist_ok=True)
    header = bytes([0, 0, codes[arr.dtype], arr.ndim]) + struct.pack(f">{arr.ndim}i", *arr.shape)
    path.write_bytes(header + arr.tobytes())


def test_one_data_directory_for_every_loader(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    c10 = tmp_path / "cifar-10-batches-py"
    c10.mkdir()
    batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [3, 7]}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (c10 / name).write_bytes(pickle.dumps(batch, protocol=2))
    c100 = tmp_path / "cifar-100-python"
    c100.mkdir()
    d100 = {b"data": batch[b"data"], b"fine_labels": [99, 0], b"coarse_labels": [19, 4]}
    for name in CIFAR100_FILES["train"] + CIFAR100_FILES["test"]:
        (c100 / name).write_bytes(pickle.dumps(d100, protocol=2))
    img = rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    _write_idx(tmp_path / "MNIST" / "raw" / "t10k-images-idx3-ubyte", img)
    _write_idx(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", np.array([1, 2, 3], np.uint8))
    write_svhn(tmp_path / "svhn" / "test_32x32.mat", 2, seed=4, labels=np.array([[10], [2]], np.uint8))

    with pytest.raises(ValueError, match=f"needs a directory.*{DATA_ENV}"):
        load_cifar10(None, "test")
    with pytest.raises(ValueError, match="needs a directory"):
        load_dataset("svhn", "test")
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    x, y = load_cifar10(split="test", normalize=False, dtype=torch.float64)
    assert torch.equal(x, torch.as_tensor(batch[b"data"].reshape(2, 3, 32, 32) / 255.0)) and y.tolist() == [
        3,
        7,
    ]
    assert load_dataset("cifar100", "test")[1].tolist() == [99, 0]
    assert load_dataset("cifar100-coarse", "test")[1].tolist() == [19, 4]
    assert load_cifar100(split="test", label_mode="coarse")[1].tolist() == [19, 4]
    xm, ym = load_mnist(split="test", normalize=False, dtype=torch.float64)
    assert torch.equal(xm, torch.as_tensor(img[:, None] / 255.0)) and ym.tolist() == [1, 2, 3]
    assert load_dataset("svhn", "test")[1].tolist() == [0, 2]
    with pytest.raises(FileNotFoundError, match=r"no train-images-idx3-ubyte\[.gz\].*MNIST/raw"):
        load_dataset("mnist", "train")
    with pytest.raises(FileNotFoundError, match="no train_32x32.mat"):
        load_dataset("svhn", "train")
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=f"nowhere \\(from {DATA_ENV}\\) does not exist.*cs.toronto"):
        load_cifar10(split="test")


def test_normalize_forms_and_unknown_specs(tmp_path):
    write_svhn(tmp_path / "test_32x32.mat", 2, seed=5)
    x0, _ = load_svhn(tmp_path, "test", normalize=False, dtype=torch.float64)
    mean, std = (0.5, 0.25, 0.125), (0.5, 0.5, 2.0)
    x1, _ = load_svhn(tmp_path, "test", normalize=(mean, std), dtype=torch.float64)
    ref = (x0.numpy() - np.array(mean).reshape(1, 3, 1, 1)) / np.array(std).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(x1.numpy(), ref, rtol=1e-14)
    with pytest.raises(ValueError, match="names no known statistics"):
        load_svhn(tmp_path, "test", normalize="places365")
    with pytest.raises(ValueError, match="1 means and 1 stds for images with 3 channels"):
        load_svhn(tmp_path, "test", normalize=((0.5,), (0.5,)))
    with pytest.raises(ValueError, match="standard deviations must be positive"):
        load_svhn(tmp_path, "test", normalize=((0, 0, 0), (1, 0, 1)))
    with pytest.raises(ValueError, match="unknown data spec 'places365:/x'.*svhn"):
        load_dataset("places365:/x")


# ---------------------------------------------------------------------------------------- transforms


def test_random_crop_is_a_window_of_the_padded_image():
    x = torch.randn(64, 3, 8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out, off = random_crop(x, 2, generator=7, return_offsets=True)
    padded = np.pad(x.numpy(), ((0, 0), (0, 0), (2, 2), (2, 2)))  # zeros, numpy reference
    for i, (dy, dx) in enumerate(off.tolist()):
        np.testing.assert_array_equal(out[i].numpy(), padded[i, :, dy : dy + 8, dx : dx + 6])
    assert off.min() >= 0 and off.max() <= 4 and len({tuple(o) for o in off.tolist()}) > 10
    # per-channel fill: torchvision's black padding on standardised inputs
    fill = black_fill("cifar10")
    np.testing.assert_allclose(fill, [-0.4914 / 0.2470, -0.4822 / 0.2435, -0.4465 / 0.2616], rtol=1e-15)
    out2, off2 = random_crop(x, 2, generator=7, fill=fill, return_offsets=True)
    assert torch.equal(off2, off)
    padded2 = np.stack([np.pad(x[:, c].numpy(), ((0, 0), (2, 2), (2, 2)), constant_values=fill[c])
                        for c in range(3)], axis=1)  # fmt: skip
    for i, (dy, dx) in enumerate(off.tolist()):
        np.testing.assert_array_equal(out2[i].numpy(), padded2[i, :, dy : dy + 8, dx : dx + 6])
    assert torch.equal(random_crop(x, 0, generator=1), x)


def test_random_flip_probability_and_seed_reproducibility():
    n = 10_000
    x = torch.randn(n, 1, 2, 3, generator=torch.Generator().manual_seed(1))
    out, mask = random_hflip(x, 0.5, generator=3, return_mask=True)
    assert torch.equal(out[mask], x[mask].flip(-1)) and torch.equal(out[~mask], x[~mask])
    # Binomial(10000, 1/2): standard deviation of the fraction 0.005; 4 sigma = 0.02
    assert abs(mask.double().mean().item() - 0.5) < 0.02
    mask_3 = random_hflip(x, 0.3, generator=4, return_mask=True)[1]
    assert abs(mask_3.double().mean().item() - 0.3) < 4 * (0.3 * 0.7 / n) ** 0.5
    a, b = RandomCropFlip(seed=5), RandomCropFlip(seed=5)
    imgs = torch.randn(16, 3, 8, 8)
    first = a(imgs)
    assert torch.equal(first, b(imgs)) and not torch.equal(a(imgs), first)  # a stream, reproducible
    assert not torch.equal(RandomCropFlip(seed=6)(imgs), first)
    c = RandomCropFlip(seed=5)
    state = c.state()
    c(imgs)
    c.load_state(state)
    assert torch.equal(c(imgs), first)
    # the composite is crop then flip from one generator
    g = torch.Generator().manual_seed(5)
    ref = random_hflip(random_crop(imgs, 4, generator=g), 0.5, generator=g)
    assert torch.equal(ref, first)
    assert a.config == {
        "transform": "random_crop_flip",
        "padding": 4,
        "flip_prob": 0.5,
        "seed": 5,
        "fill": 0.0,
    }


def test_normalisation_constants_and_computed_statistics():
    x = torch.rand(20, 3, 4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2 + 1
    mean, std = channel_stats(x)
    arr = x.numpy()
    np.testing.assert_allclose(mean, arr.mean(axis=(0, 2, 3)), rtol=1e-14)
    np.testing.assert_allclose(std, arr.std(axis=(0, 2, 3)), rtol=1e-14)
    z = normalize(x, mean, std)
    np.testing.assert_allclose(z.numpy().mean(axis=(0, 2, 3)), 0, atol=1e-14)
    np.testing.assert_allclose(z.numpy().std(axis=(0, 2, 3)), 1, rtol=1e-13)
    zc = normalize(x, "cifar10")
    np.testing.assert_allclose(zc.numpy(), (arr - C10_MEAN) / C10_STD, rtol=1e-14)
    zi = normalize(x, "imagenet")  # torchvision's ImageNet values, written out
    ref = (arr - np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)) / np.array(
        [0.229, 0.224, 0.225]
    ).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(zi.numpy(), ref, rtol=1e-14)
    with pytest.raises(ValueError, match="unknown statistics 'places365'"):
        normalize(x, "places365")
    with pytest.raises(ValueError, match=r"expected a floating tensor of images \[N, C, H, W\]"):
        random_crop(torch.zeros(3, 8, 8), 4)
    with pytest.raises(ValueError, match="padding must be a non-negative int"):
        random_crop(x, -1)
    with pytest.raises(ValueError, match=r"flip probability p must lie in \[0, 1\]"):
        random_hflip(x, 1.5)
    with pytest.raises(ValueError, match="fill has 2 values for images with 3 channels"):
        random_crop(x, 1, fill=(0.0, 1.0))


def test_train_applies_the_transform_once_per_step():
    from landscape.models import MLP, train

    x, y = torch.randn(6, 1, 2, 2, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 1, 0])
    m = MLP([4, 2]).double()
    w0 = [p.detach().clone() for p in m.parameters()]
    seen = []

    def aug(batch):
        seen.append(batch.clone())
        return batch.flip(-1)

    train(m, (x, y), lambda p: torch.optim.SGD(p, lr=0.5), epochs=1, transform=aug)
    assert len(seen) == 1 and torch.equal(seen[0], x)
    # hand step on the flipped inputs: w - lr * grad CE(W flat(x') + b)
    w = w0[0].clone().requires_grad_(True)
    b = w0[1].clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(x.flip(-1).reshape(6, 4) @ w.T + b, y)
    gw, gb = torch.autograd.grad(loss, (w, b))
    torch.testing.assert_close(m[1].weight.detach(), w0[0] - 0.5 * gw, rtol=1e-14, atol=1e-15)
    torch.testing.assert_close(m[1].bias.detach(), w0[1] - 0.5 * gb, rtol=1e-14, atol=1e-15)


# --------------------------------------------------------------------------------------- label noise


@pytest.mark.parametrize("rate", [0.0, 0.2, 0.4, 0.5, 0.8, 1.0])
def test_symmetric_noise_flips_exactly_round_r_n_labels_to_other_classes(rate):
    clean = torch.as_tensor(np.random.default_rng(0).integers(0, 10, size=1003))
    out = symmetric_label_noise(clean, rate, 10, seed=1)
    k = int(np.floor(rate * 1003 + 0.5))
    assert int(out.flipped.sum()) == k and out.realised_rate == pytest.approx(k / 1003, abs=0)
    assert bool((out.labels[out.flipped] != clean[out.flipped]).all())
    assert torch.equal(out.labels[~out.flipped], clean[~out.flipped]) and torch.equal(out.clean, clean)
    assert int(out.labels.min()) >= 0 and int(out.labels.max()) <= 9 and out.labels.dtype == torch.int64
    assert out.config == {"noise": "symmetric", "rate": rate, "num_classes": 10, "seed": 1,
                          "exact": True, "target": "other"}  # fmt: skip


def test_symmetric_noise_is_uniform_over_the_other_classes_and_seeded():
    n, c = 30_000, 4
    clean = torch.as_tensor(np.random.default_rng(1).integers(0, c, size=n))
    out = symmetric_label_noise(clean, 1.0, c, seed=2)
    shift = ((out.labels - clean) % c).numpy()
    counts = np.bincount(shift, minlength=c)
    assert counts[0] == 0  # never the true class
    # each of the 3 other classes with probability 1/3: binomial sd sqrt(n * 1/3 * 2/3) ~ 82
    np.testing.assert_allclose(counts[1:], n / 3, atol=4 * np.sqrt(n * 2 / 9))
    again = symmetric_label_noise(clean, 1.0, c, seed=2)
    assert torch.equal(again.labels, out.labels)
    assert not torch.equal(symmetric_label_noise(clean, 0.5, c, seed=3).flipped,
                           symmetric_label_noise(clean, 0.5, c, seed=4).flipped)  # fmt: skip
    # "any" convention: redrawn among all C classes, so a fraction (C-1)/C of the chosen ones change
    two = torch.zeros(n, dtype=torch.int64)
    anyc = symmetric_label_noise(two, 1.0, 2, seed=5, target="any")
    assert abs(anyc.realised_rate - 0.5) < 4 * np.sqrt(0.25 / n)
    bern = symmetric_label_noise(clean, 0.3, c, seed=6, exact=False)
    assert abs(bern.realised_rate - 0.3) < 4 * np.sqrt(0.21 / n)


def test_asymmetric_cifar10_pairs_exact_per_class():
    clean = torch.arange(10).repeat_interleave(50)[
        torch.randperm(500, generator=torch.Generator().manual_seed(0))
    ]
    out = asymmetric_label_noise(clean, 0.4, "cifar10", seed=3)
    names = dict(enumerate(CIFAR10_CLASSES))
    expected = {
        ("truck", "automobile"),
        ("bird", "airplane"),
        ("deer", "horse"),
        ("cat", "dog"),
        ("dog", "cat"),
    }
    moved = {(names[int(a)], names[int(b)]) for a, b in zip(clean[out.flipped], out.labels[out.flipped])}
    assert moved == expected
    for src in (9, 2, 4, 3, 5):  # exactly round(0.4 * 50) = 20 of each source class
        assert int(((clean == src) & out.flipped).sum()) == 20
    assert not bool(
        out.flipped[(clean == 0) | (clean == 1) | (clean == 6) | (clean == 7) | (clean == 8)].any()
    )
    assert out.realised_rate == 100 / 500
    generic = asymmetric_label_noise(torch.tensor([0, 0, 0, 0, 1, 2]), 0.5, {0: 2}, num_classes=3, seed=0)
    assert generic.labels.tolist().count(2) == 3 and int(generic.flipped.sum()) == 2
    stored = asymmetric_label_noise(clean, 0.4, out.config["mapping"], num_classes=10, seed=3)
    assert torch.equal(stored.labels, out.labels)


def test_noisy_labels_save_and_load(tmp_path):
    from landscape.results import load_result

    out = symmetric_label_noise(torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), 0.5, 5, seed=9)
    out.save(tmp_path / "noise.json")
    back = load_result(tmp_path / "noise.json")
    assert isinstance(back, NoisyLabels) and back.config == out.config
    assert torch.equal(back.labels, out.labels) and torch.equal(back.flipped, out.flipped)
    assert back.flipped.dtype == torch.bool and torch.equal(back.clean, out.clean)


def test_label_noise_bad_arguments():
    y = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"noise rate must be a number in \[0, 1\]"):
        symmetric_label_noise(y, 1.5, 3)
    with pytest.raises(ValueError, match="label 2 outside the 2 classes 0..1"):
        symmetric_label_noise(y, 0.5, 2)
    with pytest.raises(TypeError, match="labels must be a 1-D integer tensor"):
        symmetric_label_noise(y.double(), 0.5, 3)
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        symmetric_label_noise(y, 0.5, 3, seed=-1)
    with pytest.raises(ValueError, match="target must be 'other'"):
        symmetric_label_noise(y, 0.5, 3, target="same")
    with pytest.raises(ValueError, match="mapping 1 -> 1: source and target must be different"):
        asymmetric_label_noise(y, 0.5, {1: 1}, num_classes=3)
    with pytest.raises(ValueError, match="unknown asymmetric mapping 'cifar100'"):
        asymmetric_label_noise(y, 0.5, "cifar100")
    with pytest.raises(ValueError, match="flipped must mark exactly"):
        NoisyLabels(labels=[0, 1], clean=[0, 0], flipped=[False, False])
