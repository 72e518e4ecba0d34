"""Untrusted data files: no code runs from a data file, and every bad or corrupt data file (CIFAR
pickles, IDX files) gives a clear error naming the file and the problem; round trips compare against
the arrays that were written."""

from __future__ import annotations

import gzip
import os
import pickle
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from landscape.data.datasets import load_cifar10, load_cifar100, load_dataset, load_mnist, read_idx
from landscape.data.safe_pickle import RefusedGlobalError

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------ helpers


def cifar_dict(n: int, rng: np.random.Generator, *, cifar100: bool = False) -> dict:
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    d = {b"batch_label": b"batch 1", b"data": data, b"filenames": [b"%d.png" % i for i in range(n)]}
    if cifar100:
        d[b"fine_labels"] = rng.integers(0, 100, size=n).tolist()
        d[b"coarse_labels"] = rng.integers(0, 20, size=n).tolist()
    else:
        d[b"labels"] = rng.integers(0, 10, size=n).tolist()
    return d


def write_pickle(path: Path, obj, protocol: int = 2) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=protocol)


def write_cifar10(root: Path, rng: np.random.Generator, protocol: int = 2, n: int = 3) -> dict:
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        written[name] = cifar_dict(n, rng)
        write_pickle(root / name, written[name], protocol)
    return written


def write_idx(path: Path, arr: np.ndarray, type_code: int = 0x08, compress: bool = False) -> bytes:
    header = bytes([0, 0, type_code, arr.ndim]) + b"".join(struct.pack(">i", s) for s in arr.shape)
    raw = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)
    return raw


def write_mnist(root: Path, n: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=n, dtype=np.uint8)
    for split, (xs, ys) in {"train": (x, y), "t10k": (x[:2], y[:2])}.items():
        write_idx(root / f"{split}-images-idx3-ubyte", xs)
        write_idx(root / f"{split}-labels-idx1-ubyte", ys)
    return x, y


class Payload:
    """Pickles as ``call(arg)``: what a malicious file runs on ``pickle.load``."""

    def __init__(self, call, arg: str):
        self.call, self.arg = call, arg

    def __reduce__(self):
        return (self.call, (self.arg,))


# --------------------------------------------------------------------- CIFAR: no code from the file


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("payload", ["exec", "system"])
def test_cifar_pickle_with_code_payload_is_refused_and_runs_nothing(tmp_path, protocol, payload):
    marker = tmp_path / "marker"
    write_cifar10(tmp_path, np.random.default_rng(0), protocol)
    if payload == "exec":
        call, arg, name = exec, f"open({str(marker)!r}, 'w').write('x')", r"(__builtin__|builtins)\.exec"
    else:
        call, arg, name = os.system, f"touch '{marker}'", rf"{os.system.__module__}\.system"
    evil = cifar_dict(3, np.random.default_rng(1))
    evil[b"filenames"] = Payload(call, arg)  # after the legitimate-looking b"data"
    write_pickle(tmp_path / "data_batch_1", evil, protocol)
    fragment = (
        rf"data_batch_1: the CIFAR-10 reader refuses to load {name}: CIFAR-10 files contain only arrays"
    )
    with pytest.raises(RefusedGlobalError, match=fragment):
        load_cifar10(tmp_path, "train")
    assert not marker.exists()
    with open(tmp_path / "data_batch_1", "rb") as fh:  # the payload is real: plain pickle.load runs it
        pickle.load(fh)
    assert marker.exists()


def test_no_unrestricted_deserialisation_in_the_package():
    pattern = re.compile(r"pickle\.loads?\(|allow_pickle\s*=\s*True|torch\.load\((?![^)]*weights_only=True)")
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in sorted((ROOT / "landscape").rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


# --------------------------------------------------------------------- CIFAR: real formats load


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_real_format_round_trip(tmp_path, protocol):
    written = write_cifar10(tmp_path, np.random.default_rng(protocol), protocol)
    x, y = load_cifar10(tmp_path, "all", normalize=False, dtype=torch.float64)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    ref_x = np.concatenate([written[n][b"data"] for n in names]).reshape(-1, 3, 32, 32) / 255.0
    assert torch.equal(x, torch.as_tensor(ref_x))
    assert y.dtype == torch.int64 and y.tolist() == sum((written[n][b"labels"] for n in names), [])


def test_cifar10_numpy1_module_names_and_numpy_scalar_labels(tmp_path):
    """The official files were pickled by numpy < 2 (``numpy.core.multiarray``); labels may be
    numpy scalars (``multiarray.scalar``)."""
    rng = np.random.default_rng(7)
    d = cifar_dict(4, rng)
    d[b"labels"] = [np.int64(v) for v in d[b"labels"]]
    raw = pickle.dumps(d, protocol=2)
    assert b"numpy._core.multiarray" in raw and b"scalar" in raw
    (tmp_path / "test_batch").write_bytes(raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    x, y = load_cifar10(tmp_path, "test", normalize=False, dtype=torch.float64)
    assert torch.equal(x, torch.as_tensor(d[b"data"].reshape(-1, 3, 32, 32) / 255.0))
    assert y.tolist() == [int(v) for v in d[b"labels"]]


@pytest.mark.parametrize("protocol", [2, 4])
def test_cifar100_real_format_fine_and_coarse(tmp_path, protocol):
    sub = tmp_path / "cifar-100-python"
    sub.mkdir()
    rng = np.random.default_rng(10 + protocol)
    written = {name: cifar_dict(5, rng, cifar100=True) for name in ("train", "test")}
    for name, d in written.items():
        write_pickle(sub / name, d, protocol)
    x, y = load_cifar100(tmp_path, "train", normalize=False, dtype=torch.float64)
    assert torch.equal(x, torch.as_tensor(written["train"][b"data"].reshape(-1, 3, 32, 32) / 255.0))
    assert y.tolist() == written["train"][b"fine_labels"]
    _, yc = load_cifar100(tmp_path, "all", "coarse")
    assert yc.tolist() == written["train"][b"coarse_labels"] + written["test"][b"coarse_labels"]
    xn, yn = load_dataset(f"cifar100:{tmp_path}", "test", dtype=torch.float64)
    mean = np.array([0.5071, 0.4865, 0.4409]).reshape(1, 3, 1, 1)
    std = np.array([0.2673, 0.2564, 0.2762]).reshape(1, 3, 1, 1)
    ref = (written["test"][b"data"].reshape(-1, 3, 32, 32) / 255.0 - mean) / std
    np.testing.assert_allclose(xn.numpy(), ref, rtol=1e-13)
    assert yn.tolist() == written["test"][b"fine_labels"]


# ------------------------------------------------------------------ CIFAR: malformed content


def _p2(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)


_GOOD = cifar_dict(2, np.random.default_rng(5))
_C100 = cifar_dict(2, np.random.default_rng(6), cifar100=True)
# case -> (content of test_batch, fragment of the error)
CIFAR_BAD = {
    "truncated": (_p2(_GOOD)[:3000], r"not a readable CIFAR-10 python pickle.*truncated"),
    "not_a_pickle": (b"this is a text file, not a pickle\n", "not a readable CIFAR-10 python pickle"),
    "not_a_dict": (_p2([1, 2, 3]), "expected a pickled dict"),
    "missing_labels": (_p2({b"data": _GOOD[b"data"]}), r"missing \[b'labels'\]"),
    "cifar100_file": (_p2(_C100), "looks like a CIFAR-100 file"),
    "float_data": (_p2({**_GOOD, b"data": _GOOD[b"data"] / 2}), r"uint8 array of shape \[n, 3072\].*float64"),
    "wrong_width": (_p2({**_GOOD, b"data": _GOOD[b"data"][:, :3000]}), r"uint8 array of shape \(2, 3000\)"),
    "label_count": (_p2({**_GOOD, b"labels": [1, 2, 3]}), "holds 3 labels for 2 images"),
    "label_range": (_p2({**_GOOD, b"labels": [1, 10]}), "label 10, outside the 10 classes"),
    "negative_label": (_p2({**_GOOD, b"labels": [-1, 0]}), "label -1, outside"),
    "float_labels": (_p2({**_GOOD, b"labels": [1.0, 2.0]}), "integer labels, found float"),
    "no_images": (_p2({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}), "holds no images"),
    # protocol 0 text naming numpy.load (not on the allow-list) and _codecs.encode used as rot13
    "numpy_load": (
        b"cnumpy\nload\n(S'/etc/passwd'\ntR.",
        r"refuses to load numpy\.load.*corrupt or malicious",
    ),
    "codecs_rot13": (
        b"c_codecs\nencode\n(Vabc\nVrot13\ntR.",
        "encode is admitted only as a latin-1 str -> bytes",
    ),
}


@pytest.mark.parametrize("case", list(CIFAR_BAD))
def test_cifar10_malformed_file_names_file_and_problem(tmp_path, case):
    content, fragment = CIFAR_BAD[case]
    (tmp_path / "test_batch").write_bytes(content)
    with pytest.raises(ValueError, match=fragment) as info:
        load_cifar10(tmp_path, "test")
    assert str(tmp_path / "test_batch") in str(info.value)


def test_cifar100_bad_coarse_label_and_bad_arguments(tmp_path):
    d = cifar_dict(2, np.random.default_rng(2), cifar100=True)
    d[b"coarse_labels"] = [3, 20]
    write_pickle(tmp_path / "test", d)
    with pytest.raises(ValueError, match="label 20, outside the 20 classes 0..19"):
        load_cifar100(tmp_path, "test", "coarse")
    with pytest.raises(ValueError, match="label_mode must be one of"):
        load_cifar100(tmp_path, "test", "medium")
    with pytest.raises(ValueError, match="limit must be None or a positive int"):
        load_cifar100(tmp_path, "test", limit=0)
    with pytest.raises(ValueError, match="needs a directory"):
        load_dataset("cifar100")


# --------------------------------------------------------------------------------------- IDX files


def test_idx_round_trip_other_dtype_and_gzip_by_content(tmp_path):
    arr = np.arange(-6, 6, dtype=np.int16).reshape(3, 4)
    write_idx(tmp_path / "a.idx", arr, 0x0B, compress=True)  # gzip without the .gz suffix
    np.testing.assert_array_equal(read_idx(tmp_path / "a.idx"), arr)


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("bad_magic", r"bad magic number: 01 02 08 03.*expected an IDX file"),
        ("empty", "bad magic number: an empty file"),
        ("truncated_header", r"truncated IDX header \(3 dimensions need 12 size bytes, found 5\)"),
        ("truncated_data", r"truncated: the header announces shape \(2, 28, 28\) \(1568 bytes of data\)"),
        ("trailing", "has trailing bytes"),
        ("gzip_corrupt", "corrupt or truncated gzip data"),
        ("gzip_truncated", "corrupt or truncated gzip data"),
    ],
)
def test_idx_bad_files(tmp_path, case, fragment):
    path = tmp_path / "train-images-idx3-ubyte"
    raw = write_idx(path, np.zeros((2, 28, 28), np.uint8))
    gz = gzip.compress(raw)
    damaged = {
        "bad_magic": b"\x01\x02\x08\x03" + raw[4:],
        "empty": b"",
        "truncated_header": raw[:9],
        "truncated_data": raw[:-10],
        "trailing": raw + b"\x00",
        "gzip_corrupt": gz[:-8] + bytes(b ^ 0xFF for b in gz[-8:-4]) + gz[-4:],  # CRC-32 trailer
        "gzip_truncated": gz[: len(gz) - 12],
    }[case]
    path.write_bytes(damaged)
    with pytest.raises(ValueError, match=fragment) as info:
        read_idx(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("label_range", "label 12 outside the 10 classes"),
        ("float_images", r"expected unsigned-byte mnist images of shape \[N, 28, 28\], got float32"),
        ("count", "holds 4 images but train-labels-idx1-ubyte holds 3 labels"),
    ],
)
def test_mnist_content_checks(tmp_path, case, fragment):
    x, y = write_mnist(tmp_path)
    if case == "label_range":
        write_idx(tmp_path / "train-labels-idx1-ubyte", np.array([1, 12, 3, 4], np.uint8))
    elif case == "float_images":
        write_idx(tmp_path / "train-images-idx3-ubyte", x.astype(np.float32), 0x0D)
    else:
        write_idx(tmp_path / "train-labels-idx1-ubyte", y[:3])
    with pytest.raises(ValueError, match=fragment):
        load_mnist(tmp_path, "train")
