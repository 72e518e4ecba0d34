"""Top-k accuracy: the share of examples whose target is among the ``k`` highest-scored classes.

ImageNet's "top-5 error" (Russakovsky et al., IJCV 2015, Sec. 4.1: an image counts as correct
when the true label is among the five predicted labels) and the Top-5 rows of Fisher-SAM's Table 2
(Kim et al., ICML 2022) use this measure with ``k = 5``.

Ties are broken as :func:`landscape.metrics.accuracy` breaks them (``argmax``: the lower class
index wins), so ``topk_accuracy(scores, y, 1) == accuracy(scores.softmax(1), y)``: the rank of the
target is the number of classes scored strictly higher plus the number of lower-indexed classes
scored the same, and the example counts when that rank is below ``k``. Any monotone map of the
scores (logits, probabilities, log-probabilities) gives the same value.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["top5_accuracy", "topk_accuracy"]


def _check_scores_targets(scores: Any, targets: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores`` -> float64 ``[B, C]`` (finite), ``targets`` -> int64 ``[B]`` in ``[0, C)``."""
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        got = scores.dtype if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise TypeError(
            f"scores must be a floating torch.Tensor [B, C] of logits or probabilities, got {got}"
        )
    if scores.dim() != 2 or scores.shape[0] == 0:
        raise ValueError(
            f"scores must be a non-empty [B, C] matrix (one row of class scores per example), got "
            f"shape {tuple(scores.shape)}"
        )
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.is_complex():
        got = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(f"targets must be a torch.Tensor of integer class labels, got {got}; use .long()")
    n, c = scores.shape
    if tuple(targets.shape) != (n,):
        raise ValueError(
            f"targets must have shape [{n}] (one label per row of scores), got {tuple(targets.shape)}"
        )
    s = scores.detach().to(device="cpu", dtype=torch.float64)
    finite = torch.isfinite(s).all(dim=1)
    if not bool(finite.all()):
        raise ValueError(f"scores contain NaN or inf (first at example {int((~finite).nonzero()[0, 0])})")
    t = targets.detach().to(device="cpu", dtype=torch.int64)
    bad = (t < 0) | (t >= c)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"targets must be class labels in [0, {c}); example {i} has label {int(t[i])}")
    return s, t


def target_rank(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """0-based rank of each target in its row of checked scores ``s`` (ties: lower index first)."""
    target_score = s.gather(1, t.reshape(-1, 1))
    higher = (s > target_score).sum(dim=1)
    lower_index = torch.arange(s.shape[1]).reshape(1, -1) < t.reshape(-1, 1)
    tied_before = ((s == target_score) & lower_index).sum(dim=1)
    return higher + tied_before


def topk_accuracy(scores: torch.Tensor, targets: torch.Tensor, k: int) -> float:
    """Fraction of examples whose target is among the ``k`` highest-scored classes.

    Args:
        scores: ``[B, C]`` logits, probabilities or any monotone transform of them.
        targets: ``[B]`` integer labels in ``[0, C)``.
        k: a positive int; ``k >= C`` counts every example (value 1.0).

    The reference is scikit-learn's ``top_k_accuracy_score`` (equal where there are no ties;
    scikit-learn breaks ties toward the higher class index, this function toward the lower one,
    as ``argmax`` and :func:`landscape.metrics.accuracy` do).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int (e.g. 5 for top-5 accuracy), got {k!r}")
    s, t = _check_scores_targets(scores, targets)
    return float((target_rank(s, t) < k).double().mean())


def top5_accuracy(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """:func:`topk_accuracy` with ``k = 5`` (ImageNet's top-5 measure; 1.0 with five classes or fewer)."""
    return topk_accuracy(scores, targets, 5)
