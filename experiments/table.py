"""Results tables: mean and standard deviation over seeds of every metric, per method (and sweep
variant), as Markdown, CSV or JSON, next to the paper's numbers when the config has a ``[paper]``
table, and a bar chart with error bars.

The standard deviation is the sample standard deviation over seeds (``numpy.std(ddof=1)``, the
``n - 1`` denominator); with one seed it is undefined and shown as ``nan`` / left out.

``[paper]`` table of a config: ``source`` (a citation), ``percent`` (metrics the paper prints in
percent: ours are shown times 100 in those columns) and one sub-table per metric mapping a group
label (``method`` or ``variant/method``) to ``[mean, std]`` or a number, e.g.
``[paper.accuracy] sgd = [92.91, 0.13]``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

from landscape.io import atomic_write, atomic_write_text, read_json, to_jsonable

__all__ = ["aggregate", "collect_runs", "format_table", "plot_table"]

_ID_KEYS = ("method", "seed", "variant")


def collect_runs(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The ``metrics.json`` rows under ``paths`` (run directories or any directory above them).

    Each row gains ``_dir`` and ``_paper`` (the run config's ``[paper]`` table, if any).
    Raises ``FileNotFoundError`` for a missing path and ``ValueError`` when no run is found.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist; give run directories (or directories above them)")
        if p.is_file():
            files.append(p if p.name == "metrics.json" else p.parent / "metrics.json")
        else:
            files.extend(sorted(p.rglob("metrics.json")))
    rows, seen = [], set()
    for f in files:
        if f in seen or not f.is_file():
            continue
        seen.add(f)
        row = read_json(f, what="metrics file of a run")
        if not isinstance(row, dict) or "method" not in row:
            raise ValueError(f"{f} is not a metrics file of the experiment runner (no 'method' entry)")
        row = dict(row)
        row["_dir"] = str(f.parent)
        cfg_file = f.parent / "config.toml"
        paper: dict[str, Any] = {}
        if cfg_file.is_file():
            try:
                paper = tomllib.loads(cfg_file.read_text(encoding="utf-8")).get("paper", {})
            except (tomllib.TOMLDecodeError, UnicodeDecodeError):
                paper = {}
        row["_paper"] = paper
        rows.append(row)
    if not rows:
        raise ValueError(
            f"no runs (metrics.json files) under {', '.join(map(str, paths))}; has a run finished?"
        )
    return rows


def _label(row: dict[str, Any]) -> str:
    return f"{row['variant']}/{row['method']}" if row.get("variant") else str(row["method"])


def aggregate(rows: list[dict[str, Any]], metrics: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One entry per group (variant/method, in first-seen order): ``group``, ``n``, ``seeds`` and
    ``mean`` / ``std`` (ddof=1) / ``values`` per metric."""
    if metrics is None:
        metrics = []
        for r in rows:
            metrics += [k for k in r if k not in _ID_KEYS and not k.startswith("_") and k not in metrics]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(_label(r), []).append(r)
    out = []
    for label, members in groups.items():
        seeds = [m.get("seed") for m in members]
        if len(set(seeds)) != len(seeds):
            dirs = [m["_dir"] for m in members]
            raise ValueError(f"group {label!r} holds the same seed twice ({seeds}); runs: {dirs}")
        entry: dict[str, Any] = {
            "group": label,
            "n": len(members),
            "seeds": seeds,
            "mean": {},
            "std": {},
            "values": {},
            "paper": members[0].get("_paper", {}),
        }
        for m in metrics:
            vals = [float(r[m]) if isinstance(r.get(m), (int, float)) else math.nan for r in members]
            arr = np.asarray(vals, dtype=np.float64)
            entry["values"][m] = vals
            entry["mean"][m] = float(arr.mean())
            entry["std"][m] = float(arr.std(ddof=1)) if len(arr) > 1 else math.nan
        out.append(entry)
    return out


def _paper_value(entry: dict[str, Any], metric: str) -> str:
    table = entry["paper"].get(metric)
    if not isinstance(table, dict) or entry["group"] not in table:
        return ""
    v = table[entry["group"]]
    if isinstance(v, list) and len(v) == 2:
        return f"{v[0]} ± {v[1]}"
    return str(v)


def _scale(entry: dict[str, Any], metric: str) -> float:
    return 100.0 if metric in entry["paper"].get("percent", []) else 1.0


def _cell(mean: float, std: float) -> str:
    if math.isnan(std):
        return f"{mean:.4g}"
    return f"{mean:.4g} ± {std:.2g}"


def format_table(entries: list[dict[str, Any]], fmt: str = "markdown") -> str:
    """The aggregated table as ``markdown``, ``csv`` or ``json`` text."""
    if fmt == "json":
        return json.dumps(to_jsonable([{k: v for k, v in e.items()} for e in entries]), indent=2) + "\n"
    metrics = list(entries[0]["mean"]) if entries else []
    with_paper = [m for m in metrics if any(_paper_value(e, m) for e in entries)]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(
            [
                "group",
                "n",
                *[f"{m}_{s}" for m in metrics for s in ("mean", "std")],
                *[f"{m}_paper" for m in with_paper],
            ]
        )
        for e in entries:
            w.writerow(
                [
                    e["group"],
                    e["n"],
                    *[repr(e[s][m]) for m in metrics for s in ("mean", "std")],
                    *[_paper_value(e, m) for m in with_paper],
                ]
            )
        return buf.getvalue()
    if fmt != "markdown":
        raise ValueError(f"format must be markdown, csv or json, got {fmt!r}")
    head = ["method", "seeds"]
    for m in metrics:
        pct = entries and any(_scale(e, m) == 100.0 for e in entries)
        head.append(f"{m} (%)" if pct else m)
        if m in with_paper:
            head.append(f"{m} (paper)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        cells = [e["group"], str(e["n"])]
        for m in metrics:
            s = _scale(e, m)
            cells.append(_cell(e["mean"][m] * s, e["std"][m] * s))
            if m in with_paper:
                cells.append(_paper_value(e, m) or "–")
        lines.append("| " + " | ".join(cells) + " |")
    notes = sorted({e["paper"]["source"] for e in entries if e["paper"].get("source")})
    foot = ["", "mean ± sample standard deviation over seeds (ddof = 1)"]
    foot += [f"paper: {n}" for n in notes]
    return "\n".join(lines + foot) + "\n"


def plot_table(entries: list[dict[str, Any]], path: str | Path, metrics: Sequence[str] | None = None) -> Path:
    """Bar chart (one panel per metric, one bar per group, error bars = std over seeds) as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(metrics or (entries[0]["mean"] if entries else []))
    if not metrics:
        raise ValueError("nothing to plot: the runs have no metrics")
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    labels = [e["group"] for e in entries]
    for ax, m in zip(axes.flat, metrics):
        means = [e["mean"][m] for e in entries]
        stds = [0.0 if math.isnan(e["std"][m]) else e["std"][m] for e in entries]
        ax.bar(range(len(entries)), means, yerr=stds, capsize=4, color=f"C{metrics.index(m) % 10}")
        ax.set_xticks(range(len(entries)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(m, fontsize=10)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.tight_layout()
    path = Path(path)
    atomic_write(path, lambda p: fig.savefig(p, dpi=120, format="png"))
    plt.close(fig)
    return path


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write_text(path, text)
