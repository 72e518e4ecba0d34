"""Classification metrics for predictive probabilities: accuracy, NLL and expected calibration error.

``probs`` is ``[B, C]`` (rows sum to one) or ``[B]`` / ``[B, 1]`` (probability of class 1 for a
binary problem, turned into ``[1 - p, p]``); ``targets`` are integer class labels ``[B]``.
"""

from __future__ import annotations

import torch

__all__ = ["accuracy", "nll", "ece"]


def _as_matrix(probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    if not isinstance(probs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("probs and targets must be tensors")
    if probs.dim() == 1 or (probs.dim() == 2 and probs.shape[1] == 1):
        p = probs.reshape(-1)
        probs = torch.stack([1 - p, p], dim=1)
    if probs.dim() != 2:
        raise ValueError(f"probs must be [B, C] (or [B] for binary), got shape {tuple(probs.shape)}")
    if targets.shape != (probs.shape[0],):
        raise ValueError(f"targets must have shape [{probs.shape[0]}], got {tuple(targets.shape)}")
    if probs.shape[0] == 0:
        raise ValueError("empty batch: probs has no rows")
    return probs


def accuracy(probs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of examples whose arg-max class equals the target."""
    probs = _as_matrix(probs, targets)
    return float((probs.argmax(dim=1) == targets).double().mean())


def nll(probs: torch.Tensor, targets: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``-1/B sum_i log p_i[y_i]`` (probabilities clamped at ``eps``)."""
    probs = _as_matrix(probs, targets)
    p_true = probs.gather(1, targets.reshape(-1, 1).long()).reshape(-1)
    return float(-torch.log(p_true.clamp_min(eps)).double().mean())


def ece(probs: torch.Tensor, targets: torch.Tensor, n_bins: int = 15) -> float:
    """Expected calibration error with ``n_bins`` equal-width confidence bins (Guo et al. 2017, eq. 3).

    ``ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)|`` with confidence the maximum probability; bin
    ``b`` holds confidences in ``((b-1)/n_bins, b/n_bins]`` (a confidence of exactly 0 goes to the
    first bin).  15 bins as in Guo et al. (2017) and the bSAM paper.
    """
    if not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive int, got {n_bins!r}")
    probs = _as_matrix(probs, targets)
    conf, pred = probs.double().max(dim=1)
    correct = (pred == targets).double()
    idx = torch.clamp(torch.ceil(conf * n_bins).long() - 1, 0, n_bins - 1)
    total = 0.0
    n = conf.numel()
    for b in range(n_bins):
        mask = idx == b
        cnt = int(mask.sum())
        if cnt:
            total += cnt / n * abs(float(correct[mask].mean()) - float(conf[mask].mean()))
    return total
