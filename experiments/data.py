"""The data of one run: training/test sets from the ``landscape.data.load_dataset`` registry, subsets
(``limit`` and ``budget``), label noise (``landscape.data.symmetric_label_noise`` /
``asymmetric_label_noise``), an OOD set, and CIFAR-10-C (``landscape.data.load_cifar10c``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from experiments.config import data_limit

__all__ = ["CIFAR10C_GROUPS", "RunData", "corruption_root", "make_noise", "prepare_data"]

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


def _load(spec: str, split: str, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    from landscape.data import load_dataset

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
    from landscape.data import asymmetric_label_noise, symmetric_label_noise

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
    tr_idx = _subset(len(y_tr), data_limit(len(y_tr), d["limit_train"], budget, cfg["train"]["batch_size"]))
    te_idx = _subset(len(y_te), data_limit(len(y_te), d["limit_test"], budget, 100))
    x_tr, y_tr, x_te, y_te = x_tr[tr_idx], y_tr[tr_idx], x_te[te_idx], y_te[te_idx]
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
    return RunData(x_tr, noisy, y_tr, x_te, y_te, num_classes, x_ood, noise, tr_idx)


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
