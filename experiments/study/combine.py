"""Correlations over several populations: each population's Kendall tau-b with its bootstrap interval
and granulated tau (:func:`experiments.study.correlation.correlate`), and a combined conclusion
that includes the variability between populations.

A bootstrap interval describes the resampling of models within one population; a second population
sampled from the same space with another seed (other base points, other training seeds) varies more
than that. The combined interval is the percentile interval of the *pooled* bootstrap: the
resampled taus of every population together, each population contributing the same number of
resamples (an equal-weight mixture of the populations' bootstrap distributions; Efron & Tibshirani
1993, Sec. 13.3 for the percentile interval), so it is wide when the populations disagree even if
each interval is narrow. With it the report counts the populations whose own interval excludes 0.

:func:`resampled_taus` draws the resamples as :func:`experiments.study.correlation.bootstrap_tau`
does (``numpy.random.default_rng(seed)``, chunks of ``max(1, 2e6 // n^2)`` resamples of ``n``
indices) and computes tau-b (Kendall 1945) of each from the pair-sign sub-matrix, so the percentile
interval of one population's resamples is its ``bootstrap_tau`` interval (tested).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.study.correlation import correlate, resample_taus

__all__ = ["combine", "population_correlations", "resampled_taus"]


def resampled_taus(
    x: Sequence[float], y: Sequence[float], *, samples: int = 1000, seed: int = 0
) -> np.ndarray:
    """Kendall tau-b of ``samples`` resamples (with replacement) of the pairs ``(x, y)``; resamples
    where tau is undefined (a constant resample) are dropped."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    return resample_taus(a, b, samples, np.random.default_rng(seed))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def population_correlations(
    populations: Sequence[Sequence[dict[str, Any]]],
    measures: Sequence[str],
    targets: Sequence[str],
    axes: Sequence[str],
    *,
    samples: int = 1000,
    seed: int = 0,
) -> list[list[dict[str, Any]]]:
    """:func:`~experiments.study.correlation.correlate` of every population (the rows of its members
    that enter the correlations), each with its own axes (those that vary in it)."""
    out = []
    for rows in populations:
        mine = [a for a in axes if len({repr(r[a]) for r in rows}) > 1]
        out.append(correlate(list(rows), measures, targets, mine, samples=samples, seed=seed))
    return out


def combine(
    populations: Sequence[Sequence[dict[str, Any]]],
    entries: Sequence[Sequence[dict[str, Any]]],
    *,
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One combined entry per (measure, target) of ``entries`` (the output of
    :func:`population_correlations` for ``populations``).

    Each entry holds the populations' ``taus``, ``intervals`` and ``n``, ``tau`` (their mean),
    ``low`` / ``high`` (the pooled bootstrap's percentile interval at ``level``),
    ``excludes_zero`` (how many populations' own intervals exclude 0) of ``populations``, and the
    granulated tau: ``Psis`` per population, ``Psi`` their mean and ``psi`` (per axis, the mean over
    the populations where the axis has groups)."""
    keys = [(e["measure"], e["target"]) for e in entries[0]]
    by = [{(e["measure"], e["target"]): e for e in pop} for pop in entries]
    out = []
    for m, t in keys:
        es = [b[(m, t)] for b in by]
        pooled = []
        for rows in populations:
            keep = [r for r in rows if _finite(r.get(m)) and _finite(r.get(t))]
            pooled.append(
                resampled_taus([r[m] for r in keep], [r[t] for r in keep], samples=samples, seed=seed)
            )
        draws = np.concatenate(pooled) if pooled else np.zeros(0)
        low, high = (
            np.quantile(draws, [(1 - level) / 2, (1 + level) / 2]) if len(draws) else (math.nan, math.nan)
        )
        taus = [e["tau"] for e in es]
        psis = [e["Psi"] for e in es]
        axes = list(dict.fromkeys(a for e in es for a in e["psi"]))
        psi = {}
        for a in axes:
            vals = [e["psi"][a] for e in es if a in e["psi"] and not math.isnan(e["psi"][a])]
            psi[a] = float(np.mean(vals)) if vals else math.nan
        finite = [v for v in taus if not math.isnan(v)]
        out.append(
            {
                "measure": m,
                "target": t,
                "taus": taus,
                "intervals": [[e["low"], e["high"]] for e in es],
                "n": [e["n"] for e in es],
                "tau": float(np.mean(finite)) if finite else math.nan,
                "low": float(low),
                "high": float(high),
                "excludes_zero": sum(1 for e in es if e["low"] > 0 or e["high"] < 0),
                "populations": len(es),
                "Psis": psis,
                "Psi": float(np.nanmean(psis)) if any(not math.isnan(p) for p in psis) else math.nan,
                "psi": psi,
                "groups": [e["groups"] for e in es],
            }
        )
    return out
