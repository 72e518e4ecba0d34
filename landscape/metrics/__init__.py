"""Metrics of predictive distributions: scores, calibration, OOD / misclassification AUROC, plots.

``probs`` is ``[B, C]`` (each row sums to one within ``1e-3``) or ``[B]`` / ``[B, 1]`` (the
probability of class 1 of a binary problem, read as ``[1 - p, p]``); ``targets`` are integer
class labels ``[B]``. Inputs are checked (shape, NaN / inf, negative entries, rows that do not
sum to one, labels out of range) and raise ``ValueError`` / ``TypeError`` naming the problem;
they are never modified. Computation is in float64 on the CPU, whatever the input's device;
results are Python floats.

* scores: :func:`accuracy`, :func:`nll`, :func:`brier`, :func:`predictive_entropy`;
* top-k: :func:`topk_accuracy` (logits or probabilities), :func:`top5_accuracy`;
* calibration: :func:`calibration_curve` (a :class:`CalibrationCurve`), :func:`ece` (20
  equal-width bins by default, ``binning="equal_mass"``, ``norm="l1" | "l2" | "max"``),
  :func:`mce`;
* ranking: :func:`auroc`, :func:`ood_auroc`, :func:`misclassification_auroc`;
* plots: :func:`reliability_diagram` (matplotlib), :func:`reliability_figure` (Plotly);
* :func:`evaluate`: all of the above in one dict.

Example::

    from landscape import metrics
    probs = model(x).softmax(dim=1)
    metrics.evaluate(probs, y, probs_ood=model(x_ood).softmax(dim=1))
    metrics.reliability_figure({"SGD": p_sgd, "bSAM": p_bsam}, y)
"""

from landscape.metrics._calibration import CalibrationCurve, calibration_curve, ece, mce
from landscape.metrics._checks import SUM_TOL
from landscape.metrics._evaluate import METRIC_NAMES, OOD_METRIC_NAMES, evaluate
from landscape.metrics._plots import reliability_diagram, reliability_figure
from landscape.metrics._ranking import auroc, misclassification_auroc, ood_auroc
from landscape.metrics._scores import accuracy, brier, nll, predictive_entropy
from landscape.metrics._topk import top5_accuracy, topk_accuracy

__all__ = [
    "METRIC_NAMES",
    "OOD_METRIC_NAMES",
    "SUM_TOL",
    "CalibrationCurve",
    "accuracy",
    "auroc",
    "brier",
    "calibration_curve",
    "ece",
    "evaluate",
    "mce",
    "misclassification_auroc",
    "nll",
    "ood_auroc",
    "predictive_entropy",
    "reliability_diagram",
    "reliability_figure",
    "top5_accuracy",
    "topk_accuracy",
]
