"""Top-k accuracy (landscape.metrics.topk_accuracy / top5_accuracy and the ``top5_accuracy`` key of
evaluate()). References: scikit-learn's top_k_accuracy_score and counts by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import top_k_accuracy_score

from landscape.metrics import METRIC_NAMES, accuracy, evaluate, top5_accuracy, topk_accuracy


def test_topk_matches_sklearn_on_random_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 12, generator=g, dtype=torch.float64)  # continuous: no ties
    y = torch.randint(0, 12, (300,), generator=g)
    for k in (1, 2, 5, 11):
        ref = top_k_accuracy_score(y.numpy(), logits.numpy(), k=k, labels=np.arange(12))
        assert topk_accuracy(logits, y, k) == pytest.approx(ref, abs=1e-15)
    assert topk_accuracy(logits, y, 12) == 1.0  # k = C: every target is among the top C
    # probabilities and logits rank the classes alike
    assert top5_accuracy(logits.softmax(1), y) == topk_accuracy(logits, y, 5)
    assert topk_accuracy(logits, y, 1) == accuracy(logits.softmax(1), y)


def test_topk_hand_count_with_ties():
    scores = torch.tensor(
        [
            [0.9, 0.5, 0.5, 0.1],  # target 2: 0.9 higher, class 1 tied and lower-indexed -> rank 2
            [0.2, 0.2, 0.2, 0.2],  # target 0: all tied, lowest index -> rank 0
            [0.2, 0.2, 0.2, 0.2],  # target 3: rank 3
            [0.1, 0.7, 0.3, 0.3],  # target 3: 0.7 higher, class 2 tied lower -> rank 2
        ]
    )
    y = torch.tensor([2, 0, 3, 3])
    # ranks 2, 0, 3, 2 -> top-1: 1/4, top-2: 1/4, top-3: 3/4, top-4: 1
    assert [topk_accuracy(scores, y, k) for k in (1, 2, 3, 4)] == [0.25, 0.25, 0.75, 1.0]
    assert topk_accuracy(scores, y, 1) == accuracy(scores / scores.sum(1, keepdim=True), y)
    assert top5_accuracy(scores, y) == 1.0  # four classes: every target is among the top 5


def test_evaluate_reports_top5_and_metric_names():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(2 * torch.randn(200, 10, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, 10, (200,), generator=g)
    out = evaluate(probs, y)
    ref = top_k_accuracy_score(y.numpy(), probs.numpy(), k=5, labels=np.arange(10))
    assert out["top5_accuracy"] == pytest.approx(ref, abs=1e-15)
    assert tuple(out) == METRIC_NAMES  # METRIC_NAMES lists exactly the keys (config validation uses it)
    # binary [B] probabilities: two classes, top-5 counts everything
    assert evaluate(torch.tensor([0.2, 0.9]), torch.tensor([1, 0]))["top5_accuracy"] == 1.0


@pytest.mark.parametrize(
    ("scores", "targets", "k", "match"),
    [
        (torch.zeros(3, 4), torch.tensor([0, 1, 2]), 0, "k must be a positive int"),
        (torch.zeros(3, 4), torch.tensor([0, 1, 4]), 1, r"labels in \[0, 4\); example 2 has label 4"),
        (torch.zeros(3, 4), torch.tensor([0, 1]), 1, r"must have shape \[3\]"),
        (torch.zeros(4), torch.tensor([0, 1, 0, 1]), 1, r"\[B, C\] matrix"),
        (torch.tensor([[0.0, float("nan")]]), torch.tensor([0]), 1, "NaN or inf"),
    ],
)
def test_topk_rejects_bad_input(scores, targets, k, match):
    with pytest.raises(ValueError, match=match):
        topk_accuracy(scores, targets, k)
    with pytest.raises(TypeError, match="integer class labels"):
        topk_accuracy(torch.zeros(2, 3), torch.zeros(2), 1)
