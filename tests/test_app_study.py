"""Dashboard page 8 (Flatness study) under streamlit's AppTest and its logic in
``dashboard.study_view``: the table's tau equals ``experiments.study.kendall_tau_b`` and
``scipy.stats.kendalltau`` on the committed example population, the scatter panels plot the CSV
columns, and a missing directory gives a message instead of a traceback."""

from __future__ import annotations

import base64
import json
import math
import shutil
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
from dashboard import study_view as sv  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from experiments.study import kendall_tau_b  # noqa: E402

CSV = ROOT / "docs" / "figures" / "study_digits_population.csv"
PAGE = str(APP / "pages" / "8_Flatness_study.py")


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


@pytest.fixture(scope="module")
def csv() -> pd.DataFrame:
    return pd.read_csv(CSV)


@pytest.fixture(scope="module")
def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    return at


def test_page_defaults_table_matches_kendall(page: AppTest, csv: pd.DataFrame) -> None:
    _no_errors(page)
    table = page.dataframe[0].value
    assert len(table) == 18 and page.selectbox[0].value == "gap_error"
    for _, row in table.iterrows():
        x, y = csv[row["measure"]].to_numpy(float), csv["gap_error"].to_numpy(float)
        assert row["n"] == len(csv) == 38
        assert row["tau"] == pytest.approx(kendall_tau_b(x, y), abs=1e-12)
        assert row["tau"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
        assert row["low"] <= row["tau"] <= row["high"]
    # the committed report (same seed and resamples) holds the same interval and Psi
    doc = json.loads((ROOT / "docs" / "figures" / "study_digits.json").read_text())
    ref = {e["measure"]: e for e in doc["correlation"] if e["target"] == "gap_error"}
    for _, row in table.iterrows():
        e = ref[row["measure"]]
        assert (row["low"], row["high"]) == pytest.approx((e["low"], e["high"]), abs=1e-12)
        assert row["Psi"] == pytest.approx(e["Psi"], abs=1e-12)
    assert any("38 models" in m.value for m in page.markdown)


def test_page_scatter_is_csv_columns(page: AppTest, csv: pd.DataFrame) -> None:
    (spec,) = _charts(page)
    traces = spec["data"]
    chosen = page.multiselect[0].value
    assert len(traces) == len(chosen) == 4
    table = page.dataframe[0].value.set_index("measure")
    for trace, m in zip(traces, chosen):
        np.testing.assert_array_equal(_arr(trace["x"]), csv[m].to_numpy(float))
        np.testing.assert_array_equal(_arr(trace["y"]), csv["gap_error"].to_numpy(float))
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert f"τ = {table.loc[chosen[0], 'tau']:+.2f}" in titles[0]


def test_page_changed_widgets(csv: pd.DataFrame) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.selectbox[0].set_value("ood_error")
    at.multiselect[0].set_value(["tracer", "keskar", "lambda_max", "fisher_trace", "worst_case"])
    at.select_slider[0].set_value(200)
    at.run()
    _no_errors(at)
    table = at.dataframe[0].value
    x, y = csv["tracer"].to_numpy(float), csv["ood_error"].to_numpy(float)
    tau = table.set_index("measure").loc["tracer", "tau"]
    assert tau == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
    assert (table["samples"] == 200).all()
    (spec,) = _charts(at)
    assert len(spec["data"]) == 5
    np.testing.assert_array_equal(_arr(spec["data"][4]["y"]), y)
    # five panels wrap into two rows of at most three: the fourth panel sits on a new row
    assert spec["layout"]["xaxis4"]["domain"] == spec["layout"]["xaxis"]["domain"]


def test_page_every_target_from_the_url(csv: pd.DataFrame) -> None:
    """?target=...: each target of the committed population; the taus are scipy's on its columns."""
    for target in sv.targets_of(csv):
        at = AppTest.from_file(PAGE, default_timeout=60)
        at.query_params["target"] = target
        at.session_state["study_samples"] = 200
        at.run()
        _no_errors(at)
        assert not at.warning and at.selectbox[0].value == target
        y = csv[target].to_numpy(float)
        for _, row in at.dataframe[0].value.iterrows():
            tau = kendalltau(csv[row["measure"]].to_numpy(float), y).statistic
            assert row["tau"] == pytest.approx(tau, abs=1e-12), (target, row["measure"])
        (spec,) = _charts(at)
        np.testing.assert_array_equal(_arr(spec["data"][0]["y"]), y)
        assert at.query_params["target"] == target


def test_page_missing_directory_is_a_message(tmp_path: Path) -> None:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.text_input[0].set_value(str(tmp_path / "nope")).run()
    assert not at.exception
    assert len(at.error) == 1 and "does not exist" in at.error[0].value
    assert not at.dataframe


def test_load_directory_layouts(tmp_path: Path, csv: pd.DataFrame) -> None:
    shutil.copy(CSV, tmp_path / "population.csv")
    df, named = sv.load_population(tmp_path)
    assert named is None and df.shape == csv.shape
    assert sv.measures_of(df) == sv.measures_of(*sv.load_population(""))  # same columns found
    with pytest.raises(UserInputError, match="does not exist"):
        sv.load_population(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserInputError, match="population.csv"):
        sv.load_population(empty)


def test_correlation_table_direct(csv: pd.DataFrame) -> None:
    table = sv.correlation_table(csv, ["keskar", "tracer"], "test_error", samples=100, seed=3)
    for _, row in table.iterrows():
        x, y = csv[row["measure"]].to_numpy(float), csv["test_error"].to_numpy(float)
        assert row["tau"] == pytest.approx(kendalltau(x, y).statistic, abs=1e-12)
    with pytest.raises(UserInputError, match="no column"):
        sv.correlation_table(csv, ["keskar"], "nope")
    with pytest.raises(UserInputError, match="at least one measure"):
        sv.scatter_figure(csv, [], "gap_error", table)
    assert not math.isnan(table["Psi"].iloc[0])
