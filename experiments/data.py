"""The data of one run: training/test sets from the ``landscape.data.load_dataset`` registry, subsets
(``limit`` and ``budget``), label noise (``landscape.data.symmetric_label_noise`` /
``asymmetric_label_noise``), an OOD set, and CIFAR-10-C (``landscape.data.load_cifar10c``).

The test set must be held out: ``data.train_split == data.test_split`` is a configuration error
(:func:`check_splits`), and so is a training set that holds more than 1 % of the test inputs
(counted by exact per-example comparison after loading and subsetting; fewer, as natural data sets
may hold a few exact duplicates, are reported in a note), unless ``data.allow_test_as_train = true``.
:func:`data_fingerprints` (sha256 of the training and test tensors) identify the data a checkpoint
was trained on.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from experiments.budget import data_limit
from experiments.config import ConfigError
from landscape.cli_common import note
from landscape.data import asymmetric_label_noise, load_dataset, symmetric_label_noise

__all__ = [
    "CIFAR10C_GROUPS",
    "RunData",
    "check_splits",
    "corruption_root",
    "data_fingerprints",
    "make_noise",
    "prepare_data",
]

#: Share of the test inputs that may also be training inputs (exact duplicates) without refusal.
OVERLAP_TOLERANCE = 0.01

#: Subset choice is independent of the run's seed, so every method and seed sees the same examples.
SUBSET_SEED = 20240917

#: Hendrycks & Dietterich (2019), CIFAR-10-C: the 15 benchmark corruptions and the 4 extra ones,
#: grouped as in their Fig. 1 (the extra ones under "digital and others", as the flat-BNN table does).
CIFAR10C_GROUPS: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "gaussian_blur"),
    "weather": ("snow", "frost", "fog", "brightness", "spatter"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression", "saturate"),
}


@dataclass
class RunData:
    """Tensors of one run (on the CPU; the trainer moves them)."""

    x_train: torch.Tensor
    y_train: torch.Tensor  # the labels trained on (noisy when label noise is on)
    y_train_clean: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    x_ood: torch.Tensor | None = None
    noise: Any = None  # landscape.data.NoisyLabels when label noise is on
    train_indices: torch.Tensor | None = None
    fingerprints: dict[str, str] | None = field(default=None, repr=False, compare=False)
    #: classes of the whole training and test splits (largest label + 1, before any subset): a
    #: subset may lack the largest labels
    split_classes: int = 0


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def data_fingerprints(data: RunData) -> dict[str, str]:
    """``{"train": sha256, "test": sha256}`` of the inputs and labels (the noisy ones trained on) of
    the training and the test set, as loaded (before augmentation); computed once per ``data``."""
    if data.fingerprints is None:
        data.fingerprints = {
            "train": _digest(data.x_train, data.y_train),
            "test": _digest(data.x_test, data.y_test),
        }
    return data.fingerprints


def check_splits(cfg: dict[str, Any]) -> None:
    """``ConfigError`` if the test split is the training split (unless ``data.allow_test_as_train``)."""
    d = cfg["data"]
    if d["train_split"] == d["test_split"] and not d.get("allow_test_as_train", False):
        raise ConfigError(
            f"data.train_split and data.test_split are both {d['test_split']!r}: the test accuracy would be "
            "measured on the training examples; choose another split, or set "
            "data.allow_test_as_train = true to do this on purpose"
        )


def _row_digests(x: torch.Tensor) -> list[bytes]:
    """A 16-byte BLAKE2b digest of every example's bytes (no copy of the data)."""
    a = x.detach().cpu().contiguous().reshape(len(x), -1)
    if a.shape[1] == 0:
        return [b""] * len(a)
    raw = memoryview(a.view(torch.uint8).numpy()).cast("B")
    n = len(raw) // len(a)
    return [hashlib.blake2b(raw[i * n : (i + 1) * n], digest_size=16).digest() for i in range(len(a))]


def count_overlap(x_train: torch.Tensor, x_test: torch.Tensor) -> int:
    """How many test inputs are byte-for-byte equal to some training input."""
    if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
        return 0
    if not len(x_train) or not len(x_test):
        return 0
    seen = set(_row_digests(x_train))
    return sum(1 for k in _row_digests(x_test) if k in seen)


def _check_overlap(cfg: dict[str, Any], x_tr: torch.Tensor, x_te: torch.Tensor) -> None:
    d = cfg["data"]
    if d.get("allow_test_as_train", False):
        return
    n = count_overlap(x_tr, x_te)
    if n == 0:
        return
    what = (
        f"{n} of the {len(x_te)} test inputs ({100 * n / len(x_te):.1f} %) of data.name {d['name']!r} "
        f"(test_split {d['test_split']!r}) also appear among its {len(x_tr)} training inputs "
        f"(train_split {d['train_split']!r})"
    )
    if n > OVERLAP_TOLERANCE * len(x_te):
        raise ConfigError(
            f"{what}: the test accuracy would be measured partly on training examples; choose disjoint "
            "splits, or set data.allow_test_as_train = true to do this on purpose"
        )
    note(f"{what} (exact duplicates, tolerated below {100 * OVERLAP_TOLERANCE:g} %)")


def _load(spec: str, split: str, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_dataset(spec, split, **kwargs)
    if len(y) == 0:
        raise ValueError(f"data set {spec!r} (split {split!r}) holds no examples; choose another split")
    return x, y


def _subset(n: int, k: int) -> torch.Tensor:
    if k >= n:
        return torch.arange(n)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SUBSET_SEED))
    return perm[:k].sort().values


def _ood(spec: str, kwargs: dict[str, Any], like: torch.Tensor, limit: int, budget: float) -> torch.Tensor:
    """The OOD inputs: ``gaussian-noise`` (standard normal inputs shaped like the test set, seeded)
    or the test split of a ``load_dataset`` spec, subset like the test set."""
    if spec == "gaussian-noise":
        gen = torch.Generator().manual_seed(SUBSET_SEED)
        return torch.randn(like.shape, generator=gen, dtype=torch.float64).to(like.dtype)
    x, _ = _load(spec, "test", kwargs)
    if x.shape[1:] != like.shape[1:]:
        raise ValueError(
            f"OOD set {spec!r} has inputs of shape {tuple(x.shape[1:])}, the test set "
            f"{tuple(like.shape[1:])}; "
            "choose an OOD set of the same input shape"
        )
    return x[_subset(len(x), data_limit(len(x), limit, budget, 100))].to(like.dtype)


def make_noise(labels: torch.Tensor, num_classes: int, d: dict[str, Any], seed: int) -> Any:
    """Label noise of ``data``: ``flip`` (exactly ``round(rate N)`` labels moved to a uniformly drawn
    *other* class), ``uniform`` (each label redrawn from all classes with probability ``rate``) or
    ``asymmetric`` (CIFAR-10 class pairs of Patrini et al. 2017); seeded by ``label_noise_seed``
    (``-1``: the run's seed)."""
    noise_seed = seed if d["label_noise_seed"] < 0 else d["label_noise_seed"]
    mode, rate = d["label_noise_mode"], d["label_noise"]
    if mode == "asymmetric":
        return asymmetric_label_noise(
            labels, rate, "cifar10", num_classes=max(num_classes, 10), seed=noise_seed
        )
    if mode == "uniform":
        return symmetric_label_noise(labels, rate, num_classes, seed=noise_seed, exact=False, target="any")
    return symmetric_label_noise(labels, rate, num_classes, seed=noise_seed, exact=True, target="other")


def prepare_data(cfg: dict[str, Any], seed: int) -> RunData:
    """Load and subset the data of a run, add label noise; every choice from ``cfg`` and ``seed``."""
    d, e, budget = cfg["data"], cfg["evaluation"], float(cfg["budget"])
    kwargs = dict(d["kwargs"])
    if cfg["precision"] == "float64":  # load (and standardise) in double, not float32 cast up
        kwargs.setdefault("dtype", torch.float64)
    x_tr, y_tr = _load(d["name"], d["train_split"], kwargs)
    x_te, y_te = _load(d["name"], d["test_split"], kwargs)
    split_classes = int(max(int(y_tr.max()), int(y_te.max())) + 1)
    tr_idx = _subset(len(y_tr), data_limit(len(y_tr), d["limit_train"], budget, cfg["train"]["batch_size"]))
    te_idx = _subset(len(y_te), data_limit(len(y_te), d["limit_test"], budget, 100))
    x_tr, y_tr, x_te, y_te = x_tr[tr_idx], y_tr[tr_idx], x_te[te_idx], y_te[te_idx]
    _check_overlap(cfg, x_tr, x_te)
    num_classes = int(max(int(y_tr.max()), int(y_te.max())) + 1)
    mk = cfg["model"]["kwargs"]  # a subset may miss the last classes: the model's output size counts
    declared = mk.get("num_classes", (mk.get("sizes") or [0])[-1])
    if isinstance(declared, int) and not isinstance(declared, bool):
        num_classes = max(num_classes, declared)
    noise = None
    if d["label_noise"] > 0:
        noise = make_noise(y_tr, num_classes, d, seed)
    noisy = noise.labels if noise is not None else y_tr
    x_ood = _ood(e["ood"], dict(e["ood_kwargs"]), x_te, d["limit_test"], budget) if e["ood"] else None
    return RunData(
        x_tr, noisy, y_tr, x_te, y_te, num_classes, x_ood, noise, tr_idx, split_classes=split_classes
    )


# ---------------------------------------------------------------------------------- CIFAR-10-C
def corruption_root(spec: str) -> str | None:
    """The directory of ``evaluation.corruptions``: ``DIR``, ``cifar10c:DIR`` or ``cifar10c`` (then
    ``$SHARPSCAPE_DATA``, as ``landscape.data.load_cifar10c``)."""
    name, _, where = spec.partition(":")
    if name.lower().replace("-", "").replace("_", "") == "cifar10c":
        return where or None
    return spec


def corruption_limit(budget: float, limit_test: int) -> int | None:
    """How many of each block's 10,000 images an evaluation uses (``None`` = all)."""
    k = data_limit(10_000, limit_test, budget, 100)
    return None if k >= 10_000 else int(math.ceil(k))
