"""Dashboard pages 5-7 (Experiments, Curvature monitor, Paths between minima) under streamlit's
AppTest, with defaults and changed widgets; the numbers on the pages checked against the library
calls that produce them (experiments.table, CurvatureMonitor.history, PathResult, Objective.loss)."""

from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from streamlit.testing.v1 import AppTest  # noqa: E402

from experiments.table import aggregate, collect_runs  # noqa: E402


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: a plain list, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return arr.reshape(v["shape"]) if "shape" in v else arr
    return np.asarray([math.nan if e is None else e for e in v], dtype=float)


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _frame(at: AppTest, i: int = 0):
    return at.dataframe[i].value


# ------------------------------------------------------------------------------ experiments


@pytest.fixture(scope="module")
def run_root(tmp_path_factory) -> Path:
    """A tiny grid (3 methods x 2 seeds, 1 epoch, 5 % of the data) written by the runner's CLI."""
    from experiments.cli import main

    out = tmp_path_factory.mktemp("runs")
    status = main(
        [
            "run",
            str(ROOT / "configs" / "digits_sam_vs_sgd.toml"),
            "train.epochs=1",
            "seeds=[0,1]",
            "budget=0.05",
            "evaluation.sharpness=[]",
            f"out_dir={out}",
            "--no-progress",
        ]
    )
    assert status == 0
    return out


def _experiments_page(root: Path) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "5_Experiments.py"), default_timeout=120)
    at.run()
    at.text_input(key="exp_root").set_value(str(root)).run()
    return at


def test_experiments_table_equals_experiments_table(run_root):
    at = _experiments_page(run_root)
    _no_errors(at)
    assert len(at.multiselect(key="exp_runs").value) == 6
    df = _frame(at, 0)
    entries = aggregate(collect_runs([run_root]))
    assert list(df["method"]) == [e["group"] for e in entries]
    for i, e in enumerate(entries):
        assert df["seeds"].iloc[i] == e["n"] == 2
        for m in ("accuracy", "nll", "ece", "brier"):
            assert df[f"{m} mean"].iloc[i] == pytest.approx(e["mean"][m], rel=0, abs=0)
            vals = np.asarray(e["values"][m])
            assert df[f"{m} std"].iloc[i] == pytest.approx(np.std(vals, ddof=1), rel=1e-12)
    # the training curves: one line per run, its y the log.jsonl values, coloured by method
    charts = _charts(at)
    loss = next(c for c in charts if c["layout"]["yaxis"]["title"]["text"] == "train_loss")
    assert len(loss["data"]) == 6
    for tr in loss["data"]:
        run = run_root / tr["meta"]["run"]
        logged = [json.loads(line)["train_loss"] for line in (run / "log.jsonl").read_text().splitlines()]
        assert _arr(tr["y"]).tolist() == logged
    colours = {tr["meta"]["method"]: tr["line"]["color"] for tr in loss["data"]}
    assert colours["sgd"] == "#bcbd22" and colours["sam"] == "#d62728" and colours["bsam"] == "#1f77b4"
    # the reliability rows: the recomputed ECE equals the ECE the runner recorded
    rel = _frame(at, 1)
    assert len(rel) == 3  # one run per method by default
    for _, row in rel.iterrows():
        assert row["ECE (recomputed)"] == pytest.approx(row["ECE (metrics.json)"], rel=1e-12)


def test_experiments_changed_widgets(run_root):
    at = _experiments_page(run_root)
    sgd_only = [o for o in at.multiselect(key="exp_runs").options if "/sgd/" in o]
    at.multiselect(key="exp_runs").set_value(sgd_only).run()
    _no_errors(at)
    df = _frame(at, 0)
    assert list(df["method"]) == ["sgd"]
    accs = [json.loads((run_root / o / "metrics.json").read_text())["accuracy"] for o in sgd_only]
    assert df["accuracy mean"].iloc[0] == pytest.approx(float(np.mean(accs)), rel=1e-12)
    at.multiselect(key="exp_curves").set_value(["test_nll", "lr"]).run()
    at.select_slider(key="exp_bins").set_value(10).run()
    at.multiselect(key="exp_reliability").set_value([]).run()
    _no_errors(at)
    at.multiselect(key="exp_runs").set_value([]).run()
    _no_errors(at)
    assert any("Choose at least one run" in i.value for i in at.info)


def test_experiments_missing_directory(tmp_path):
    at = _experiments_page(tmp_path / "nowhere")
    assert not at.exception
    assert any("does not exist" in e.value for e in at.error)
    at = _experiments_page(tmp_path)  # exists, holds no run
    _no_errors(at)
    assert any("No finished runs" in i.value for i in at.info)
