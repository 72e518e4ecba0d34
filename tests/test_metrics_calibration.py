"""Calibration: ECE / MCE / l2 on a hand-worked example, equal-mass bins, a perfectly calibrated
predictor (ECE within a derived sampling bound of 0), the reliability curve and torchmetrics."""

from __future__ import annotations

import math

import pytest
import torch

from landscape.metrics import CalibrationCurve, calibration_curve, ece, mce
from landscape.results import load_result

# Eight predictions over three classes, worked by hand (float64, so 0.40 is exactly 8/20):
#  #  probs               target  conf  correct
#  0  [.90, .05, .05]     0       .90   1
#  1  [.80, .10, .10]     1       .80   0
#  2  [.20, .70, .10]     1       .70   1
#  3  [.30, .60, .10]     0       .60   0
#  4  [.30, .52, .18]     1       .52   1
#  5  [.45, .40, .15]     0       .45   1
#  6  [.40, .32, .28]     2       .40   0
#  7  [.95, .03, .02]     0       .95   1
PROBS = torch.tensor(
    [
        [0.90, 0.05, 0.05],
        [0.80, 0.10, 0.10],
        [0.20, 0.70, 0.10],
        [0.30, 0.60, 0.10],
        [0.30, 0.52, 0.18],
        [0.45, 0.40, 0.15],
        [0.40, 0.32, 0.28],
        [0.95, 0.03, 0.02],
    ],
    dtype=torch.float64,
)
TARGETS = torch.tensor([0, 1, 1, 0, 1, 0, 2, 0])


def test_ece_hand_worked_equal_width():
    # 4 bins (0,.25] (.25,.5] (.5,.75] (.75,1]:
    #   (.25,.5]: .45 c, .40 w         -> acc 1/2, conf .425,   |gap| .075, weight 2/8
    #   (.5,.75]: .70 c, .60 w, .52 c  -> acc 2/3, conf 1.82/3, |gap| .06,  weight 3/8
    #   (.75,1]:  .90 c, .80 w, .95 c  -> acc 2/3, conf 2.65/3, |gap| 13/60, weight 3/8
    assert ece(PROBS, TARGETS, n_bins=4) == pytest.approx((2 * 0.075 + 3 * 0.06 + 3 * 13 / 60) / 8)  # .1225
    assert mce(PROBS, TARGETS, n_bins=4) == pytest.approx(13 / 60)
    assert ece(PROBS, TARGETS, n_bins=4, norm="max") == pytest.approx(13 / 60)
    l2 = math.sqrt((2 * 0.075**2 + 3 * 0.06**2 + 3 * (13 / 60) ** 2) / 8)
    assert ece(PROBS, TARGETS, n_bins=4, norm="l2") == pytest.approx(l2)
    c = calibration_curve(PROBS, TARGETS, n_bins=4)
    assert c.count.tolist() == [0, 2, 3, 3]
    assert math.isnan(c.accuracy[0]) and math.isnan(c.confidence[0])
    assert c.accuracy[1:].tolist() == pytest.approx([1 / 2, 2 / 3, 2 / 3])
    assert c.confidence[1:].tolist() == pytest.approx([0.425, 1.82 / 3, 2.65 / 3])
    assert c.lower.tolist() == [0, 0.25, 0.5, 0.75] and c.upper.tolist() == [0.25, 0.5, 0.75, 1]


def test_ece_default_twenty_bins_are_closed_on_the_right():
    # width .05: .40 lies in (.35,.40] and .45 in (.40,.45]; all eight confidences get a bin of
    # their own, so ECE = mean |correct - conf| = (.10+.80+.30+.60+.48+.55+.40+.05)/8 = 3.28/8
    assert ece(PROBS, TARGETS) == pytest.approx(0.41)
    c = calibration_curve(PROBS, TARGETS)
    assert len(c.count) == 20 and c.count[7] == 1 and c.count[8] == 1
    assert c.config == {"n_bins": 20, "binning": "equal_width", "n": 8} and c.n == 8


def test_ece_hand_worked_equal_mass():
    # sorted: .40w .45c | .52c .60w | .70c .80w | .90c .95c  (two per bin)
    #   gaps |acc - conf|: |.5-.425|=.075, |.5-.56|=.06, |.5-.75|=.25, |1-.925|=.075
    assert ece(PROBS, TARGETS, n_bins=4, binning="equal_mass") == pytest.approx(
        (0.075 + 0.06 + 0.25 + 0.075) / 4
    )
    assert mce(PROBS, TARGETS, n_bins=4, binning="equal_mass") == pytest.approx(0.25)
    c = calibration_curve(PROBS, TARGETS, n_bins=4, binning="equal_mass")
    assert c.count.tolist() == [2, 2, 2, 2]
    # edges: midpoints between neighbouring bins' extreme confidences, 0 and 1 at the ends
    assert c.lower.tolist() == pytest.approx([0, 0.485, 0.65, 0.85])
    assert c.upper.tolist() == pytest.approx([0.485, 0.65, 0.85, 1])


@pytest.mark.parametrize("n", [1000, 1003, 997])
def test_equal_mass_bins_hold_equal_counts(n):
    g = torch.Generator().manual_seed(n)
    probs = torch.softmax(3 * torch.randn(n, 5, generator=g, dtype=torch.float64), dim=1)
    y = torch.randint(0, 5, (n,), generator=g)
    c = calibration_curve(probs, y, n_bins=20, binning="equal_mass")
    counts = c.count.long().tolist()
    assert sum(counts) == n and max(counts) - min(counts) <= (0 if n % 20 == 0 else 1)
    # bins are ordered: every confidence of bin b is <= every confidence of bin b + 1
    conf = probs.max(dim=1).values.sort().values
    bounds = torch.cumsum(c.count.long(), 0)
    for b in range(19):
        assert conf[bounds[b] - 1] <= c.upper[b] <= conf[bounds[b]]
    with pytest.raises(ValueError, match="at least n_bins examples"):
        calibration_curve(probs[:10], y[:10], n_bins=20, binning="equal_mass")


def _calibrated_sample(n: int, n_classes: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-class confidence ~ U(0.3, 1); the prediction is right with probability ``conf - shift``."""
    g = torch.Generator().manual_seed(seed)
    conf = 0.3 + 0.7 * torch.rand(n, generator=g, dtype=torch.float64)
    pred = torch.randint(0, n_classes, (n,), generator=g)
    probs = ((1 - conf) / (n_classes - 1)).unsqueeze(1).repeat(1, n_classes)  # others <= .7/3 < .3
    probs[torch.arange(n), pred] = conf
    right = torch.rand(n, generator=g, dtype=torch.float64) < conf - shift
    other = (pred + torch.randint(1, n_classes, (n,), generator=g)) % n_classes
    return probs, torch.where(right, pred, other)


def _sampling_bound(probs: torch.Tensor, curve: CalibrationCurve) -> float:
    """Upper bound on ECE for a calibrated predictor, given its confidences.

    In bin b, acc - conf = mean of (correct_i - conf_i): independent, mean 0, variance
    v_b / n_b with v_b the bin's mean of conf (1 - conf). So E|gap_b| <= sd_b = sqrt(v_b / n_b)
    (Jensen), E[ECE] <= sum_b w_b sd_b, Var[ECE] <= sum_b w_b^2 sd_b^2 (bins independent);
    the bound is that mean plus three standard deviations.
    """
    conf = probs.max(dim=1).values
    w, sd = [], []
    for lo, hi, n_b in zip(curve.lower, curve.upper, curve.count, strict=True):
        if n_b == 0:
            continue
        inside = conf[(conf > lo) & (conf <= hi)]
        assert inside.numel() == n_b  # no confidence on an edge
        w.append(float(n_b) / conf.numel())
        sd.append(math.sqrt(float((inside * (1 - inside)).mean()) / float(n_b)))
    mean = sum(a * b for a, b in zip(w, sd, strict=True))
    std = math.sqrt(sum((a * b) ** 2 for a, b in zip(w, sd, strict=True)))
    return mean + 3 * std


def test_perfectly_calibrated_predictor_has_ece_within_sampling_error():
    probs, y = _calibrated_sample(200_000, 4, shift=0.0, seed=11)
    curve = calibration_curve(probs, y)
    bound = _sampling_bound(probs, curve)
    assert 0.002 < bound < 0.01  # about 14 bins of ~14k examples
    assert ece(probs, y) < bound
    mass = calibration_curve(probs, y, binning="equal_mass")
    assert mass.calibration_error() < _sampling_bound(probs, mass)
    # the test can fail: the same confidences, right 2 points less often, exceed the bound
    probs_bad, y_bad = _calibrated_sample(200_000, 4, shift=0.02, seed=11)
    assert ece(probs_bad, y_bad) == pytest.approx(0.02, abs=bound)
    assert ece(probs_bad, y_bad) > bound


def test_curve_round_trips_through_a_result_file(tmp_path):
    c = calibration_curve(PROBS, TARGETS, n_bins=4)
    c.save(tmp_path / "curve.json")
    back = load_result(tmp_path / "curve.json")
    assert isinstance(back, CalibrationCurve) and back.config == c.config
    assert torch.equal(back.count, c.count) and torch.allclose(back.accuracy, c.accuracy, equal_nan=True)
    assert back.calibration_error() == pytest.approx(0.1225)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_ece_matches_torchmetrics_when_installed(norm):
    tm = pytest.importorskip("torchmetrics.functional.classification")
    g = torch.Generator().manual_seed(12)
    probs = torch.softmax(2 * torch.randn(2000, 6, generator=g), dim=1)
    y = torch.randint(0, 6, (2000,), generator=g)
    ref = tm.multiclass_calibration_error(probs, y, num_classes=6, n_bins=20, norm=norm)
    assert ece(probs, y, n_bins=20, norm=norm) == pytest.approx(float(ref), abs=1e-5)
