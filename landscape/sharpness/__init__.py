"""Sharpness measures of the literature behind one call, :func:`sharpness`, and one table,
:func:`sharpness_report`.

* ``api``: :func:`sharpness`, :class:`SharpnessResult` and the registry ``MEASURES``;
* ``report``: :func:`sharpness_report` (CSV/JSON/Markdown);
* the measures by family: ``curvature_based`` (lambda_max, Hessian/GGN/Fisher traces, gradient
  norm, G-TRACER's penalty), ``worst_case`` (SAM/ASAM/Fisher-SAM neighbourhoods, Keskar, the
  robustness curve), ``average_case`` (random perturbations and filter-normalised directions),
  ``flatness`` (Jiang et al. 2020's PAC-Bayes and sharpness flatness), ``kronecker_based`` (KFAC /
  EKFAC trace and lambda_max, exact from the factors); ``common`` holds the
  context every measure receives;
* ``cli``: ``python -m landscape sharpness``.

Every measure is a function ``measure(ctx, **options) -> dict`` taking a :class:`common.Ctx` (the
objective, the flat parameter vector ``w0`` and the evaluation counters) and returning
``dict(value=..., stderr=..., config=..., extra=...)``; :func:`sharpness` wraps it in a
:class:`SharpnessResult` with the evaluation counts and the run time.
"""

from landscape.sharpness.api import MEASURES, SharpnessResult, sharpness
from landscape.sharpness.report import SharpnessReport, sharpness_report

__all__ = ["MEASURES", "SharpnessReport", "SharpnessResult", "sharpness", "sharpness_report"]
