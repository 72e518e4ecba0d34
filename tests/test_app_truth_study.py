"""Issue 29, flatness study (page 8): log axes carry whole numbers as tick labels (never the bare
mantissas "2 5 1 2 5"), every point shows its optimizer (colour) and model (marker) with a key
above the panels, and models that barely trained (training error above a threshold) are marked,
counted and can be left out of the correlations. Each sentence the page states about the committed
study (stopping rule, exclusions, populations, the pooled intervals, which intervals exclude 0) is
checked against a recount from the committed CSV (``csv`` module) and JSON."""

from __future__ import annotations

import csv as csvlib
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import study_data as sd  # noqa: E402
from dashboard import study_view as sv  # noqa: E402
from dashboard.experiments_view import color_of  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

CSV = ROOT / "docs" / "figures" / "study_digits_population.csv"
DOC = json.loads((ROOT / "docs" / "figures" / "study_digits.json").read_text(encoding="utf-8"))
PAGE = str(APP / "pages" / "8_Flatness_study.py")
LEFT_OUT = {"diverged", "not_converged"}  # the statuses the report leaves out of the correlations


@pytest.fixture(scope="module")
def raw() -> list[dict[str, str]]:
    with CSV.open(encoding="utf-8", newline="") as f:
        return list(csvlib.DictReader(f))


@pytest.fixture(scope="module")
def study() -> sd.Study:
    return sd.load_study("")


@pytest.fixture(scope="module")
def pop0(study) -> pd.DataFrame:
    """Population 0 as the page correlates it (its order is checked in tests/test_app_study.py)."""
    return sd.population_frame(study, 0)


def _in(r: dict[str, str], k: int) -> bool:
    return str(k) in r["populations"].split(";")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.0021, 0.013, 0.5], ["0.003", "0.01", "0.03", "0.1", "0.3"]),
        ([3e-5, 0.2, 40.0], ["1e-4", "0.01", "1"]),
        ([0.12, 0.5], ["0.2", "0.5"]),
        ([1.3, 1.9], ["1.2", "1.4", "1.6", "1.8", "2"]),
        ([2e-4, 3e4], ["1e-4", "0.01", "1", "100", "10000"]),
    ],
)
def test_log_ticks_are_whole_numbers(values, expected):
    vals, text = sv.log_ticks(values)
    assert text == expected
    for v, t in zip(vals, text):
        assert float(t) == pytest.approx(v, rel=1e-9)  # each label is its value, not a mantissa
    assert sv.log_ticks([]) == ([], [])


def test_scatter_colours_markers_and_barely_trained(pop0):
    """The committed models all trained to the stopping rule (training error at most a few %): a
    threshold of 0.01 marks some of them, 0.5 (the page's default) none."""
    df = pop0
    table = sv.correlation_table(df, ["lambda_max", "keskar"], "gap_error", samples=100)
    fig = sv.scatter_figure(df, ["lambda_max", "keskar"], "gap_error", table, threshold=0.01)
    panel = fig.data[0]
    assert np.array_equal(np.asarray(panel.x, float), df["lambda_max"].to_numpy(float))
    assert list(panel.marker.color) == [color_of(o) for o in df["optimizer"]]
    weak = df["train_error"] > 0.01
    assert 0 < int(weak.sum()) < len(df)
    symbols = list(panel.marker.symbol)
    assert [s.endswith("-open") for s in symbols] == weak.tolist()
    by_model = {
        m: {s.removesuffix("-open") for s, k in zip(symbols, df["model"]) if k == m} for m in df["model"]
    }
    assert all(len(v) == 1 for v in by_model.values())
    assert len({next(iter(v)) for v in by_model.values()}) == df["model"].nunique() == 2
    key = fig.layout.annotations[-1].text
    for o in sorted(set(df["optimizer"])):
        assert f"<span style='color:{color_of(o)}'>●</span> {o}" in key
    assert "marker = model: ● lenet5-digits  ■ mlp" in key
    assert "open marker (○) = training error > 0.01: barely trained" in key
    # log axis: explicit whole-number labels
    axis = fig.layout.xaxis
    assert axis.type == "log" and all(
        float(t) == pytest.approx(v) for t, v in zip(axis.ticktext, axis.tickvals)
    )
    # the default threshold marks none: no legend entry for it
    assert not (df["train_error"] > sv.BARELY_TRAINED).any()
    fig = sv.scatter_figure(df, ["lambda_max"], "gap_error", table, threshold=sv.BARELY_TRAINED)
    assert not any(s.endswith("-open") for s in fig.data[0].marker.symbol)
    assert "barely trained" not in fig.layout.annotations[-1].text


def test_barely_trained_text_counts(raw, pop0):
    rows = [r for r in raw if _in(r, 0) and r["status"] not in LEFT_OUT]
    weak = [r for r in rows if float(r["train_error"]) > 0.01]
    counts: dict[tuple[str, str], int] = {}
    for r in weak:
        counts[(r["model"], r["optimizer"])] = counts.get((r["model"], r["optimizer"]), 0) + 1
    kinds = ", ".join(f"{n} {m}/{o}" for (m, o), n in sorted(counts.items()))
    worst = max(float(r["train_error"]) for r in weak)
    text = sv.barely_trained_text(pop0, 0.01, left_out=False)
    assert text == (
        f"{len(weak)} of {len(rows)} models have a training error above 0.01 ({kinds}), up to "
        f"{worst:.2f}: they barely trained (open markers in the plots)."
    )
    assert sv.barely_trained_text(pop0, 0.5, left_out=False) == "No model has a training error above 0.5."


def test_page_sentences_are_the_data(raw):
    """Every sentence above the table of the default view, against the CSV and the JSON."""
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception and not at.error
    texts = [m.value for m in at.markdown][1:]  # after the page's introduction
    stop = DOC["stop"]
    done = [int(r["epochs"]) for r in raw if r["status"] == "completed"]
    out = [r for r in raw if r["status"] in LEFT_OUT]
    assert not out  # the committed study: every member reached the stopping rule
    assert texts[0] == (
        f"**Stopping rule:** every model trained until the cross-entropy on its whole training set was at "
        f"most {stop['train_loss']:g} (checked after every epoch, at most {stop['max_epochs']} epochs). "
        f"{len(done)} of the {len(raw)} models reached it (after {min(done)}–{max(done)} epochs, median "
        f"{statistics.median(done):g}). No model is excluded from the correlations."
    )
    n_pop = len(DOC["populations"])
    members = [[r for r in raw if _in(r, k)] for k in range(n_pop)]
    shared = sum(1 for r in raw if len(r["populations"].split(";")) > 1)
    assert texts[1] == (
        f"**Population 0** (sampling seed {DOC['populations'][0]['sampling_seed']}): {len(members[0])} "
        f"members, {len(members[0])} in the correlations. The study has {n_pop} populations "
        f"({'/'.join(str(len(m)) for m in members)} members; {len(raw)} distinct models, {shared} of them "
        "in more than one), each correlated on its own as the report does."
    )
    assert texts[2] == "No model has a training error above 0.5."
    # which intervals exclude 0: the committed report's population 0 (same numbers, tested elsewhere)
    ref = [e for e in DOC["populations"][0]["correlation"] if e["target"] == "gap_error"]
    above = [e["measure"] for e in ref if e["low"] > 0]
    below = [e["measure"] for e in ref if e["high"] < 0]
    assert texts[3] == (
        f"{len(members[0])} models; Kendall τ-b of each measure against gap error over the models where "
        "both are finite, with 95% percentile bootstrap intervals (1000 resamples, seed 0); Ψ is the "
        "granulated τ (mean over the varying hyperparameter axes). "
        + (f"Interval above 0: {', '.join(above)}. " if above else "No interval lies above 0. ")
        + (f"Interval below 0: {', '.join(below)}. " if below else "No interval lies below 0. ")
        + f"{len(ref) - len(above) - len(below)} of {len(ref)} intervals contain 0."
    )
    labels = at.selectbox(key="study_population").options
    assert labels == [
        f"population {k} (sampling seed {p['sampling_seed']}, {p['included']} models)"
        for k, p in enumerate(DOC["populations"])
    ] + [f"all {n_pop} populations pooled (the report's intervals)"]
    assert [p["members"] for p in DOC["populations"]] == [len(m) for m in members]


def test_pooled_sentences_are_the_report(raw):
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["study_samples"] = 200
    at.run()
    at.selectbox(key="study_population").set_value(sd.POOLED).run()
    assert not at.exception and not at.error
    texts = [m.value for m in at.markdown][1:]
    boot = DOC["bootstrap"]
    n_pop = len(DOC["populations"])
    distinct = sum(1 for r in raw if r["status"] not in LEFT_OUT and r["populations"])
    assert texts[1] == (
        f"**Pooled over the {n_pop} populations**, from the report (`study_digits.json`): τ is the mean "
        f"of the populations' τ-b and the interval the {boot['level']:.0%} percentile interval of all "
        f"their bootstrap resamples together ({boot['samples']} per population, seed {boot['seed']}: an "
        "equal-weight mixture), so it includes the variability between populations; "
        "`populations_excluding_0` counts the populations whose own interval excludes 0, Ψ is the mean "
        "of their granulated τ. The resamples set in the sidebar apply to single populations. The "
        f"plots show the {distinct} distinct models in the correlations, each once."
    )
    gap = [e for e in DOC["combined"] if e["target"] == "gap_error"]
    above = [e["measure"] for e in gap if e["low"] > 0]
    below = [e["measure"] for e in gap if e["high"] < 0]
    every = [e["measure"] for e in gap if e["excludes_zero"] == n_pop]
    assert texts[3] == (
        "Mean τ-b over the populations of each measure against gap error, with the pooled interval. "
        + (f"Pooled interval above 0: {', '.join(above)}. " if above else "No pooled interval lies above 0. ")
        + (f"Pooled interval below 0: {', '.join(below)}. " if below else "No pooled interval lies below 0. ")
        + f"{len(gap) - len(above) - len(below)} of {len(gap)} pooled intervals contain 0. "
        + (
            f"In all {n_pop} populations the measure's own interval excludes 0 for: {', '.join(every)}."
            if every
            else f"No measure's own interval excludes 0 in all {n_pop} populations."
        )
    )
    # the headline (README) counts the same intervals
    assert f"{len(above)} of {len(gap)} measures have a pooled interval" in DOC["headline"]
    assert f"{len(every)} measures exclude 0 in all {n_pop} populations" in DOC["headline"]


def _barely_trained_table(tmp_path: Path, raw: list[dict[str, str]]) -> tuple[Path, set[str]]:
    """The committed table as a study without a stopping rule might leave it: three LeNet-5/ASAM
    members of population 0 with training errors of 0.6-0.8 (no report next to it)."""
    rows = [dict(r) for r in raw]
    picked = [r for r in rows if _in(r, 0) and (r["model"], r["optimizer"]) == ("lenet5-digits", "asam")][:3]
    for r, err in zip(picked, ("0.6", "0.7", "0.81")):
        r["train_error"] = err
    path = tmp_path / "population.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csvlib.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path, {r["id"] for r in picked}


def test_page_leaves_them_out_on_request(tmp_path, raw):
    path, weak = _barely_trained_table(tmp_path, raw)
    n0 = sum(_in(r, 0) and r["status"] not in LEFT_OUT for r in raw)
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["study_samples"] = 200
    at.run()
    at.text_input(key="study_dir").set_value(str(path)).run()
    assert not at.exception and not at.error
    start = (
        f"{len(weak)} of {n0} models have a training error above 0.5 ({len(weak)} lenet5-digits/asam), "
        "up to 0.81"
    )
    assert any(m.value.startswith(start) for m in at.markdown)
    assert set(at.dataframe[-1].value["n"]) == {n0}
    at.checkbox(key="study_leave_out").check().run()
    assert not at.exception and not at.error
    kept = n0 - len(weak)
    assert set(at.dataframe[-1].value["n"]) == {kept} and any(
        f"{kept} models" in m.value for m in at.markdown
    )
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    x = spec["data"][0]["x"]
    n = (
        len(x)
        if isinstance(x, list)
        else int(np.prod([int(k) for k in str(x.get("shape", str(kept))).split(",")]))
    )
    assert n == kept and not weak & {t.split(" · ")[0] for t in spec["data"][0]["text"]}
    assert not math.isnan(float(at.dataframe[-1].value["tau"].iloc[0]))
