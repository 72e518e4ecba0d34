"""The study's figure: one panel per sharpness measure against the generalisation gap, every distinct
member of the populations as a point (colour: optimizer, marker: model; open markers: the members
left out of the correlations because they did not reach the stopping rule's training loss), the
pooled Kendall tau-b with its interval and ``k/P`` (populations whose own interval excludes 0,
:mod:`experiments.study.combine`) in each title. A measure whose values are all positive and span a
factor of 3 or more gets a log axis with labelled ticks (:func:`log_ticks`: decades, 1-2-5 steps or
finer on a narrow range) so that a narrow range still carries readable labels."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from landscape.io import atomic_savefig

__all__ = ["log_ticks", "plot_study"]


def _label(v: float) -> str:
    if v == 0:
        return "0"
    e = math.floor(math.log10(abs(v)) + 1e-9)
    if -3 <= e <= 3:
        return f"{v:g}"
    m = v / 10**e
    return f"{m:g}e{e}" if abs(m - 1) > 1e-9 else f"1e{e}"


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick positions and labels for a log axis over ``[lo, hi]`` (``0 < lo <= hi``): powers of ten
    when they give at least three ticks, else 1-2-5 or 1-2-3-5 steps when they do, else every
    integer mantissa; the two neighbours of the range when even that gives fewer than two."""
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"log_ticks needs 0 < lo <= hi, got {lo!r}, {hi!r}")
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    ticks: list[float] = []
    for mantissas in ((1,), (1, 2, 5), (1, 2, 3, 5), tuple(range(1, 10))):
        ticks = [m * 10.0**e for e in range(e0, e1 + 1) for m in mantissas]
        inside = [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        if len(inside) >= (2 if len(mantissas) == 9 else 3):
            ticks = inside
            break
    else:  # narrower than one mantissa step: the neighbours around the range
        below = max((t for t in ticks if t <= lo), default=lo)
        above = min((t for t in ticks if t >= hi), default=hi)
        ticks = sorted({below, above})
    return ticks, [_label(t) for t in ticks]


def plot_study(
    rows: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    measures: list[str],
    path: str | Path,
    target: str = "gap_error",
) -> Path:
    """Write the figure (atomically, in the format the name ends in; PNG without one) of ``rows``
    (every member; those without a finite value of a measure are not drawn in its panel) with the
    combined ``entries`` of ``target`` in the titles; returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

    by = {(e["measure"], e["target"]): e for e in entries}
    ncol = 4
    nrow = math.ceil(len(measures) / ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(4.0 * ncol, 3.2 * nrow + 0.6), squeeze=False)
    opts = sorted({r["optimizer"] for r in rows})
    models = sorted({r["model"] for r in rows})
    colours = {o: f"C{i}" for i, o in enumerate(opts)}
    markers = {m: "o^sDv"[i % 5] for i, m in enumerate(models)}
    ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    for ax, m in zip(axs.flat, measures):
        pts = [r for r in rows if ok(r.get(m)) and ok(r.get(target))]
        for r in pts:
            c = colours[r["optimizer"]]
            out = r.get("status") == "not_converged"
            ax.scatter(
                r[m],
                r[target],
                marker=markers[r["model"]],
                s=16,
                facecolors="none" if out else c,
                edgecolors=c,
                linewidths=0.8,
                alpha=0.9 if out else 0.6,
            )
        lo, hi = (min(r[m] for r in pts), max(r[m] for r in pts)) if pts else (0.0, 0.0)
        if lo > 0 and hi >= 3 * lo:  # a log axis where the values span a factor of 3 or more
            ax.set_xscale("log")
            ticks, labels = log_ticks(lo, hi)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_major_formatter(FixedFormatter(labels))
            ax.xaxis.set_minor_formatter(NullFormatter())
        e = by.get((m, target))
        title = m
        if e is not None and not math.isnan(e["tau"]):
            title += (
                f"\npooled τ={e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}], "
                f"excl. 0 in {e['excludes_zero']}/{e['populations']}"
            )
        ax.set_title(title, fontsize=8.5)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(target, fontsize=8)
    for ax in list(axs.flat)[len(measures) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], ls="", marker="o", color=colours[o], label=o) for o in opts]
    handles += [plt.Line2D([], [], ls="", marker=markers[m], color="grey", label=m) for m in models]
    handles.append(
        plt.Line2D(
            [],
            [],
            ls="",
            marker="o",
            markerfacecolor="none",
            color="grey",
            label="did not reach the target loss (excluded)",
        )
    )
    fig.legend(handles=handles, loc="lower right", fontsize=8, ncol=2)
    n_in = sum(1 for r in rows if r.get("status") not in ("diverged", "not_converged"))
    n_pop = next(iter(entries))["populations"] if entries else 1
    fig.suptitle(
        f"Sharpness vs generalisation gap: {len(rows)} models in {n_pop} populations, {n_in} in the "
        "correlations (Kendall tau-b, pooled 95% bootstrap interval)"
    )
    fig.tight_layout(rect=(0, 0, 1, 0.975))
    atomic_savefig(path, fig, dpi=80)
    plt.close(fig)
    return Path(path)
