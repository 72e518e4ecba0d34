"""Flatness study page logic: load a population of models written by ``python -m experiments.study``,
correlate each sharpness measure with a generalisation target through the study module's own
functions (:func:`experiments.study.correlate`: Kendall tau-b with a percentile bootstrap interval
and the granulated tau Psi of Jiang et al. 2020, Sec. 4, eqs. 3-4) and draw measure-vs-target
scatter panels. Plain functions returning DataFrames, dicts and Plotly figures."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import UserInputError
from dashboard.layout import grid_shape
from experiments.study import AXES, correlate
from experiments.study.report import collect_rows
from landscape.io import read_json

__all__ = [
    "DEFAULT_DIR",
    "TARGET_LABELS",
    "axes_of",
    "correlation_table",
    "load_population",
    "measures_of",
    "records",
    "scatter_figure",
    "barely_trained",
    "barely_trained_text",
    "log_ticks",
    "summary_text",
    "targets_of",
]

ROOT = Path(__file__).resolve().parents[2]
#: the committed example study (``study_digits_population.csv`` and ``study_digits.json``)
DEFAULT_DIR = ROOT / "docs" / "figures"

#: the generalisation targets the page offers, in this order, when the table holds them
TARGET_LABELS: dict[str, str] = {
    "gap_error": "gap error",
    "test_error": "test error",
    "ood_error": "OOD error",
}

#: per-model columns that are neither a hyperparameter axis nor a sharpness measure
_NOT_MEASURES = {
    "id",
    "train_error",
    "train_loss",
    "test_error",
    "test_loss",
    "gap_error",
    "gap_loss",
    "ood_error",
    "ood_loss",
    "final_epoch_loss",
    "seconds",
}


def _resolve(path: str | Path) -> Path:
    p = Path(str(path).strip() or DEFAULT_DIR).expanduser()
    if not p.is_absolute() and not p.exists() and (ROOT / p).exists():
        p = ROOT / p
    return p


def load_population(path: str | Path = DEFAULT_DIR) -> tuple[pd.DataFrame, list[str] | None]:
    """The per-model table of a study and its measure names (``None`` when no config says them).

    ``path`` is a study directory (``population.csv`` from ``report``, or ``study_config.json`` and
    ``models/*.json`` from ``run``), a directory holding one ``*_population.csv`` (the committed
    example in ``docs/figures``) or a population CSV file."""
    p = _resolve(path)
    if not p.exists():
        raise UserInputError(
            f"{p} does not exist; give a directory written by `python -m experiments.study run CONFIG "
            f"--out DIR` (then `report DIR`), or leave the box empty for the example in {DEFAULT_DIR}"
        )
    measures = None
    if p.is_file():
        csv_path = p
    elif (p / "population.csv").is_file():
        csv_path = p / "population.csv"
    elif (p / "study_config.json").is_file():
        try:
            rows, cfg = collect_rows(p)  # names a truncated or corrupt file and the fix
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
        return pd.DataFrame(rows), [m["name"] for m in cfg["measures"]]
    else:
        found = sorted(p.glob("*_population.csv"))
        if len(found) != 1:
            raise UserInputError(
                f"{p} holds no population.csv, study_config.json or single *_population.csv; run "
                f"`python -m experiments.study run CONFIG --out {p}` and `report {p}` first"
            )
        csv_path = found[0]
    if csv_path.suffix.lower() != ".csv":
        raise UserInputError(f"{csv_path} is not a CSV file; give the study directory or its population CSV")
    df = _read_population_csv(csv_path)
    if df.empty:
        raise UserInputError(f"{csv_path} holds no models")
    stem = csv_path.name.removesuffix("population.csv").rstrip("_")
    docs = [csv_path.with_name("correlation.json")] + ([csv_path.with_name(f"{stem}.json")] if stem else [])
    for doc_path in docs:
        if doc_path.is_file():
            measures = _report_measures(doc_path)
            if measures is not None:
                break
    return df, measures


def _rewrite_fix(path: Path) -> str:
    return (
        f"delete it and run `python -m experiments.study report {path.parent}` to write it again from "
        "models/*.json (or restore the file)"
    )


def _read_population_csv(path: Path) -> pd.DataFrame:
    """A population CSV written by ``report``; an empty, truncated or corrupt file raises
    :class:`UserInputError` naming it, what is wrong and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise UserInputError(f"cannot read {path}: {why} — check the path and its permissions") from None
    fix = _rewrite_fix(path)
    if not raw.strip():
        raise UserInputError(f"{path} is empty (an interrupted copy?) — {fix}")
    try:
        text = raw.decode("utf-8")
        lines = list(csv.reader(io.StringIO(text)))
    except (UnicodeDecodeError, csv.Error) as exc:
        why = f"byte {exc.start} is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise UserInputError(f"{path} is not a CSV table ({why}; binary or corrupt?) — {fix}") from None
    width = len(lines[0])
    short = next((i for i, r in enumerate(lines[1:], 2) if r and len(r) != width), None)
    if not text.endswith("\n") or short is not None:
        n = short or len(lines)
        where = (
            f"line {n} has {len(lines[n - 1])} of {width} columns"
            if short
            else f"it ends inside line {n}, without a final newline"
        )
        raise UserInputError(f"{path} is truncated or corrupt ({where}; an interrupted copy?) — {fix}")
    try:
        return pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as exc:
        why = " ".join(str(exc).split())
        raise UserInputError(f"{path} is not a valid CSV table ({why}) — {fix}") from None


def _report_measures(path: Path) -> list[str] | None:
    """The measure names of a report's JSON (``correlation.json``); ``None`` when it is another JSON
    file. A truncated or corrupt file raises :class:`UserInputError` naming it and the fix."""
    try:
        doc = read_json(path, what="study report (JSON)", fix=_rewrite_fix(path))
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    if not (isinstance(doc, dict) and "study" in doc):
        return None
    measures = doc["study"].get("measures") if isinstance(doc["study"], dict) else None
    if not (isinstance(measures, list) and all(isinstance(m, dict) and "name" in m for m in measures)):
        raise UserInputError(
            f"{path} is not a study report: its 'study' table holds no 'measures' list of tables with a "
            f"'name' (truncated or edited?) — {_rewrite_fix(path)}"
        )
    return [m["name"] for m in measures]


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain Python values (NaN/empty cells become ``None``), as the study module takes them."""
    return json.loads(df.to_json(orient="records"))


def targets_of(df: pd.DataFrame) -> list[str]:
    """The targets of :data:`TARGET_LABELS` the table has a column for."""
    return [t for t in TARGET_LABELS if t in df.columns]


def measures_of(df: pd.DataFrame, named: list[str] | None = None) -> list[str]:
    """The numeric measure columns: the configured names when given, else every numeric column that is
    not an axis, an error, a loss or a timing."""
    if named is not None:
        return [m for m in named if m in df.columns]
    skip = _NOT_MEASURES | set(AXES)
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])]


def axes_of(df: pd.DataFrame) -> list[str]:
    """The hyperparameter axes that vary over the population (the rule of ``write_report``)."""
    rows = records(df)
    return [a for a in AXES if a in df.columns and len({repr(r[a]) for r in rows}) > 1]


def correlation_table(
    df: pd.DataFrame,
    measures: list[str],
    target: str,
    *,
    samples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per measure: models used, Kendall tau-b, its bootstrap interval and the granulated Psi,
    all from :func:`experiments.study.correlate`."""
    if target not in df.columns:
        raise UserInputError(f"the table has no column {target!r}; pick one of {targets_of(df)}")
    entries = correlate(records(df), measures, [target], axes_of(df), samples=samples, level=level, seed=seed)
    cols = ["measure", "n", "tau", "low", "high", "Psi", "level", "samples", "seed"]
    return pd.DataFrame([{k: e[k] for k in cols} for e in entries], columns=cols)


#: training error above which a model counts as barely trained (the page's default)
BARELY_TRAINED = 0.5

#: marker per model (Plotly symbol, the character the legend draws)
_SYMBOLS = (("circle", "●"), ("square", "■"), ("diamond", "◆"), ("triangle-up", "▲"), ("cross", "✚"))


def barely_trained(df: pd.DataFrame, threshold: float = BARELY_TRAINED) -> pd.Series:
    """True for the models whose training error is above ``threshold`` (all False without a
    ``train_error`` column)."""
    if "train_error" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["train_error"].astype(float) > threshold


def styles(df: pd.DataFrame) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The colour of each optimizer (the palette's, :func:`dashboard.experiments_view.color_of`) and
    the marker (Plotly symbol, legend character) of each model."""
    from dashboard.experiments_view import color_of

    opts = sorted({str(o) for o in df["optimizer"]}) if "optimizer" in df.columns else []
    models = sorted({str(m) for m in df["model"]}) if "model" in df.columns else []
    return {o: color_of(o) for o in opts}, {m: _SYMBOLS[i % len(_SYMBOLS)] for i, m in enumerate(models)}


def _tick_text(v: float) -> str:
    if v == 0:
        return "0"
    e = math.floor(math.log10(abs(v)))
    if -3 <= e <= 4:
        return f"{v:.10g}"
    m = v / 10**e
    return f"{m:.3g}e{e}" if abs(m - 1) > 1e-9 else f"1e{e}"


def _nice_step(width: float, n: int = 4) -> float:
    raw = width / n
    e = math.floor(math.log10(raw))
    return min((m * 10.0**e for m in (1, 2, 2.5, 5, 10) if m * 10.0**e >= raw), default=10.0 ** (e + 1))


def log_ticks(values: Any) -> tuple[list[float], list[str]]:
    """Tick positions and labels of a log axis over positive ``values``: decades over more than 2.6
    decades, 1-3 over 1.2 to 2.6, 1-2-5 over 0.6 to 1.2 and evenly spaced round numbers within a
    narrower range; every label is its whole number (``0.002``, ``3e-5``), never the bare mantissa
    Plotly puts between decades."""
    v = [float(x) for x in values if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
    if not v:
        return [], []
    lo, hi = min(v), max(v)
    span = math.log10(hi / lo) if hi > lo else 0.0
    if span <= 0.6:
        step = _nice_step(hi - lo) if hi > lo else 10.0 ** math.floor(math.log10(lo))
        ticks = [k * step for k in range(math.floor(lo / step), math.ceil(hi / step) + 1) if k > 0]
    else:
        mantissas = (1,) if span > 2.6 else (1, 3) if span > 1.2 else (1, 2, 5)
        every = max(1, math.ceil(span / 6))
        ticks = [
            m * 10.0**e
            for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            if e % every == 0
            for m in mantissas
        ]
        pad = 10 ** (0.05 * span)
        ticks = [t for t in ticks if lo / pad <= t <= hi * pad]
    if len(ticks) < 2:
        ticks = sorted({float(f"{lo:.3g}"), float(f"{hi:.3g}")})
    ticks = [float(f"{t:.12g}") for t in ticks]
    return ticks, [_tick_text(t) for t in ticks]


def legend_text(df: pd.DataFrame, threshold: float | None = BARELY_TRAINED) -> str:
    """The figure's key (one line): the colour of each optimizer, the marker of each model and, when
    some model's training error is above ``threshold``, the open marker of the barely trained."""
    colours, symbols = styles(df)
    parts = []
    if colours:
        parts.append(
            "colour = optimizer: "
            + "  ".join(f"<span style='color:{c}'>●</span> {o}" for o, c in colours.items())
        )
    if symbols:
        parts.append("marker = model: " + "  ".join(f"{ch} {m}" for m, (_, ch) in symbols.items()))
    if threshold is not None and bool(barely_trained(df, threshold).any()):
        parts.append(f"open marker (○) = training error > {threshold:g}: barely trained")
    return "  |  ".join(parts)


def scatter_figure(
    df: pd.DataFrame,
    measures: list[str],
    target: str,
    table: pd.DataFrame,
    threshold: float | None = BARELY_TRAINED,
) -> go.Figure:
    """One panel per measure against ``target`` (models where both are finite; log x when all values
    are positive, with readable tick labels :func:`log_ticks`); the colour of a point is its
    optimizer, its marker its model, open markers the models whose training error is above
    ``threshold`` (key above the panels, :func:`legend_text`); tau-b and its interval from
    ``table`` in each title; at most three panels a row."""
    if not measures:
        raise UserInputError("select at least one measure to plot")
    by = table.set_index("measure")
    rows, cols = grid_shape(len(measures))
    titles = []
    for m in measures:
        e = by.loc[m]
        tau = "n/a" if math.isnan(e["tau"]) else f"{e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}]"
        titles.append(f"{m}<br>τ = {tau}")
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.3 / rows + 0.05)
    label = TARGET_LABELS.get(target, target)
    colours, symbols = styles(df)
    weak = barely_trained(df, threshold) if threshold is not None else pd.Series(False, index=df.index)
    extra = [k for k in ("id", "optimizer", "model", "train_error") if k in df.columns]
    for i, m in enumerate(measures):
        r, c = divmod(i, cols)
        sub = df[list(dict.fromkeys([m, target, *extra]))].dropna(subset=[m, target])
        sub = sub[sub[m].map(math.isfinite) & sub[target].map(math.isfinite)]
        colour = [colours.get(str(o), "#555555") for o in sub["optimizer"]] if "optimizer" in sub else None
        symbol = [symbols[str(k)][0] for k in sub["model"]] if "model" in sub else ["circle"] * len(sub)
        symbol = [s + "-open" if bool(weak.loc[ix]) else s for s, ix in zip(symbol, sub.index)]
        hover = [
            " · ".join(str(row[k]) for k in ("id", "optimizer", "model") if k in sub)
            + (f"<br>training error {row['train_error']:.3g}" if "train_error" in sub else "")
            for _, row in sub.iterrows()
        ]
        fig.add_trace(
            go.Scatter(
                x=sub[m].to_numpy(float),
                y=sub[target].to_numpy(float),
                mode="markers",
                name=m,
                text=hover,
                marker=dict(color=colour, symbol=symbol, size=8, line=dict(width=1.5, color=colour)),
                hovertemplate=f"%{{text}}<br>{m} = %{{x:.4g}}<br>{label} = %{{y:.4g}}<extra></extra>",
                showlegend=False,
            ),
            row=r + 1,
            col=c + 1,
        )
        log = len(sub) > 0 and bool((sub[m] > 0).all())
        axis: dict[str, Any] = dict(title_text=m, type="log" if log else "linear")
        if log:
            axis["tickvals"], axis["ticktext"] = log_ticks(sub[m])
        fig.update_xaxes(**axis, row=r + 1, col=c + 1)
        fig.update_yaxes(title_text=label, row=r + 1, col=c + 1)
    fig.add_annotation(
        text=legend_text(df, threshold),
        xref="paper",
        yref="paper",
        x=0.0,
        y=1.0,
        xanchor="left",
        yanchor="bottom",
        yshift=48,
        showarrow=False,
        align="left",
        font=dict(size=12),
    )
    fig.update_layout(height=320 * rows + 90, margin=dict(t=120))
    return fig


def barely_trained_text(df: pd.DataFrame, threshold: float, left_out: bool) -> str:
    """How many models have a training error above ``threshold`` and what the page does with them."""
    if "train_error" not in df.columns:
        return "The table has no train_error column: models that barely trained cannot be marked."
    weak = df[barely_trained(df, threshold)]
    if weak.empty:
        return f"No model has a training error above {threshold:g}."
    what = "left out of the correlations and the plots" if left_out else "open markers in the plots"
    worst = float(weak["train_error"].max())
    kinds = ""
    if {"model", "optimizer"} <= set(weak.columns):
        counts = weak.groupby(["model", "optimizer"]).size()
        kinds = " (" + ", ".join(f"{n} {m}/{o}" for (m, o), n in counts.items()) + ")"
    return (
        f"{len(weak)} of {len(df)} models have a training error above {threshold:g}{kinds}, up to "
        f"{worst:.2f}: they barely trained ({what})."
    )


def summary_text(table: pd.DataFrame, target: str, n_models: int) -> str:
    """What the table shows: models, bootstrap setting, and which intervals exclude zero."""
    if table.empty:
        return f"{n_models} models; no measure selected."
    first = table.iloc[0]
    label = TARGET_LABELS.get(target, target)
    head = (
        f"{n_models} models; Kendall τ-b of each measure against {label} over the models where both are "
        f"finite, with {first['level']:.0%} percentile bootstrap intervals ({int(first['samples'])} "
        f"resamples, seed {int(first['seed'])}); Ψ is the granulated τ (mean over the varying "
        "hyperparameter axes)."
    )
    pos = table[table["low"] > 0]["measure"].tolist()
    neg = table[table["high"] < 0]["measure"].tolist()
    parts = [head]
    parts.append(f"Interval above 0: {', '.join(pos)}." if pos else "No interval lies above 0.")
    parts.append(f"Interval below 0: {', '.join(neg)}." if neg else "No interval lies below 0.")
    rest = len(table) - len(pos) - len(neg)
    parts.append(f"{rest} of {len(table)} intervals contain 0.")
    return " ".join(parts)
