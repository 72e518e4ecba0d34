"""Seeded synthetic label noise: symmetric and asymmetric (class-pair) flips, returned with the mask
of the flipped labels so a run can save exactly which examples were corrupted.

Symmetric noise, the convention followed here: a fraction ``rate`` of the labels is chosen and
each chosen label is replaced by a class drawn uniformly from the ``C - 1`` **other** classes, so
exactly that fraction ends up wrong. This is the reading of the papers whose tables this toolkit
reproduces: G-TRACER (CIFAR-100, "randomly flip 50% of the labels so that 50% of examples are
incorrectly labeled") and Fisher SAM (Kim et al. 2022, Sec. 5.5 / Table 4: "symmetric label noise
by random flipping with corruption levels 20, 40, 60, and 80%", after van Rooyen et al. 2015,
where a flip always changes the label). ``target="any"`` gives the other common convention
(Zhang et al. 2017): the chosen labels are redrawn uniformly from all ``C`` classes, so about
``rate * (C - 1) / C`` of them change.

Asymmetric noise (Patrini et al. 2017, CIFAR-10): within each source class a fraction ``rate``
is moved to a fixed target class: truck -> automobile, bird -> airplane, deer -> horse,
cat <-> dog (:data:`CIFAR10_ASYMMETRIC`); any ``{source: target}`` mapping works.

``exact=True`` (default) chooses exactly ``round(rate * n)`` examples (round half up; per source
class for asymmetric noise) without replacement; ``exact=False`` flips each eligible example
independently with probability ``rate``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from landscape.results import Result

__all__ = [
    "CIFAR10_ASYMMETRIC",
    "CIFAR10_CLASSES",
    "NoisyLabels",
    "asymmetric_label_noise",
    "symmetric_label_noise",
]

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
# Patrini et al. 2017, Sec. 5: TRUCK -> AUTOMOBILE, BIRD -> AIRPLANE, DEER -> HORSE, CAT <-> DOG
CIFAR10_ASYMMETRIC: dict[int, int] = {9: 1, 2: 0, 4: 7, 3: 5, 5: 3}


@dataclass
class NoisyLabels(Result):
    """Noisy labels, the clean ones and the mask of the changed ones (``labels != clean``).

    At run time ``labels`` / ``clean`` are int64 tensors and ``flipped`` a bool tensor; the file
    written by :meth:`save` holds them as lists, and :func:`landscape.results.load_result` reads
    them back. ``config`` records the noise model, rate and seed.
    """

    labels: list[int] = field(default_factory=list)
    clean: list[int] = field(default_factory=list)
    flipped: list[bool] = field(default_factory=list)

    kind: ClassVar[str] = "label_noise"

    def __post_init__(self) -> None:
        self.labels = torch.as_tensor(self.labels, dtype=torch.int64)
        self.clean = torch.as_tensor(self.clean, dtype=torch.int64)
        self.flipped = torch.as_tensor(self.flipped, dtype=torch.bool)
        if not self.labels.shape == self.clean.shape == self.flipped.shape:
            raise ValueError(
                f"NoisyLabels: labels, clean and flipped differ in shape: {tuple(self.labels.shape)}, "
                f"{tuple(self.clean.shape)}, {tuple(self.flipped.shape)}"
            )
        if not torch.equal(self.flipped, self.labels != self.clean):
            raise ValueError("NoisyLabels: flipped must mark exactly the labels that differ from clean")

    @property
    def realised_rate(self) -> float:
        """Fraction of labels that differ from the clean ones."""
        return float(self.flipped.double().mean()) if self.flipped.numel() else 0.0


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def _check_labels(labels: Any, num_classes: int | None) -> torch.Tensor:
    if isinstance(labels, torch.Tensor):
        t = labels.detach().cpu()
    else:
        arr = np.asarray(labels)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"labels must be integers, got an array of {arr.dtype}")
        t = torch.as_tensor(arr)
    if t.ndim != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"labels must be a 1-D integer tensor, got {t.dtype} of shape {tuple(t.shape)}")
    t = t.to(torch.int64)
    if num_classes is not None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= num_classes):
            bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
            raise ValueError(f"label {bad} outside the {num_classes} classes 0..{num_classes - 1}")
    return t


def _check_rate(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"noise rate must be a number in [0, 1] (fraction of labels), got {rate!r}")
    return float(rate)


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return torch.Generator().manual_seed(int(seed))


def _choose(candidates: torch.Tensor, rate: float, exact: bool, gen: torch.Generator) -> torch.Tensor:
    """Indices (into the data set) of the examples to corrupt among ``candidates``."""
    if exact:
        k = _round_half_up(rate * len(candidates))
        return candidates[torch.randperm(len(candidates), generator=gen)[:k]]
    return candidates[torch.rand(len(candidates), generator=gen) < rate]


def symmetric_label_noise(
    labels: Any,
    rate: float,
    num_classes: int,
    *,
    seed: int = 0,
    exact: bool = True,
    target: str = "other",
) -> NoisyLabels:
    """Replace a fraction ``rate`` of ``labels`` by uniformly random other classes (see the
    module docstring for the convention and ``target="any"``).

    Returns:
        :class:`NoisyLabels` with ``labels`` (noisy, int64), ``clean``, ``flipped`` (bool mask)
        and ``config``, on the device of ``labels`` (the draws are made on the CPU, so a seed
        gives the same noise on every device); with ``exact=True`` and ``target="other"``,
        ``flipped.sum()`` equals ``round(rate * N)``.
    """
    rate = _check_rate(rate)
    clean = _check_labels(labels, num_classes)
    device = labels.device if isinstance(labels, torch.Tensor) else torch.device("cpu")
    if target not in ("other", "any"):
        raise ValueError(f"target must be 'other' (a different class) or 'any' (any class), got {target!r}")
    gen = _generator(seed)
    chosen = _choose(torch.arange(len(clean)), rate, exact, gen)
    noisy = clean.clone()
    if target == "other":  # clean + U{1..C-1} mod C: uniform over the C - 1 other classes
        shift = torch.randint(1, num_classes, (len(chosen),), generator=gen)
        noisy[chosen] = (clean[chosen] + shift) % num_classes
    else:
        noisy[chosen] = torch.randint(0, num_classes, (len(chosen),), generator=gen)
    config = {"noise": "symmetric", "rate": rate, "num_classes": num_classes, "seed": seed,
              "exact": exact, "target": target}  # fmt: skip
    noisy, clean = noisy.to(device), clean.to(device)
    return NoisyLabels(labels=noisy, clean=clean, flipped=noisy != clean, config=config)


def asymmetric_label_noise(
    labels: Any,
    rate: float,
    mapping: str | Mapping[int, int] = "cifar10",
    *,
    num_classes: int | None = None,
    seed: int = 0,
    exact: bool = True,
) -> NoisyLabels:
    """Move a fraction ``rate`` of each source class of ``mapping`` to its target class.

    ``mapping="cifar10"`` is :data:`CIFAR10_ASYMMETRIC` (10 classes); otherwise a
    ``{source: target}`` dict of class indices (or the ``[[source, target], ...]`` list stored in
    a result's ``config``; sources are chosen among the *clean* labels, so
    cat <-> dog swaps never undo each other). With ``exact=True`` exactly
    ``round(rate * n_c)`` examples of each source class ``c`` change.
    """
    rate = _check_rate(rate)
    if isinstance(mapping, (list, tuple)):  # the [[source, target], ...] form stored in a config
        mapping = _as_pairs(mapping)
    if isinstance(mapping, str):
        if mapping.lower().replace("-", "") != "cifar10":
            raise ValueError(
                f"unknown asymmetric mapping {mapping!r}: use 'cifar10' or a {{source: target}} dict"
            )
        mapping, num_classes = CIFAR10_ASYMMETRIC, num_classes or 10
    if not isinstance(mapping, Mapping) or not mapping:
        raise TypeError(
            f"mapping must be a non-empty {{source: target}} dict of class indices, got {mapping!r}"
        )
    pairs = sorted((int(s), int(t)) for s, t in mapping.items())
    clean = _check_labels(labels, num_classes)
    device = labels.device if isinstance(labels, torch.Tensor) else torch.device("cpu")
    limit = num_classes if num_classes is not None else int(clean.max()) + 1 if clean.numel() else 0
    for s, t in pairs:
        if s == t or min(s, t) < 0 or (num_classes is not None and max(s, t) >= num_classes):
            raise ValueError(
                f"mapping {s} -> {t}: source and target must be different classes in 0..{max(limit - 1, 0)}"
            )
    gen = _generator(seed)
    noisy = clean.clone()
    for s, t in pairs:
        chosen = _choose(torch.nonzero(clean == s).flatten(), rate, exact, gen)
        noisy[chosen] = t
    config = {"noise": "asymmetric", "rate": rate, "mapping": [list(p) for p in pairs],
              "num_classes": num_classes, "seed": seed, "exact": exact}  # fmt: skip
    noisy, clean = noisy.to(device), clean.to(device)
    return NoisyLabels(labels=noisy, clean=clean, flipped=noisy != clean, config=config)


def _as_pairs(mapping: Sequence[Sequence[int]]) -> dict[int, int]:
    """A mapping stored in a config (list of ``[source, target]``) back to a dict."""
    if any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in mapping):
        raise TypeError(f"a mapping given as a list must hold [source, target] pairs, got {mapping!r}")
    return {int(s): int(t) for s, t in mapping}
