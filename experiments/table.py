"""Results tables: mean and standard deviation over seeds of every metric, per method (and sweep
variant), as Markdown, CSV or JSON, next to the paper's numbers when the config has a ``[paper]``
table, and a figure: a bar chart with error bars, or the sensitivity plot of a sweep
(:mod:`experiments.sweep_plot`: lines for one swept key, a heat map for two), its numbers in JSON
beside it.

The standard deviation is the sample standard deviation over seeds (``numpy.std(ddof=1)``, the
``n - 1`` denominator); with one seed it is undefined: the Markdown cell is the mean alone, the CSV
cell is empty and JSON has ``NaN``. The standard error of the mean is ``std / sqrt(n)`` over the
``n`` completed runs (G-TRACER's tables report it): ``stderr`` in JSON, ``<metric>_stderr`` in CSV,
and ``mean ± std (se stderr)`` in Markdown with ``stderr=True`` (``table --stderr``).

Grouping rule (:func:`group_runs`): runs are pooled under one row only when they share the
variant, the method and every result-relevant key of their ``config.toml`` except the seed
(:func:`experiments.run_identity.run_settings`: the resolved config without the keys that change no
result and ``seeds``; the experiment ``name`` is not compared). Runs
of one method with different settings get one row each, labelled by the fewest dotted keys that
tell them apart (``sgd [train.lr=0.05]``), and the table notes every differing key;
``strict=True`` refuses them instead. Runs without a ``config.toml`` are grouped by their
``metrics.json`` (method, variant) only, with a note. Two runs of one row with the same seed are
reported and only the first (in path order) is averaged.

Diverged runs (``"status": "diverged"`` in ``metrics.json``; the ``divergence`` of their
``results.json``) are not averaged: each row counts them (``diverged``: "1 of 3") and lists them;
a row whose runs all diverged has no numbers, only the count.

Non-finite and missing metrics are told apart. A metric a completed run has but that is NaN or
+-inf (``NaN`` / ``Infinity`` in ``metrics.json``; the legacy strings ``"nan"`` / ``"inf"`` too) is
*non-finite*: it is not dropped, so the row's mean is non-finite as well (NaN, or +-inf when every
non-finite member is that infinity), its cell reads ``nan (non-finite in seed 1)`` and a note names
each such run (group, seed, directory) and its metrics. A metric the run does not have at all was
*not computed*: ``–`` when no run of the row has it (e.g. ``bma_*`` of a non-Bayesian method),
``– (missing in seed 2)`` plus a note when only some runs lack it (no mean: as before, the row's
mean needs every seed). :func:`format_cell` is the rule for one cell (the dashboard uses it too);
in CSV a non-finite value is written ``nan`` / ``inf`` / ``-inf``, a value that was not computed or
is undefined (the std of one seed) is left empty, and ``nonfinite`` / ``missing`` columns name the
runs; JSON keeps ``None`` for a missing value and ``NaN`` / ``Infinity`` for a non-finite one in
``values``, with the runs under ``nonfinite`` / ``missing``.

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

from experiments import run_identity
from experiments.sweep_plot import ERROR_LABELS, numbers_path, sweep_figure, sweep_layout
from landscape.deprecation import moved_names
from landscape.io import atomic_savefig, atomic_write_json, atomic_write_text, read_json, to_jsonable

__all__ = [
    "aggregate",
    "collect_runs",
    "format_cell",
    "format_table",
    "group_runs",
    "plot_table",
    "table_notes",
]


#: moved to :mod:`experiments.run_identity`: importable from here, with a warning, for one release
__getattr__ = moved_names(__name__, {"run_settings": "experiments.run_identity"})


_ID_KEYS = ("method", "seed", "variant", "status")
_UNSET = "(unset)"
NO_CONFIG = "no config.toml"


#: the fix of a run file that cannot be read (a corrupt ``metrics.json`` or ``config.toml``)
_BAD_RUN_FIX = "run that run again (delete its directory first), or leave it out of the run directories given"


def _read_toml(path: Path) -> dict[str, Any] | None:
    """A run's ``config.toml`` (``None`` without one); a corrupt one is a ``ValueError`` naming it."""
    if not path.is_file():
        return None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ValueError(f"{path}: not a readable config of a run ({exc}) — {_BAD_RUN_FIX}") from None


def _divergence(run_dir: Path) -> dict[str, Any]:
    """The ``divergence`` record of a diverged run's ``results.json`` ({} when absent)."""
    try:
        res = read_json(run_dir / "results.json", what="results file of a run")
    except (OSError, ValueError):
        return {}
    div = res.get("divergence") if isinstance(res, dict) else None
    return dict(div) if isinstance(div, dict) else {}


def collect_runs(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The ``metrics.json`` rows under ``paths`` (run directories or any directory above them).

    Each row gains ``_dir``, ``_config`` (the run's ``config.toml``, ``None`` without one),
    ``_paper`` (its ``[paper]`` table, if any), ``_status`` (``completed`` or ``diverged``) and, for
    a diverged run, ``_divergence`` (from ``results.json``).
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
        row = read_json(f, what="metrics file of a run", fix=_BAD_RUN_FIX)
        if not isinstance(row, dict) or "method" not in row:
            raise ValueError(
                f"{f} is not a metrics file of the experiment runner (no 'method' entry) — {_BAD_RUN_FIX}"
            )
        row = dict(row)
        row["_dir"] = str(f.parent)
        cfg = _read_toml(f.parent / "config.toml")
        row["_config"] = cfg
        paper = cfg.get("paper", {}) if cfg else {}
        row["_paper"] = paper if isinstance(paper, dict) else {}
        row["_status"] = str(row.get("status") or "completed")
        if row["_status"] != "completed":
            row["_divergence"] = _divergence(f.parent)
        rows.append(row)
    if not rows:
        raise ValueError(
            f"no runs (metrics.json files) under {', '.join(map(str, paths))} — give the out_dir of "
            "`run` (or run directories under it); a run writes its metrics.json when it finishes"
        )
    return rows


# ----------------------------------------------------------------------------------------- grouping
def _canon(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def _row_label(row: dict[str, Any]) -> str:
    return f"{row['variant']}/{row['method']}" if row.get("variant") else str(row["method"])


def _row_config(row: dict[str, Any]) -> dict[str, Any] | None:
    """``_config`` of a row of :func:`collect_runs`; for other rows (the runner's own) the
    ``config.toml`` of its ``_dir``."""
    if "_config" in row:
        return row["_config"]
    return _read_toml(Path(row["_dir"]) / "config.toml") if row.get("_dir") else None


def _label_keys(flats: list[dict[str, str]], keys: list[str]) -> list[str]:
    """Few keys (greedily, the one that tells most pairs apart first) that tell every setting apart."""
    pairs = [(i, j) for i in range(len(flats)) for j in range(i + 1, len(flats))]
    chosen: list[str] = []
    while pairs:
        best = max(keys, key=lambda k: sum(flats[i][k] != flats[j][k] for i, j in pairs))
        chosen.append(best)
        pairs = [(i, j) for i, j in pairs if flats[i][best] == flats[j][best]]
    return [k for k in keys if k in chosen]


def group_runs(rows: list[dict[str, Any]], *, strict: bool = False) -> list[dict[str, Any]]:
    """The rows in groups by the grouping rule of the module docstring, in first-seen order.

    Each group: ``group`` (the label), ``base`` (``method`` or ``variant/method``), ``method``,
    ``swept`` (the dotted keys in which the settings of the groups of its method differ, with this
    group's values: its point of a sweep; ``{}`` for a method with one setting), ``settings``
    (the label's keys and values), ``differing`` (every key in which the runs of ``base`` differ),
    ``config`` (whether the runs' settings were compared), ``rows`` (one per seed) and
    ``duplicates`` (``{"seed", "dirs"}``: runs of one seed and setting; the first is kept).
    ``strict=True`` raises ``ValueError`` naming the keys when runs of one method differ, and
    naming the directories when a seed appears twice.
    """
    by_base: dict[str, dict[str | None, list[dict[str, Any]]]] = {}
    flats: dict[str | None, dict[str, Any]] = {}
    for r in rows:
        cfg = _row_config(r)
        flat = run_identity.run_settings(cfg) if isinstance(cfg, dict) else None
        key = None if flat is None else json.dumps({k: _canon(v) for k, v in flat.items()}, sort_keys=True)
        if flat is not None:
            flats[key] = flat
        by_base.setdefault(_row_label(r), {}).setdefault(key, []).append(r)
    groups: list[dict[str, Any]] = []
    keys: list[str | None] = []
    for base, subs in by_base.items():
        configured = [k for k in subs if k is not None]
        differing: list[str] = []
        if len(configured) > 1:
            for k in configured:
                differing += [d for d in flats[k] if d not in differing]
            canon = [{d: _canon(flats[k].get(d, _UNSET)) for d in differing} for k in configured]
            differing = [d for d in differing if len({c[d] for c in canon}) > 1]
            shown = _label_keys(canon, differing)
        if strict and len(subs) > 1:
            what = f"differ in {', '.join(differing)}" if differing else "are partly without config.toml"
            raise ValueError(
                f"runs of {base!r} {what}; --strict refuses to tabulate them together (without it "
                "they get one row per setting)"
            )
        for key, members in subs.items():
            settings: dict[str, Any] = {}
            if key is None:
                label = base if len(subs) == 1 else f"{base} [{NO_CONFIG}]"
            elif len(configured) > 1:
                settings = {d: flats[key].get(d, _UNSET) for d in shown}
                label = f"{base} [{', '.join(f'{d}={_canon(v)}' for d, v in settings.items())}]"
            else:
                label = base
            kept: dict[Any, dict[str, Any]] = {}
            dups: dict[Any, list[str]] = {}
            for m in members:
                seed = m.get("seed")
                if seed in kept:
                    dups.setdefault(seed, [kept[seed].get("_dir", "?")]).append(m.get("_dir", "?"))
                else:
                    kept[seed] = m
            if strict and dups:
                seed, dirs = next(iter(dups.items()))
                raise ValueError(f"group {label!r} holds seed {seed} twice; runs: {dirs}")
            keys.append(key)
            groups.append(
                {
                    "group": label,
                    "base": base,
                    "method": str(members[0].get("method")),
                    "settings": settings,
                    "differing": differing if key is not None else [],
                    "config": key is not None,
                    "rows": list(kept.values()),
                    "duplicates": [{"seed": s, "dirs": d} for s, d in dups.items()],
                }
            )
    _mark_swept(groups, keys, flats)
    return groups


def _mark_swept(
    groups: list[dict[str, Any]], keys: list[str | None], flats: dict[Any, dict[str, Any]]
) -> None:
    """``swept`` of each group: the dotted keys (and this group's values) in which the settings of
    the groups of its method differ -- a sweep's point (``{"methods.sam.hyperparameters.rho": 0.05}``),
    whether the runs came from one ``[sweep]`` or from several run directories; ``{}`` for a method
    with one setting, or runs without ``config.toml``."""
    by_method: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for g, key in zip(groups, keys):
        g["swept"] = {}
        if key is not None:
            by_method.setdefault(g["method"], []).append((g, key))
    for items in by_method.values():
        if len(items) < 2:
            continue
        names: list[str] = []
        for _, key in items:
            names += [d for d in flats[key] if d not in names]

        def value(key: str, d: str) -> Any:
            return flats[key].get(d, run_identity.hashed_default(d, _UNSET))

        differ = [d for d in names if len({_canon(value(key, d)) for _, key in items}) > 1]
        for g, key in items:
            g["swept"] = {d: value(key, d) for d in differ}


def _is_completed(row: dict[str, Any]) -> bool:
    return str(row.get("_status") or row.get("status") or "completed") == "completed"


def _diverged_record(row: dict[str, Any]) -> dict[str, Any]:
    div = row.get("_divergence")
    if div is None and row.get("_dir"):
        div = _divergence(Path(row["_dir"]))
    div = div or {}
    rec = {"dir": row.get("_dir", ""), "seed": row.get("seed")}
    rec["status"] = str(row.get("_status") or row.get("status"))
    for k in ("step", "epoch", "loss", "reason"):
        rec[k] = div.get(k)
    # experiments.divergence.DivergenceRecord writes ``reference`` (the initial loss) and ``detail``
    rec["reference_loss"] = div.get("reference_loss", div.get("reference"))
    if div.get("detail"):
        rec["detail"] = div["detail"]
    return rec


#: legacy spellings of non-finite numbers in older metrics files (read as the floats)
_NONFINITE_STRINGS = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf}
_NONFINITE_STRINGS |= {"infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def _metric_value(row: dict[str, Any], metric: str) -> float | None:
    """A run's metric as a float, NaN and +-inf kept; ``None`` when the run has none."""
    v = row.get(metric)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v.strip().lower() in _NONFINITE_STRINGS:
        return _NONFINITE_STRINGS[v.strip().lower()]
    return None


def _token(x: float) -> str:
    """``nan``, ``inf`` or ``-inf``."""
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def aggregate(
    rows: list[dict[str, Any]], metrics: Sequence[str] | None = None, *, strict: bool = False
) -> list[dict[str, Any]]:
    """One entry per group of :func:`group_runs` (first-seen order): ``group``, ``base``,
    ``method``, ``swept`` (the group's point of a sweep, see :func:`group_runs`), ``settings``,
    ``differing``, ``config``, ``duplicates``; ``n`` and ``seeds`` of the completed
    runs averaged; ``runs`` (all runs of the group), ``diverged`` (how many of them diverged),
    ``diverged_runs`` (``dir``, ``seed``, ``step``, ``epoch``, ``loss``, ``reference_loss``,
    ``reason``), ``dirs``; ``mean`` / ``std`` (ddof=1) / ``stderr`` (std / sqrt(n)) / ``values`` per
    metric over the completed
    runs (nan without any; a value is ``None`` where the run has no such metric, and NaN / +-inf
    where it has a non-finite one, which makes the mean non-finite too); ``nonfinite``: metric ->
    the runs (``seed``, ``dir``, ``value``) whose value is non-finite; ``missing``: metric -> the
    runs (``seed``, ``dir``) without it, for metrics that other runs of the group have."""
    if metrics is None:
        metrics = []
        for r in rows:
            metrics += [k for k in r if k not in _ID_KEYS and not k.startswith("_") and k not in metrics]
    out = []
    for g in group_runs(rows, strict=strict):
        done = [r for r in g["rows"] if _is_completed(r)]
        failed = [r for r in g["rows"] if not _is_completed(r)]
        entry: dict[str, Any] = {
            "group": g["group"],
            "base": g["base"],
            "method": g["method"],
            "swept": g["swept"],
            "settings": g["settings"],
            "differing": g["differing"],
            "config": g["config"],
            "n": len(done),
            "seeds": [r.get("seed") for r in done],
            "runs": len(g["rows"]),
            "diverged": len(failed),
            "diverged_runs": [_diverged_record(r) for r in failed],
            "duplicates": g["duplicates"],
            "dirs": [r.get("_dir", "") for r in g["rows"]],
            "mean": {},
            "std": {},
            "stderr": {},
            "values": {},
            "nonfinite": {},
            "missing": {},
            "paper": g["rows"][0].get("_paper", {}),
        }
        for m in metrics:
            vals = [_metric_value(r, m) for r in done]
            arr = np.asarray([math.nan if v is None else v for v in vals], dtype=np.float64)
            entry["values"][m] = vals
            with np.errstate(invalid="ignore"):  # inf - inf: the NaN is the answer
                entry["mean"][m] = float(arr.mean()) if len(arr) else math.nan
                entry["std"][m] = float(arr.std(ddof=1)) if len(arr) > 1 else math.nan
            entry["stderr"][m] = entry["std"][m] / math.sqrt(len(arr)) if len(arr) > 1 else math.nan
            bad = [
                {"seed": r.get("seed"), "dir": r.get("_dir", ""), "value": v}
                for r, v in zip(done, vals)
                if v is not None and not math.isfinite(v)
            ]
            if bad:
                entry["nonfinite"][m] = bad
            absent = [
                {"seed": r.get("seed"), "dir": r.get("_dir", "")} for r, v in zip(done, vals) if v is None
            ]
            if absent and len(absent) < len(done):
                entry["missing"][m] = absent
        out.append(entry)
    return out


_NOTE_KINDS = ("settings", "config", "duplicates", "diverged", "nonfinite", "missing")


def table_notes(entries: list[dict[str, Any]], kinds: Sequence[str] = _NOTE_KINDS) -> list[str]:
    """The lines a table needs under it, of the ``kinds`` asked for: ``settings``, the keys in which
    runs of one method differ (one line); ``config``, runs without ``config.toml``; ``duplicates``,
    repeated seeds (with their directories); ``diverged``, one line per diverged run;
    ``nonfinite``, one line per run with a NaN / inf metric (its group, seed, metrics, directory);
    ``missing``, one line per metric that some runs of a group lack and others have."""
    notes = []
    differing: list[str] = []
    for e in entries:
        differing += [k for k in e.get("differing", []) if k not in differing]
    if differing and "settings" in kinds:
        notes.append(
            f"runs of one method with different settings are in separate rows; they differ in: "
            f"{', '.join(differing)} (--strict refuses them)"
        )
    bare = [e for e in entries if not e.get("config", True)]
    if bare and "config" in kinds:
        k = sum(e["runs"] for e in bare)
        notes.append(
            f"{k} run(s) without config.toml ({', '.join(e['group'] for e in bare)}): grouped by "
            "method and variant of metrics.json only, their settings not compared"
        )
    for e in entries if "duplicates" in kinds else []:
        for d in e.get("duplicates", []):
            notes.append(
                f"{e['group']}: seed {d['seed']} appears {len(d['dirs'])} times with the same settings "
                f"({', '.join(d['dirs'])}); only the first is averaged"
            )
    for e in entries if "diverged" in kinds else []:
        for d in e.get("diverged_runs", []):
            where = f" at step {d['step']}" if d.get("step") is not None else ""
            where += f" (epoch {d['epoch']})" if d.get("epoch") is not None else ""
            why = f": {d['reason']}" if d.get("reason") else ""
            why += f" ({d['detail']})" if d.get("detail") else ""
            run = f"{e['group']} seed {d['seed']} {d['status']}{where}{why}"
            notes.append(f"{run}; not averaged ({d['dir']})")
    for e in entries if "nonfinite" in kinds else []:
        runs: dict[str, tuple[Any, list[str]]] = {}
        for m, bad in e.get("nonfinite", {}).items():
            for b in bad:
                runs.setdefault(b["dir"], (b["seed"], []))[1].append(f"{m} = {_token(b['value'])}")
        for d, (seed, what) in runs.items():
            these = "this metric" if len(what) == 1 else "these metrics"
            notes.append(
                f"{e['group']} seed {seed} has a non-finite {', '.join(what)} ({d}); the row's mean of "
                f"{these} is non-finite: the run is kept, not left out"
            )
    for e in entries if "missing" in kinds else []:
        for m, absent in e.get("missing", {}).items():
            seeds = ", ".join(str(a["seed"]) for a in absent)
            dirs = ", ".join(a["dir"] for a in absent)
            notes.append(
                f"{e['group']}: {m} is missing in seed(s) {seeds} ({dirs}) while the row's other runs "
                "have it: no mean"
            )
    return notes


def _paper_value(entry: dict[str, Any], metric: str) -> str:
    table = entry["paper"].get(metric)
    key = entry.get("base", entry["group"])
    if not isinstance(table, dict) or key not in table:
        return ""
    v = table[key]
    if isinstance(v, list) and len(v) == 2:
        return f"{v[0]} ± {v[1]}"
    return str(v)


def _scale(entry: dict[str, Any], metric: str) -> float:
    return 100.0 if metric in entry["paper"].get("percent", []) else 1.0


def _cell(mean: float, std: float, stderr: float | None = None) -> str:
    if math.isnan(mean):
        return "–"
    if math.isnan(std):
        return f"{mean:.4g}"
    if stderr is None:
        return f"{mean:.4g} ± {std:.2g}"
    return f"{mean:.4g} ± {std:.2g} (se {stderr:.2g})"


def _seed_list(runs: list[dict[str, Any]], n: int) -> str:
    if len(runs) > 3:
        return f"{len(runs)} of {n} seeds"
    return ("seed " if len(runs) == 1 else "seeds ") + ", ".join(str(r["seed"]) for r in runs)


def format_cell(entry: dict[str, Any], metric: str, scale: float = 1.0, *, stderr: bool = False) -> str:
    """The table cell of ``metric`` in an :func:`aggregate` entry (its values times ``scale``):
    ``mean ± std`` (the mean alone for one seed), ``mean ± std (se stderr)`` with ``stderr=True``;
    ``nan (non-finite in seed 1)`` (or ``inf`` / ``-inf``, the row's mean) when a run's value is
    non-finite; ``–`` when no run has the metric; ``– (missing in seed 2)`` when some runs lack it."""
    mean = entry.get("mean", {}).get(metric, math.nan)
    bad = entry.get("nonfinite", {}).get(metric)
    if bad:
        return f"{_token(mean)} (non-finite in {_seed_list(bad, entry.get('n', len(bad)))})"
    absent = entry.get("missing", {}).get(metric)
    if absent:
        return f"– (missing in {_seed_list(absent, entry.get('n', len(absent)))})"
    std = entry.get("std", {}).get(metric, math.nan)
    if not stderr:
        return _cell(mean * scale, std * scale)
    return _cell(mean * scale, std * scale, _stderr(entry, metric) * scale)


def _csv_cell(entry: dict[str, Any], metric: str, stat: str) -> str:
    """``repr`` of a finite mean / std / stderr; ``nan`` / ``inf`` / ``-inf`` when a run's value is
    non-finite; empty when nothing was computed (no such metric, a missing seed, one seed's std)."""
    x = _stderr(entry, metric) if stat == "stderr" else entry[stat][metric]
    if math.isfinite(x):
        return repr(x)
    if entry.get("nonfinite", {}).get(metric) and (stat == "mean" or entry["n"] > 1):
        return _token(x)
    return ""


def _csv_runs(entry: dict[str, Any], kind: str) -> str:
    parts = []
    for m, runs in entry.get(kind, {}).items():
        for r in runs:
            what = f"{m}={_token(r['value'])}" if kind == "nonfinite" else m
            parts.append(f"{what} seed {r['seed']} ({r['dir']})")
    return "; ".join(parts)


def _diverged_cell(entry: dict[str, Any]) -> str:
    return f"{entry.get('diverged', 0)} of {entry.get('runs', entry['n'])}"


#: the statistics of a metric in CSV, one column each (``accuracy_mean``, ``accuracy_std``, ...)
_CSV_STATS = ("mean", "std", "stderr")


def format_table(entries: list[dict[str, Any]], fmt: str = "markdown", *, stderr: bool = False) -> str:
    """The aggregated table as ``markdown``, ``csv`` or ``json`` text. A ``diverged`` column
    ("1 of 3") appears when a run diverged; Markdown ends with :func:`table_notes`; cells follow
    :func:`format_cell` (non-finite and missing metrics, see the module docstring), and CSV gains
    ``nonfinite`` / ``missing`` columns naming the runs when any has such a metric. CSV has
    ``<metric>_mean``, ``<metric>_std`` and ``<metric>_stderr`` (std / sqrt(n)) columns; JSON has
    ``stderr`` beside ``std``; ``stderr=True`` adds the standard error to each Markdown cell
    (``0.912 ± 0.003 (se 0.0017)``), as G-TRACER's tables report it."""
    if fmt == "json":
        return json.dumps(to_jsonable([{k: v for k, v in e.items()} for e in entries]), indent=2) + "\n"
    metrics = list(entries[0]["mean"]) if entries else []
    with_paper = [m for m in metrics if any(_paper_value(e, m) for e in entries)]
    any_diverged = any(e.get("diverged") for e in entries)
    flagged = [k for k in ("nonfinite", "missing") if any(e.get(k) for e in entries)]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(
            [
                "group",
                "n",
                *(["diverged", "runs"] if any_diverged else []),
                *[f"{m}_{s}" for m in metrics for s in _CSV_STATS],
                *[f"{m}_paper" for m in with_paper],
                *flagged,
            ]
        )
        for e in entries:
            w.writerow(
                [
                    e["group"],
                    e["n"],
                    *([e.get("diverged", 0), e.get("runs", e["n"])] if any_diverged else []),
                    *[_csv_cell(e, m, s) for m in metrics for s in _CSV_STATS],
                    *[_paper_value(e, m) for m in with_paper],
                    *[_csv_runs(e, k) for k in flagged],
                ]
            )
        return buf.getvalue()
    if fmt != "markdown":
        raise ValueError(f"format must be markdown, csv or json, got {fmt!r}")
    head = ["method", "seeds", *(["diverged"] if any_diverged else [])]
    for m in metrics:
        pct = entries and any(_scale(e, m) == 100.0 for e in entries)
        head.append(f"{m} (%)" if pct else m)
        if m in with_paper:
            head.append(f"{m} (paper)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        cells = [e["group"], str(e["n"]), *([_diverged_cell(e)] if any_diverged else [])]
        for m in metrics:
            s = _scale(e, m)
            cells.append(format_cell(e, m, s, stderr=stderr))
            if m in with_paper:
                cells.append(_paper_value(e, m) or "–")
        lines.append("| " + " | ".join(cells) + " |")
    sources = sorted({e["paper"]["source"] for e in entries if e["paper"].get("source")})
    foot = ["", "mean ± sample standard deviation over seeds (ddof = 1)"]
    if stderr:
        foot[-1] += "; se: standard error of the mean, std / sqrt(n)"
    if any_diverged:
        foot[-1] += "; diverged runs are counted, not averaged"
    if "nonfinite" in flagged:
        foot[-1] += "; nan / inf: a run's value is not finite (see the notes), – : not computed"
    foot += [f"paper: {n}" for n in sources]
    foot += [f"note: {n}" for n in table_notes(entries)]
    return "\n".join(lines + foot) + "\n"


def plot_table(
    entries: list[dict[str, Any]],
    path: str | Path,
    metrics: Sequence[str] | None = None,
    *,
    error: str = "std",
) -> Path:
    """The figure of a table, in the format the name ends in (``.png``, ``.pdf``, ``.svg``, ...; PNG
    without one), and its numbers as JSON next to it (:func:`experiments.sweep_plot.numbers_path`:
    ``t.png`` -> ``t.plot.json``). Error bars are ``error``: ``std`` (sample standard deviation over
    seeds, ddof 1) or ``stderr`` (std / sqrt(n)); the figure says which.

    When the runs form a 1-D sweep (every swept method varies one key), the metric against the
    swept value, one line per method; for a 2-D sweep, a heat map of the mean per method
    (:mod:`experiments.sweep_plot`). Otherwise a bar chart: one panel per metric, one bar per group.
    Diverged runs are not in the bars; their count is under the group's name, and a group whose
    runs all diverged has no bar, only the word "diverged". A non-finite mean (a run's NaN / inf
    value) has no bar either, only ``nan`` / ``inf`` in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if error not in ERROR_LABELS:
        raise ValueError(f"error must be one of {sorted(ERROR_LABELS)}, got {error!r}")
    metrics = list(metrics or (entries[0]["mean"] if entries else []))
    if not metrics:
        raise ValueError("nothing to plot: the runs have no metrics")
    layout = sweep_layout(entries)
    if layout is not None:
        fig, record = sweep_figure(entries, metrics, error, layout)
    else:
        fig, record = _bar_figure(plt, entries, metrics, error)
    path = Path(path)
    atomic_savefig(path, fig, dpi=120)
    plt.close(fig)
    atomic_write_json(numbers_path(path), record)
    return path


def _bar_figure(
    plt: Any, entries: list[dict[str, Any]], metrics: list[str], error: str
) -> tuple[Any, dict[str, Any]]:
    """The bar chart of :func:`plot_table` and the record of its numbers (``kind = "bar"``)."""
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    labels = [
        f"{e['group']}\n({_diverged_cell(e)} diverged)" if e.get("diverged") else e["group"] for e in entries
    ]
    record: dict[str, Any] = {
        "kind": "bar",
        "error": error,
        "error_label": ERROR_LABELS[error],
        "metrics": metrics,
        "groups": [e["group"] for e in entries],
        "values": {},
    }
    for ax, m in zip(axes.flat, metrics):
        errs = [_stderr(e, m) if error == "stderr" else e["std"][m] for e in entries]
        record["values"][m] = {
            "mean": [e["mean"][m] for e in entries],
            "std": [e["std"][m] for e in entries],
            "stderr": [_stderr(e, m) for e in entries],
            "n": [e["n"] for e in entries],
        }
        shown = [i for i, e in enumerate(entries) if math.isfinite(e["mean"][m])]
        means = [entries[i]["mean"][m] for i in shown]
        bars = [0.0 if math.isnan(errs[i]) else errs[i] for i in shown]
        ax.bar(shown, means, yerr=bars, capsize=4, color=f"C{metrics.index(m) % 10}")
        for i, e in enumerate(entries):
            if e["n"] == 0 and e.get("diverged"):
                ax.text(i, 0, "diverged", rotation=90, ha="center", va="bottom", fontsize=8, color="0.3")
            elif e.get("nonfinite", {}).get(m):
                tok = _token(e["mean"][m])
                ax.text(i, 0, tok, rotation=90, ha="center", va="bottom", fontsize=8, color="tab:red")
        ax.set_xlim(-0.6, len(entries) - 0.4)
        ax.set_xticks(range(len(entries)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(m, fontsize=10)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    fig.text(0.5, 0.005, ERROR_LABELS[error], ha="center", va="bottom", fontsize=8, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig, record


def _stderr(entry: dict[str, Any], metric: str) -> float:
    """std / sqrt(n) of ``metric`` (NaN for fewer than two runs)."""
    if "stderr" in entry:
        return entry["stderr"][metric]
    n = entry["n"]
    return entry["std"][metric] / math.sqrt(n) if n > 1 else math.nan


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write_text(path, text)
