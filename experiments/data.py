"""The data of one run: training/test sets from the ``landscape.data.load_dataset`` registry, subsets
(``limit`` and ``budget``), symmetric label noise, an OOD set, and CIFAR-10-C.

Label noise and augmentation are implemented here (minimal versions, see :mod:`experiments.augment`)
because the ``landscape.data`` package offers none; both are seeded and device-agnostic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.config import data_limit

__all__ = [
    "CIFAR10C_CORRUPTIONS",
    "CIFAR10C_GROUPS",
    "RunData",
    "load_corruption",
    "prepare_data",
    "symmetric_label_noise",
]

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
CIFAR10C_CORRUPTIONS: tuple[str, ...] = tuple(c for g in CIFAR10C_GROUPS.values() for c in g)
_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))  # as landscape.data's CIFAR-10


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
    noise: dict[str, Any] = field(default_factory=dict)
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


def symmetric_label_noise(
    labels: torch.Tensor, rate: float, num_classes: int, *, mode: str = "flip", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric label noise (van Rooyen et al. 2015), seeded; returns ``(noisy, changed)``.

    * ``mode="flip"``: exactly ``round(rate * N)`` examples (a seeded random choice) get a label drawn
      uniformly from the *other* ``C - 1`` classes, so the share of wrong labels is ``rate``
      (G-TRACER's "50% of examples are incorrectly labeled");
    * ``mode="uniform"``: each label is, with probability ``rate``, replaced by a class drawn
      uniformly from all ``C`` classes (it may stay correct; expected wrong share ``rate (C-1)/C``).

    ``changed`` is the boolean mask of labels that differ from the clean ones.
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"label-noise rate must lie in [0, 1), got {rate}")
    if num_classes < 2:
        raise ValueError(f"label noise needs at least 2 classes, got {num_classes}")
    gen = torch.Generator().manual_seed(int(seed))
    y = labels.clone().long().cpu()
    n = len(y)
    if mode == "flip":
        idx = torch.randperm(n, generator=gen)[: int(round(rate * n))]
        shift = torch.randint(1, num_classes, (len(idx),), generator=gen)
        y[idx] = (y[idx] + shift) % num_classes
    elif mode == "uniform":
        pick = torch.rand(n, generator=gen) < rate
        y[pick] = torch.randint(0, num_classes, (int(pick.sum()),), generator=gen)
    else:
        raise ValueError(f"label-noise mode must be 'flip' or 'uniform', got {mode!r}")
    return y, y != labels.cpu()


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
    noisy, noise = y_tr, {}
    if d["label_noise"] > 0:
        noise_seed = seed if d["label_noise_seed"] < 0 else d["label_noise_seed"]
        noisy, changed = symmetric_label_noise(
            y_tr, d["label_noise"], num_classes, mode=d["label_noise_mode"], seed=noise_seed
        )
        noise = {
            "rate": d["label_noise"],
            "mode": d["label_noise_mode"],
            "seed": noise_seed,
            "changed": int(changed.sum()),
            "changed_fraction": float(changed.float().mean()),
        }
    x_ood = _ood(e["ood"], dict(e["ood_kwargs"]), x_te, d["limit_test"], budget) if e["ood"] else None
    return RunData(x_tr, noisy, y_tr, x_te, y_te, num_classes, x_ood, noise, tr_idx)


# ---------------------------------------------------------------------------------- CIFAR-10-C
def _corruption_root(spec: str) -> Path:
    name, _, where = spec.partition(":")
    root = Path(where or name)
    if not root.is_dir():
        raise FileNotFoundError(
            f"CIFAR-10-C directory {root} does not exist; set evaluation.corruptions to the directory "
            "holding <corruption>.npy and labels.npy (nothing is downloaded)"
        )
    return root


def load_corruption(
    spec: str, corruption: str, severity: int, *, normalize: bool = True, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-10-C (Hendrycks & Dietterich 2019) test images of one corruption and severity.

    ``spec`` is ``DIR`` or ``cifar10-c:DIR`` holding ``<corruption>.npy`` (uint8 ``[50000, 32, 32,
    3]``, severities 1..5 in blocks of 10,000) and ``labels.npy``. Inputs become ``[N, 3, 32, 32]``
    in [0, 1], standardised with the CIFAR-10 training statistics when ``normalize`` (as
    ``landscape.data``'s CIFAR-10). ``limit`` keeps a fixed subset of the 10,000.
    """
    from landscape.data import load_dataset

    try:  # a registry entry, when landscape.data has one, takes precedence
        return load_dataset(spec, "test", corruption=corruption, severity=severity)
    except (ValueError, TypeError):
        pass
    if corruption not in CIFAR10C_CORRUPTIONS:
        raise ValueError(
            f"unknown CIFAR-10-C corruption {corruption!r}; known: {', '.join(CIFAR10C_CORRUPTIONS)}"
        )
    if severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"CIFAR-10-C severity must be 1..5, got {severity!r}")
    root = _corruption_root(spec)
    files = {"images": root / f"{corruption}.npy", "labels": root / "labels.npy"}
    for what, path in files.items():
        if not path.is_file():
            raise FileNotFoundError(
                f"CIFAR-10-C: no {path.name} in {root} (expected the {what} file of the release)"
            )
    images = np.load(files["images"], mmap_mode="r", allow_pickle=False)
    labels = np.load(files["labels"], allow_pickle=False)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ValueError(
            f"{files['images']}: expected uint8 images [N, 32, 32, 3], got {images.dtype} {images.shape}"
        )
    per = len(images) // 5
    if len(labels) != len(images) or per * 5 != len(images):
        raise ValueError(
            f"{root}: {len(images)} images and {len(labels)} labels; expected 5 equal severity blocks"
        )
    lo = (severity - 1) * per
    idx = _subset(per, per if limit is None else min(limit, per)).numpy() + lo
    x = torch.as_tensor(np.asarray(images[idx], dtype=np.float64) / 255.0).permute(0, 3, 1, 2)
    if normalize:
        mean, std = (torch.tensor(s, dtype=torch.float64).view(1, 3, 1, 1) for s in _CIFAR10_STATS)
        x = (x - mean) / std
    return x.float().contiguous(), torch.as_tensor(labels[idx].astype(np.int64))


def corruption_limit(budget: float, limit_test: int) -> int | None:
    """How many of each block's 10,000 images an evaluation uses (``None`` = all)."""
    k = data_limit(10_000, limit_test, budget, 100)
    return None if k >= 10_000 else int(math.ceil(k))
