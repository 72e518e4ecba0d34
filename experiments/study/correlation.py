"""Rank correlation of a measure with generalisation: Kendall's tau-b, a bootstrap interval and the
granulated tau of Jiang et al. 2020 ("Fantastic generalization measures", Sec. 4, eqs. 3-4).

* :func:`kendall_tau_b`: ``tau_b = (C - D) / sqrt((n0 - n1)(n0 - n2))`` over the ``n0 = n(n-1)/2``
  pairs, ``C`` / ``D`` the concordant / discordant pairs, ``n1`` / ``n2`` the pairs tied in ``x`` /
  ``y`` (Kendall 1945), computed by ``scipy.stats.kendalltau`` (``variant="b"``);
* :func:`bootstrap_tau`: percentile interval over resampled models (seeded);
* :func:`granulated_tau`: for each hyperparameter axis ``i``, ``psi_i`` is the mean tau over the
  groups of models that agree on every other axis (only axis ``i`` varies in a group; Jiang et al.
  eq. 4); ``Psi`` is the mean of ``psi_i`` over the axes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.stats

__all__ = ["bootstrap_tau", "correlate", "granulated_tau", "kendall_tau_b"]


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two equally long sequences (NaN when either is constant or n < 2)."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x and y must be 1-D and equally long, got shapes {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("x and y must be finite; drop the models with NaN/inf values first")
    # n < 2 or a constant sequence: every pair tied, tau undefined (scipy would warn, then say NaN)
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return math.nan
    return float(scipy.stats.kendalltau(a, b, variant="b").statistic)


def resample_taus(a: np.ndarray, b: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    """tau-b of ``samples`` resamples (with replacement, drawn from ``rng``) of the pairs ``(a, b)``;
    resamples where tau is undefined (a constant resample) are dropped."""
    n = len(a)
    if n < 2:
        return np.zeros(0)
    # pair signs once; a resample's pairs are a sub-matrix (a duplicated model: sign 0, a tie)
    sx = np.sign(a[:, None] - a[None, :])
    sy = np.sign(b[:, None] - b[None, :])
    out: list[np.ndarray] = []
    chunk = max(1, 2_000_000 // max(n * n, 1))
    for start in range(0, samples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, samples - start), n))
        px = sx[idx[:, :, None], idx[:, None, :]]
        py = sy[idx[:, :, None], idx[:, None, :]]
        num = np.sum(px * py, axis=(1, 2))  # 2 (C - D): each pair counted twice
        den = np.sqrt(np.count_nonzero(px, axis=(1, 2)).astype(float) * np.count_nonzero(py, axis=(1, 2)))
        ok = den > 0
        out.append(num[ok] / den[ok])
    return np.concatenate(out) if out else np.zeros(0)


def bootstrap_tau(
    x: Sequence[float], y: Sequence[float], *, samples: int = 1000, level: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """tau-b with a percentile bootstrap interval over models resampled with replacement (Efron &
    Tibshirani 1993, Sec. 13.3); resamples where tau is undefined are dropped.

    Returns ``{"tau", "low", "high", "samples", "level", "seed"}``."""
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    tau = kendall_tau_b(a, b)
    taus = resample_taus(a, b, samples, np.random.default_rng(seed))
    if taus.size:
        low, high = np.quantile(taus, [(1 - level) / 2, (1 + level) / 2])
    else:
        low = high = math.nan
    return {
        "tau": tau,
        "low": float(low),
        "high": float(high),
        "samples": samples,
        "level": level,
        "seed": seed,
    }


def granulated_tau(
    rows: Sequence[dict[str, Any]], measure: str, target: str, axes: Sequence[str]
) -> dict[str, Any]:
    """Jiang et al. 2020's granulated Kendall coefficient of ``measure`` against ``target``.

    For each axis ``i`` the rows are grouped by their values on the other axes; a group in which axis
    ``i`` takes at least two values contributes its tau-b (groups where tau is undefined, e.g. a
    constant measure, are skipped and counted). ``psi_i`` is the mean over the contributing groups,
    ``Psi`` the mean over the axes with at least one (Jiang et al. 2020, eq. 4).

    Returns ``{"psi": {axis: value}, "groups": {axis: count}, "skipped": {axis: count}, "Psi": value}``.
    """
    psi: dict[str, float] = {}
    groups: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for axis in axes:
        others = [a for a in axes if a != axis]
        bucket: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            bucket.setdefault(repr([r[a] for a in others]), []).append(r)
        taus, bad = [], 0
        for members in bucket.values():
            if len({repr(m[axis]) for m in members}) < 2:
                continue
            t = kendall_tau_b([m[measure] for m in members], [m[target] for m in members])
            if math.isnan(t):
                bad += 1
            else:
                taus.append(t)
        psi[axis] = float(np.mean(taus)) if taus else math.nan
        groups[axis], skipped[axis] = len(taus), bad
    finite = [v for v in psi.values() if not math.isnan(v)]
    return {
        "psi": psi,
        "groups": groups,
        "skipped": skipped,
        "Psi": float(np.mean(finite)) if finite else math.nan,
    }


def correlate(
    rows: Sequence[dict[str, Any]],
    measures: Sequence[str],
    targets: Sequence[str],
    axes: Sequence[str],
    *,
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One entry per (measure, target): tau-b, its bootstrap interval and the granulated tau, over the
    rows where both are finite (``n`` records how many)."""
    out = []
    for m in measures:
        for t in targets:
            keep = [r for r in rows if _finite(r.get(m)) and _finite(r.get(t))]
            boot = bootstrap_tau(
                [r[m] for r in keep], [r[t] for r in keep], samples=samples, level=level, seed=seed
            )
            gran = granulated_tau(keep, m, t, axes)
            out.append(
                {
                    "measure": m,
                    "target": t,
                    "n": len(keep),
                    **boot,
                    "Psi": gran["Psi"],
                    "psi": gran["psi"],
                    "groups": gran["groups"],
                }
            )
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
