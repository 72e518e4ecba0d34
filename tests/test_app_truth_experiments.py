"""Issue 29, experiments (page 5): after the README's two digits runs (the clean config and the
same with ``name=digits_label_noise_40 data.label_noise=0.4``) in one runs/ directory, runs are
grouped by experiment before method: one table per experiment with three rows of seeds 0, 1, 2 (no
duplicate seed), curves coloured per (experiment, method); another directory gets new widgets (no
chip of the previous directory stays)."""

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

from dashboard import experiments_groups as eg  # noqa: E402
from dashboard import experiments_view as ev  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from experiments.table import collect_runs, table_notes  # noqa: E402

METHODS = ["bsam", "sam", "sgd"]
CLEAN, NOISY = "digits_sam_vs_sgd", "digits_label_noise_40"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The README's two experiments in one directory, shortened: 1 epoch on 5 % of the data."""
    from experiments.cli import main

    out = tmp_path_factory.mktemp("runs")
    cfg = str(ROOT / "configs" / "digits_sam_vs_sgd.toml")
    short = ["train.epochs=1", "budget=0.05", "evaluation.sharpness=[]", f"out_dir={out}", "--no-progress"]
    assert main(["run", cfg, *short]) == 0
    assert main(["run", cfg, f"name={NOISY}", "data.label_noise=0.4", *short]) == 0
    return out


def _page(root: Path) -> AppTest:
    at = AppTest.from_file(str(APP / "pages" / "5_Experiments.py"), default_timeout=300)
    at.run()
    at.text_input(key="exp_root").set_value(str(root)).run()
    return at


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def test_two_configs_give_two_experiments_without_duplicate_seeds(runs):
    experiments = eg.split_experiments(collect_runs([runs]), runs)
    assert list(experiments) == [NOISY, CLEAN]
    tables = eg.tables_by_experiment(experiments)
    for exp, entries in tables.items():
        assert sorted(e["group"] for e in entries) == METHODS  # plain method names: nothing to tell apart
        for e in entries:
            assert sorted(e["seeds"]) == [0, 1, 2] and e["duplicates"] == [] and e["n"] == 3
            assert all(Path(d).parts[-3] == exp for d in e["dirs"])
        assert not table_notes(entries, ("duplicates",))
    titles = eg.experiment_titles(experiments)
    assert titles == {NOISY: "data.label_noise=0.4", CLEAN: "data.label_noise=0.0"}
    # the cells are mean ± std of metrics.json over the three seeds
    for entries in tables.values():
        rows = eg.display_rows(entries, ["accuracy"])
        for row, e in zip(rows, entries):
            accs = [json.loads((Path(d) / "metrics.json").read_text())["accuracy"] for d in e["dirs"]]
            assert row["accuracy"] == f"{np.mean(accs):.4g} ± {np.std(accs, ddof=1):.2g}"
            assert row["seeds"] == 3


def test_curve_colours_per_experiment_and_method(runs):
    tables = eg.tables_by_experiment(eg.split_experiments(collect_runs([runs]), runs))
    styles = eg.curve_styles(tables, multi=True)
    assert set(styles) == {f"{x} · {m}" for x in (CLEAN, NOISY) for m in METHODS}
    assert len({c for c, _ in styles.values()}) == 6  # one colour per (experiment, method)
    assert {d for label, (_, d) in styles.items() if label.startswith(NOISY)} == {"solid"}
    assert {d for label, (_, d) in styles.items() if label.startswith(CLEAN)} == {"dash"}
    assert styles[f"{NOISY} · sgd"][0] == ev.color_of("sgd")  # the first experiment keeps the palette
    groups = eg.curve_groups(tables, multi=True)
    assert groups[str(runs / CLEAN / "sam" / "seed2")] == f"{CLEAN} · sam"
    single = eg.curve_styles({CLEAN: tables[CLEAN]}, multi=False)
    assert single == {m: (ev.color_of(m), "solid") for m in METHODS}


def test_state_keys_belong_to_the_directory(tmp_path):
    a, b = eg.state_key("exp_runs", tmp_path / "a"), eg.state_key("exp_runs", tmp_path / "b")
    assert a != b and a.startswith("exp_runs@") and a == eg.state_key("exp_runs", tmp_path / "a")


def test_page_one_table_per_experiment(runs):
    at = _page(runs)
    _no_errors(at)
    assert not at.warning
    heads = [h.value for h in at.subheader]
    assert heads[:2] == [f"Experiment {NOISY}", f"Experiment {CLEAN}"]
    assert any("`data.label_noise=0.4`" in m.value for m in at.markdown)
    tables = [d.value for d in at.dataframe[:2]]
    for df in tables:
        assert list(df["method"]) == METHODS and list(df["seeds"]) == [3, 3, 3]
    assert not any("same seed" in x.value or "twice" in x.value for x in [*at.error, *at.warning, *at.info])
    # the curves: 18 runs, one legend entry per (experiment, method)
    loss = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"] == "train_loss"
    )
    assert len(loss["data"]) == 18
    legend = {tr["name"] for tr in loss["data"] if tr.get("showlegend", True)}
    assert legend == {f"{x} · {m}" for x in (CLEAN, NOISY) for m in METHODS}
    for tr in loss["data"]:
        assert tr["name"].split(" · ")[0] == Path(tr["meta"]["run"]).parts[0]
    captions = " ".join(c.value for c in at.caption)
    assert "9 runs in 3 rows, 3 completed seed(s) per row" in captions


def test_page_another_directory_resets_the_widgets(runs, tmp_path):
    clean = tmp_path / "clean"
    shutil.copytree(runs / CLEAN, clean / CLEAN)
    at = _page(runs)
    exp_key = eg.state_key("exp_experiments", runs)
    assert at.multiselect(key=exp_key).value == [NOISY, CLEAN]
    at.multiselect(key=exp_key).set_value([NOISY]).run()
    _no_errors(at)
    assert [h.value for h in at.subheader][0] == f"Experiment {NOISY}"
    at.text_input(key="exp_root").set_value(str(clean)).run()
    _no_errors(at)
    labels = [m.label for m in at.multiselect]
    keys = [m.key for m in at.multiselect]
    assert exp_key not in keys  # the old directory's widgets are gone
    new = at.multiselect(key=eg.state_key("exp_experiments", clean))
    assert new.value == new.options == [CLEAN]
    runs_widget = next(m for m in at.multiselect if m.label == "runs")
    assert runs_widget.value == [f"{CLEAN}/{m}/seed{s}" for m in METHODS for s in (0, 1, 2)]
    rel = next(m for m in at.multiselect if m.label == "runs in the diagram")
    assert rel.value == [f"{CLEAN}/{m}/seed0" for m in METHODS]
    assert "runs in the diagram" in labels
    assert [h.value for h in at.subheader][0] == f"Experiment {CLEAN}"
    assert list(at.dataframe[0].value["method"]) == METHODS
