"""Dashboard page 8 (Flatness study) under streamlit's AppTest and its logic in
``dashboard.study_view``, on the committed study (three populations, every member trained to the
stopping rule): the page shows one population at a time, in the order the report correlated it, so
its table's tau equals ``experiments.study.kendall_tau_b`` and ``scipy.stats.kendalltau`` on that
population's CSV rows and its intervals and Psi are the committed report's; the pooled view is the
report's ``combined`` entries (recomputed here with ``experiments.study.combine``); the scatter
panels plot the CSV columns; a missing directory gives a message instead of a traceback. Every
count is recounted from the committed CSV (``csv`` module) and JSON, never written here."""

from __future__ import annotations

import base64
import csv as csvlib
import json
import math
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import UserInputError  # noqa: E402
from dashboard import study_data as sd  # noqa: E402
from dashboard import study_view as sv  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from experiments.study import AXES, kendall_tau_b  # noqa: E402
from experiments.study.combine import combine, population_correlations  # noqa: E402
from experiments.study.population import population_ids  # noqa: E402

FIG = ROOT / "docs" / "figures"
CSV = FIG / "study_digits_population.csv"
JSON = FIG / "study_digits.json"
PAGE = str(APP / "pages" / "8_Flatness_study.py")
DOC = json.loads(JSON.read_text(encoding="utf-8"))
MEASURES = [m["name"] for m in DOC["study"]["measures"]]
#: the statuses the report leaves out of the correlations (experiments.study.report.EXCLUDED)
LEFT_OUT = {"diverged", "not_converged"}


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: a plain list, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return arr.reshape(v["shape"]) if "shape" in v else arr
    return np.asarray(v, dtype=float)


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _table(at: AppTest) -> pd.DataFrame:
    """The correlation table: the page's last table (the excluded members, when any, come first)."""
    return at.dataframe[-1].value


def _raw_rows() -> list[dict[str, str]]:
    with CSV.open(encoding="utf-8", newline="") as f:
        return list(csvlib.DictReader(f))


@pytest.fixture(scope="module")
def csv() -> pd.DataFrame:
    return pd.read_csv(CSV)


@pytest.fixture(scope="module")
def pops(csv: pd.DataFrame) -> list[pd.DataFrame]:
    """Each population's members that enter the correlations, in the order the study plans them
    (``experiments.study.population.population_ids`` of the committed config: the order of the
    run's ``populations.json``, which the report's bootstrap used); the members are those the CSV's
    ``populations`` column names (checked)."""
    raw = _raw_rows()
    order = population_ids(DOC["study"])
    for k, ids in enumerate(order):
        assert set(ids) == {r["id"] for r in raw if str(k) in r["populations"].split(";")}
    keep = {r["id"] for r in raw if r["status"] not in LEFT_OUT}
    by_id = csv.set_index("id", drop=False)
    return [by_id.loc[[i for i in ids if i in keep]].reset_index(drop=True) for ids in order]


@pytest.fixture(scope="module")
def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    return at


def _report(k: int, target: str) -> dict[str, dict]:
    return {e["measure"]: e for e in DOC["populations"][k]["correlation"] if e["target"] == target}


def _matches_report(table: pd.DataFrame, rows: pd.DataFrame, k: int, target: str) -> None:
    ref = _report(k, target)
    y = rows[target].to_numpy(float)
    for _, row in table.iterrows():
        x = rows[row["measure"]].to_numpy(float)
        assert row["n"] == len(rows) == DOC["populations"][k]["included"]
        assert row["tau"] == pytest.approx(kendall_tau_b(x, y), abs=1e-12)
        assert row["tau"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
        assert row["low"] <= row["tau"] <= row["high"]
        # the committed report (same members in the same order, seed and resamples): same numbers
        e = ref[row["measure"]]
        assert (row["tau"], row["low"], row["high"]) == pytest.approx(
            (e["tau"], e["low"], e["high"]), abs=1e-12
        )
        assert row["Psi"] == pytest.approx(e["Psi"], abs=1e-12)


def test_page_defaults_to_population_0_and_matches_the_report(page: AppTest, pops) -> None:
    _no_errors(page)
    assert page.selectbox(key="study_population").value == 0
    assert page.selectbox(key="study_target").value == "gap_error"
    table = _table(page)
    assert list(table["measure"]) == MEASURES
    _matches_report(table, pops[0], 0, "gap_error")
    assert any(m.value.startswith(f"{len(pops[0])} models; Kendall") for m in page.markdown)
    assert page.query_params["population"] == "0" and page.query_params["target"] == "gap_error"
    if all(r["status"] not in LEFT_OUT for r in _raw_rows()):  # nobody to list
        assert len(page.dataframe) == 1  # the correlation table only


def test_page_every_population_matches_the_report(pops) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    for k in range(1, len(pops)):
        at.selectbox(key="study_population").set_value(k).run()
        _no_errors(at)
        _matches_report(_table(at), pops[k], k, "gap_error")
        (spec,) = _charts(at)
        np.testing.assert_array_equal(_arr(spec["data"][0]["y"]), pops[k]["gap_error"].to_numpy(float))
        assert at.query_params["population"] == str(k)


def test_page_pooled_is_the_reports_combined_entries(csv: pd.DataFrame, pops) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert at.selectbox(key="study_population").options[-1] == sv.population_label(
        sd.load_study(""), sd.POOLED
    )
    at.selectbox(key="study_population").set_value(sd.POOLED).run()
    _no_errors(at)
    assert at.checkbox(key="study_leave_out").disabled
    table = _table(at).set_index("measure")
    ref = {e["measure"]: e for e in DOC["combined"] if e["target"] == "gap_error"}
    assert list(table.index) == MEASURES
    for m, row in table.iterrows():
        e = ref[m]
        assert (row["tau"], row["low"], row["high"], row["Psi"]) == pytest.approx(
            (e["tau"], e["low"], e["high"], e["Psi"]), abs=1e-12
        )
        assert row["populations_excluding_0"] == e["excludes_zero"]
        assert row["n"] == "/".join(str(len(p)) for p in pops)
        # the mean of the populations' tau-b, each recomputed with scipy on the CSV rows
        taus = [kendalltau(p[m].to_numpy(float), p["gap_error"].to_numpy(float)).statistic for p in pops]
        assert row["tau"] == pytest.approx(np.mean(taus), abs=1e-12)
        for k, tau in enumerate(taus):
            assert row[f"tau_{k}"] == pytest.approx(tau, abs=1e-12)
    # the pooled interval recomputed by the study's own combination of the CSV rows (two measures)
    two = ["lambda_max", "tracer"]
    rows = [sd.records(p) for p in pops]
    per = population_correlations(rows, two, ["gap_error"], AXES, samples=1000, seed=0)
    for e in combine(rows, per, samples=1000, seed=0):
        assert (table.loc[e["measure"], "low"], table.loc[e["measure"], "high"]) == pytest.approx(
            (e["low"], e["high"]), abs=1e-12
        )
    # the plots: every distinct model in the correlations once, in CSV order
    raw = _raw_rows()
    keep = [r for r in raw if r["status"] not in LEFT_OUT and r["populations"]]
    (spec,) = _charts(at)
    chosen = at.multiselect(key="study_measures").value
    for trace, m in zip(spec["data"], chosen):
        np.testing.assert_array_equal(_arr(trace["x"]), [float(r[m]) for r in keep])
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert f"mean τ = {table.loc[chosen[0], 'tau']:+.2f} [{table.loc[chosen[0], 'low']:+.2f}," in titles[0]
    assert at.query_params["population"] == "pooled"


def test_page_scatter_is_csv_columns(page: AppTest, pops) -> None:
    (spec,) = _charts(page)
    traces = spec["data"]
    chosen = page.multiselect(key="study_measures").value
    assert len(traces) == len(chosen) == 4 and chosen == MEASURES[:4]
    table = _table(page).set_index("measure")
    for trace, m in zip(traces, chosen):
        np.testing.assert_array_equal(_arr(trace["x"]), pops[0][m].to_numpy(float))
        np.testing.assert_array_equal(_arr(trace["y"]), pops[0]["gap_error"].to_numpy(float))
        assert list(trace["text"]) == [
            f"{r.id} · {r.optimizer} · {r.model}<br>training error {r.train_error:.3g}"
            for r in pops[0].itertuples()
        ]
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert f"τ = {table.loc[chosen[0], 'tau']:+.2f}" in titles[0]


def test_page_changed_widgets(pops) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.selectbox(key="study_target").set_value("ood_error")
    at.multiselect(key="study_measures").set_value(
        ["tracer", "keskar", "lambda_max", "fisher_trace", "worst_case"]
    )
    at.select_slider(key="study_samples").set_value(200)
    at.run()
    _no_errors(at)
    table = _table(at)
    x, y = pops[0]["tracer"].to_numpy(float), pops[0]["ood_error"].to_numpy(float)
    tau = table.set_index("measure").loc["tracer", "tau"]
    assert tau == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
    assert (table["samples"] == 200).all()
    (spec,) = _charts(at)
    assert len(spec["data"]) == 5
    np.testing.assert_array_equal(_arr(spec["data"][4]["y"]), y)
    # five panels wrap into two rows of at most three: the fourth panel sits on a new row
    assert spec["layout"]["xaxis4"]["domain"] == spec["layout"]["xaxis"]["domain"]


def test_page_every_target_and_population_from_the_url(csv: pd.DataFrame, pops) -> None:
    """?population=K&target=...: each target, on the last population; the taus are scipy's."""
    k = len(pops) - 1
    for target in sv.targets_of(csv):
        at = AppTest.from_file(PAGE, default_timeout=60)
        at.query_params["population"] = str(k)
        at.query_params["target"] = target
        at.session_state["study_samples"] = 200
        at.run()
        _no_errors(at)
        assert not at.warning and at.selectbox(key="study_target").value == target
        assert at.selectbox(key="study_population").value == k
        y = pops[k][target].to_numpy(float)
        for _, row in _table(at).iterrows():
            tau = kendalltau(pops[k][row["measure"]].to_numpy(float), y).statistic
            assert row["tau"] == pytest.approx(tau, abs=1e-12), (target, row["measure"])
            assert row["n"] == len(pops[k])
        (spec,) = _charts(at)
        np.testing.assert_array_equal(_arr(spec["data"][0]["y"]), y)
        assert at.query_params["target"] == target and at.query_params["population"] == str(k)


def test_page_unknown_population_in_the_url_warns() -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params["population"] = "7"
    at.session_state["study_samples"] = 200
    at.run()
    _no_errors(at)
    assert any("population='7'" in w.value for w in at.warning)
    assert at.selectbox(key="study_population").value == 0


def test_page_missing_directory_is_a_message(tmp_path: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.text_input(key="study_dir").set_value(str(tmp_path / "nope")).run()
    assert not at.exception
    assert len(at.error) == 1 and "does not exist" in at.error[0].value
    assert not at.dataframe


def test_load_directory_layouts(tmp_path: Path, csv: pd.DataFrame, pops) -> None:
    shutil.copy(CSV, tmp_path / "population.csv")
    alone = sd.load_study(tmp_path)
    assert alone.measures is None and alone.df.shape == csv.shape and alone.report is None
    assert sv.measures_of(alone.df) == sv.measures_of(*sd.load_population(""))  # same columns found
    # without the report: the populations the CSV column names, in table order; no pooled view
    assert [set(p) for p in alone.populations] == [set(p["id"]) for p in pops]
    assert sd.population_choices(alone) == list(range(len(pops)))
    # with it (correlation.json): the report's order and the pooled view, as the committed example
    shutil.copy(JSON, tmp_path / "correlation.json")
    full = sd.load_study(tmp_path)
    assert full.populations == [list(p["id"]) for p in pops] and full.stop == DOC["stop"]
    assert sd.population_choices(full) == [*range(len(pops)), sd.POOLED]
    assert full.seeds == [p["sampling_seed"] for p in DOC["populations"]]
    with pytest.raises(UserInputError, match="does not exist"):
        sd.load_population(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserInputError, match="population.csv"):
        sd.load_population(empty)


def test_population_frame_is_the_population_in_report_order(pops) -> None:
    study = sd.load_study("")
    for k, rows in enumerate(pops):
        frame = sd.population_frame(study, k)
        assert list(frame["id"]) == list(rows["id"])
        pd.testing.assert_frame_equal(frame, rows[frame.columns], check_dtype=False)
    pooled = sd.population_frame(study, sd.POOLED)
    assert sorted(pooled["id"]) == sorted({i for p in pops for i in p["id"]})


def test_correlation_table_direct(pops) -> None:
    rows = pops[0]
    table = sv.correlation_table(rows, ["keskar", "tracer"], "test_error", samples=100, seed=3)
    for _, row in table.iterrows():
        x, y = rows[row["measure"]].to_numpy(float), rows["test_error"].to_numpy(float)
        assert row["tau"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
    with pytest.raises(UserInputError, match="no column"):
        sv.correlation_table(rows, ["keskar"], "nope")
    with pytest.raises(UserInputError, match="at least one measure"):
        sv.scatter_figure(rows, [], "gap_error", table)
    assert not math.isnan(table["Psi"].iloc[0])


def _with_excluded(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The committed CSV with four members of population 0 marked as a study leaves those that
    missed the stopping rule (three ``not_converged``) or diverged (one, without measures)."""
    raw = _raw_rows()
    first = [r for r in raw if r["populations"].split(";") == ["0"]][:4]
    changed = {r["id"]: s for r, s in zip(first, ["not_converged"] * 3 + ["diverged"])}
    for r in raw:
        if r["id"] in changed:
            r["status"] = changed[r["id"]]
            if r["status"] == "diverged":
                for m in MEASURES:
                    r[m] = ""
    path = tmp_path / "population.csv"
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csvlib.DictWriter(f, fieldnames=list(raw[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(raw)
    return path, changed


def test_excluded_members_are_named_and_left_out(tmp_path: Path) -> None:
    path, changed = _with_excluded(tmp_path)
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["study_samples"] = 200
    at.run()
    at.text_input(key="study_dir").set_value(str(path)).run()
    _no_errors(at)
    raw = list(csvlib.DictReader(path.open(encoding="utf-8")))
    n_out = sum(r["status"] in LEFT_OUT for r in raw)
    assert n_out == len(changed)
    texts = [m.value for m in at.markdown]
    nc = sum(r["status"] == "not_converged" for r in raw)
    dv = sum(r["status"] == "diverged" for r in raw)
    excluded = (
        f"{n_out} are excluded from the correlations and the plots ({nc} did not reach the target "
        f"training loss, {dv} diverged; listed below)."
    )
    assert any(t.endswith(excluded) for t in texts), texts
    assert len(at.dataframe) == 2  # the excluded members, then the correlation table
    listed = at.dataframe[0].value
    assert dict(zip(listed["id"], listed["status"])) == changed
    in_0 = [r for r in raw if "0" in r["populations"].split(";")]
    kept_0 = [r for r in in_0 if r["status"] not in LEFT_OUT]
    population = (
        f"**Population 0**: {len(in_0)} members, {len(kept_0)} in the correlations, "
        f"{len(in_0) - len(kept_0)} excluded."
    )
    assert any(t.startswith(population) for t in texts), texts
    table = _table(at)
    assert set(table["n"]) == {len(kept_0)}
    x = [float(r["lambda_max"]) for r in kept_0]
    y = [float(r["gap_error"]) for r in kept_0]
    assert table.set_index("measure").loc["lambda_max", "tau"] == pytest.approx(kendalltau(x, y).statistic)
    (spec,) = _charts(at)
    assert not set(changed) & {t.split(" · ")[0] for t in spec["data"][0]["text"]}
    assert sd.POOLED not in at.selectbox(key="study_population").options  # no report next to this CSV


def test_page_renders_in_a_few_seconds() -> None:
    """The first view (population 0, 1000 resamples for every measure, nothing cached) and the
    pooled view; generous bounds for a loaded two-core CI machine (about 4 s and 0.3 s on one)."""
    import time

    import streamlit as st

    st.cache_data.clear()  # the other tests' bootstraps are cached in this process
    at = AppTest.from_file(PAGE, default_timeout=60)
    t0 = time.perf_counter()
    at.run()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    at.selectbox(key="study_population").set_value(sd.POOLED).run()
    pooled = time.perf_counter() - t0
    _no_errors(at)
    assert first < 20 and pooled < 5, (first, pooled)


def test_stopping_text_counts(csv: pd.DataFrame) -> None:
    raw = _raw_rows()
    done = [int(r["epochs"]) for r in raw if r["status"] == "completed"]
    stop = DOC["stop"]
    text = sv.stopping_text(sd.load_study(""))
    assert text.startswith(
        f"**Stopping rule:** every model trained until the cross-entropy on its whole training set was at "
        f"most {stop['train_loss']:g} (checked after every epoch, at most {stop['max_epochs']} epochs). "
        f"{len(done)} of the {len(raw)} models reached it (after {min(done)}–{max(done)} epochs, median "
        f"{statistics.median(done):g})."
    )
    if all(r["status"] not in LEFT_OUT for r in raw):
        assert text.endswith("No model is excluded from the correlations.")
