"""Sensitivity plots of a sweep: a metric against one swept key (one line per method, error bars)
or against two (a heat map of the mean per method), from the entries of
:func:`experiments.table.aggregate`.

A sweep is read from the entries, not from a config: each entry's ``swept`` holds the dotted keys in
which the settings of its method's rows differ and its values there
(``{"methods.sam.hyperparameters.rho": 0.05}``). :func:`sweep_layout` decides the kind of plot:

* ``line`` -- every swept method (a method with more than one row) varies exactly one key: metric
  against that key, one line per method, error bars of ``error`` (``std``: the sample standard
  deviation over seeds, ddof 1; ``stderr``: std / sqrt(n)); the x-axis is logarithmic when the
  values are positive and span more than one decade (max / min > 10), as the rho sensitivity plots
  of SAM-family papers are drawn; non-numeric values are placed at 0, 1, 2, ... with their names.
  Methods that were not swept (one row, e.g. SGD beside a SAM rho sweep) are a dashed horizontal
  line with a band of the same error.
* ``heatmap`` -- every swept method varies exactly two keys (Fisher-SAM's gamma x eta, Kim et al.
  2022, Fig. 3): one panel per (method, metric), rows = the first key, columns = the second (their
  order in the run's config), each cell the mean, annotated with mean and error; cells that were
  not run, or whose runs all diverged, are blank and say so.
* ``None`` -- anything else (no sweep, methods sweeping different numbers of keys, two rows of a
  method at one point): the caller draws its bar chart.

The figure's numbers go into a plain dict (:func:`sweep_figure`'s record) that the table command
writes as JSON next to the figure (:func:`numbers_path`), so a plotted value can be checked without
reading pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ERROR_LABELS", "numbers_path", "sweep_figure", "sweep_layout"]

#: what an error bar is, for ``error="std"`` and ``error="stderr"``
ERROR_LABELS = {
    "std": "error bars: ± 1 sample standard deviation over seeds (ddof 1)",
    "stderr": "error bars: ± 1 standard error of the mean (std / sqrt(n))",
}


def numbers_path(figure: str | Path) -> Path:
    """Where the numbers of the figure ``figure`` go: ``sweep.png`` -> ``sweep.plot.json``."""
    figure = Path(figure)
    return figure.with_name(f"{figure.stem}.plot.json")


def _short(key: str) -> str:
    return key.split(".")[-1]


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _axis(values: Sequence[Any]) -> list[Any]:
    """The distinct values of a key in axis order: sorted numbers, else the order first seen."""
    distinct: list[Any] = []
    for v in values:
        if v not in distinct:
            distinct.append(v)
    return sorted(distinct) if _numeric(distinct) else distinct


def sweep_layout(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep the entries form: ``{"kind": "line" | "heatmap", "methods": {method: {"keys":
    [dotted keys], "entries": [...]}}, "unswept": {method: entry}}``, or ``None`` when they form no
    1-D or 2-D sweep (see the module docstring)."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_method.setdefault(str(e.get("method", e.get("base", e["group"]))), []).append(e)
    swept: dict[str, dict[str, Any]] = {}
    unswept: dict[str, dict[str, Any]] = {}
    for method, items in by_method.items():
        if len(items) == 1 and not items[0].get("swept"):
            unswept[method] = items[0]
            continue
        keys = list(items[0].get("swept") or {})
        if not keys or any(list(e.get("swept") or {}) != keys for e in items):
            return None  # rows of a method that are no sweep (no config.toml, other keys)
        points = [_point(e["swept"], keys) for e in items]
        if len(set(points)) != len(points):
            return None  # two rows at one point (other settings, or two experiments)
        swept[method] = {"keys": keys, "entries": items}
    dims = {len(s["keys"]) for s in swept.values()}
    if len(dims) != 1 or dims.pop() not in (1, 2):
        return None
    kind = "line" if len(next(iter(swept.values()))["keys"]) == 1 else "heatmap"
    return {"kind": kind, "methods": swept, "unswept": unswept}


def _point(point: dict[str, Any], keys: Sequence[str]) -> str:
    """A hashable form of one sweep point (its values of ``keys``)."""
    return repr([point[k] for k in keys])


def _stats(entry: dict[str, Any], metric: str) -> dict[str, float]:
    std = entry["std"].get(metric, math.nan)
    n = entry.get("n", 0)
    se = entry.get("stderr", {}).get(metric, std / math.sqrt(n) if n > 1 else math.nan)
    return {"mean": entry["mean"].get(metric, math.nan), "std": std, "stderr": se, "n": n}


def _err(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def sweep_figure(
    entries: list[dict[str, Any]],
    metrics: Sequence[str],
    error: str = "std",
    layout: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The matplotlib figure of the sweep the entries form and the record of its numbers:
    ``kind``, ``error``, ``error_label``, ``metrics`` and per swept method its ``keys``, the axis
    values (``x`` for a line; ``rows`` / ``cols`` for a heat map) and per metric ``mean``, ``std``,
    ``stderr``, ``n``, ``groups`` (lists along ``x``, or ``rows`` x ``cols`` grids with NaN where no
    run finished); ``unswept``: per method not swept its ``group`` and per metric the same numbers.

    Raises:
        ValueError: ``error`` is not ``std`` or ``stderr``, no metrics, or the entries form no sweep.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if error not in ERROR_LABELS:
        raise ValueError(f"error must be one of {sorted(ERROR_LABELS)}, got {error!r}")
    metrics = list(metrics)
    if not metrics:
        raise ValueError("nothing to plot: the runs have no metrics")
    layout = layout or sweep_layout(entries)
    if layout is None:
        raise ValueError("the runs form no 1-D or 2-D sweep (see experiments.sweep_plot)")
    record: dict[str, Any] = {
        "kind": layout["kind"],
        "error": error,
        "error_label": ERROR_LABELS[error],
        "metrics": metrics,
        "methods": {},
        "unswept": {},
    }
    for method, e in layout["unswept"].items():
        record["unswept"][method] = {"group": e["group"], "metrics": {m: _stats(e, m) for m in metrics}}
    if layout["kind"] == "line":
        fig = _line_figure(plt, layout, metrics, error, record)
    else:
        fig = _heatmap_figure(plt, layout, metrics, error, record)
    caption = ERROR_LABELS[error] if layout["kind"] == "line" else _heat_caption(error)
    if layout["kind"] == "heatmap" and record["unswept"]:
        caption += f"; not swept (numbers in the JSON): {', '.join(record['unswept'])}"
    fig.text(0.5, 0.005, caption, ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig, record


def _heat_caption(error: str) -> str:
    return f"cells: mean over seeds, ± {'standard error' if error == 'stderr' else 'sample std (ddof 1)'}"


def _line_figure(
    plt: Any, layout: dict[str, Any], metrics: list[str], error: str, record: dict[str, Any]
) -> Any:
    methods = layout["methods"]
    all_values = [e["swept"][s["keys"][0]] for s in methods.values() for e in s["entries"]]
    numeric = _numeric(all_values)
    categories = _axis(all_values)
    log = numeric and min(all_values) > 0 and max(all_values) / min(all_values) > 10
    xlabel = " / ".join(dict.fromkeys(_short(s["keys"][0]) for s in methods.values()))
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.4 * rows), squeeze=False)
    for method, s in methods.items():
        key = s["keys"][0]
        by_value = {_point(e["swept"], [key]): e for e in s["entries"]}
        xs = _axis([e["swept"][key] for e in s["entries"]])
        ordered = [by_value[_point({key: x}, [key])] for x in xs]
        rec: dict[str, Any] = {"keys": [key], "x": xs, "groups": [e["group"] for e in ordered], "metrics": {}}
        for m in metrics:
            stats = [_stats(e, m) for e in ordered]
            rec["metrics"][m] = {k: [st[k] for st in stats] for k in ("mean", "std", "stderr", "n")}
        record["methods"][method] = rec
    for i, (ax, m) in enumerate(zip(axes.flat, metrics)):
        for j, (method, rec) in enumerate(record["methods"].items()):
            r = rec["metrics"][m]
            pos = rec["x"] if numeric else [categories.index(x) for x in rec["x"]]
            shown = [k for k, y in enumerate(r["mean"]) if math.isfinite(y)]
            ax.errorbar(
                [pos[k] for k in shown],
                [r["mean"][k] for k in shown],
                yerr=[_err(r[error][k]) for k in shown],
                marker="o",
                markersize=4,
                capsize=3,
                color=f"C{j % 10}",
                label=method,
            )
        for j, (method, u) in enumerate(record["unswept"].items(), start=len(record["methods"])):
            st = u["metrics"][m]
            if not math.isfinite(st["mean"]):
                continue
            ax.axhline(st["mean"], ls="--", lw=1, color=f"C{j % 10}", label=f"{method} (not swept)")
            e = _err(st[error])
            if e > 0:
                ax.axhspan(st["mean"] - e, st["mean"] + e, color=f"C{j % 10}", alpha=0.12, lw=0)
        if log:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(categories)), [str(c) for c in categories], rotation=30, ha="right")
        ax.set_xlabel(xlabel)
        ax.set_title(m, fontsize=10)
        if i == 0:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    record["log_x"] = bool(log)
    return fig


def _heatmap_figure(
    plt: Any, layout: dict[str, Any], metrics: list[str], error: str, record: dict[str, Any]
) -> Any:
    methods = layout["methods"]
    fig, axes = plt.subplots(
        len(methods), len(metrics), figsize=(4.6 * len(metrics), 3.8 * len(methods)), squeeze=False
    )
    for i, (method, s) in enumerate(methods.items()):
        ky, kx = s["keys"]
        ys = _axis([e["swept"][ky] for e in s["entries"]])
        xs = _axis([e["swept"][kx] for e in s["entries"]])
        cell = {_point(e["swept"], [ky, kx]): e for e in s["entries"]}
        rec: dict[str, Any] = {"keys": [ky, kx], "rows": ys, "cols": xs, "metrics": {}}
        at = {(y, x): cell.get(_point({ky: y, kx: x}, [ky, kx])) for y in ys for x in xs}
        rec["groups"] = [[at[y, x]["group"] if at[y, x] else None for x in xs] for y in ys]
        for j, m in enumerate(metrics):
            grids = {k: np.full((len(ys), len(xs)), np.nan) for k in ("mean", "std", "stderr", "n")}
            ax = axes[i, j]
            for a, y in enumerate(ys):
                for b, x in enumerate(xs):
                    e = at[y, x]
                    if e is None:
                        continue
                    for k, v in _stats(e, m).items():
                        grids[k][a, b] = v
            image = ax.imshow(
                np.ma.masked_invalid(grids["mean"]), origin="lower", aspect="auto", cmap="viridis"
            )
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
            for a, y in enumerate(ys):
                for b, x in enumerate(xs):
                    e = at[y, x]
                    mean, err = grids["mean"][a, b], grids[error][a, b]
                    if e is None:
                        text = "not run"
                    elif not math.isfinite(mean):
                        text = "diverged" if e.get("n", 0) == 0 and e.get("diverged") else "–"
                    else:
                        text = f"{mean:.4g}" + (f"\n±{err:.1g}" if math.isfinite(err) else "")
                    light = e is not None and math.isfinite(mean) and float(image.norm(mean)) > 0.6
                    color = "k" if light or e is None else "w"
                    ax.text(b, a, text, ha="center", va="center", fontsize=7, color=color)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
            ax.set_yticks(range(len(ys)), [str(y) for y in ys])
            ax.set_xlabel(_short(kx))
            ax.set_ylabel(_short(ky))
            ax.set_title(f"{method}: {m}", fontsize=10)
            rec["metrics"][m] = {k: g.tolist() for k, g in grids.items()}
        record["methods"][method] = rec
    return fig
