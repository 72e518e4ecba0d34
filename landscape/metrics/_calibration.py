"""Calibration of the top-label confidence: reliability curve, ECE, MCE and the l2 calibration error.

The confidence of example ``i`` is its largest class probability ``max_c p_ic`` and it is
"correct" when that class (the arg-max; ties go to the lower index) equals the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from landscape.metrics._checks import BINNINGS, NORMS, check_choice, check_n_bins, check_pair
from landscape.results import Result

Binning = Literal["equal_width", "equal_mass"]
Norm = Literal["l1", "l2", "max"]


@dataclass
class CalibrationCurve(Result):
    """Per-bin statistics of a reliability diagram (Guo et al., ICML 2017, section 2).

    Every tensor has one entry per bin (float64; an empty bin has ``count`` 0 and NaN mean
    confidence and accuracy). ``lower`` / ``upper`` are the bin's edges: ``k / n_bins`` for
    equal-width bins, for equal-mass bins the midpoints between the neighbouring bins' extreme
    confidences (0 and 1 at the ends), so the bins tile ``[0, 1]`` either way.
    ``config`` records ``n_bins``, ``binning`` and the number of examples ``n``.
    """

    lower: torch.Tensor | None = None
    upper: torch.Tensor | None = None
    confidence: torch.Tensor | None = None
    accuracy: torch.Tensor | None = None
    count: torch.Tensor | None = None

    kind: ClassVar[str] = "calibration_curve"
    tensor_fields: ClassVar[tuple[str, ...]] = ("lower", "upper", "confidence", "accuracy", "count")

    @property
    def n(self) -> int:
        """Number of examples."""
        return int(self.count.sum())

    @property
    def gap(self) -> torch.Tensor:
        """``confidence - accuracy`` per bin: positive where the model is over-confident (NaN if empty)."""
        return self.confidence - self.accuracy

    def calibration_error(self, norm: Norm = "l1") -> float:
        """The calibration error of these bins; see :func:`ece` for the three norms."""
        check_choice(norm, "norm", NORMS)
        full = self.count > 0
        w = self.count[full] / self.count.sum()
        g = self.gap[full].abs()
        if norm == "l1":
            return float((w * g).sum())
        if norm == "l2":
            return math.sqrt(float((w * g**2).sum()))
        return float(g.max())


def calibration_curve(
    probs: torch.Tensor, targets: torch.Tensor, n_bins: int = 20, binning: Binning = "equal_width"
) -> CalibrationCurve:
    """Bin examples by top-label confidence; per bin the mean confidence, the accuracy and the count.

    Equal-width bins are ``((k-1)/n_bins, k/n_bins]``, closed on the right as in Guo et al.
    (ICML 2017, section 2) (a confidence of exactly 0 goes to the first bin). Equal-mass bins
    sort the examples by confidence (stably) and give bin ``k`` the ranks ``r`` with
    ``floor(r n_bins / n) = k``, so the counts differ by at most one; tied confidences at a split
    may land in neighbouring bins. This is the adaptive binning of Nixon et al. ("Measuring
    calibration in deep learning", CVPR Workshops 2019, section 4) applied to the top label only.

    Unlike scikit-learn's ``calibration_curve`` (the probability of the positive class of a
    binary problem), this uses the top-label confidence, as ECE does.

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
        n_bins: number of bins (20 as in the bSAM and flat-BNN evaluations; Guo et al. used 15).
        binning: ``"equal_width"`` or ``"equal_mass"`` (needs at least ``n_bins`` examples).
    """
    n_bins = check_n_bins(n_bins)
    check_choice(binning, "binning", BINNINGS)
    p, t = check_pair(probs, targets)
    return curve_matrix(p, t, n_bins, binning)


def ece(
    probs: torch.Tensor,
    targets: torch.Tensor,
    n_bins: int = 20,
    binning: Binning = "equal_width",
    norm: Norm = "l1",
) -> float:
    """Expected calibration error of the top-label confidence (Guo et al., ICML 2017, eq. 3).

    With bins ``B_b`` from :func:`calibration_curve` and ``n`` examples,

    * ``norm="l1"`` (ECE): ``sum_b |B_b|/n * |acc(B_b) - conf(B_b)|`` (Naeini et al., AAAI 2015);
    * ``norm="l2"``: ``sqrt(sum_b |B_b|/n * (acc(B_b) - conf(B_b))^2)``, the l2 / RMS calibration
      error (Kumar et al., NeurIPS 2019, with the square root as in torchmetrics);
    * ``norm="max"`` (MCE): ``max_b |acc(B_b) - conf(B_b)|`` over non-empty bins (Guo et al., eq. 5).

    ``binning="equal_mass"`` gives the adaptive (equal-count) variant of Nixon et al. (2019).
    The default is 20 equal-width bins, as in the bSAM and flat-BNN evaluation code; pass
    ``n_bins=15`` for Guo et al.'s choice.

    Args:
        probs: ``[B, C]`` class probabilities, or ``[B]`` probabilities of class 1 (binary).
        targets: ``[B]`` integer labels in ``[0, C)``.
        n_bins: number of confidence bins.
        binning: ``"equal_width"`` or ``"equal_mass"``.
        norm: ``"l1"``, ``"l2"`` or ``"max"``.
    """
    check_choice(norm, "norm", NORMS)
    return calibration_curve(probs, targets, n_bins, binning).calibration_error(norm)


def mce(
    probs: torch.Tensor, targets: torch.Tensor, n_bins: int = 20, binning: Binning = "equal_width"
) -> float:
    """Maximum calibration error, ``max_b |acc(B_b) - conf(B_b)|`` over non-empty bins.

    Guo et al. (ICML 2017, eq. 5); the same as ``ece(..., norm="max")``. Sensitive to sparsely
    populated bins: with few examples read it next to the counts of :func:`calibration_curve`.
    """
    return ece(probs, targets, n_bins, binning, norm="max")


# ------------------------------------------------------------------ on checked float64 matrices


def curve_matrix(p: torch.Tensor, t: torch.Tensor, n_bins: int, binning: str) -> CalibrationCurve:
    conf, pred = p.max(dim=1)
    correct = (pred == t).to(torch.float64)
    n = conf.numel()
    if binning == "equal_width":
        edges = torch.arange(n_bins + 1, dtype=torch.float64) / n_bins  # k / n_bins, correctly rounded
        idx = (torch.bucketize(conf, edges, right=False) - 1).clamp(0, n_bins - 1)
        lower, upper = edges[:-1].clone(), edges[1:].clone()
    else:
        if n < n_bins:
            raise ValueError(
                f"equal-mass binning needs at least n_bins examples, got {n} examples for "
                f"n_bins={n_bins}; lower n_bins"
            )
        order = torch.sort(conf, stable=True).indices
        idx = torch.empty(n, dtype=torch.int64)
        idx[order] = torch.div(torch.arange(n) * n_bins, n, rounding_mode="floor")
        lo = torch.full((n_bins,), math.inf, dtype=torch.float64).scatter_reduce(0, idx, conf, "amin")
        hi = torch.full((n_bins,), -math.inf, dtype=torch.float64).scatter_reduce(0, idx, conf, "amax")
        mid = (hi[:-1] + lo[1:]) / 2
        lower = torch.cat([torch.zeros(1, dtype=torch.float64), mid])
        upper = torch.cat([mid, torch.ones(1, dtype=torch.float64)])
    count = torch.bincount(idx, minlength=n_bins).to(torch.float64)
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, conf)
    corr_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, idx, correct)
    safe = count.clamp_min(1)
    empty = count == 0
    nan = torch.tensor(math.nan, dtype=torch.float64)
    return CalibrationCurve(
        config={"n_bins": n_bins, "binning": binning, "n": n},
        lower=lower,
        upper=upper,
        confidence=torch.where(empty, nan, conf_sum / safe),
        accuracy=torch.where(empty, nan, corr_sum / safe),
        count=count,
    )
