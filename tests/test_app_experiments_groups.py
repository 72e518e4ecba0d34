"""Dashboard page 5 (Experiments) with two experiments in one runs/ folder (issues 24 and 29): a
clean and a 40 %-label-noise digits experiment, each with its own table of one row per method (as
``python -m experiments table <out_dir>/<name>`` prints it, no 'same seed twice' error box) and its
own CSV, a line naming the setting in which they differ, curves coloured per (experiment, method)
with one line style per experiment, a diverged run listed and left out of the means; another
directory gets new run and diagram selections."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

from experiments.table import aggregate, collect_runs, table_notes
from experiments.toml_writer import dumps

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import experiments_groups as eg  # noqa: E402
from dashboard import experiments_view as ev  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

METHODS = ("bsam", "sam", "sgd")
EXPS = ("digits_clean", "digits_noise")
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
    cfg_text = tomllib.loads((src / "config.toml").read_text())
    assert cfg_text["seeds"] == [1]
    (bad / "config.toml").write_text(dumps({**cfg_text, "seeds": [2]}))
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


def _cli_table(capsys, run_dir: Path, fmt: str = "markdown") -> str:
    """What ``python -m experiments table RUN_DIR --format FMT`` prints."""
    from experiments.cli import main

    capsys.readouterr()
    assert main(["table", str(run_dir), "--format", fmt]) == 0
    return capsys.readouterr().out


def _markdown_rows(text: str) -> list[dict[str, str]]:
    """The rows of a Markdown table printed by ``python -m experiments table``, by column name."""
    lines = [ln for ln in text.splitlines() if ln.startswith("|") and not ln.startswith("|---")]
    head, *rows = ([c.strip() for c in ln.strip("|").split(" | ")] for ln in lines)
    return [dict(zip(head, r)) for r in rows]


def _record_downloads(monkeypatch) -> dict[str, bytes]:
    """file id -> bytes of every file the page hands to a download button (AppTest's media store)."""
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage

    files: dict[str, bytes] = {}
    load = MemoryMediaFileStorage.load_and_get_id

    def recording(self, data, mimetype, kind, filename=None):
        file_id = load(self, data, mimetype, kind, filename)
        files[file_id] = data
        return file_id

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", recording)
    return files


def test_two_experiments_one_table_per_experiment(two_experiments, capsys, monkeypatch):
    files = _record_downloads(monkeypatch)
    at = _page(two_experiments)
    _no_errors(at)
    assert [h.value for h in at.subheader][:2] == [f"Experiment {x}" for x in EXPS]
    # one table per experiment, its cells those of `python -m experiments table <out_dir>/<name>`
    for i, exp in enumerate(EXPS):
        df = at.dataframe[i].value
        cli = _markdown_rows(_cli_table(capsys, two_experiments / exp))
        assert len(df) == len(cli) == 3
        for col in df.columns:
            assert [str(v) for v in df[col]] == [r[col] for r in cli], (exp, col)
        assert list(df["method"]) == list(METHODS) and list(df["seeds"]) == [2, 2, 2]
        # the means and sample stds of the completed seeds' metrics.json (the diverged seed 2 left out)
        for j, m in enumerate(METHODS):
            accs = [
                json.loads((two_experiments / exp / m / f"seed{s}" / "metrics.json").read_text())["accuracy"]
                for s in (0, 1)
            ]
            assert df["accuracy"].iloc[j] == f"{np.mean(accs):.4g} ± {np.std(accs, ddof=1):.2g}"
        # its own CSV, with every metric: `python -m experiments table --format csv`
        button = next(
            b for b in at.get("download_button") if b.proto.label == f"download the table of {exp} (CSV)"
        )
        csv_text = files[Path(button.proto.url).stem].decode()
        assert csv_text == _cli_table(capsys, two_experiments / exp, fmt="csv")
    clean, noisy = at.dataframe[0].value, at.dataframe[1].value
    assert "diverged" not in clean.columns
    assert list(noisy["diverged"]) == ["0 of 2", "0 of 2", "1 of 3"]
    # the line naming the setting in which the experiments differ: data.label_noise of their configs
    for exp in EXPS:
        cfg = tomllib.loads((two_experiments / exp / "sgd" / "seed0" / "config.toml").read_text())
        line = f"Differs from the other experiments shown in: `data.label_noise={cfg['data']['label_noise']}`"
        assert line in [m.value for m in at.markdown]
    assert not any("same seed" in x.value or "twice" in x.value for x in [*at.warning, *at.info])
    failed = at.dataframe[2].value
    assert list(failed["group"]) == ["sgd"] and list(failed["step"]) == [3]
    assert list(failed["reason"]) == [DIV["reason"]] and list(failed["run"]) == ["digits_noise/sgd/seed2"]
    # curves: one colour per (experiment, method) (the first experiment keeps the method colours),
    # one line style per experiment, one line per completed run
    loss = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["layout"]["yaxis"]["title"]["text"] == "train_loss"
    )
    assert len(loss["data"]) == 12  # the diverged run has no log.jsonl
    styles = {tr["meta"]["method"]: (tr["line"]["color"], tr["line"]["dash"]) for tr in loss["data"]}
    assert set(styles) == {f"{x} · {m}" for x in EXPS for m in METHODS}
    assert len({c for c, _ in styles.values()}) == 6
    assert {m: styles[f"digits_clean · {m}"][0] for m in METHODS} == {m: ev.color_of(m) for m in METHODS}
    assert {d for label, (_, d) in styles.items() if label.startswith("digits_clean")} == {"solid"}
    assert {d for label, (_, d) in styles.items() if label.startswith("digits_noise")} == {"dash"}
    for tr in loss["data"]:
        exp, method = tr["meta"]["method"].split(" · ")
        assert Path(tr["meta"]["run"]).parts[:2] == (exp, method)
    # the diagram's default: the first completed run of every row, experiment by experiment
    runs = at.multiselect(key=eg.state_key("exp_runs", str(two_experiments), list(EXPS))).value
    rel = at.multiselect(key=eg.state_key("exp_reliability", str(two_experiments), runs)).value
    assert rel == [f"{x}/{m}/seed0" for x in EXPS for m in METHODS]


def test_another_directory_resets_the_selections(two_experiments, tmp_path):
    clean = tmp_path / "clean"
    shutil.copytree(two_experiments / "digits_clean", clean / "digits_clean")
    root = str(two_experiments)
    at = _page(two_experiments)
    runs_key = eg.state_key("exp_runs", root, list(EXPS))
    runs = at.multiselect(key=runs_key)
    assert len(runs.options) == 13 and runs.value == runs.options
    noisy_sgd = ["digits_noise/sgd/seed0", "digits_noise/sgd/seed1"]
    at.multiselect(key=runs_key).set_value(noisy_sgd).run()
    rel_key = eg.state_key("exp_reliability", root, noisy_sgd)
    at.multiselect(key=rel_key).set_value(["digits_noise/sgd/seed1"]).run()
    _no_errors(at)
    assert [h.value for h in at.subheader][0] == "Experiment digits_noise"
    assert "Experiment digits_clean" not in [h.value for h in at.subheader]  # no run of it chosen
    assert list(at.dataframe[0].value["method"]) == ["sgd"]
    assert list(at.dataframe[-1].value["run"]) == ["digits_noise/sgd/seed1"]  # the reliability rows
    at.text_input(key="exp_root").set_value(str(clean)).run()
    _no_errors(at)
    keys = {m.key for m in at.multiselect}
    assert not keys & {runs_key, rel_key, eg.state_key("exp_experiments", root)}  # none of the old
    assert not any("digits_noise" in x for m in at.multiselect for x in [*m.options, *m.value])
    runs = at.multiselect(key=eg.state_key("exp_runs", str(clean), ["digits_clean"]))
    assert runs.value == runs.options == [f"digits_clean/{m}/seed{s}" for m in METHODS for s in (0, 1)]
    rel = at.multiselect(key=eg.state_key("exp_reliability", str(clean), runs.value))
    assert rel.value == [f"digits_clean/{m}/seed0" for m in METHODS]
    assert list(at.dataframe[0].value["method"]) == list(METHODS)
    at.text_input(key="exp_root").set_value(root).run()
    _no_errors(at)
    runs = at.multiselect(key=runs_key)
    assert len(runs.value) == 13 and runs.value == runs.options  # back: all runs again, not the two


def test_cells_are_the_table_cells_nan_is_not_missing(tmp_path):
    """A NaN metric of one seed is shown as the table shows it (experiments.table.format_cell), not
    as "–", and the caption's "no such metric" is only said of metrics no run has."""
    acc = {0: 0.91, 1: 0.87}
    for seed, nll in ((0, 0.31), (1, float("nan"))):
        d = tmp_path / "sgd" / f"seed{seed}"
        d.mkdir(parents=True)
        row = {"method": "sgd", "seed": seed, "variant": "", "accuracy": acc[seed], "nll": nll}
        (d / "metrics.json").write_text(json.dumps(row))
    entries = aggregate(collect_runs([tmp_path]), ["accuracy", "nll", "bma_nll"])
    [row] = eg.display_rows(entries)
    assert row["nll"] == "nan (non-finite in seed 1)" and row["bma_nll"] == "–"
    assert row["accuracy"] == f"{np.mean([0.91, 0.87]):.4g} ± {np.std([0.91, 0.87], ddof=1):.2g}"
    assert "no such metric" not in eg.table_caption(entries, 2, ["accuracy", "nll"])
    assert "no such metric" in eg.table_caption(entries, 2, ["bma_nll"])
    assert any("sgd seed 1 has a non-finite nll = nan" in n for n in table_notes(entries, ("nonfinite",)))
