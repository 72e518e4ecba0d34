"""AUROC (general, OOD detection, misclassification detection) against sklearn's roc_auc_score."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import roc_auc_score

from landscape.metrics import auroc, misclassification_auroc, ood_auroc


def test_auroc_hand_example():
    # positives score .35 and .8, negatives .1 and .4: of the four (pos, neg) pairs, three are
    # ordered correctly -> 3/4
    assert auroc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])) == pytest.approx(0.75)
    # a tie between a positive and a negative counts one half: pairs (.5 vs .5) = 1/2, (.9 vs .5) = 1
    assert auroc(torch.tensor([0.5, 0.5, 0.9]), torch.tensor([0, 1, 1])) == pytest.approx(0.75)
    assert auroc(torch.full((6,), 3.0), torch.tensor([0, 1, 0, 1, 1, 0])) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(5))
def test_auroc_matches_sklearn_with_many_ties(seed):
    g = torch.Generator().manual_seed(seed)
    n = 400 + 37 * seed
    scores = torch.randint(0, 8, (n,), generator=g)  # integer scores: many ties
    labels = (torch.rand(n, generator=g) < 0.3 + 0.1 * seed).long()
    ref = roc_auc_score(labels.numpy(), scores.numpy())
    assert auroc(scores, labels) == pytest.approx(ref, abs=1e-12)
    assert auroc(scores.double() + 0.01 * labels, labels.bool()) == pytest.approx(
        roc_auc_score(labels.numpy(), scores.double().numpy() + 0.01 * labels.numpy()), abs=1e-12
    )
    # continuous scores, no ties
    s = torch.randn(n, generator=g, dtype=torch.float64) + labels
    assert auroc(s, labels) == pytest.approx(roc_auc_score(labels.numpy(), s.numpy()), abs=1e-12)


def _probs(n: int, c: int, scale: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(scale * torch.randn(n, c, generator=g, dtype=torch.float64), dim=1)


def test_ood_auroc_in_distribution_is_the_positive_class():
    p_in, p_out = _probs(300, 5, 3.0, 1), _probs(200, 5, 1.0, 2)
    is_in = np.r_[np.ones(300), np.zeros(200)]
    conf = np.concatenate([p_in.max(dim=1).values.numpy(), p_out.max(dim=1).values.numpy()])
    ent = np.concatenate([scipy_entropy(p_in.numpy(), axis=1), scipy_entropy(p_out.numpy(), axis=1)])
    assert ood_auroc(p_in, p_out) == pytest.approx(roc_auc_score(is_in, conf), abs=1e-12)
    # entropy: in-distribution positive with score -H equals OOD positive with score H
    assert ood_auroc(p_in, p_out, score="entropy") == pytest.approx(roc_auc_score(is_in, -ent), abs=1e-12)
    assert ood_auroc(p_in, p_out, score="entropy") == pytest.approx(roc_auc_score(1 - is_in, ent), abs=1e-12)
    assert ood_auroc(p_in, p_out) > 0.7  # the sharper in-distribution predictions are detected
    # swapping the roles gives the complement
    assert ood_auroc(p_out, p_in) == pytest.approx(1 - ood_auroc(p_in, p_out), abs=1e-12)


def test_misclassification_auroc_matches_sklearn():
    p = _probs(500, 4, 2.0, 3)
    g = torch.Generator().manual_seed(4)
    # targets agree with the arg-max more often when the model is confident
    right = torch.rand(500, generator=g, dtype=torch.float64) < p.max(dim=1).values
    y = torch.where(right, p.argmax(dim=1), (p.argmax(dim=1) + 1) % 4)
    correct = (p.argmax(dim=1) == y).numpy()
    conf = p.max(dim=1).values.numpy()
    assert misclassification_auroc(p, y) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)
    ent = scipy_entropy(p.numpy(), axis=1)
    assert misclassification_auroc(p, y, score="entropy") == pytest.approx(
        roc_auc_score(1 - correct, ent), abs=1e-12
    )
    assert misclassification_auroc(p, y) > 0.6


def test_auroc_errors():
    with pytest.raises(ValueError, match="no positive"):
        auroc(torch.rand(5), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="no negative"):
        auroc(torch.rand(5), torch.ones(5, dtype=torch.long))
    with pytest.raises(ValueError, match="same length"):
        auroc(torch.rand(5), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="0 \\(negative\\) or 1"):
        auroc(torch.rand(3), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="labels must be 0/1"):
        auroc(torch.rand(3), torch.tensor([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="NaN or inf"):
        auroc(torch.tensor([0.1, float("nan")]), torch.tensor([0, 1]))
    with pytest.raises(TypeError, match="scores must be a torch.Tensor"):
        auroc([0.1, 0.2], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="score must be one of"):
        ood_auroc(_probs(3, 2, 1.0, 0), _probs(3, 2, 1.0, 1), score="margin")
    with pytest.raises(ValueError, match="same number of classes"):
        ood_auroc(_probs(3, 2, 1.0, 0), _probs(3, 3, 1.0, 1))
    with pytest.raises(ValueError, match="all 2 predictions are correct"):
        misclassification_auroc(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 1]))
