"""landscape.metrics scores (accuracy, NLL, Brier, entropy), input checks and evaluate().

References: values computed by hand, scikit-learn (log_loss, brier_score_loss, roc_auc_score)
and scipy.stats.entropy.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from landscape import metrics
from landscape.metrics import accuracy, brier, ece, evaluate, nll, predictive_entropy


def _random_probs(n: int, c: int, seed: int, scale: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(scale * torch.randn(n, c, generator=g, dtype=torch.float64), dim=1)
    return probs, torch.randint(0, c, (n,), generator=g)


def test_metrics_hand_computed():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.5, 0.4], [0.3, 0.3, 0.4], [0.05, 0.9, 0.05]])
    y = torch.tensor([0, 2, 2, 1])
    assert accuracy(probs, y) == pytest.approx(3 / 4)
    assert nll(probs, y) == pytest.approx(
        -(math.log(0.7) + math.log(0.4) + math.log(0.4) + math.log(0.9)) / 4
    )
    # 15 bins of width 1/15: conf 0.7 -> bin 10 (0.6667, 0.7333], 0.5 -> bin 7, 0.4 -> bin 5, 0.9 -> bin 13
    # every bin holds one example: ECE = mean |correct - conf|
    expected = (abs(1 - 0.7) + abs(0 - 0.5) + abs(1 - 0.4) + abs(1 - 0.9)) / 4
    assert ece(probs, y, n_bins=15) == pytest.approx(expected)
    # two bins: (0, .5] holds 0.5, 0.4 (acc 1/2, conf .45); (.5, 1] holds 0.7, 0.9 (acc 1, conf .8)
    assert ece(probs, y, n_bins=2) == pytest.approx(0.5 * abs(0.5 - 0.45) + 0.5 * abs(1 - 0.8))
    # Brier by hand: sum_c (p_c - onehot_c)^2 per row, then the mean
    rows = [
        0.3**2 + 0.2**2 + 0.1**2,
        0.1**2 + 0.5**2 + 0.6**2,
        0.3**2 + 0.3**2 + 0.6**2,
        0.05**2 + 0.1**2 + 0.05**2,
    ]
    assert brier(probs, y) == pytest.approx(sum(rows) / 4)
    # entropy of [0.7, 0.2, 0.1] by hand
    h0 = -(0.7 * math.log(0.7) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1))
    assert float(predictive_entropy(probs)[0]) == pytest.approx(h0, rel=1e-6)


def test_binary_probs_and_module_access():
    p = torch.tensor([0.8, 0.3, 0.6])
    y = torch.tensor([1, 0, 0])
    assert metrics.accuracy(p, y) == pytest.approx(2 / 3)
    assert metrics.nll(p, y) == pytest.approx(-(math.log(0.8) + math.log(0.7) + math.log(0.4)) / 3)
    assert metrics.ece(p, y, n_bins=1) == pytest.approx(abs(2 / 3 - (0.8 + 0.7 + 0.6) / 3))
    # [B, 1] is the same binary problem as [B]
    assert metrics.ece(p[:, None], y, n_bins=1) == pytest.approx(abs(2 / 3 - (0.8 + 0.7 + 0.6) / 3))


def test_nll_matches_sklearn_log_loss():
    probs, y = _random_probs(300, 6, seed=1)
    assert nll(probs, y) == pytest.approx(
        log_loss(y.numpy(), probs.numpy(), labels=list(range(6))), rel=1e-12
    )
    p1 = torch.rand(200, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.98 + 0.01
    y1 = (torch.rand(200, generator=torch.Generator().manual_seed(3)) < 0.5).long()
    assert nll(p1, y1) == pytest.approx(log_loss(y1.numpy(), p1.numpy()), rel=1e-12)


def test_brier_matches_sklearn_binary_and_multiclass():
    g = torch.Generator().manual_seed(4)
    p1 = torch.rand(500, generator=g, dtype=torch.float64)
    y1 = torch.randint(0, 2, (500,), generator=g)
    ref = brier_score_loss(y1.numpy(), p1.numpy())  # mean (p - y)^2
    assert brier(p1, y1) == pytest.approx(ref, rel=1e-12)
    both = torch.stack([1 - p1, p1], dim=1)
    assert brier(both, y1) == pytest.approx(ref, rel=1e-12)  # "auto": [B, 2] also halved
    assert brier(p1, y1, scale_by_half=False) == pytest.approx(2 * ref, rel=1e-12)
    probs, y = _random_probs(400, 5, seed=5)
    ref_mc = brier_score_loss(y.numpy(), probs.numpy(), labels=list(range(5)))  # sum over classes
    assert brier(probs, y) == pytest.approx(ref_mc, rel=1e-12)
    assert brier(probs, y, scale_by_half=True) == pytest.approx(ref_mc / 2, rel=1e-12)


def test_entropy_matches_scipy_including_zero_probabilities():
    probs, _ = _random_probs(50, 7, seed=6)
    probs = probs.clone()
    probs[:5, 0] = 0.0
    probs = probs / probs.sum(dim=1, keepdim=True)
    ref = scipy_entropy(probs.numpy(), axis=1)  # nats
    h = predictive_entropy(probs)
    assert isinstance(h, torch.Tensor) and h.dtype == torch.float64 and h.shape == (50,)
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-12, atol=1e-15)
    assert predictive_entropy(probs, reduction="mean") == pytest.approx(ref.mean(), rel=1e-12)
    assert float(predictive_entropy(torch.tensor([[1.0, 0.0, 0.0]]))[0]) == 0.0
    assert float(predictive_entropy(torch.full((1, 4), 0.25))[0]) == pytest.approx(math.log(4))


def test_inputs_are_left_untouched_and_any_float_dtype_works():
    probs, y = _random_probs(64, 3, seed=7)
    probs.requires_grad_(True)
    before, y_before = probs.detach().clone(), y.clone()
    out = evaluate(probs, y, probs_ood=probs[:10])
    assert torch.equal(probs.detach(), before) and torch.equal(y, y_before) and probs.grad is None
    assert evaluate(probs.detach().float(), y.int())["nll"] == pytest.approx(out["nll"], rel=1e-6)


def test_evaluate_agrees_with_each_function_and_references():
    probs, y = _random_probs(500, 4, seed=8)
    ood, _ = _random_probs(200, 4, seed=9, scale=0.5)
    out = evaluate(probs, y, probs_ood=ood, n_bins=10)
    assert out["accuracy"] == accuracy(probs, y)
    assert out["nll"] == pytest.approx(log_loss(y.numpy(), probs.numpy(), labels=list(range(4))), rel=1e-12)
    assert out["brier"] == pytest.approx(brier_score_loss(y.numpy(), probs.numpy(), labels=list(range(4))))
    assert out["ece"] == ece(probs, y, n_bins=10)
    assert out["mce"] == metrics.mce(probs, y, n_bins=10)
    assert out["entropy"] == pytest.approx(scipy_entropy(probs.numpy(), axis=1).mean(), rel=1e-12)
    conf = probs.max(dim=1).values.numpy()
    correct = (probs.argmax(dim=1) == y).numpy()
    assert out["auroc_misclassification"] == pytest.approx(roc_auc_score(correct, conf), rel=1e-12)
    conf_all = np.concatenate([conf, ood.max(dim=1).values.numpy()])
    is_in = np.r_[np.ones(500), np.zeros(200)]
    assert out["auroc_ood_maxprob"] == pytest.approx(roc_auc_score(is_in, conf_all), rel=1e-12)
    h_all = np.concatenate([scipy_entropy(probs.numpy(), axis=1), scipy_entropy(ood.numpy(), axis=1)])
    assert out["auroc_ood_entropy"] == pytest.approx(roc_auc_score(1 - is_in, h_all), rel=1e-12)
    assert out["entropy_ood"] == pytest.approx(scipy_entropy(ood.numpy(), axis=1).mean(), rel=1e-12)
    assert (out["n"], out["n_ood"], out["n_bins"]) == (500, 200, 10)
    assert all(type(v) in (float, int) for v in out.values())


def test_evaluate_without_ood_and_with_every_prediction_right():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    y = torch.tensor([0, 1, 0])
    out = evaluate(probs, y)
    assert not any(k.startswith("auroc_ood") or k.endswith("_ood") for k in out)
    assert out["accuracy"] == 1.0 and math.isnan(out["auroc_misclassification"])
    # binary Brier halved: ((0.1)^2 + (0.2)^2 + (0.4)^2) / 3
    assert out["brier"] == pytest.approx((0.01 + 0.04 + 0.16) / 3)


@pytest.mark.parametrize(
    ("probs", "targets", "exc", "fragment"),
    [
        ([[0.5, 0.5]], torch.tensor([0]), TypeError, "torch.Tensor"),
        (torch.tensor([[1, 0]]), torch.tensor([0]), TypeError, "floating-point"),
        (torch.rand(2, 3, 4), torch.tensor([0, 1]), ValueError, "[B, C]"),
        (torch.empty(0, 3), torch.empty(0, dtype=torch.long), ValueError, "empty"),
        (torch.tensor([[0.5, 0.5]] * 3), torch.tensor([0, 1]), ValueError, "targets must have shape [3]"),
        (torch.tensor([[0.5, 0.5]] * 2), torch.tensor([[1, 0], [0, 1]]), ValueError, "one-hot"),
        (torch.tensor([[0.5, 0.5]] * 2), torch.tensor([0.0, 1.0]), TypeError, "targets.long()"),
        (torch.tensor([[0.5, 0.5]] * 2), [0, 1], TypeError, "targets must be a torch.Tensor"),
        (torch.tensor([[0.5, float("nan")], [0.5, 0.5]]), torch.tensor([0, 1]), ValueError, "NaN"),
        (torch.tensor([[1.5, -0.5], [0.5, 0.5]]), torch.tensor([0, 1]), ValueError, "negative"),
        (torch.tensor([[0.5, 0.4], [0.5, 0.5]]), torch.tensor([0, 1]), ValueError, "row 0 sums to 0.9"),
        (torch.tensor([[2.0, 3.0], [0.5, 0.5]]), torch.tensor([0, 1]), ValueError, "not logits"),
        (torch.tensor([[0.5, 0.5]] * 2), torch.tensor([0, 2]), ValueError, "example 1 has label 2"),
        (torch.tensor([[0.5, 0.5]] * 2), torch.tensor([-1, 0]), ValueError, "labels in [0, 2)"),
        (torch.tensor([0.2, 1.3]), torch.tensor([0, 1]), ValueError, "sigmoid"),
        (torch.tensor([0.2, 0.3]), torch.tensor([0, 3]), ValueError, "labels 0/1"),
    ],
)
def test_bad_inputs_raise_clear_errors(probs, targets, exc, fragment):
    for fn in (accuracy, nll, brier, ece, evaluate):
        with pytest.raises(exc, match=re.escape(fragment)):
            fn(probs, targets)


def test_bad_options_raise_clear_errors():
    probs, y = _random_probs(10, 3, seed=10)
    with pytest.raises(ValueError, match="n_bins must be a positive int"):
        ece(probs, y, n_bins=0)
    with pytest.raises(ValueError, match="n_bins must be a positive int"):
        ece(probs, y, n_bins=2.5)
    with pytest.raises(ValueError, match="binning must be one of"):
        ece(probs, y, binning="quantile")
    with pytest.raises(ValueError, match="norm must be one of"):
        ece(probs, y, norm="l3")
    with pytest.raises(ValueError, match="scale_by_half"):
        brier(probs, y, scale_by_half="yes")
    with pytest.raises(ValueError, match="reduction must be one of"):
        predictive_entropy(probs, reduction="sum")
    with pytest.raises(ValueError, match="probs_ood contains NaN"):
        evaluate(probs, y, probs_ood=torch.full((2, 3), float("nan")))
    with pytest.raises(ValueError, match="same number of classes"):
        evaluate(probs, y, probs_ood=torch.full((2, 4), 0.25))
