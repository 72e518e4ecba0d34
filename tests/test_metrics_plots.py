"""Reliability diagrams: the bars drawn equal per-bin accuracies computed independently (numpy)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

from landscape.metrics import reliability_diagram, reliability_figure

matplotlib.use("Agg")


def _data(seed: int = 0, n: int = 600, c: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2 * torch.randn(n, c, generator=g, dtype=torch.float64), dim=1)
    return probs, torch.randint(0, c, (n,), generator=g)


def _bins_by_hand(probs: torch.Tensor, y: torch.Tensor, n_bins: int):
    """Per-bin accuracy, mean confidence and count with numpy (bins ((k-1)/n, k/n])."""
    p, t = probs.numpy(), y.numpy()
    conf, correct = p.max(axis=1), (p.argmax(axis=1) == t)
    idx = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    acc, mean_conf, count = [], [], []
    for b in range(n_bins):
        m = idx == b
        count.append(int(m.sum()))
        acc.append(correct[m].mean() if m.any() else math.nan)
        mean_conf.append(conf[m].mean() if m.any() else math.nan)
    return np.array(acc), np.array(mean_conf), np.array(count)


def _trace(fig, model, role):
    (tr,) = [t for t in fig.data if t.meta == {"model": model, "role": role}]
    return tr


def _num(values) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=float)


def test_plotly_bar_heights_are_the_per_bin_accuracies():
    probs, y = _data()
    acc, conf, count = _bins_by_hand(probs, y, 20)
    fig = reliability_figure(probs, y, n_bins=20)
    bars = _trace(fig, "model", "accuracy")
    np.testing.assert_allclose(_num(bars.y), acc, rtol=1e-12, equal_nan=True)
    assert np.isnan(acc[:4]).all()  # confidence >= 1/4: the first bins are empty and drawn empty
    np.testing.assert_allclose(np.array(bars.x), (np.arange(20) + 0.5) / 20, rtol=1e-12)
    gap = _trace(fig, "model", "gap")
    np.testing.assert_allclose(_num(gap.base) + _num(gap.y), conf, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(np.array(_trace(fig, "model", "count").y), count)
    diag = _trace(fig, None, "diagonal")
    assert list(diag.x) == [0, 1] and list(diag.y) == [0, 1]


def test_plotly_several_models_share_the_bins_side_by_side():
    probs, y = _data(1)
    sharp = probs**3 / (probs**3).sum(dim=1, keepdim=True)
    fig = reliability_figure({"sgd": probs, "sam": sharp}, y, n_bins=10, title="two models")
    for name, p in (("sgd", probs), ("sam", sharp)):
        acc, _, _ = _bins_by_hand(p, y, 10)
        np.testing.assert_allclose(_num(_trace(fig, name, "accuracy").y), acc, rtol=1e-12, equal_nan=True)
    x0, x1 = np.array(_trace(fig, "sgd", "accuracy").x), np.array(_trace(fig, "sam", "accuracy").x)
    np.testing.assert_allclose(x1 - x0, 0.05)  # half of a 0.1-wide bin apart
    assert fig.layout.title.text == "two models"


def test_matplotlib_bar_heights_are_the_per_bin_accuracies():
    import matplotlib.figure

    probs, y = _data(2)
    acc, conf, _ = _bins_by_hand(probs, y, 20)
    ax = matplotlib.figure.Figure().add_subplot()
    out = reliability_diagram(probs, y, ax=ax)
    assert out is ax
    heights = np.array([r.get_height() for r in ax.containers[0]])
    np.testing.assert_allclose(heights, acc, rtol=1e-12, equal_nan=True)
    tops = np.array([r.get_y() + r.get_height() for r in ax.containers[1]])  # gap bars end at conf
    np.testing.assert_allclose(tops, conf, rtol=1e-12, equal_nan=True)
    assert "ECE" in ax.get_legend().get_texts()[1].get_text()


def test_matplotlib_several_models_and_errors():
    probs, y = _data(3)
    ax = reliability_diagram({"a": probs, "b": probs.flip(0)}, y, n_bins=5, show_counts=False)
    assert len(ax.containers) == 4  # accuracy and gap bars for each model
    acc_b, _, _ = _bins_by_hand(probs.flip(0), y, 5)
    np.testing.assert_allclose([r.get_height() for r in ax.containers[1]], acc_b, equal_nan=True)
    with pytest.raises(ValueError, match="empty mapping"):
        reliability_diagram({}, y)
    with pytest.raises(TypeError, match="must be strings"):
        reliability_figure({1: probs}, y)
    with pytest.raises(ValueError, match="targets must have shape"):
        reliability_figure(probs, y[:5])
