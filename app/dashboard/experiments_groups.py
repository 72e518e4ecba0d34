"""Experiments before methods: the "Experiments" page splits the runs it finds into experiments
(one directory ``<out_dir>/<name>`` of ``python -m experiments run`` each, the runner's layout
``<out_dir>/<name>/[<variant>/]<method>/seed<k>/``) and shows one table per experiment, as
``python -m experiments table <out_dir>/<name>`` prints it; the settings in which the experiments
differ (:func:`experiments.run_identity.run_settings` of their configs, e.g. ``data.label_noise``) label
them. Training curves are coloured per (experiment, method), with one line style per experiment.

Widget state belongs to the directory it was chosen in (:func:`state_key`): another directory gets
new widgets, so no chip of the previous directory stays on screen. No Streamlit here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from plotly.colors import qualitative

from experiments.run_identity import run_settings
from experiments.table import aggregate, format_cell

from .experiments_view import color_of, default_reliability_runs

__all__ = [
    "DASHES",
    "DEFAULT_METRICS",
    "curve_groups",
    "curve_styles",
    "default_metrics",
    "display_rows",
    "experiment_dir",
    "experiment_titles",
    "split_experiments",
    "state_key",
    "tables_by_experiment",
]

#: line style per experiment (cycled)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

#: metrics shown first in a table (the miniature table of docs/reproductions.md); the rest can be added
DEFAULT_METRICS = ("accuracy", "nll", "ece", "brier", "sharpness_lambda_max", "auroc_misclassification")

#: metrics a table shows by default: more would not fit the page's width
MAX_DEFAULT_METRICS = 6


def state_key(name: str, root: str | Path, *extra: Any) -> str:
    """A widget key that belongs to ``root`` (and ``extra``): ``name@<hash>``. Another directory
    gives another key, hence a new widget with its own defaults (a Streamlit widget keeps what the
    browser sent for its key, whatever the page pops from ``session_state``)."""
    text = json.dumps([str(root), *[str(e) for e in extra]])
    return f"{name}@{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def experiment_dir(row: dict[str, Any]) -> Path:
    """The experiment directory ``<out_dir>/<name>`` of a run (a row of
    :func:`experiments.table.collect_runs`): its directory without ``[<variant>/]<method>/seed<k>``.
    A directory laid out otherwise counts as its grandparent's experiment."""
    d = Path(row["_dir"])
    variant = str(row.get("variant") or "")
    tail = [*Path(variant).parts, str(row.get("method")), f"seed{row.get('seed')}"]
    if len(d.parts) > len(tail) and list(d.parts[-len(tail) :]) == tail:
        return Path(*d.parts[: -len(tail)])
    return d.parent.parent


def _label(exp: Path, root: Path) -> str:
    try:
        rel = exp.relative_to(root)
    except ValueError:
        return exp.name or str(exp)
    return str(rel) if str(rel) != "." else (exp.name or str(exp))


def split_experiments(rows: list[dict[str, Any]], root: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The rows by experiment, labelled by the experiment's directory below ``root`` (its name when
    ``root`` is the experiment itself), in path order."""
    root = Path(root).expanduser()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: str(r["_dir"])):
        out.setdefault(_label(experiment_dir(r), root), []).append(r)
    return out


def _common_settings(rows: list[dict[str, Any]]) -> tuple[dict[str, str], set[str]] | None:
    """The settings (``run_settings``, without the per-method ``methods.*`` keys) every run of an
    experiment shares (canonical JSON values) and every key any run has; ``None`` when a run has no
    ``config.toml``."""
    common: dict[str, str] | None = None
    seen: set[str] = set()
    for r in rows:
        cfg = r.get("_config")
        if not isinstance(cfg, dict):
            return None
        flat = {
            k: json.dumps(v, sort_keys=True, default=str)
            for k, v in run_settings(cfg).items()
            if not k.startswith("methods")
        }
        seen |= set(flat)
        common = flat if common is None else {k: v for k, v in common.items() if flat.get(k) == v}
    return common or {}, seen


def _shown(v: str) -> str:
    try:
        value = json.loads(v)
    except (TypeError, ValueError):
        return v
    return value if isinstance(value, str) else json.dumps(value)


def experiment_titles(experiments: dict[str, list[dict[str, Any]]], max_keys: int = 4) -> dict[str, str]:
    """Per experiment, the settings in which it differs from the other experiments shown
    (``data.label_noise=0.4``; "varies" where its own runs differ, e.g. a sweep; "" when alone or
    equal), from their configs; at most ``max_keys`` keys, then "and N more"."""
    found = {e: _common_settings(rows) for e, rows in experiments.items()}
    known = {e: c[0] for e, c in found.items() if c is not None}
    keys: list[str] = []
    for c in known.values():
        keys += [k for k in c if k not in keys]
    differing = [k for k in keys if len({c.get(k, "(unset)") for c in known.values()}) > 1]
    out = {}
    for e in experiments:
        if found[e] is None:
            out[e] = "runs without config.toml: settings unknown"
            continue
        common, seen = found[e]
        parts = [
            f"{k}={_shown(common[k]) if k in common else 'varies' if k in seen else '(unset)'}"
            for k in differing
        ]
        more = len(parts) - max_keys
        out[e] = ", ".join(parts[:max_keys]) + (f" and {more} more" if more > 0 else "")
    return out


def tables_by_experiment(experiments: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """:func:`experiments.table.aggregate` of each experiment's runs on its own (one row per method,
    or per method and settings where runs of one experiment differ)."""
    return {e: aggregate(rows) for e, rows in experiments.items()}


def metrics_of(entries: list[dict[str, Any]]) -> list[str]:
    """The metrics of an experiment's table, in the table's order."""
    out: list[str] = []
    for e in entries:
        out += [m for m in e["mean"] if m not in out]
    return out


def default_metrics(metrics: list[str]) -> list[str]:
    """The metrics a table shows before the user adds others: :data:`DEFAULT_METRICS` first, then
    the table's order, at most :data:`MAX_DEFAULT_METRICS`."""
    first = [m for m in DEFAULT_METRICS if m in metrics]
    rest = [m for m in metrics if m not in first]
    return (first + rest)[:MAX_DEFAULT_METRICS]


def display_rows(entries: list[dict[str, Any]], metrics: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per table group: ``method``, ``seeds`` (completed runs averaged), ``diverged``
    ("1 of 3", when a run diverged) and one "mean ± std" cell per metric (4 and 2 significant
    digits, as ``python -m experiments table`` prints them, by :func:`experiments.table.format_cell`:
    "–" where a method has no such metric, "nan (non-finite in seed 1)" where a run's value is NaN)."""
    metrics = metrics_of(entries) if metrics is None else metrics
    any_diverged = any(e.get("diverged") for e in entries)
    rows = []
    for e in entries:
        row: dict[str, Any] = {"method": e["group"], "seeds": e["n"]}
        if any_diverged:
            row["diverged"] = f"{e['diverged']} of {e['runs']}"
        for m in metrics:
            row[m] = format_cell(e, m)
        rows.append(row)
    return rows


def curve_groups(tables: dict[str, list[dict[str, Any]]], multi: bool) -> dict[str, str]:
    """Run directory -> its curve label: ``experiment · group`` when several experiments are shown,
    else the group label of the table."""
    return {
        str(d): f"{exp} · {e['group']}" if multi else e["group"]
        for exp, entries in tables.items()
        for e in entries
        for d in e.get("dirs", [])
    }


def curve_styles(tables: dict[str, list[dict[str, Any]]], multi: bool) -> dict[str, tuple[str, str]]:
    """Curve label -> (colour, dash): one colour per (experiment, method), the method's palette
    colour (:func:`color_of`) for its first experiment and unused colours for the others, and one
    line style per experiment (:data:`DASHES`)."""
    spare = [*qualitative.Dark24, *qualitative.Alphabet, *qualitative.Light24]
    exps = list(tables)
    out: dict[str, tuple[str, str]] = {}
    used: set[str] = set()
    for label in dict.fromkeys(curve_groups(tables, multi).values()):
        exp, method = label.split(" · ", 1) if multi else (exps[0], label)
        colour = color_of(method.split(" [")[0])
        if colour in used:
            colour = next((c for c in spare if c not in used), spare[len(used) % len(spare)])
        used.add(colour)
        out[label] = (colour, DASHES[exps.index(exp) % len(DASHES)] if exp in exps else "solid")
    return out


#: default runs of the reliability diagram: the first completed run of at most this many table rows
MAX_RELIABILITY = 8


def default_reliability(tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The diagram's default runs: per table row (experiment by experiment), the first completed
    run with a checkpoint, at most :data:`MAX_RELIABILITY`."""
    out = [d for entries in tables.values() for d in default_reliability_runs(entries)]
    return out[:MAX_RELIABILITY]


def slug(text: str) -> str:
    """A file-name-safe version of an experiment label."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", text).strip("_") or "experiment"


def table_caption(entries: list[dict[str, Any]], n_runs: int, metrics: list[str] | None = None) -> str:
    """What a table's cells are, from its rows: runs, seeds per row, what "–" and a missing std mean
    (each only when the table's ``metrics`` columns show one)."""
    metrics = metrics_of(entries) if metrics is None else metrics
    seeds = sorted({e["n"] for e in entries})
    per_row = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]}"
    parts = [
        f"{n_runs} runs in {len(entries)} rows, {per_row} completed seed(s) per row; each cell is the "
        "mean ± sample standard deviation over the row's seeds (ddof = 1), as `python -m experiments "
        "table` prints it"
    ]
    if any(e["n"] == 1 for e in entries) and metrics:
        parts.append("a row with one seed has no standard deviation (the mean alone)")
    if any(format_cell(e, m) == "–" for e in entries for m in metrics):
        parts.append("– : the method has no such metric (e.g. bma_* of a non-Bayesian method)")
    return "; ".join(parts) + "."


def curves_caption(multi: bool) -> str:
    """How the training curves are coloured."""
    if multi:
        return (
            "One colour per experiment and method (legend: experiment · method) and one line style per "
            "experiment; one line per seed."
        )
    return "One colour per table row (method), one line per seed."
