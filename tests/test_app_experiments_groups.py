"""Dashboard page 5 (Experiments) groups runs as ``python -m experiments table`` does (issue 24): a
runs/ folder holding a clean and a 40 %-label-noise digits experiment shows one row per method and
noise level (no 'same seed twice' error box), curves coloured per row, a diverged run listed and
left out of the means; another directory resets the run and diagram selections."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import experiments_view as ev  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from experiments.table import aggregate, collect_runs  # noqa: E402

METHODS = ("bsam", "sam", "sgd")
DIV = {"step": 3, "epoch": 1, "loss": 1e9, "reference_loss": 2.3, "reason": "loss above 10 x reference"}


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.fixture(scope="module")
def two_experiments(tmp_path_factory) -> Path:
    """runs/digits_clean and runs/digits_noise (label_noise 0.4): 3 methods x seeds 0, 1 each, by
    the runner's CLI (1 epoch, 5 % of the data), plus a diverged seed 2 of sgd in the noisy one."""
    from experiments.cli import main

    out = tmp_path_factory.mktemp("runs")
    for name, extra in (("digits_clean", []), ("digits_noise", ["data.label_noise=0.4"])):
        args = ["train.epochs=1", "seeds=[0,1]", "budget=0.05", "evaluation.sharpness=[]", f"name={name}"]
        cfg = str(ROOT / "configs" / "digits_sam_vs_sgd.toml")
        assert main(["run", cfg, *args, *extra, f"out_dir={out}", "--no-progress"]) == 0
    src, bad = out / "digits_noise" / "sgd" / "seed1", out / "digits_noise" / "sgd" / "seed2"
    bad.mkdir()
    (bad / "config.toml").write_text((src / "config.toml").read_text().replace("seeds = [1]", "seeds = [2]"))
    (bad / "metrics.json").write_text(
        json.dumps({"method": "sgd", "seed": 2, "variant": "", "status": "diverged"})
    )
    (bad / "results.json").write_text(json.dumps({"status": "diverged", "divergence": DIV}))
    return out


def _page(root: Path) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "5_Experiments.py"), default_timeout=120)
    at.run()
    at.text_input(key="exp_root").set_value(str(root)).run()
    return at


def test_two_experiments_one_row_per_method_and_noise(two_experiments):
    at = _page(two_experiments)
    _no_errors(at)
    groups = [f"{m} [data.label_noise={n}]" for m in METHODS for n in ("0.0", "0.4")]
    df = at.dataframe[0].value
    assert list(df["method"]) == groups
    assert list(df["seeds"]) == [2, 2, 2, 2, 2, 2]
    assert list(df["diverged"]) == ["0 of 2"] * 5 + ["1 of 3"]
    entries = aggregate(collect_runs([two_experiments]))
    for i, e in enumerate(entries):
        accs = [json.loads((Path(d) / "metrics.json").read_text())["accuracy"] for d in e["dirs"][:2]]
        assert df["accuracy mean"].iloc[i] == pytest.approx(float(np.mean(accs)), rel=1e-12)
        assert df["accuracy std"].iloc[i] == pytest.approx(float(np.std(accs, ddof=1)), rel=1e-12)
        want = "digits_noise" if "0.4" in e["group"] else "digits_clean"
        assert all(Path(d).parts[-3] == want for d in e["dirs"])
    assert any("differ in: data.label_noise" in i.value for i in at.info)
    failed = at.dataframe[1].value
    assert list(failed["group"]) == ["sgd [data.label_noise=0.4]"] and list(failed["step"]) == [3]
    assert list(failed["reason"]) == [DIV["reason"]] and list(failed["run"]) == ["digits_noise/sgd/seed2"]
    # curves: one colour per table row (the clean rows keep the method colours), one line per run
    loss = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"] == "train_loss"
    )
    colours = {tr["meta"]["method"]: tr["line"]["color"] for tr in loss["data"]}
    assert set(colours) == set(groups) and len(set(colours.values())) == 6
    assert colours["sgd [data.label_noise=0.0]"] == ev.color_of("sgd")
    assert colours["bsam [data.label_noise=0.0]"] == ev.color_of("bsam")
    assert len(loss["data"]) == 12  # the diverged run has no log.jsonl
    # the diagram's default: the first completed run of every row
    rel = at.multiselect(key="exp_reliability").value
    assert rel == [f"digits_{x}/{m}/seed0" for m in METHODS for x in ("clean", "noise")]


def test_another_directory_resets_the_selections(two_experiments, tmp_path):
    clean = tmp_path / "clean"
    shutil.copytree(two_experiments / "digits_clean", clean / "digits_clean")
    at = _page(two_experiments)
    runs = at.multiselect(key="exp_runs")
    assert len(runs.options) == 13 and runs.value == runs.options
    at.multiselect(key="exp_runs").set_value(["digits_noise/sgd/seed0", "digits_noise/sgd/seed1"]).run()
    at.multiselect(key="exp_reliability").set_value(["digits_noise/sgd/seed1"]).run()
    _no_errors(at)
    assert list(at.dataframe[0].value["method"]) == ["sgd"]  # one setting chosen: no label needed
    at.text_input(key="exp_root").set_value(str(clean)).run()
    _no_errors(at)
    runs = at.multiselect(key="exp_runs")
    assert runs.value == runs.options == [f"digits_clean/{m}/seed{s}" for m in METHODS for s in (0, 1)]
    assert at.multiselect(key="exp_reliability").value == [f"digits_clean/{m}/seed0" for m in METHODS]
    assert list(at.dataframe[0].value["method"]) == list(METHODS)
    at.text_input(key="exp_root").set_value(str(two_experiments)).run()
    _no_errors(at)
    assert len(at.multiselect(key="exp_runs").value) == 13
