"""experiments.table groups runs by their settings (issue 24): runs of one method are averaged only
when their resolved config.toml agrees in every result-relevant key but the seed; otherwise one row
per setting, labelled by the differing dotted keys. Diverged runs are counted, not averaged. The run
directories are written here by hand (config.toml from resolve_config, metrics.json rows), and every
number is checked against numpy on the values written."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.config import resolve_config
from experiments.run_identity import run_settings
from experiments.table import aggregate, collect_runs, format_table, group_runs, plot_table
from experiments.toml_writer import dumps


def _config(name: str = "exp", method: str = "sgd", seed: int = 0, **over) -> dict:
    raw = {
        "name": name,
        "seeds": [seed],
        "methods": [{"name": method, "optimizer": method}],
        "model": {"kwargs": {"sizes": [64, over.pop("width", 16), 10]}},
        "train": {"lr": over.pop("lr", 0.05), "epochs": 2},
        "data": {"label_noise": over.pop("noise", 0.0)},
        "out_dir": over.pop("out_dir", "runs"),
    }
    assert not over
    return resolve_config(raw)


def _run(
    root: Path,
    metrics: dict | None,
    *,
    name: str = "exp",
    method: str = "sgd",
    seed: int = 0,
    config: bool = True,
    divergence: dict | None = None,
    **over,
) -> Path:
    """One run directory ``root/name/method/seed<k>`` (what the runner writes, by hand)."""
    d = root / name / method / f"seed{seed}"
    d.mkdir(parents=True)
    if config:
        (d / "config.toml").write_text(dumps(_config(name, method, seed, **over)))
    row = {"method": method, "seed": seed, "variant": ""}
    if divergence is None:
        row |= metrics or {}
        (d / "results.json").write_text(json.dumps({"status": "completed", "metrics": metrics}))
    else:
        row["status"] = "diverged"
        (d / "results.json").write_text(json.dumps({"status": "diverged", "divergence": divergence}))
    (d / "metrics.json").write_text(json.dumps(row))
    return d


ACC = {0: 0.91, 1: 0.87, 2: 0.82, 3: 0.79}
NLL = {0: 0.31, 1: 0.42, 2: 0.55, 3: 0.6}
DIV = {"step": 140, "epoch": 2, "loss": float("inf"), "reference_loss": 2.3, "reason": "loss is inf"}


def _m(seed: int, shift: float = 0.0) -> dict:
    return {"accuracy": ACC[seed] - shift, "nll": NLL[seed] + shift}


def test_same_settings_different_seeds_are_pooled(tmp_path):
    for s in (0, 1, 2):
        _run(tmp_path, _m(s), seed=s)
    [e] = aggregate(collect_runs([tmp_path]))
    assert e["group"] == "sgd" and e["n"] == 3 and e["seeds"] == [0, 1, 2]
    assert e["runs"] == 3 and e["diverged"] == 0 and e["differing"] == [] and e["duplicates"] == []
    acc = np.array([0.91, 0.87, 0.82])
    assert e["mean"]["accuracy"] == pytest.approx(np.mean(acc), rel=1e-15)
    assert e["std"]["accuracy"] == pytest.approx(np.std(acc, ddof=1), rel=1e-12)
    assert e["mean"]["nll"] == pytest.approx((0.31 + 0.42 + 0.55) / 3, rel=1e-15)
    md = format_table([e])
    assert "| sgd | 3 | 0.8667 ± 0.045 | 0.4267 ± 0.12 |" in md and "note:" not in md


def test_experiment_name_and_out_dir_are_not_settings(tmp_path):
    """Seeds 0-1 of experiment a and seed 2 of experiment b (same settings, other name and
    out_dir) are one row of three seeds; an older config.toml without keys added since (min_lr,
    written out by resolve_config) still matches."""
    _run(tmp_path, _m(0), name="a", seed=0)
    _run(tmp_path, _m(1), name="a", seed=1)
    d = _run(tmp_path, _m(2), name="b", seed=2, out_dir="elsewhere")
    text = (d / "config.toml").read_text()
    (d / "config.toml").write_text("\n".join(li for li in text.splitlines() if not li.startswith("min_lr")))
    [e] = aggregate(collect_runs([tmp_path]))
    assert (e["group"], e["n"], e["seeds"]) == ("sgd", 3, [0, 1, 2])
    assert e["mean"]["accuracy"] == pytest.approx((0.91 + 0.87 + 0.82) / 3, rel=1e-15)


def test_different_lr_gives_two_rows_labelled_by_train_lr(tmp_path):
    _run(tmp_path, _m(0), name="a", seed=0, lr=0.05)
    _run(tmp_path, _m(1), name="a", seed=1, lr=0.05)
    _run(tmp_path, _m(0, 0.3), name="b", seed=0, lr=0.5)
    _run(tmp_path, _m(1, 0.3), name="b", seed=1, lr=0.5)
    entries = aggregate(collect_runs([tmp_path]))
    assert [e["group"] for e in entries] == ["sgd [train.lr=0.05]", "sgd [train.lr=0.5]"]
    assert [e["settings"] for e in entries] == [{"train.lr": 0.05}, {"train.lr": 0.5}]
    assert [e["n"] for e in entries] == [2, 2] and all(e["differing"] == ["train.lr"] for e in entries)
    assert entries[0]["mean"]["accuracy"] == pytest.approx((0.91 + 0.87) / 2, rel=1e-15)
    assert entries[1]["mean"]["accuracy"] == pytest.approx((0.61 + 0.57) / 2, rel=1e-15)
    assert entries[1]["std"]["accuracy"] == pytest.approx(0.04 / math.sqrt(2), rel=1e-9)
    md = format_table(entries)
    assert "| sgd [train.lr=0.05] | 2 | 0.89 ± 0.028 |" in md
    assert "| sgd [train.lr=0.5] | 2 | 0.59 ± 0.028 |" in md
    notes = [li for li in md.splitlines() if li.startswith("note:")]
    assert len(notes) == 1 and "differ in: train.lr" in notes[0]


def test_lr_and_width_differ_label_is_one_key_note_names_both(tmp_path):
    """The measured case of the issue (lr 0.05 vs 0.5 and width 16 vs 64): no longer one row."""
    _run(tmp_path, _m(0), name="a", seed=0, lr=0.05, width=16)
    _run(tmp_path, _m(1), name="b", seed=1, lr=0.5, width=64)
    entries = aggregate(collect_runs([tmp_path]))
    assert [e["group"] for e in entries] == [
        "sgd [model.kwargs.sizes=[64, 16, 10]]",
        "sgd [model.kwargs.sizes=[64, 64, 10]]",
    ]
    assert entries[0]["differing"] == ["model.kwargs.sizes", "train.lr"]
    assert [e["n"] for e in entries] == [1, 1]
    assert [e["mean"]["accuracy"] for e in entries] == [0.91, 0.87]
    assert "differ in: model.kwargs.sizes, train.lr" in format_table(entries)


def test_clean_and_label_noise_experiments_in_one_folder(tmp_path):
    """Two experiments (clean, 40 % label noise), two methods, three seeds each, in one runs/: four
    rows split by data.label_noise; no 'same seed twice' error."""
    for name, noise, shift in (("digits_clean", 0.0, 0.0), ("digits_noise", 0.4, 0.2)):
        for method in ("sgd", "bsam"):
            for s in (0, 1, 2):
                _run(tmp_path, _m(s, shift), name=name, method=method, seed=s, noise=noise)
    entries = aggregate(collect_runs([tmp_path]))
    assert [e["group"] for e in entries] == [
        "bsam [data.label_noise=0.0]",
        "bsam [data.label_noise=0.4]",
        "sgd [data.label_noise=0.0]",
        "sgd [data.label_noise=0.4]",
    ]
    assert all(e["n"] == 3 and e["seeds"] == [0, 1, 2] and not e["duplicates"] for e in entries)
    for e, shift in zip(entries, (0.0, 0.2, 0.0, 0.2)):
        acc = np.array([ACC[s] - shift for s in (0, 1, 2)])
        assert e["mean"]["accuracy"] == pytest.approx(np.mean(acc), rel=1e-15)
        assert e["std"]["accuracy"] == pytest.approx(np.std(acc, ddof=1), rel=1e-12)
        assert Path(e["dirs"][0]).parts[-3] == ("digits_noise" if shift else "digits_clean")


def test_diverged_run_is_counted_not_averaged(tmp_path):
    _run(tmp_path, _m(0), seed=0)
    bad = _run(tmp_path, None, seed=1, divergence=DIV)
    _run(tmp_path, _m(2), seed=2)
    rows = collect_runs([tmp_path])
    [e] = aggregate(rows)
    assert "status" not in e["mean"]  # the status is no metric
    assert (e["n"], e["seeds"], e["runs"], e["diverged"]) == (2, [0, 2], 3, 1)
    assert e["mean"]["accuracy"] == pytest.approx((0.91 + 0.82) / 2, rel=1e-15)
    assert e["std"]["accuracy"] == pytest.approx(0.09 / math.sqrt(2), rel=1e-9)
    assert e["diverged_runs"] == [
        {"dir": str(bad), "seed": 1, "status": "diverged", **DIV},
    ]
    md = format_table([e])
    assert "| method | seeds | diverged | accuracy | nll |" in md
    assert "| sgd | 2 | 1 of 3 | 0.865 ± 0.064 |" in md
    assert "sgd seed 1 diverged at step 140 (epoch 2): loss is inf" in md
    table = list(csv.reader(io.StringIO(format_table([e], "csv"))))
    assert table[0][:4] == ["group", "n", "diverged", "runs"] and table[1][:4] == ["sgd", "2", "1", "3"]
    [j] = json.loads(format_table([e], "json"))
    assert j["diverged"] == 1 and j["runs"] == 3 and j["diverged_runs"][0]["step"] == 140
    png = plot_table([e], tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_divergence_record_of_the_runner(tmp_path):
    """experiments.divergence.DivergenceRecord.to_dict names the initial loss ``reference`` and may
    add a ``detail``: read as ``reference_loss``, the detail shown after the reason."""
    rec = {"reason": "non-finite loss", "step": 7, "epoch": 1, "loss": None, "reference": 2.25}
    rec |= {"factor": 10.0, "window": 20, "detail": "loss nan"}
    d = _run(tmp_path, None, seed=0, divergence=rec)
    [e] = aggregate(collect_runs([tmp_path]))
    assert e["diverged_runs"] == [
        {"dir": str(d), "seed": 0, "status": "diverged", "step": 7, "epoch": 1, "loss": None}
        | {"reference_loss": 2.25, "reason": "non-finite loss", "detail": "loss nan"}
    ]
    assert "sgd seed 0 diverged at step 7 (epoch 1): non-finite loss (loss nan); not averaged" in (
        format_table([e])
    )


def test_all_diverged_group_has_the_count_only(tmp_path):
    _run(tmp_path, _m(0), method="sam", seed=0)
    _run(tmp_path, None, seed=0, divergence=DIV)
    _run(tmp_path, None, seed=1, divergence=DIV)
    entries = aggregate(collect_runs([tmp_path]))
    assert [e["group"] for e in entries] == ["sam", "sgd"]
    sgd = entries[1]
    assert (sgd["n"], sgd["seeds"], sgd["runs"], sgd["diverged"]) == (0, [], 2, 2)
    assert math.isnan(sgd["mean"]["accuracy"]) and math.isnan(sgd["std"]["nll"])
    md = format_table(entries)
    assert "| sgd | 0 | 2 of 2 | – | – |" in md and "| sam | 1 | 0 of 1 | 0.91 | 0.31 |" in md
    plot_table(entries, tmp_path / "t.png")


def test_strict_refuses_and_names_the_keys(tmp_path):
    _run(tmp_path, _m(0), name="clean", seed=0)
    _run(tmp_path, _m(0), name="noisy", seed=0, noise=0.4, lr=0.5)
    rows = collect_runs([tmp_path])
    with pytest.raises(ValueError, match=r"'sgd' differ in data\.label_noise, train\.lr; --strict"):
        aggregate(rows, strict=True)
    assert len(aggregate(rows)) == 2


def test_runs_without_config_grouped_by_metrics_with_a_note(tmp_path):
    _run(tmp_path, _m(0), name="old", seed=0, config=False)
    _run(tmp_path, _m(1), name="old", seed=1, config=False, lr=0.5)
    [e] = aggregate(collect_runs([tmp_path]))
    assert (e["group"], e["n"], e["config"]) == ("sgd", 2, False)
    assert e["mean"]["accuracy"] == pytest.approx((0.91 + 0.87) / 2, rel=1e-15)
    assert "note: 2 run(s) without config.toml (sgd): grouped by method and variant" in format_table([e])
    # next to runs with a config.toml: their own row
    _run(tmp_path, _m(2), name="new", seed=2)
    entries = aggregate(collect_runs([tmp_path]))
    assert [(e["group"], e["n"]) for e in entries] == [("sgd", 1), ("sgd [no config.toml]", 2)]
    with pytest.raises(ValueError, match="partly without config.toml"):
        aggregate(collect_runs([tmp_path]), strict=True)


def test_same_seed_twice_reported_with_directories_table_kept(tmp_path):
    first = _run(tmp_path, _m(0), name="a", seed=0)
    again = _run(tmp_path, _m(0, 0.5), name="b", seed=0)
    _run(tmp_path, _m(1), name="b", seed=1)
    [e] = aggregate(collect_runs([tmp_path]))
    assert e["n"] == 2 and e["seeds"] == [0, 1]
    assert e["mean"]["accuracy"] == pytest.approx((0.91 + 0.87) / 2, rel=1e-15)  # the first seed 0
    assert e["duplicates"] == [{"seed": 0, "dirs": [str(first), str(again)]}]
    assert f"sgd: seed 0 appears 2 times with the same settings ({first}, {again})" in format_table([e])
    with pytest.raises(ValueError, match="holds seed 0 twice"):
        aggregate(collect_runs([tmp_path]), strict=True)


def test_runner_rows_read_the_config_of_their_directory(tmp_path):
    """The runner's own rows (``_dir``, no ``_config``: experiments.cli ``_run``) are grouped too."""
    a = _run(tmp_path, _m(0), name="a", seed=0)
    b = _run(tmp_path, _m(1), name="b", seed=1, lr=0.5)
    rows = [{**json.loads((d / "metrics.json").read_text()), "_dir": str(d)} for d in (a, b)]
    assert [g["group"] for g in group_runs(rows)] == ["sgd [train.lr=0.05]", "sgd [train.lr=0.5]"]


def test_run_settings_leave_out_what_does_not_change_results():
    s = run_settings(_config("x", "sam", 3, lr=0.2))
    assert s["train.lr"] == 0.2 and s["methods.sam.optimizer"] == "sam"
    for key in ("name", "seeds", "out_dir", "device", "threads", "progress", "paper", "train.min_lr"):
        assert key not in s


# ---------------------------------------------------------------- non-finite vs missing metrics
def _rows(tmp_path, per_seed: dict[int, dict]) -> tuple[list[dict], dict[int, Path]]:
    dirs = {s: _run(tmp_path, m, seed=s) for s, m in per_seed.items()}
    return collect_runs([tmp_path]), dirs


def test_a_nan_seed_is_shown_as_nan_and_named_not_as_missing(tmp_path):
    rows, dirs = _rows(
        tmp_path,
        {0: _m(0), 1: {"accuracy": ACC[1], "nll": math.nan}, 2: _m(2)},
    )
    [e] = aggregate(rows, ["accuracy", "nll", "bma_nll"])  # bma_nll: no run has it, "not computed"
    # accuracy untouched: numpy on the values written
    acc = np.array([ACC[s] for s in (0, 1, 2)])
    assert e["mean"]["accuracy"] == pytest.approx(np.mean(acc), rel=1e-15)
    # the NaN is kept: the mean is NaN, the run is named, and None marks "not computed"
    assert math.isnan(e["mean"]["nll"]) and math.isnan(e["values"]["nll"][1])
    assert e["values"]["nll"][0] == NLL[0] and e["values"]["bma_nll"] == [None, None, None]
    [bad] = e["nonfinite"]["nll"]
    assert (bad["seed"], bad["dir"], math.isnan(bad["value"])) == (1, str(dirs[1]), True)
    assert "bma_nll" not in e["nonfinite"] and e["missing"] == {}  # missing everywhere: no note
    md = format_table([e])
    assert "| sgd | 3 | 0.8667 ± 0.045 | nan (non-finite in seed 1) | – |" in md
    notes = [li for li in md.splitlines() if li.startswith("note:")]
    assert notes == [
        f"note: sgd seed 1 has a non-finite nll = nan ({dirs[1]}); the row's mean of this metric is "
        "non-finite: the run is kept, not left out"
    ]
    table = list(csv.reader(io.StringIO(format_table([e], "csv"))))
    head, row = table
    cell = dict(zip(head, row))
    assert cell["accuracy_mean"] == repr(float(np.mean(acc)))
    assert cell["nll_mean"] == "nan" and cell["nll_std"] == "nan"
    assert cell["bma_nll_mean"] == "" and cell["bma_nll_std"] == ""  # not computed: empty
    assert cell["nonfinite"] == f"nll=nan seed 1 ({dirs[1]})" and "missing" not in head
    [j] = json.loads(format_table([e], "json"))  # Python's json reads NaN
    assert math.isnan(j["values"]["nll"][1]) and j["values"]["bma_nll"] == [None, None, None]
    assert j["nonfinite"]["nll"][0]["seed"] == 1 and j["nonfinite"]["nll"][0]["dir"] == str(dirs[1])
    png = plot_table([e], tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_infinite_values_and_their_mean(tmp_path):
    rows, dirs = _rows(
        tmp_path,
        {0: {"a": 1.0, "b": 1.0}, 1: {"a": math.inf, "b": math.inf}, 2: {"a": 2.0, "b": -math.inf}},
    )
    [e] = aggregate(rows)
    assert e["mean"]["a"] == math.inf and math.isnan(e["mean"]["b"])  # inf - inf: NaN
    md = format_table([e])
    assert "| sgd | 3 | inf (non-finite in seed 1) | nan (non-finite in seeds 1, 2) |" in md
    assert f"note: sgd seed 1 has a non-finite a = inf, b = inf ({dirs[1]}); the row's mean of these" in md
    assert f"note: sgd seed 2 has a non-finite b = -inf ({dirs[2]})" in md
    cell = dict(zip(*csv.reader(io.StringIO(format_table([e], "csv")))))
    assert (cell["a_mean"], cell["b_mean"]) == ("inf", "nan")
    want = f"a=inf seed 1 ({dirs[1]}); b=inf seed 1 ({dirs[1]}); b=-inf seed 2 ({dirs[2]})"
    assert cell["nonfinite"] == want


def test_legacy_nan_string_is_non_finite_and_one_seed_std_is_not(tmp_path):
    rows, dirs = _rows(tmp_path, {0: {"a": "nan", "b": 0.5}})
    [e] = aggregate(rows)
    assert e["nonfinite"]["a"][0]["dir"] == str(dirs[0]) and math.isnan(e["mean"]["a"])
    cell = dict(zip(*csv.reader(io.StringIO(format_table([e], "csv")))))
    # one seed: the std is undefined (empty), not a non-finite metric
    assert (cell["a_mean"], cell["a_std"], cell["b_mean"], cell["b_std"]) == ("nan", "", "0.5", "")
    assert "| sgd | 1 | nan (non-finite in seed 0) | 0.5 |" in format_table([e])


def test_a_metric_missing_in_some_seeds_is_named_and_not_averaged(tmp_path):
    rows, dirs = _rows(tmp_path, {0: {"a": 1.0, "ece": 0.1}, 1: {"a": 2.0}, 2: {"a": 3.0, "ece": 0.3}})
    [e] = aggregate(rows)
    assert e["mean"]["a"] == pytest.approx(2.0, rel=1e-15) and math.isnan(e["mean"]["ece"])
    assert e["values"]["ece"] == [0.1, None, 0.3] and e["nonfinite"] == {}
    assert e["missing"] == {"ece": [{"seed": 1, "dir": str(dirs[1])}]}
    md = format_table([e])
    assert "| sgd | 3 | 2 ± 1 | – (missing in seed 1) |" in md
    assert f"note: sgd: ece is missing in seed(s) 1 ({dirs[1]}) while the row's other runs have it" in md
    cell = dict(zip(*csv.reader(io.StringIO(format_table([e], "csv")))))
    assert cell["ece_mean"] == "" and cell["missing"] == f"ece seed 1 ({dirs[1]})"
