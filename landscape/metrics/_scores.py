"""Proper scores and summaries of a predictive distribution: accuracy, NLL, Brier score, entropy."""

from __future__ import annotations

from typing import Literal

import torch

from landscape.metrics._checks import check_choice, check_pair, check_probs


def accuracy(probs: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of examples whose arg-max class equals the target (ties go to the lower class index).

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
    """
    p, t = check_pair(probs, targets)
    return float((p.argmax(dim=1) == t).double().mean())


def nll(probs: torch.Tensor, targets: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``-1/B sum_i log p_i[y_i]`` in nats.

    The probability of the true class is clamped at ``eps`` so that a confident mistake gives a
    large finite value rather than ``inf`` (scikit-learn's ``log_loss`` clips in the same way).
    """
    if not isinstance(eps, float) or not 0.0 <= eps < 1.0:
        raise ValueError(f"eps must be a float in [0, 1), got {eps!r}")
    p, t = check_pair(probs, targets)
    return float(-torch.log(true_class_prob(p, t).clamp_min(eps)).mean())


def brier(
    probs: torch.Tensor, targets: torch.Tensor, scale_by_half: bool | Literal["auto"] = "auto"
) -> float:
    """Brier score, ``1/B sum_i sum_c (p_ic - [y_i = c])^2`` (Brier 1950, the multi-class form).

    This sum over classes lies in ``[0, 2]``. For two classes it equals twice the familiar binary
    score ``1/B sum_i (p_i - y_i)^2`` of the probability of class 1, which lies in ``[0, 1]``.
    ``scale_by_half`` follows scikit-learn's ``brier_score_loss`` (version 1.7 and later):
    ``"auto"`` halves the sum for two classes only, whether ``probs`` is ``[B]`` or ``[B, 2]``,
    so binary problems give ``brier_score_loss`` and multi-class ones the full sum; ``True`` /
    ``False`` always / never halve it.

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
        scale_by_half: ``"auto"``, ``True`` or ``False`` (see above).
    """
    if scale_by_half not in ("auto", True, False):
        raise ValueError(f"scale_by_half must be 'auto', True or False, got {scale_by_half!r}")
    p, t = check_pair(probs, targets)
    half = p.shape[1] == 2 if scale_by_half == "auto" else bool(scale_by_half)
    return brier_matrix(p, t) * (0.5 if half else 1.0)


def predictive_entropy(
    probs: torch.Tensor, reduction: Literal["none", "mean"] = "none"
) -> torch.Tensor | float:
    """Entropy ``H(p_i) = -sum_c p_ic log p_ic`` of each predictive distribution, in nats.

    ``0 log 0 = 0``. For a Bayesian model average, pass the averaged probabilities: this is then
    the total predictive uncertainty (Shannon 1948; e.g. Depeweg et al., ICML 2018, eq. 5).

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        reduction: ``"none"`` returns a float64 ``[B]`` tensor, ``"mean"`` its mean as a float.
    """
    check_choice(reduction, "reduction", ("none", "mean"))
    h = entropy_matrix(check_probs(probs))
    return float(h.mean()) if reduction == "mean" else h


# ------------------------------------------------------------------ on checked float64 matrices


def true_class_prob(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return p.gather(1, t.reshape(-1, 1)).reshape(-1)


def brier_matrix(p: torch.Tensor, t: torch.Tensor) -> float:
    onehot = torch.nn.functional.one_hot(t, p.shape[1]).to(p.dtype)
    return float(((p - onehot) ** 2).sum(dim=1).mean())


def entropy_matrix(p: torch.Tensor) -> torch.Tensor:
    return -torch.special.xlogy(p, p).sum(dim=1)
