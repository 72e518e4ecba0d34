"""Presentation rules shared by every page: compact numbers, legends outside the axes, at most three
subplots per row, one colour scale for surfaces that are compared, and the finite range of a
surface (so one exploding run cannot stretch an axis to 1e115)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

#: subplots per row; more panels wrap onto further rows
MAX_COLUMNS = 3

#: legend below the plotting area (outside the axes and clear of the colour bar on the right)
LEGEND_BELOW: dict[str, Any] = dict(orientation="h", x=0.0, xanchor="left", y=-0.18, yanchor="top")


def fmt(x: Any, digits: int = 4) -> str:
    """A number in at most ``digits`` significant digits (``3.705e+115``, ``0.01234``, ``nan``)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.{digits}g}"


def fmt_point(point: Iterable[Any], digits: int = 4) -> str:
    """``(x, y)`` with each coordinate in :func:`fmt`."""
    return "(" + ", ".join(fmt(v, digits) for v in point) + ")"


def grid_shape(n: int, max_columns: int = MAX_COLUMNS) -> tuple[int, int]:
    """``(rows, columns)`` for ``n`` panels: at most ``max_columns`` per row, four as 2 x 2."""
    if n < 1:
        raise ValueError(f"need at least one panel, got {n}")
    cols = 2 if n == 4 and max_columns >= 2 else min(n, max_columns)
    return math.ceil(n / cols), cols


def finite_range(*arrays: Any, upper_percentile: float = 100.0) -> tuple[float, float] | None:
    """``(low, high)`` over the finite entries of all ``arrays`` (``high`` at ``upper_percentile``);
    ``None`` when none is finite. A flat range is widened so that it can be drawn."""
    vals = [np.asarray(a, dtype=float).ravel() for a in arrays]
    finite = np.concatenate([v[np.isfinite(v)] for v in vals]) if vals else np.zeros(0)
    if finite.size == 0:
        return None
    lo = float(finite.min())
    hi = float(np.percentile(finite, upper_percentile)) if upper_percentile < 100 else float(finite.max())
    if hi <= lo:
        pad = max(abs(lo) * 1e-6, 1e-12)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def padded(r: tuple[float, float], fraction: float = 0.05) -> list[float]:
    """``[low, high]`` widened by ``fraction`` of its width on both sides."""
    lo, hi = r
    d = (hi - lo) * fraction
    return [lo - d, hi + d]
