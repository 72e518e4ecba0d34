"""All the metrics of a predictive distribution in one call."""

from __future__ import annotations

import math

import torch

from landscape.metrics._calibration import Binning, curve_matrix
from landscape.metrics._checks import BINNINGS, check_choice, check_n_bins, check_pair, check_probs
from landscape.metrics._ranking import auroc_checked, confidence_score, ood_auroc_checked
from landscape.metrics._scores import brier_matrix, entropy_matrix, true_class_prob
from landscape.metrics._topk import target_rank

#: The keys of :func:`evaluate`'s result without OOD inputs (``OOD_METRIC_NAMES`` come with them).
METRIC_NAMES = (
    "accuracy", "top5_accuracy", "nll", "brier", "ece", "mce", "entropy", "auroc_misclassification",
    "n", "n_bins",
)  # fmt: skip
OOD_METRIC_NAMES = ("auroc_ood_maxprob", "auroc_ood_entropy", "entropy_ood", "n_ood")


def evaluate(
    probs: torch.Tensor,
    targets: torch.Tensor,
    probs_ood: torch.Tensor | None = None,
    n_bins: int = 20,
    binning: Binning = "equal_width",
    eps: float = 1e-12,
) -> dict[str, float | int]:
    """Accuracy, NLL, Brier, ECE, MCE, entropy and the AUROCs of a predictive distribution.

    Returns a flat dict of Python numbers (one row of a results table):

    * ``accuracy``, ``top5_accuracy`` (:func:`top5_accuracy`; 1.0 with five classes or fewer),
      ``nll`` (clamped at ``eps``, see :func:`nll`), ``brier`` (:func:`brier`, ``scale_by_half="auto"``),
      ``ece`` and ``mce`` (:func:`ece` with ``n_bins`` / ``binning``),
      ``entropy`` (mean predictive entropy in nats);
    * ``auroc_misclassification`` (:func:`misclassification_auroc` with the max probability;
      NaN when every prediction is right or every one wrong, where it is undefined);
    * with ``probs_ood``: ``auroc_ood_maxprob`` and ``auroc_ood_entropy`` (:func:`ood_auroc`,
      in-distribution = positive), ``entropy_ood`` (mean entropy on the OOD inputs), ``n_ood``;
    * the configuration: ``n`` (examples) and ``n_bins``.

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
        probs_ood: probabilities on out-of-distribution inputs (same number of classes), or None.
        n_bins, binning: as in :func:`calibration_curve`.
        eps: clamp of the true-class probability in the NLL.
    """
    n_bins = check_n_bins(n_bins)
    check_choice(binning, "binning", BINNINGS)
    p, t = check_pair(probs, targets)
    p_ood = None if probs_ood is None else check_probs(probs_ood, "probs_ood")
    curve = curve_matrix(p, t, n_bins, binning)
    correct = p.argmax(dim=1) == t
    n_right = int(correct.sum())
    out: dict[str, float | int] = {
        "accuracy": n_right / t.numel(),
        "top5_accuracy": float((target_rank(p, t) < 5).double().mean()),
        "nll": float(-torch.log(true_class_prob(p, t).clamp_min(eps)).mean()),
        "brier": brier_matrix(p, t) * (0.5 if p.shape[1] == 2 else 1.0),
        "ece": curve.calibration_error("l1"),
        "mce": curve.calibration_error("max"),
        "entropy": float(entropy_matrix(p).mean()),
        "auroc_misclassification": (
            auroc_checked(confidence_score(p, "max_prob"), correct.long())
            if 0 < n_right < t.numel()
            else math.nan
        ),
    }
    if p_ood is not None:
        out["auroc_ood_maxprob"] = ood_auroc_checked(p, p_ood, "max_prob")
        out["auroc_ood_entropy"] = ood_auroc_checked(p, p_ood, "entropy")
        out["entropy_ood"] = float(entropy_matrix(p_ood).mean())
        out["n_ood"] = p_ood.shape[0]
    out["n"] = t.numel()
    out["n_bins"] = n_bins
    return out
