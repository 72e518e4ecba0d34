"""Issue 29, flatness study (page 8): log axes carry whole numbers as tick labels (never the bare
mantissas "2 5 1 2 5"), every point shows its optimizer (colour) and model (marker) with a key
above the panels, and models that barely trained (training error above a threshold) are marked,
counted and can be left out of the correlations."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import study_view as sv  # noqa: E402
from dashboard.experiments_view import color_of  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

CSV = ROOT / "docs" / "figures" / "study_digits_population.csv"
PAGE = str(APP / "pages" / "8_Flatness_study.py")


@pytest.fixture(scope="module")
def csv() -> pd.DataFrame:
    return pd.read_csv(CSV)


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


def test_scatter_colours_markers_and_barely_trained(csv):
    table = sv.correlation_table(csv, ["lambda_max", "keskar"], "gap_error", samples=100)
    fig = sv.scatter_figure(csv, ["lambda_max", "keskar"], "gap_error", table, threshold=0.5)
    panel = fig.data[0]
    assert np.array_equal(np.asarray(panel.x, float), csv["lambda_max"].to_numpy(float))
    assert list(panel.marker.color) == [color_of(o) for o in csv["optimizer"]]
    weak = csv["train_error"] > 0.5
    assert int(weak.sum()) == 3  # three LeNet-5/ASAM models (README: up to 0.81)
    symbols = list(panel.marker.symbol)
    assert [s.endswith("-open") for s in symbols] == weak.tolist()
    by_model = {
        m: {s.removesuffix("-open") for s, k in zip(symbols, csv["model"]) if k == m} for m in csv["model"]
    }
    assert (
        all(len(v) == 1 for v in by_model.values()) and len({next(iter(v)) for v in by_model.values()}) == 2
    )
    key = fig.layout.annotations[-1].text
    for o in sorted(set(csv["optimizer"])):
        assert f"<span style='color:{color_of(o)}'>●</span> {o}" in key
    assert "marker = model: ● lenet5-digits  ■ mlp" in key
    assert "open marker (○) = training error > 0.5: barely trained" in key
    # log axis: explicit whole-number labels
    axis = fig.layout.xaxis
    assert axis.type == "log" and all(
        float(t) == pytest.approx(v) for t, v in zip(axis.ticktext, axis.tickvals)
    )
    # a stricter threshold marks none: no legend entry for it
    fig = sv.scatter_figure(csv, ["lambda_max"], "gap_error", table, threshold=0.9)
    assert not any(s.endswith("-open") for s in fig.data[0].marker.symbol)
    assert "barely trained" not in fig.layout.annotations[-1].text


def test_barely_trained_text_counts(csv):
    text = sv.barely_trained_text(csv, 0.5, left_out=False)
    assert text.startswith(
        "3 of 38 models have a training error above 0.5 (3 lenet5-digits/asam), up to 0.81"
    )
    assert "open markers" in text
    assert sv.barely_trained_text(csv, 0.9, left_out=False) == "No model has a training error above 0.9."


def test_page_leaves_them_out_on_request(csv):
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["study_samples"] = 200
    at.run()
    assert not at.exception and not at.error
    assert any(m.value.startswith("3 of 38 models have a training error above 0.5") for m in at.markdown)
    assert set(at.dataframe[0].value["n"]) <= {38}
    at.checkbox(key="study_leave_out").check().run()
    assert not at.exception and not at.error
    assert set(at.dataframe[0].value["n"]) <= {35} and any("35 models" in m.value for m in at.markdown)
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    x = spec["data"][0]["x"]
    n = (
        len(x)
        if isinstance(x, list)
        else int(np.prod([int(k) for k in str(x.get("shape", "35")).split(",")]))
    )
    assert n == 35
    assert not math.isnan(float(at.dataframe[0].value["tau"].iloc[0]))
