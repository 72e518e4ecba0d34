"""The study's findings in words: the paragraph that the report prints first and the README quotes
(``docs/figures/study_digits.json`` holds it as ``headline``; ``tests/test_study_claims.py`` checks
that every number the README quotes is this paragraph's, which :func:`headline` recomputes from the
JSON's values).

Every number comes from the report document (:func:`experiments.study.report.write_report`): the
population sizes and exclusions, the stopping rule and the epochs it took, the pooled intervals of
:mod:`experiments.study.combine` (``k/P``: how many of the ``P`` populations' own bootstrap intervals
exclude 0), the ranges of tau against test and OOD error, the granulated Psi of Jiang et al. (2020,
eq. 4) averaged over the populations, and the wall and CPU time of the training and measuring.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

__all__ = ["excludes_zero", "headline", "interval"]


def interval(e: dict[str, Any]) -> str:
    """``+0.21 [+0.05, +0.38]``: a tau and its interval as the report prints them."""
    return f"{e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}]"


def excludes_zero(e: dict[str, Any]) -> bool:
    """Whether an entry's interval lies on one side of 0."""
    return e["low"] > 0 or e["high"] < 0


def _range(entries: list[dict[str, Any]], key: str = "tau") -> tuple[float, float]:
    vals = [e[key] for e in entries if not math.isnan(e[key])]
    return (min(vals), max(vals)) if vals else (math.nan, math.nan)


def _target_sentence(entries: list[dict[str, Any]], label: str, n_pop: int) -> str:
    lo, hi = _range(entries)
    k = sum(excludes_zero(e) for e in entries)
    every = sum(e["excludes_zero"] == n_pop for e in entries)
    return (
        f"against {label} τ ranges from {lo:+.2f} to {hi:+.2f} ({k} of {len(entries)} pooled intervals "
        f"exclude 0, {every} exclude it in all {n_pop} populations)"
    )


def headline(doc: dict[str, Any]) -> str:
    """The findings paragraph of a report document (see the module docstring)."""
    pops = doc["populations"]
    n_pop = len(pops)
    combined = doc["combined"]
    measures = list(dict.fromkeys(e["measure"] for e in combined))
    by_target: dict[str, list[dict[str, Any]]] = {}
    for e in combined:
        by_target.setdefault(e["target"], []).append(e)
    seeds = ", ".join(str(p["sampling_seed"]) for p in pops)
    sizes = "/".join(str(p["members"]) for p in pops)
    parts = [
        f"{doc['n_members']} distinct models in {n_pop} populations ({sizes} members, sampling seeds {seeds})"
    ]
    stop = doc.get("stop") or {}
    rows = [r for r in doc["models"] if r.get("status") != "diverged"]
    if stop:
        done = [r["epochs"] for r in rows if r.get("status") == "completed"]
        med = statistics.median(done) if done else math.nan
        parts[0] += (
            f", each trained until its training cross-entropy is at most {stop['train_loss']:g} (at "
            f"most {stop['max_epochs']} epochs; median {med:g}, range "
            f"{min(done, default=0)}–{max(done, default=0)})"
        )
    nc, dv = len(doc["not_converged"]), len(doc["diverged"])
    parts[0] += (
        f"; {nc + dv} excluded from the correlations ({nc} did not reach the target, {dv} diverged), "
        f"{doc['n_models']} included."
    )
    gap = by_target.get("gap_error", [])
    ex = sorted((e for e in gap if excludes_zero(e)), key=lambda e: -e["tau"])
    listed = "; ".join(f"`{e['measure']}` {interval(e)} ({e['excludes_zero']}/{n_pop})" for e in ex)
    gap_text = (
        f"Against the generalisation gap (test − training error), {len(ex)} of {len(measures)} measures "
        f"have a pooled interval (bootstrap over all {n_pop} populations) that excludes 0"
    )
    parts.append(gap_text + (f": {listed}." if ex else "."))
    lo, hi = _range(gap)
    every = [e["measure"] for e in gap if e["excludes_zero"] == n_pop]
    none = sum(e["excludes_zero"] == 0 for e in gap)
    parts.append(
        f"The gap τ of the measures ranges from {lo:+.2f} to {hi:+.2f}; {len(every)} measures exclude 0 in "
        f"all {n_pop} populations, {none} in none."
    )
    others = [
        _target_sentence(by_target[t], label, n_pop)
        for t, label in (("test_error", "test error"), ("ood_error", "OOD error"))
        if t in by_target
    ]
    if others:
        parts.append(
            others[0][0].upper() + others[0][1:] + ("; " + "; ".join(others[1:]) if others[1:] else "") + "."
        )
    if gap:
        psi_lo = min(gap, key=lambda e: e["Psi"] if not math.isnan(e["Psi"]) else math.inf)
        psi_hi = max(gap, key=lambda e: e["Psi"] if not math.isnan(e["Psi"]) else -math.inf)
        axes = list(dict.fromkeys(a for pop in gap[0]["groups"] for a in pop))
        counts = {a: [pop.get(a, 0) for pop in gap[0]["groups"]] for a in axes}
        used = [c for a in axes if min(counts[a]) > 0 for c in counts[a]]
        empty = [a for a in axes if max(counts[a]) == 0]
        parts.append(
            f"Granulated Ψ against the gap (mean over the populations) ranges from {psi_lo['Psi']:+.2f} "
            f"(`{psi_lo['measure']}`) to {psi_hi['Psi']:+.2f} (`{psi_hi['measure']}`), from "
            f"{min(used, default=0)}–{max(used, default=0)} groups per axis and population"
            + (f" (none for {', '.join(f'`{a}`' for a in empty)})." if empty else ".")
        )
    t = doc.get("timing") or {}
    if t.get("wall_seconds"):
        parts.append(
            f"Training and measuring took {t['wall_seconds'] / 60:.1f} min wall time with {t['jobs']} "
            f"worker processes ({t['cpu_seconds'] / 60:.1f} CPU-min)."
        )
    return " ".join(parts)
