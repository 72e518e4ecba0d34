"""Area under the ROC curve: general, for out-of-distribution detection, for misclassification detection."""

from __future__ import annotations

from typing import Literal

import torch

from landscape.metrics._checks import SCORES, check_choice, check_pair, check_probs, check_scores_labels
from landscape.metrics._scores import entropy_matrix

Score = Literal["max_prob", "entropy"]


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for telling positives (``labels == 1``) from negatives.

    Computed from ranks as the Mann-Whitney statistic, ``(R_+ - n_+(n_+ + 1)/2) / (n_+ n_-)``
    with ``R_+`` the sum of the positives' ranks (Hanley & McNeil, Radiology 1982, eq. 2): the
    probability that a random positive scores higher than a random negative, ties counted as one
    half. Tied scores get their average rank, which gives the same value as scikit-learn's
    ``roc_auc_score`` (trapezoidal ROC area). 0.5 is chance; higher scores must mean "positive".

    Args:
        scores: ``[N]`` real scores (any real dtype).
        labels: ``[N]`` 0/1 integers or bools; both classes must occur.
    """
    s, y = check_scores_labels(scores, labels)
    return auroc_checked(s, y)


def confidence_score(p: torch.Tensor, score: str) -> torch.Tensor:
    """Per-example confidence, higher = more confident: the max probability or the negative entropy."""
    return p.max(dim=1).values if score == "max_prob" else -entropy_matrix(p)


def ood_auroc(probs_in: torch.Tensor, probs_out: torch.Tensor, score: Score = "max_prob") -> float:
    """AUROC for telling in-distribution from out-of-distribution inputs by predictive confidence.

    In-distribution examples are the positives and the detector score is the confidence: the
    maximum probability for ``score="max_prob"`` (Hendrycks & Gimpel, ICLR 2017), the negative
    predictive entropy for ``score="entropy"``. Because the AUROC is unchanged when both the
    classes and the sign of the score are swapped, the result also equals the AUROC of the
    entropy for detecting the OOD examples as positives. 1 = perfect separation, 0.5 = chance.

    Args:
        probs_in: ``[B_in, C]`` (or ``[B_in]`` binary) probabilities on in-distribution data.
        probs_out: ``[B_out, C]`` (or ``[B_out]``) probabilities on OOD data, same ``C``.
        score: ``"max_prob"`` or ``"entropy"``.
    """
    check_choice(score, "score", SCORES)
    p_in = check_probs(probs_in, "probs_in")
    p_out = check_probs(probs_out, "probs_out")
    return ood_auroc_checked(p_in, p_out, score)


def misclassification_auroc(probs: torch.Tensor, targets: torch.Tensor, score: Score = "max_prob") -> float:
    """AUROC for telling correct from wrong predictions by confidence (Hendrycks & Gimpel, ICLR 2017).

    Correctly classified examples are the positives and the score is the maximum probability
    (``"max_prob"``) or the negative predictive entropy (``"entropy"``): equivalently the AUROC
    of low confidence for flagging the mistakes, the misclassification-detection metric of the
    bSAM evaluation (Möllenhoff & Khan, ICLR 2023). It is undefined, and raises, when every
    prediction is right or every one is wrong.

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
        score: ``"max_prob"`` or ``"entropy"``.
    """
    check_choice(score, "score", SCORES)
    p, t = check_pair(probs, targets)
    correct = p.argmax(dim=1) == t
    if bool(correct.all()) or not bool(correct.any()):
        which = "correct" if bool(correct.all()) else "wrong"
        raise ValueError(
            f"misclassification AUROC needs both correct and wrong predictions, but all {t.numel()} "
            f"predictions are {which}"
        )
    return auroc_checked(confidence_score(p, score), correct.long())


# ------------------------------------------------------------------ on checked float64 tensors


def auroc_checked(s: torch.Tensor, y: torch.Tensor) -> float:
    sorted_s, order = torch.sort(s, stable=True)
    _, inverse, counts = torch.unique_consecutive(sorted_s, return_inverse=True, return_counts=True)
    last = torch.cumsum(counts, 0).to(torch.float64)  # 1-based rank of each tie group's last member
    avg_rank = last - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty_like(s)
    ranks[order] = avg_rank[inverse]
    pos = y == 1
    n_pos = int(pos.sum())
    n_neg = y.numel() - n_pos
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def ood_auroc_checked(p_in: torch.Tensor, p_out: torch.Tensor, score: str) -> float:
    if p_in.shape[1] != p_out.shape[1]:
        raise ValueError(
            f"probs_in and probs_out must have the same number of classes, got {p_in.shape[1]} "
            f"and {p_out.shape[1]}"
        )
    s = torch.cat([confidence_score(p_in, score), confidence_score(p_out, score)])
    y = torch.cat(
        [torch.ones(p_in.shape[0], dtype=torch.int64), torch.zeros(p_out.shape[0], dtype=torch.int64)]
    )
    return auroc_checked(s, y)
