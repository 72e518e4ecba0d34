"""Logic of the "Experiments" page: open the run directories written by ``python -m experiments run``
and show their results table (mean ± std over seeds, from :mod:`experiments.table`), per-epoch
training curves (``log.jsonl``) and reliability diagrams of the trained point models.

Runs are grouped as the table command groups them (:func:`experiments.table.aggregate`: one row per
method and result-relevant settings, labelled by the keys that differ, e.g.
``sgd [data.label_noise=0.4]``); the curves have one colour per such group, and diverged runs are
listed (step, reason) and left out of the means.

The runner saves no test probabilities, so a reliability diagram is recomputed: the run's model is
rebuilt from its ``config.toml`` and the weights in ``checkpoint.pt`` and evaluated on the run's own
test set (:func:`experiments.data.prepare_data`), which gives the calibration curve of the point
model whose ``ece`` is in ``metrics.json`` (Guo et al., ICML 2017, section 2).
No Streamlit here, so tests call it directly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import tomllib
import torch
from plotly.colors import qualitative

from experiments.amp import param_dtype
from experiments.budget import apply_budget
from experiments.checkpoint import read_checkpoint
from experiments.config import resolve_config
from experiments.data import prepare_data
from experiments.ensembles import predict_probs
from experiments.table import aggregate, collect_runs, format_table
from experiments.train import build_model
from landscape import metrics as lm
from landscape.io import read_json
from toy_problems.figures.palette import METHOD_COLORS, method_color

from .layout import LEGEND_BELOW

__all__ = [
    "DEFAULT_ROOT_ENV",
    "color_of",
    "default_reliability_runs",
    "default_root",
    "diverged_rows",
    "group_colors",
    "run_groups",
    "find_runs",
    "results_table",
    "table_rows",
    "table_csv",
    "read_history",
    "curve_keys",
    "curves_figure",
    "run_label",
    "run_method",
    "run_probs",
    "reliability_of",
]

#: environment variable with the default directory the page searches for runs
DEFAULT_ROOT_ENV = "SHARPSCAPE_RUNS"


_EXTRA = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d")


def color_of(method: str) -> str:
    """The palette colour of a method name as the runner writes it (``sgd``, ``sam``, ``bsam``,
    ``variant/sam``: case-insensitive, the variant ignored); a name the palette lacks gets a fixed
    colour derived from its letters (the same on every page load)."""
    base = str(method).split("/")[-1].strip()
    known = {k.lower(): k for k in METHOD_COLORS} | {"bsam": "bSAM", "fsam": "FSAM", "fishersam": "FisherSAM"}
    if base.lower() in known:
        return method_color(known[base.lower()])
    return _EXTRA[sum(map(ord, base)) % len(_EXTRA)]


def default_root() -> str:
    """``$SHARPSCAPE_RUNS`` when set, else ``runs`` (the runner's default ``out_dir``)."""
    return os.environ.get(DEFAULT_ROOT_ENV, "runs")


def find_runs(root: str | Path) -> list[str]:
    """Run directories (holding ``metrics.json``) under ``root``, sorted.

    The default root (:func:`default_root`) not existing yet is the empty state of a fresh install
    (no runs: ``[]``); any other missing path raises ``FileNotFoundError`` naming it."""
    if not Path(root).expanduser().exists() and str(root) == default_root():
        return []
    root = Path(root).expanduser()
    if not root.exists():
        raise FileNotFoundError(
            f"{root} does not exist; give the out_dir of `python -m experiments run` (default runs/)"
        )
    if root.is_file():
        root = root.parent
    return sorted(str(f.parent) for f in root.rglob("metrics.json"))


def run_label(run_dir: str | Path, root: str | Path | None = None) -> str:
    """``variant/method/seedK`` (the run's path below ``root``), or the path itself."""
    p = Path(run_dir)
    if root is not None:
        try:
            return str(p.relative_to(Path(root).expanduser()))
        except ValueError:
            pass
    return str(p)


def results_table(run_dirs: list[str], *, strict: bool = False) -> list[dict[str, Any]]:
    """:func:`experiments.table.aggregate` of the runs' ``metrics.json`` rows (one entry per group:
    variant/method and settings, with ``mean`` / ``std`` (ddof = 1) / ``values`` per metric over the
    completed runs, ``diverged`` / ``diverged_runs``, ``dirs``)."""
    if not run_dirs:
        raise ValueError("no runs chosen; pick at least one run directory")
    return aggregate(collect_runs(run_dirs), strict=strict)


def table_rows(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per group for display: ``method`` (the group label), ``seeds`` (completed runs
    averaged), ``diverged`` ("1 of 3", only when a run diverged) and ``<metric> mean`` / ``std``."""
    any_diverged = any(e.get("diverged") for e in entries)
    rows = []
    for e in entries:
        row: dict[str, Any] = {"method": e["group"], "seeds": e["n"]}
        if any_diverged:
            row["diverged"] = f"{e['diverged']} of {e['runs']}"
        for m in e["mean"]:
            row[f"{m} mean"] = e["mean"][m]
            row[f"{m} std"] = e["std"][m]
        rows.append(row)
    return rows


def diverged_rows(entries: list[dict[str, Any]], root: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per diverged run: ``group``, ``run`` (its path below ``root``), ``seed``, ``step``,
    ``epoch``, ``loss``, ``reference loss`` and ``reason`` (from its ``results.json``)."""
    return [
        {
            "group": e["group"],
            "run": run_label(d["dir"], root),
            "seed": d["seed"],
            "step": d["step"],
            "epoch": d["epoch"],
            "loss": d["loss"],
            "reference loss": d["reference_loss"],
            "reason": (d["reason"] or d["status"]) + (f" ({d['detail']})" if d.get("detail") else ""),
        }
        for e in entries
        for d in e.get("diverged_runs", [])
    ]


def run_groups(entries: list[dict[str, Any]]) -> dict[str, str]:
    """Run directory -> its group label in the table (diverged runs included)."""
    return {str(d): e["group"] for e in entries for d in e.get("dirs", [])}


def group_colors(groups: list[str]) -> dict[str, str]:
    """One distinct colour per group label: the first group of a method keeps the method's palette
    colour (:func:`color_of`), further groups of it (other settings or variants) take unused ones."""
    spare = [*_EXTRA, *qualitative.Dark24, *qualitative.Alphabet]
    out: dict[str, str] = {}
    for g in groups:
        c = color_of(g.split(" [")[0])
        if c in out.values():
            c = next((x for x in spare if x not in out.values()), spare[len(out) % len(spare)])
        out[g] = c
    return out


def default_reliability_runs(entries: list[dict[str, Any]]) -> list[str]:
    """Per group, the first completed run that has a checkpoint (the diagram's default runs)."""
    failed = {d["dir"] for e in entries for d in e.get("diverged_runs", [])}
    out = []
    for e in entries:
        for d in e.get("dirs", []):
            p = Path(d)
            ckpt = (p / "checkpoint.pt").is_file() or (p / "member0" / "checkpoint.pt").is_file()
            if d not in failed and ckpt:
                out.append(d)
                break
    return out


def table_csv(entries: list[dict[str, Any]]) -> bytes:
    """The table as :func:`experiments.table.format_table` writes it in CSV (``python -m
    experiments table --format csv``)."""
    return format_table(entries, "csv").encode("utf-8")


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The per-epoch rows of ``log.jsonl`` (empty when the run has no log)."""
    f = Path(run_dir) / "log.jsonl"
    if not f.is_file():
        return []
    rows = []
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{f} line {i} is not JSON ({exc}); is the run still writing?") from None
    return rows


def run_method(run_dir: str | Path) -> str:
    """The run's group label as in the table: ``method`` or ``variant/method``."""
    row = read_json(Path(run_dir) / "metrics.json", what="metrics file of a run")
    return f"{row['variant']}/{row['method']}" if row.get("variant") else str(row["method"])


def curve_keys(histories: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The numeric per-epoch columns present in the logs (``train_loss``, ``test_accuracy``, ...)."""
    keys: list[str] = []
    for hist in histories.values():
        for row in hist:
            for k, v in row.items():
                numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
                if numeric and k not in ("epoch", "step", "seconds", "skipped_steps") and k not in keys:
                    keys.append(k)
    return keys


def curves_figure(
    histories: dict[str, list[dict[str, Any]]],
    methods: dict[str, str],
    key: str,
    colors: dict[str, str] | None = None,
    dashes: dict[str, str] | None = None,
) -> go.Figure:
    """``key`` against epoch, one line per run (``histories`` by run label), coloured by group
    (``methods``: run label -> group label of the table; ``colors``: group -> colour, default
    :func:`group_colors`; ``dashes``: group -> line style, default solid); one legend entry per
    group."""
    if colors is None:
        colors = group_colors(list(dict.fromkeys(methods.values())))
    fig = go.Figure()
    shown: set[str] = set()
    for label, hist in histories.items():
        pts = [(r["epoch"], r[key]) for r in hist if isinstance(r.get(key), (int, float))]
        if not pts:
            continue
        method = methods[label]
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] if math.isfinite(p[1]) else None for p in pts],
                mode="lines+markers",
                name=method,
                legendgroup=method,
                showlegend=method not in shown,
                line={
                    "color": colors.get(method) or color_of(method),
                    "dash": (dashes or {}).get(method, "solid"),
                },
                hovertext=label,
                meta={"run": label, "method": method},
            )
        )
        shown.add(method)
    last = max((max(tr.x) for tr in fig.data if tr.x), default=0)
    xaxis = {"title": "epoch", "dtick": 1} if last <= 20 else {"title": "epoch"}  # whole epochs only
    fig.update_layout(xaxis=xaxis, yaxis_title=key, legend=LEGEND_BELOW, title=f"{key} per epoch")
    return fig


def run_probs(run_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Test-set probabilities of the run's trained point model and the test labels.

    Rebuilds the model from ``config.toml`` (budget applied as in training) and loads the weights of
    ``checkpoint.pt`` (a deep ensemble's point model is member 0, ``member0/checkpoint.pt``, as in
    its ``metrics.json``); the test set is the run's own (:func:`experiments.data.prepare_data`).
    Returns ``(probs, targets, metrics)`` with ``metrics`` the run's ``metrics.json`` row."""
    d = Path(run_dir)
    ckpt = d / "checkpoint.pt"
    if not ckpt.is_file() and (d / "member0" / "checkpoint.pt").is_file():
        ckpt = d / "member0" / "checkpoint.pt"  # a deep ensemble: its point model is member 0
    for path in (d / "config.toml", ckpt, d / "metrics.json"):
        if not path.is_file():
            raise FileNotFoundError(f"{d} has no {path.name}; a reliability diagram needs a finished run")
    try:
        cfg = apply_budget(resolve_config(tomllib.loads((d / "config.toml").read_text(encoding="utf-8"))))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(
            f"{d / 'config.toml'} is not a valid run config ({exc}); the file is truncated or was edited "
            "— rerun the experiment to rewrite it"
        ) from None
    row = read_json(d / "metrics.json", what="metrics file of a run")
    if not isinstance(row.get("seed"), int):
        raise ValueError(f"{d / 'metrics.json'} has no integer 'seed'; it was not written by the runner")
    seed = row["seed"]
    data = prepare_data(cfg, seed)
    cpu = torch.device("cpu")
    model = build_model(cfg, seed, param_dtype(cfg["precision"]), cpu, initial_weights=False)
    blob = read_checkpoint(ckpt)
    model.load_state_dict(blob["model"])
    probs = predict_probs(model, data.x_test, int(cfg["evaluation"]["batch_size"]), cpu)
    return probs, data.y_test, row


def reliability_of(
    run_dirs: dict[str, str], n_bins: int = 20, report: Callable[[float, str], None] | None = None
) -> tuple[go.Figure, list[dict[str, Any]], list[str]]:
    """One reliability diagram (:func:`landscape.metrics.reliability_figure`) of the point models of
    ``run_dirs`` (label -> run directory) on their test set.

    Runs whose test labels differ from the first run's cannot share the diagram; they are left
    out and named in the third return value. ``report(fraction, label)`` is called before each
    run. Also returns rows with each run's recomputed ECE next to the ECE its ``metrics.json``
    records.
    """
    if not run_dirs:
        raise ValueError("no runs chosen for the reliability diagram")
    probs: dict[str, torch.Tensor] = {}
    rows, skipped = [], []
    targets = None
    for i, (label, d) in enumerate(run_dirs.items()):
        if report is not None:
            report(i / len(run_dirs), label)
        p, y, row = run_probs(d)
        if targets is None:
            targets = y
        elif not torch.equal(y, targets):
            skipped.append(label)
            continue
        probs[label] = p
        rows.append(
            {
                "run": label,
                "test examples": len(y),
                "ECE (recomputed)": lm.ece(p, y, n_bins=n_bins),
                "ECE (metrics.json)": row.get("ece", math.nan),
            }
        )
    fig = lm.reliability_figure(
        probs, targets, n_bins=n_bins, title="reliability of the point models (test set)"
    )
    # the legend (one entry per run and the gap) below the axes, not over the diagram
    fig.update_layout(legend=LEGEND_BELOW, height=(fig.layout.height or 450) + 40 + 22 * len(probs))
    fig.update_layout(margin=dict(b=120 + 22 * len(probs)))
    return fig, rows, skipped
