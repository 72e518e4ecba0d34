"""Divergence is a recorded outcome (experiments/divergence.py): a run whose training loss grows past
``train.divergence_factor`` x its first loss, or whose loss, weights or predictions become NaN / inf,
is stopped and written as ``status = "diverged"`` (results.json: step, epoch, loss, reference,
reason; metrics.json: no metrics); the sweep goes on, ``run`` prints the table of the finished runs,
names the diverged ones on stderr and exits with 3; a re-run trains nothing; a diverged study member
is excluded from the correlations and counted.

The blow-ups, measured on the digits (seed 0, batch 64, plain SGD at lr 1e6): a tanh MLP's loss goes
2.32 -> 1.5e5 at step 2 and stays near 2e5, finite in float64 (tanh saturates); a ReLU MLP's goes
2.3 -> 1.3e10 -> 4.5e21 -> 2.0e33 -> NaN at step 5 in float32.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import experiments.ensembles as ensembles_mod
import experiments.evaluate as evaluate_mod
import experiments.train as train_mod
from experiments.cli import main
from experiments.config import ConfigError, resolve_config
from experiments.divergence import GROWTH, DivergenceMonitor, agree
from experiments.parallel import DistContext
from experiments.runner import RunResult, plan_runs, run_one
from experiments.table import collect_runs
from landscape.results import load_result

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _cfg(tmp_path, *, lr=0.2, act="tanh", precision="float64", every=1, **train):
    raw = {
        "name": "div",
        "seeds": [0],
        "device": "cpu",
        "threads": 1,
        "progress": False,
        "precision": precision,
        "out_dir": str(tmp_path / "runs"),
        "data": {"name": "digits"},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 12, 10], "activation": act}},
        "train": {"epochs": 2, "batch_size": 64, "lr": lr, "schedule": "constant", **train},
        "methods": [{"name": "sgd", "optimizer": "sgd"}],
        "evaluation": {"sharpness": [], "every": every, "metrics": ["accuracy", "nll"]},
    }
    return resolve_config(raw)


def _run(cfg):
    (run,) = plan_runs(cfg)
    return run, run_one(run, device=CPU, ctx=DistContext())


def _results(run):
    return json.loads((run.run_dir / "results.json").read_text()), json.loads(
        (run.run_dir / "metrics.json").read_text()
    )


def _ckpt_epoch(run):
    return torch.load(run.run_dir / "checkpoint.pt", weights_only=True)["counters"]["epoch"]


def test_finite_blow_up_is_recorded_as_growth_and_factor_zero_completes_it(tmp_path):
    run, out = _run(_cfg(tmp_path / "a", lr=1e6))
    res, row = _results(run)
    div = res["divergence"]
    assert out == {"status": "diverged", "divergence": div} and res["status"] == "diverged"
    assert div["reason"] == GROWTH == "loss grew by more than divergence_factor"
    # the first full window of 10 steps: mean about 2.7e5 > 10 x the first loss (2.32)
    assert div["step"] == 10 and div["epoch"] == 1 and div["window"] == 10 and div["factor"] == 10
    assert div["reference"] == pytest.approx(2.32, abs=0.01) and div["loss"] > 1e4 * div["reference"]
    assert res["metrics"] == {} and row == {"method": "sgd", "seed": 0, "variant": "", "status": "diverged"}
    assert res["history"] == [] and not (run.run_dir / "checkpoint.pt").exists()  # no good epoch yet
    # divergence_factor = 0: the same finite blow-up trains to the end and is tabulated
    run0, out0 = _run(_cfg(tmp_path / "b", lr=1e6, divergence_factor=0))
    res0, row0 = _results(run0)
    assert res0["status"] == "completed" and res0["divergence"] == {} and "status" not in out0
    assert math.isfinite(row0["accuracy"]) and len(res0["history"]) == 2 and _ckpt_epoch(run0) == 2


def test_non_finite_loss_is_recorded(tmp_path):
    run, _ = _run(_cfg(tmp_path, lr=1e6, act="relu", precision="float32"))
    res, _ = _results(run)
    div = res["divergence"]
    assert res["status"] == "diverged" and div["reason"] == "non-finite loss"
    assert div["step"] == 5 and div["epoch"] == 1 and math.isnan(div["loss"])  # 2.3, 1e10, 1e21, 2e33, NaN
    assert div["reference"] == pytest.approx(2.3, abs=0.05)


def test_non_finite_weights_stop_before_the_epochs_checkpoint(tmp_path, monkeypatch):
    original = train_mod.Trainer._train_epoch

    def corrupt(self, epoch):
        row = original(self, epoch)
        if epoch == 1:
            with torch.no_grad():
                self.model[1].bias[3] = math.inf
        return row

    monkeypatch.setattr(train_mod.Trainer, "_train_epoch", corrupt)
    run, _ = _run(_cfg(tmp_path))
    res, _ = _results(run)
    div = res["divergence"]
    assert div["reason"] == "non-finite weights" and div["epoch"] == 2 and div["step"] == 46
    assert div["detail"] == "1.bias" and math.isfinite(div["loss"]) and div["loss"] < div["reference"]
    assert len(res["history"]) == 1 and _ckpt_epoch(run) == 1  # the last good epoch's checkpoint


def test_non_finite_predictions_per_epoch_and_in_the_final_evaluation(tmp_path, monkeypatch):
    real = ensembles_mod.predict_probs
    calls = []

    def nan_second_time(model, x, *a, **k):
        calls.append(1)
        p = real(model, x, *a, **k)
        return p if len(calls) == 1 else p * math.nan

    monkeypatch.setattr(train_mod, "predict_probs", nan_second_time)  # the per-epoch test metrics
    run, _ = _run(_cfg(tmp_path / "a"))
    res, _ = _results(run)
    div = res["divergence"]
    assert div["reason"] == "non-finite predictions" and div["epoch"] == 2 and div["step"] == 46
    assert "per-epoch" in div["detail"] and len(res["history"]) == 1 and _ckpt_epoch(run) == 1
    monkeypatch.setattr(train_mod, "predict_probs", real)
    # the final evaluation (no per-epoch metrics): the point prediction is NaN
    monkeypatch.setattr(evaluate_mod, "predict_probs", lambda *a, **k: real(*a, **k) * math.nan)
    run, _ = _run(_cfg(tmp_path / "b", every=0))
    res, row = _results(run)
    div = res["divergence"]
    assert div["reason"] == "non-finite predictions" and "point prediction" in div["detail"]
    assert div["epoch"] == 2 and div["step"] == 46 and math.isfinite(div["loss"]) and div["reference"] > 2
    assert len(res["history"]) == 2 and _ckpt_epoch(run) == 2 and row["status"] == "diverged"


SWEEP = """
name = "sweep"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
[model]
name = "mlp"
kwargs = { sizes = [64, 12, 10], activation = "tanh" }
[train]
epochs = 2
batch_size = 64
lr = 0.2
schedule = "constant"
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "blowup"
optimizer = "sgd"
hyperparameters = { lr = 1e6 }
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05 }
[evaluation]
metrics = ["accuracy", "nll"]
sharpness = []
"""


def test_sweep_goes_on_prints_the_finished_runs_names_the_diverged_one_and_exits_3(
    tmp_path, capsys, monkeypatch
):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP)
    argv = ["run", str(path), f"out_dir={tmp_path / 'runs'}"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 3
    table = [line for line in out.splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table[1:]] == ["sgd", "sam"]
    root = tmp_path / "runs" / "sweep"
    diverged = [line for line in err.splitlines() if line.startswith("diverged:")]
    assert diverged == [
        f"diverged: {root / 'blowup' / 'seed0'}: loss grew by more than divergence_factor at step 10 "
        + diverged[0].split("at step 10 ", 1)[1]
    ]
    assert "(epoch 1): loss " in diverged[0] and "initial loss 2.3" in diverged[0]
    assert err.strip().splitlines()[-1].startswith("error: 1 of 3 runs diverged")
    for name in ("sgd", "sam"):
        row = json.loads((root / name / "seed0" / "metrics.json").read_text())
        assert set(row) == {"method", "seed", "variant", "accuracy", "nll"} and row["accuracy"] > 0.8
    before = {p: p.stat().st_mtime_ns for p in root.rglob("results.json")}
    # the same command again: every result is reused (nothing trains), the exit status stays 3
    monkeypatch.setattr(train_mod.Trainer, "fit", lambda self: pytest.fail("a run was trained again"))
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 3 and "blowup" in err and "| sgd " in out and "| sam " in out
    assert {p: p.stat().st_mtime_ns for p in root.rglob("results.json")} == before
    # the results load: landscape.results (a diverged and an older completed file) and the table collector
    res = load_result(root / "blowup" / "seed0" / "results.json")
    assert isinstance(res, RunResult) and res.status == "diverged" and res.divergence["step"] == 10
    old = json.loads((root / "sgd" / "seed0" / "results.json").read_text())
    del old["status"], old["divergence"]  # written before the fields existed
    (tmp_path / "old.json").write_text(json.dumps(old))
    older = load_result(tmp_path / "old.json")
    assert older.status == "completed" and older.divergence == {} and older.metrics["accuracy"] > 0.8
    rows = {r["method"]: r for r in collect_runs([root])}
    assert set(rows) == {"sgd", "blowup", "sam"} and rows["blowup"]["status"] == "diverged"


@pytest.mark.distributed
def test_data_parallel_ranks_stop_together_with_global_and_local_perturbations(tmp_path):
    """Two gloo ranks: the all-reduced loss (global) trips on both at once; with per-rank losses
    (local) the ranks agree at the end of the epoch. Nobody waits forever; rank 0 records and
    exits with 3 (torchrun then fails with 1)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "dp.toml"
    path.write_text(SWEEP)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "experiments", "run", str(path), f"out_dir={tmp_path / 'runs'}",
           "distributed.mode=data_parallel",
           "methods=[{name = 'blowup', optimizer = 'sam', hyperparameters = {rho = 0.05, lr = 1e6}}, "
           "{name = 'sam', optimizer = 'sam', hyperparameters = {rho = 0.05}}]",
           'sweep={"distributed.perturbation" = ["global", "local"]}']  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 1 and "error: 2 of 4 runs diverged" in proc.stderr, proc.stderr[-3000:]
    for mode in ("global", "local"):
        run = tmp_path / "runs" / "sweep" / f"perturbation={mode}"
        res = json.loads((run / "blowup" / "seed0" / "results.json").read_text())
        assert res["status"] == "diverged" and res["divergence"]["reason"] == GROWTH
        assert res["divergence"]["step"] == 10 and res["environment"]["world_size"] == 2
        assert json.loads((run / "sam" / "seed0" / "metrics.json").read_text())["accuracy"] > 0.5


def test_monitor_checks_batches_of_steps_and_resumes_from_its_state():
    losses = [2.0, 1.5, 1.0, 30.0, 40.0, 60.0, 80.0]
    per_step = DivergenceMonitor(10.0, window=3)
    found = [per_step.update([v], step=i + 1, epoch=1) for i, v in enumerate(losses)]
    first = next(f for f in found if f is not None)
    # the same losses handed over every 4 steps (or per epoch), and after a save / load in between
    batched = DivergenceMonitor(10.0, window=3)
    assert batched.update(losses[:4], step=4, epoch=1) is None
    resumed = DivergenceMonitor(10.0, window=3)
    resumed.load_state_dict(batched.state_dict())
    rec = resumed.update(losses[4:], step=7, epoch=1)
    assert rec == first and rec.step == 5 and rec.loss == pytest.approx(71 / 3) and rec.reference == 2.0
    assert DivergenceMonitor(0.0, window=3).update(losses, step=7, epoch=1) is None  # 0 = off
    nan = DivergenceMonitor(0.0, window=3).update([2.0, math.inf], step=8, epoch=2)
    assert nan.reason == "non-finite loss" and nan.step == 8 and nan.epoch == 2
    assert agree(DistContext(), rec, CPU) is rec  # one process: nothing to agree on
    with pytest.raises(ConfigError, match="divergence_factor must be >= 0"):
        resolve_config({"train": {"divergence_factor": -1.0}, "methods": [{"optimizer": "sgd"}]})


def test_diverged_study_member_is_excluded_from_the_correlations_and_counted(tmp_path):
    from experiments.study import resolve_study_config, run_population, write_report

    cfg = resolve_study_config(
        {
            "sampling": "grid",
            "epochs": 2,
            "sharpness_subset": 32,
            "space": {
                "model": ["mlp"],
                "optimizer": ["sgd"],
                "lr": [0.02, 0.05, 1e6],
                "batch_size": [64],
                "weight_decay": [0.0],
                "width": [8],
                "n_train": [96],
            },
            "measures": [{"measure": "gradient_norm"}],
        }
    )
    rows = run_population(cfg, tmp_path, progress=False)
    bad = [r for r in rows if r.get("status") == "diverged"]
    assert len(rows) == 3 and len(bad) == 1 and bad[0]["lr"] == 1e6 and "gradient_norm" not in bad[0]
    assert bad[0]["divergence"] in ("non-finite loss", GROWTH)
    doc = write_report(tmp_path, samples=20)
    assert doc["diverged"] == [bad[0]["id"]] and doc["n_models"] == 2
    assert all(e["n"] == 2 for e in doc["correlation"])
    assert f"1 member diverged, excluded: {bad[0]['id']}" in doc["markdown"]
    assert len(json.loads((tmp_path / "population.json").read_text())) == 3
    # a second run reuses the diverged member's record (its run's result) instead of failing
    assert run_population(cfg, tmp_path, progress=False) == rows
