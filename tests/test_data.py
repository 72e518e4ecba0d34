"""Data loaders: digits, and MNIST / CIFAR-10 files written here in their real formats."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from landscape.data import batches, load_cifar10, load_dataset, load_digits, load_mnist, make_loader, read_idx


def write_idx_ubyte(path, arr: np.ndarray, compress: bool = False) -> None:
    """IDX by hand: magic 0x0000 08 ndim, big-endian int32 sizes, unsigned bytes."""
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">i", s) for s in arr.shape)
    raw = header + arr.astype(np.uint8).tobytes()
    if compress:
        raw = gzip.compress(raw)
    path.write_bytes(raw)


def test_digits_splits_and_standardisation():
    from sklearn.datasets import load_digits as sk

    raw = sk()
    xa, ya = load_digits("all", dtype=torch.float64)
    xtr, ytr = load_digits("train", dtype=torch.float64, seed=1)
    xte, yte = load_digits("test", dtype=torch.float64, seed=1)
    assert xa.shape == (1797, 64) and len(xtr) + len(xte) == 1797 and len(xte) == round(0.2 * 1797)
    assert torch.equal(ya, torch.as_tensor(raw.target))
    # train split standardised on its own statistics (constant pixels keep scale 1)
    mu, sd = xtr.mean(0), xtr.std(0, unbiased=False)
    train_raw = raw.data[np.sort(np.random.default_rng(1).permutation(1797)[round(0.2 * 1797) :])]
    varying = train_raw.std(0) > 0
    assert float(mu.abs().max()) < 1e-12 and 0 < varying.sum() < 64
    np.testing.assert_allclose(sd.numpy()[varying], 1.0, rtol=1e-10)
    assert float(sd[~torch.as_tensor(varying)].abs().max()) == 0.0
    # same examples: the test split is a subset of the raw data with its labels
    xi, _ = load_digits("all", image=True)
    assert xi.shape == (1797, 1, 8, 8) and xi.dtype == torch.float32
    xr, _ = load_digits("all", standardize=False, dtype=torch.float64)
    assert torch.equal(xr, torch.as_tensor(raw.data))
    assert sorted(ytr.tolist() + yte.tolist()) == sorted(raw.target.tolist())
    assert not torch.equal(load_digits("test", seed=1)[1], load_digits("test", seed=2)[1])
    with pytest.raises(ValueError, match="split"):
        load_digits("valid")


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_round_trip(tmp_path, compress):
    rng = np.random.default_rng(0)
    tr_x = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    tr_y = rng.integers(0, 10, size=5, dtype=np.uint8)
    te_x = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    te_y = rng.integers(0, 10, size=3, dtype=np.uint8)
    sfx = ".gz" if compress else ""
    write_idx_ubyte(tmp_path / f"train-images-idx3-ubyte{sfx}", tr_x, compress)
    write_idx_ubyte(tmp_path / f"train-labels-idx1-ubyte{sfx}", tr_y, compress)
    write_idx_ubyte(tmp_path / f"t10k-images-idx3-ubyte{sfx}", te_x, compress)
    write_idx_ubyte(tmp_path / f"t10k-labels-idx1-ubyte{sfx}", te_y, compress)
    assert np.array_equal(read_idx(tmp_path / f"train-images-idx3-ubyte{sfx}"), tr_x)
    x, y = load_mnist(tmp_path, "train", normalize=False, dtype=torch.float64)
    assert x.shape == (5, 1, 28, 28)
    assert torch.equal(x[:, 0], torch.as_tensor(tr_x / 255.0)) and torch.equal(
        y, torch.as_tensor(tr_y).long()
    )
    xn, _ = load_mnist(tmp_path, "test", dtype=torch.float64)
    np.testing.assert_allclose(xn[:, 0].numpy(), (te_x / 255.0 - 0.1307) / 0.3081, rtol=1e-12)
    xa, ya = load_dataset(f"fashion-mnist:{tmp_path}", "all", normalize=False, dtype=torch.float64)
    assert len(xa) == 8 and torch.equal(ya[5:], torch.as_tensor(te_y).long())
    xl, _ = load_mnist(tmp_path, "train", limit=2)
    assert len(xl) == 2


def test_idx_other_types_and_errors(tmp_path):
    arr = np.array([[1.5, -2.25], [3.0, 4.0]], dtype=">f4")
    (tmp_path / "f.idx").write_bytes(bytes([0, 0, 0x0D, 2]) + struct.pack(">ii", 2, 2) + arr.tobytes())
    np.testing.assert_array_equal(read_idx(tmp_path / "f.idx"), arr.astype(np.float32))
    (tmp_path / "bad.idx").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad.idx")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_mnist(tmp_path, "train")


def test_cifar10_pickles_round_trip(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARPSCAPE_DATA", raising=False)  # "cifar10" without DIR must then fail
    rng = np.random.default_rng(1)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=2).tolist()
        written[name] = (data, labels)
        with open(tmp_path / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, fh)
    x, y = load_cifar10(tmp_path, "train", normalize=False, dtype=torch.float64)
    assert x.shape == (10, 3, 32, 32)
    ref = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32) / 255.0
    assert torch.equal(x, torch.as_tensor(ref))
    assert y.tolist() == sum((written[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    xt, _ = load_dataset(f"cifar10:{tmp_path}", "test", dtype=torch.float64)
    mean = np.array([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
    std = np.array([0.2470, 0.2435, 0.2616]).reshape(1, 3, 1, 1)
    np.testing.assert_allclose(
        xt.numpy(), (written["test_batch"][0].reshape(-1, 3, 32, 32) / 255.0 - mean) / std
    )
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar10(tmp_path, "train")
    with pytest.raises(ValueError, match="directory"):
        load_dataset("cifar10")
    with pytest.raises(ValueError, match="unknown data spec"):
        load_dataset("places365:/x")  # imagenet:DIR is known since the image folders


def test_batches_and_loader():
    x, y = torch.arange(10.0)[:, None], torch.arange(10)
    bs = batches(x, y, 4)
    assert [len(b[1]) for b in bs] == [4, 4, 2] and torch.equal(torch.cat([b[1] for b in bs]), y)
    sh = batches(x, y, 4, shuffle=True, seed=3)
    assert sorted(torch.cat([b[1] for b in sh]).tolist()) == list(range(10))
    assert torch.equal(torch.cat([b[0] for b in sh])[:, 0].long(), torch.cat([b[1] for b in sh]))
    a = [b[1].tolist() for b in make_loader(x, y, 3, seed=5)]
    b = [b[1].tolist() for b in make_loader(x, y, 3, seed=5)]
    assert a == b and sorted(sum(a, [])) == list(range(10))
    with pytest.raises(ValueError, match="batch_size"):
        batches(x, y, 0)


def test_limit_across_files_reads_only_what_it_needs_except_mnist(tmp_path):
    # CIFAR: 2 images per batch file; limit=3 takes batch 1 and the first image of batch 2, and the
    # files after it are neither read nor checked (a broken data_batch_3 goes unnoticed)
    rng = np.random.default_rng(7)
    data = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data[name] = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        with open(tmp_path / name, "wb") as fh:
            pickle.dump({b"data": data[name], b"labels": [1, 2]}, fh)
    (tmp_path / "data_batch_3").write_bytes(b"not a pickle")
    x, y = load_cifar10(tmp_path, "all", normalize=False, limit=3, dtype=torch.float64)
    ref = np.concatenate([data["data_batch_1"], data["data_batch_2"][:1]]).reshape(3, 3, 32, 32) / 255.0
    assert torch.equal(x, torch.as_tensor(ref)) and y.tolist() == [1, 2, 1]
    with pytest.raises(ValueError, match="data_batch_3"):
        load_cifar10(tmp_path, "all", limit=5)
    # MNIST reads and checks every split of "all" before keeping the first `limit` examples
    tr = rng.integers(0, 256, size=(4, 28, 28), dtype=np.uint8)
    write_idx_ubyte(tmp_path / "train-images-idx3-ubyte", tr)
    write_idx_ubyte(tmp_path / "train-labels-idx1-ubyte", np.array([3, 1, 4, 1]))
    write_idx_ubyte(tmp_path / "t10k-images-idx3-ubyte", tr[:2])
    with pytest.raises(FileNotFoundError, match="no t10k-labels-idx1-ubyte"):
        load_mnist(tmp_path, "all", limit=3)
    write_idx_ubyte(tmp_path / "t10k-labels-idx1-ubyte", np.array([5, 9]))
    xm, ym = load_mnist(tmp_path, "all", normalize=False, limit=3, dtype=torch.float64)
    assert torch.equal(xm[:, 0], torch.as_tensor(tr[:3] / 255.0)) and ym.tolist() == [3, 1, 4]
