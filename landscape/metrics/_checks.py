"""Input checks shared by every metric: predictive probabilities, integer targets, scores, labels.

Everything is converted to float64 on the CPU (metrics are cheap and float64 keeps sums exact
enough for 10^6 examples), never modified in place: the caller's tensors stay untouched.
"""

from __future__ import annotations

from typing import Any

import torch

#: How far a row of ``probs`` may sum from one (float32 softmax over many classes is off by ~1e-6).
SUM_TOL = 1e-3

SCORES = ("max_prob", "entropy")
BINNINGS = ("equal_width", "equal_mass")
NORMS = ("l1", "l2", "max")


def _type_name(x: Any) -> str:
    return type(x).__name__


def probs_shape(probs: Any, name: str = "probs") -> tuple[torch.Tensor, bool]:
    """Type and shape of ``probs``: a float64 CPU copy (``[B]`` or ``[B, C]``) and whether it is binary."""
    if not isinstance(probs, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of probabilities, got {_type_name(probs)}; "
            "convert it with torch.as_tensor(...)"
        )
    if not probs.is_floating_point():
        raise TypeError(
            f"{name} must hold floating-point probabilities, got dtype {probs.dtype}; "
            "pass e.g. logits.softmax(dim=1)"
        )
    p = probs.detach().to(device="cpu", dtype=torch.float64)
    binary = p.dim() == 1 or (p.dim() == 2 and p.shape[1] == 1)
    if binary:
        p = p.reshape(-1)
    elif p.dim() != 2:
        raise ValueError(
            f"{name} must be [B, C] class probabilities or [B] probabilities of class 1 "
            f"(binary), got shape {tuple(probs.shape)}"
        )
    if p.shape[0] == 0:
        raise ValueError(f"{name} is empty: it has no examples (shape {tuple(probs.shape)})")
    return p, binary


def probs_values(p: torch.Tensor, binary: bool, name: str = "probs") -> torch.Tensor:
    """Value checks on the output of :func:`probs_shape`; returns the ``[B, C]`` matrix (binary -> C = 2)."""
    finite = torch.isfinite(p) if binary else torch.isfinite(p).all(dim=1)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0, 0])
        raise ValueError(f"{name} contains NaN or inf (first at example {i})")
    if bool((p < 0).any()):
        raise ValueError(
            f"{name} has negative entries (minimum {float(p.min()):.4g}); pass probabilities "
            "(e.g. logits.softmax(dim=1)), not logits"
        )
    if binary:
        if bool((p > 1).any()):
            raise ValueError(
                f"binary {name} (shape [B]: the probability of class 1) must lie in [0, 1], "
                f"maximum is {float(p.max()):.4g}; pass torch.sigmoid(logits), not logits"
            )
        return torch.stack([1.0 - p, p], dim=1)
    dev = (p.sum(dim=1) - 1.0).abs()
    if bool((dev > SUM_TOL).any()):
        i = int(dev.argmax())
        raise ValueError(
            f"each row of {name} must sum to 1 (within {SUM_TOL:g}); row {i} sums to "
            f"{float(p[i].sum()):.6g}. Pass probabilities (e.g. logits.softmax(dim=1)), "
            "not logits or unnormalised scores"
        )
    return p


def check_probs(probs: Any, name: str = "probs") -> torch.Tensor:
    """``probs`` -> float64 ``[B, C]`` matrix of checked probabilities."""
    p, binary = probs_shape(probs, name)
    return probs_values(p, binary, name)


def check_pair(probs: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``probs`` (float64 ``[B, C]``) and ``targets`` (int64 ``[B]``, labels in ``[0, C)``).

    Shapes are checked before values, so a shape mismatch is reported as such.
    """
    p, binary = probs_shape(probs)
    n = p.shape[0]
    if not isinstance(targets, torch.Tensor):
        raise TypeError(
            f"targets must be a torch.Tensor of integer class labels, got {_type_name(targets)}; "
            "convert it with torch.as_tensor(..., dtype=torch.long)"
        )
    if targets.is_floating_point() or targets.is_complex():
        raise TypeError(
            f"targets must hold integer class labels, got dtype {targets.dtype}; use targets.long()"
        )
    if targets.dim() == 2 and targets.shape[0] == n and not binary and targets.shape[1] == p.shape[1] > 1:
        raise ValueError(
            f"targets must have shape [{n}] (class indices), got {tuple(targets.shape)}, which looks "
            "one-hot; pass targets.argmax(dim=1)"
        )
    if tuple(targets.shape) != (n,):
        raise ValueError(
            f"targets must have shape [{n}] (one label per row of probs), got {tuple(targets.shape)}"
        )
    p = probs_values(p, binary)
    t = targets.detach().to(device="cpu", dtype=torch.int64)
    n_classes = p.shape[1]
    bad = (t < 0) | (t >= n_classes)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        hint = " (binary probs of shape [B] need labels 0/1)" if binary else ""
        raise ValueError(
            f"targets must be class labels in [0, {n_classes}){hint}; example {i} has label {int(t[i])}"
        )
    return p, t


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value


def check_n_bins(n_bins: Any) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive int (e.g. 20), got {n_bins!r}")
    return n_bins


def check_scores_labels(scores: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (real, finite, ``[N]``) and binary labels (``[N]``, 0/1 or bool) for a ROC analysis."""
    for name, x in (("scores", scores), ("labels", labels)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch.Tensor, got {_type_name(x)}; convert it with torch.as_tensor(...)"
            )
    if scores.is_complex() or scores.dtype == torch.bool:
        raise TypeError(f"scores must be real numbers, got dtype {scores.dtype}")
    if labels.is_floating_point() or labels.is_complex():
        raise TypeError(f"labels must be 0/1 integers or bool, got dtype {labels.dtype}; use labels.long()")
    if scores.dim() != 1 or tuple(labels.shape) != tuple(scores.shape):
        raise ValueError(
            f"scores and labels must be 1-D of the same length, got shapes {tuple(scores.shape)} "
            f"and {tuple(labels.shape)}"
        )
    s = scores.detach().to(device="cpu", dtype=torch.float64)
    y = labels.detach().to(device="cpu", dtype=torch.int64)
    if not bool(torch.isfinite(s).all()):
        i = int((~torch.isfinite(s)).nonzero()[0, 0])
        raise ValueError(f"scores contain NaN or inf (first at index {i})")
    if bool(((y != 0) & (y != 1)).any()):
        raise ValueError(
            f"labels must be 0 (negative) or 1 (positive), found {sorted(set(y.tolist()) - {0, 1})}"
        )
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == y.numel():
        which = "positive (1)" if n_pos == 0 else "negative (0)"
        raise ValueError(f"AUROC needs both classes, but there is no {which} example among {y.numel()}")
    return s, y
