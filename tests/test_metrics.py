"""accuracy / NLL / ECE against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from landscape.metrics import accuracy, ece, nll


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


def test_metrics_binary_and_errors():
    p = torch.tensor([0.8, 0.3, 0.6])
    y = torch.tensor([1, 0, 0])
    assert accuracy(p, y) == pytest.approx(2 / 3)
    assert nll(p, y) == pytest.approx(-(math.log(0.8) + math.log(0.7) + math.log(0.4)) / 3)
    assert ece(p, y, n_bins=1) == pytest.approx(abs(2 / 3 - (0.8 + 0.7 + 0.6) / 3))
    with pytest.raises(ValueError, match="targets"):
        accuracy(torch.rand(3, 2), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="n_bins"):
        ece(p, y, n_bins=0)
