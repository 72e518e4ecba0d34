"""Flatness study page logic: load a study written by ``python -m experiments.study`` (its per-model
table, the members of each population and the stopping rule), correlate each sharpness measure
with a generalisation target through the study module's own functions
(:func:`experiments.study.correlate`: Kendall tau-b with a percentile bootstrap interval and the
granulated tau Psi of Jiang et al. 2020, Sec. 4, eqs. 3-4), one population at a time, show the
report's pooled intervals (:func:`experiments.study.combine.combine`) and draw measure-vs-target
scatter panels. Only the members that enter the report's correlations (status not ``diverged`` or
``not_converged``, :data:`experiments.study.report.EXCLUDED`) are correlated and plotted; reading
the files and choosing those rows is :mod:`dashboard.study_data`. Plain
functions returning DataFrames, dicts, strings and Plotly figures."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard import UserInputError
from dashboard.experiments_view import color_of
from dashboard.layout import grid_shape
from dashboard.study_data import POOLED, Study, included, included_ids, population_frame, records
from experiments.study import AXES, correlate

__all__ = [
    "TARGET_LABELS",
    "axes_of",
    "barely_trained",
    "barely_trained_text",
    "correlation_table",
    "log_ticks",
    "measures_of",
    "pooled_summary_text",
    "pooled_table",
    "population_label",
    "population_text",
    "scatter_figure",
    "stopping_text",
    "summary_text",
    "targets_of",
]


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
    "cpu_seconds",
    "epochs",
    "status",
    "populations",
    "divergence",
}


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


def population_label(study: Study, choice: int | str) -> str:
    """The selector's label of a population (its sampling seed and models) or of the pooled view."""
    if choice == POOLED:
        return f"all {len(study.populations)} populations pooled (the report's intervals)"
    ids = study.populations[int(choice)]
    kept = included_ids(study)
    inc = sum(i in kept for i in ids)
    seed = f"sampling seed {study.seeds[int(choice)]}, " if study.seeds else ""
    models = f"{inc} models" if inc == len(ids) else f"{inc} of {len(ids)} models"
    return f"population {choice} ({seed}{models})"


def _counted(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"


def stopping_text(study: Study) -> str:
    """The stopping rule and how many members reached it; how many are excluded from the
    correlations, and why."""
    df = study.df
    status = df["status"].astype(str) if "status" in df.columns else pd.Series("completed", index=df.index)
    n = len(df)
    not_converged = int((status == "not_converged").sum())
    diverged = int((status == "diverged").sum())
    out = int((~included(df)).sum())
    parts = []
    if study.stop:
        loss, most = study.stop.get("train_loss"), study.stop.get("max_epochs")
        parts.append(
            f"**Stopping rule:** every model trained until the cross-entropy on its whole training set "
            f"was at most {loss:g} (checked after every epoch, at most {most} epochs)."
        )
        reached = df[status == "completed"]
        how = ""
        if "epochs" in df.columns and len(reached):
            ep = reached["epochs"].astype(int)
            how = f" (after {ep.min()}–{ep.max()} epochs, median {float(ep.median()):g})"
        parts.append(f"{len(reached)} of the {n} models reached it{how}.")
    elif study.measures is not None:
        parts.append("This study has no stopping rule: every model trained for the configured epochs.")
    else:
        parts.append("No report or config comes with this table, so its stopping rule is not known.")
    if out == 0:
        parts.append("No model is excluded from the correlations.")
    else:
        why = []
        if not_converged:
            limit = f" within {study.stop['max_epochs']} epochs" if study.stop else ""
            why.append(f"{not_converged} did not reach the target training loss{limit}")
        if diverged:
            why.append(f"{diverged} diverged")
        verb = "is" if out == 1 else "are"
        parts.append(
            f"{out} {verb} excluded from the correlations and the plots ({', '.join(why)}; listed below)."
        )
    return " ".join(parts)


def population_text(study: Study, choice: int | str) -> str:
    """What the selected view is: a population (its members, how many enter the correlations) or the
    report's pooled intervals (how they are computed)."""
    pops = study.populations
    inc = included_ids(study)
    if choice == POOLED:
        doc = study.report or {}
        boot = doc.get("bootstrap", {})
        distinct = len(population_frame(study, POOLED))
        return (
            f"**Pooled over the {len(pops)} populations**, from the report "
            f"(`{study.report_path.name if study.report_path else 'correlation.json'}`): τ is the mean of "
            f"the populations' τ-b and the interval the "
            f"{boot.get('level', 0.95):.0%} percentile interval of all their bootstrap resamples together "
            f"({boot.get('samples', '?')} per population, seed {boot.get('seed', '?')}: an equal-weight "
            "mixture), so it includes the variability between populations; `populations_excluding_0` "
            "counts the populations whose own interval excludes 0, Ψ is the mean of their granulated τ. "
            "The resamples set in the sidebar apply to single populations. The plots show the "
            f"{distinct} distinct models in the correlations, each once."
        )
    k = int(choice)
    ids = pops[k]
    n_in = sum(i in inc for i in ids)
    seed = f" (sampling seed {study.seeds[k]})" if study.seeds else ""
    text = f"**Population {k}**{seed}: {_counted(len(ids), 'member')}, {n_in} in the correlations"
    if n_in < len(ids):
        text += f", {len(ids) - n_in} excluded"
    text += "."
    if len(pops) > 1:
        distinct = {i for pop in pops for i in pop}
        shared = sum(1 for i in distinct if sum(i in pop for pop in pops) > 1)
        sizes = "/".join(str(len(pop)) for pop in pops)
        text += (
            f" The study has {len(pops)} populations ({sizes} members; {len(distinct)} distinct models, "
            f"{shared} of them in more than one), each correlated on its own as the report does."
        )
    return text


def pooled_table(study: Study, measures: list[str], target: str) -> pd.DataFrame:
    """One row per measure from the report's pooled entries (:func:`experiments.study.combine.combine`):
    the models of each population's correlation (``160/159/154``), the mean tau, the pooled bootstrap
    interval, how many populations' own intervals exclude 0, the mean granulated Psi and each
    population's tau."""
    if study.report is None:
        raise UserInputError(
            "the pooled intervals need the study's report: run `python -m experiments.study report DIR`"
        )
    if target not in study.report.get("targets", [target]):
        raise UserInputError(f"the report has no correlations with {target!r}")
    by = {(e["measure"], e["target"]): e for e in study.report["combined"]}
    boot = study.report.get("bootstrap", {})
    rows = []
    for m in measures:
        e = by.get((m, target))
        if e is None:
            raise UserInputError(f"the report has no pooled entry for {m!r} against {target!r}")
        row = {
            "measure": m,
            "n": "/".join(str(v) for v in e["n"]),
            "tau": e["tau"],
            "low": e["low"],
            "high": e["high"],
            "populations_excluding_0": e["excludes_zero"],
            "Psi": e["Psi"],
            "level": boot.get("level", 0.95),
            "samples": boot.get("samples"),
            "seed": boot.get("seed"),
        }
        row.update({f"tau_{k}": v for k, v in enumerate(e["taus"])})
        rows.append(row)
    return pd.DataFrame(rows)


def _interval_sentences(table: pd.DataFrame, what: str = "interval") -> list[str]:
    pos = table[table["low"] > 0]["measure"].tolist()
    neg = table[table["high"] < 0]["measure"].tolist()
    cap = what[0].upper() + what[1:]
    parts = [f"{cap} above 0: {', '.join(pos)}." if pos else f"No {what} lies above 0."]
    parts.append(f"{cap} below 0: {', '.join(neg)}." if neg else f"No {what} lies below 0.")
    rest = len(table) - len(pos) - len(neg)
    parts.append(f"{rest} of {len(table)} {what}s contain 0.")
    return parts


def pooled_summary_text(table: pd.DataFrame, target: str) -> str:
    """Which pooled intervals exclude zero, and in how many populations each measure's own does."""
    if table.empty:
        return "No measure selected."
    label = TARGET_LABELS.get(target, target)
    n_pop = sum(c.startswith("tau_") for c in table.columns)
    every = table[table["populations_excluding_0"] == n_pop]["measure"].tolist()
    head = f"Mean τ-b over the populations of each measure against {label}, with the pooled interval."
    tail = (
        f"In all {n_pop} populations the measure's own interval excludes 0 for: {', '.join(every)}."
        if every
        else f"No measure's own interval excludes 0 in all {n_pop} populations."
    )
    return " ".join([head, *_interval_sentences(table, "pooled interval"), tail])


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
    tau_label: str = "τ",
) -> go.Figure:
    """One panel per measure against ``target`` (models where both are finite; log x when all values
    are positive, with readable tick labels :func:`log_ticks`); the colour of a point is its
    optimizer, its marker its model, open markers the models whose training error is above
    ``threshold`` (key above the panels, :func:`legend_text`); tau-b and its interval from
    ``table`` in each title (``tau_label``: what the tau is, ``mean τ`` for the pooled view); at
    most three panels a row. Column operations only (no loop over the models)."""
    if not measures:
        raise UserInputError("select at least one measure to plot")
    by = table.set_index("measure")
    rows, cols = grid_shape(len(measures))
    titles = []
    for m in measures:
        e = by.loc[m]
        tau = "n/a" if math.isnan(e["tau"]) else f"{e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}]"
        titles.append(f"{m}<br>{tau_label} = {tau}")
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, vertical_spacing=0.3 / rows + 0.05)
    label = TARGET_LABELS.get(target, target)
    colours, symbols = styles(df)
    weak = barely_trained(df, threshold) if threshold is not None else pd.Series(False, index=df.index)
    extra = [k for k in ("id", "optimizer", "model", "train_error") if k in df.columns]
    for i, m in enumerate(measures):
        r, c = divmod(i, cols)
        sub = df[list(dict.fromkeys([m, target, *extra]))].dropna(subset=[m, target])
        finite = np.isfinite(sub[m].to_numpy(float)) & np.isfinite(sub[target].to_numpy(float))
        sub = sub[finite]
        colour = (
            sub["optimizer"].astype(str).map(colours).fillna("#555555").tolist()
            if "optimizer" in sub
            else None
        )
        shape = (
            sub["model"].astype(str).map({k: s for k, (s, _) in symbols.items()})
            if "model" in sub
            else pd.Series("circle", index=sub.index)
        )
        symbol = shape.where(~weak.loc[sub.index].to_numpy(bool), shape + "-open").tolist()
        names = [sub[k].astype(str) for k in ("id", "optimizer", "model") if k in sub]
        hover = names[0].str.cat(names[1:], sep=" · ") if names else pd.Series("", index=sub.index)
        if "train_error" in sub:
            hover = hover + "<br>training error " + sub["train_error"].map("{:.3g}".format)
        hover = hover.tolist()
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
    return " ".join([head, *_interval_sentences(table)])
