"""``python -m experiments run CONFIG --estimate``: one row per (variant, method), hours recomputed
from the measured step times, runs = seeds, nothing written under ``out_dir``, a method that fails
to build or diverges is an error row while the others are estimated (:mod:`experiments.estimate`)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
import torch

import experiments.cli as cli_mod
import experiments.estimate as estimate_mod
from experiments.cli import main

CONFIG = """
name = "tiny"
seeds = [0, 1, 2]
device = "cpu"
threads = 1
progress = false
[data]
name = "digits"
[model]
name = "mlp"
kwargs = { sizes = [64, 12, 10], activation = "tanh" }
[train]
epochs = 7
batch_size = 256
lr = 0.1
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05 }
[[methods]]
name = "broken"
optimizer = "sgd"
hyperparameters = { lr = -1.0 }
[[methods]]
name = "exploding"
optimizer = "sgd"
hyperparameters = { lr = 1e30 }
[evaluation]
sharpness = ["lambda_max"]
[sweep]
"train.batch_size" = [128, 256]
"""


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def _table_rows(out: str) -> list[list[str]]:
    lines = [ln for ln in out.splitlines() if ln.startswith("| ") and not ln.startswith("| variant")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_estimate_prints_one_row_per_variant_and_method_and_writes_nothing(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    out_dir = tmp_path / "runs"
    returned = []

    def spy(*args, **kwargs):
        returned.extend(real(*args, **kwargs))
        return returned

    real = estimate_mod.estimate_runs
    monkeypatch.setattr(cli_mod, "estimate_runs", spy)  # the name the command line calls
    assert main(["run", str(cfg), "--estimate", "--estimate-steps", "8", f"out_dir={out_dir}"]) == 0
    out = capsys.readouterr().out
    assert not out_dir.exists()  # no run directory, checkpoint or result

    rows = _table_rows(out)
    assert [(r[0], r[1]) for r in rows] == [
        (f"batch_size={b}", m) for b in (128, 256) for m in ("sgd", "sam", "broken", "exploding")
    ]
    assert [(e.variant, e.method) for e in returned] == [(r[0], r[1]) for r in rows]
    for row, est in zip(rows, returned):
        assert row[7] == "3" and est.runs == 3  # one run per seed
        if est.method == "broken":  # fails to build: its one-line error, the others go on
            assert est.error.startswith("ConfigError:") and "Invalid learning rate" in est.error
            assert row[2].startswith("error: ConfigError:") and "\n" not in est.error
            continue
        if est.method == "exploding":  # diverges in the timed steps
            assert est.error.startswith("Diverged:"), est.error
            assert row[2].startswith("error: Diverged:")
            continue
        assert est.error is None
        assert len(est.step_ms_all) == 8 and est.step_ms == statistics.median(est.step_ms_all)
        n_train = 1438  # load_digits("train")
        batch = int(est.variant.split("=")[1])
        assert est.steps_per_epoch == math.ceil(n_train / batch) and est.epochs == 7 and est.members == 1
        hours = est.epochs * est.steps_per_epoch * est.step_ms / 3.6e6
        assert est.train_h == pytest.approx(hours, rel=1e-12)
        assert est.total_h == pytest.approx(3 * (hours + est.eval_s / 3600), rel=1e-12)
        assert float(row[4]) == pytest.approx(est.step_ms, rel=1e-2)
        assert float(row[5]) == pytest.approx(hours, rel=1e-2)
        assert float(row[8]) == pytest.approx(est.total_h, rel=1e-2)
        assert float(row[9]) == pytest.approx(hours + est.eval_s / 3600, rel=1e-2)  # one run: one task
    good = [e for e in returned if e.error is None]
    total = sum(e.total_h for e in good)
    total_line = next(ln for ln in out.splitlines() if ln.startswith("total:"))
    assert float(total_line.split()[1]) == pytest.approx(total, rel=1e-2)
    assert "for 12 runs" in total_line and "4 (variant, method) not estimated" in total_line
    for m in ("sgd", "sam"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"total {m}:"))
        assert float(line.split()[2]) == pytest.approx(
            sum(e.total_h for e in good if e.method == m), rel=1e-2
        )
    assert "not included: sharpness lambda_max" in out
    longest = max(good, key=lambda e: e.run_h)
    task_line = next(ln for ln in out.splitlines() if ln.startswith("per task"))
    assert float(task_line.split()[8]) == pytest.approx(longest.run_h, rel=1e-2)
    assert f"slurm.time = {math.ceil(longest.run_h * 72)} " in task_line


def test_step_times_span_epochs_and_median(tmp_path):
    """More timed steps than an epoch has: the hook carries on into the next epochs."""
    from experiments.config import load_config
    from experiments.runner import plan_runs

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    runs = plan_runs(load_config(cfg, [f"out_dir={tmp_path / 'runs'}", "sweep={}", "seeds=[0]"]))
    runs = [r for r in runs if r.method == "sgd"]
    (est,) = estimate_mod.estimate_runs(runs, device=torch.device("cpu"), steps=13)
    assert est.error is None and est.steps_per_epoch == 6 and len(est.step_ms_all) == 13
    assert est.step_ms == sorted(est.step_ms_all)[6] and est.eval_s > 0
    assert not (tmp_path / "runs").exists()


def test_estimate_with_dry_run_or_bad_steps_is_a_usage_error(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(CONFIG)
    for extra in (["--dry-run"], ["--estimate-steps", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(["run", str(cfg), "--estimate", *extra, f"out_dir={tmp_path / 'runs'}"])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1
    assert not Path(tmp_path / "runs").exists()
