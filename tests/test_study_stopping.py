"""The study's common stopping criterion (train until the full training-set cross-entropy reaches a
target, Jiang et al. 2020), its populations and worker processes, and the pooled interval over
populations: a stopped member equals the runner CLI trained for as many epochs bit for bit; it
stops at the first epoch whose recorded loss is at or below the target; a killed member resumes to
the same weights; a member that never gets there is listed and excluded; another target is refused;
``--jobs 2`` gives the same rows as one process; the pooled resamples reproduce
``bootstrap_tau``'s interval."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import experiments.train as train_mod
from experiments.cli import main as runner_main
from experiments.study import member_runs, resolve_study_config, run_population, write_report
from experiments.study.combine import combine, resampled_taus
from experiments.study.config import plan_population
from experiments.study.correlation import bootstrap_tau
from experiments.study.figure import log_ticks
from experiments.study.population import population_ids
from experiments.study.report import report_markdown
from experiments.study.stopping import StopMismatch

TARGET = 1.2  # reached after 7 epochs of 2 steps by the tiny MLPs below


def _cfg(**over):
    raw = {
        "sampling": "grid",
        "sharpness_subset": 32,
        "stop": {"train_loss": TARGET, "max_epochs": 12},
        "space": {
            "model": ["mlp"],
            "optimizer": ["sgd", "sam"],
            "lr": [0.2],
            "batch_size": [64],
            "weight_decay": [0.0],
            "width": [16],
            "n_train": [96],
        },
        "measures": [{"measure": "gradient_norm"}, {"measure": "average_case", "options": {"samples": 2}}],
    }
    raw.update(over)
    return resolve_study_config(raw)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    out = tmp_path_factory.mktemp("stopped")
    cfg = _cfg()
    return cfg, out, run_population(cfg, out, progress=False)


def _weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def test_members_stop_at_the_first_epoch_at_or_below_the_target(stopped):
    cfg, out, rows = stopped
    for (_, run), row in zip(member_runs(cfg, out), rows):
        res = json.loads((run.run_dir / "results.json").read_text())
        losses = [h["full_train_loss"] for h in res["history"]]
        k = next(i + 1 for i, v in enumerate(losses) if v <= TARGET)
        assert k == len(losses) == row["epochs"] == res["effective"]["epochs"] and 1 < k < 12
        stop = res["details"]["stop"]
        assert stop["reached"] and stop["epochs"] == k and stop["train_loss_target"] == TARGET
        # the recorded loss and error are the study's own train_loss / train_error of the weights
        assert row["status"] == "completed"
        assert (row["train_loss"], row["train_error"]) == (stop["full_train_loss"], stop["full_train_error"])
        assert res["effective"]["steps"] == 2 * k


def test_stopped_member_equals_the_runner_cli_trained_that_many_epochs(stopped, tmp_path):
    cfg, out, rows = stopped
    _, run = member_runs(cfg, out)[1]  # SAM
    epochs = rows[1]["epochs"]
    args = ["run", str(run.run_dir / "config.toml"), f"train.epochs={epochs}", f"out_dir={tmp_path}"]
    assert runner_main([*args, "--no-progress"]) == 0
    (direct,) = list(tmp_path.glob("*/sam/seed0"))
    a, b = _weights(run.run_dir), _weights(direct)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


class _Crash(Exception):
    pass


def test_killed_member_resumes_to_the_same_weights_and_epoch(stopped, tmp_path, monkeypatch):
    cfg, ref_out, ref_rows = stopped
    out = tmp_path / "killed"
    calls = []

    def crash(step):
        calls.append(step)
        if len(calls) == 5:  # the fifth step: after the first member's epoch-2 checkpoint
            raise _Crash

    monkeypatch.setattr(train_mod, "STEP_HOOK", crash)
    with pytest.raises(_Crash):
        run_population(cfg, out, progress=False)
    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    rows = run_population(cfg, out, progress=False)
    for (_, a), (_, b) in zip(member_runs(cfg, out), member_runs(cfg, ref_out)):
        wa, wb = _weights(a.run_dir), _weights(b.run_dir)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    drop = ("seconds", "cpu_seconds")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in ref_rows
    ]


def test_a_member_short_of_the_target_is_listed_and_excluded(tmp_path):
    # lr 1e-4: the loss hardly moves in 3 epochs; the others reach 2.0 in 2 or 3
    cfg = _cfg(
        stop={"train_loss": 2.0, "max_epochs": 3},
        space={
            "optimizer": ["sgd"],
            "lr": [1e-4, 0.2, 0.4],
            "width": [16],
            "n_train": [96],
            "batch_size": [64],
        },
    )
    rows = run_population(cfg, tmp_path, progress=False)
    slow = [r for r in rows if r["status"] == "not_converged"]
    assert len(slow) == 1 and slow[0]["lr"] == 1e-4 and slow[0]["epochs"] == 3 and slow[0]["train_loss"] > 2.0
    doc = write_report(tmp_path, samples=20)
    assert doc["not_converged"] == [slow[0]["id"]] and doc["n_models"] == 2 and doc["n_members"] == 3
    assert all(e["n"] == 2 for e in doc["correlation"])
    assert doc["excluded"][0]["train_loss"] == slow[0]["train_loss"]
    assert f"| {slow[0]['id']} | 0 | not_converged | 3 | {slow[0]['train_loss']:.3f} |" in doc["markdown"]
    assert "1 excluded from the correlations (1 did not reach the target, 0 diverged)" in doc["headline"]
    # the page renders again from the JSON alone (docs/figures/study_digits.md is compared so)
    written = json.loads((tmp_path / "correlation.json").read_text())
    assert report_markdown(written) == (tmp_path / "correlation.md").read_text() == doc["markdown"]
    # another target for the same run directories is refused, naming the fix
    other = _cfg(
        stop={"train_loss": 1.0, "max_epochs": 3},
        space={
            "optimizer": ["sgd"],
            "lr": [1e-4, 0.2, 0.4],
            "width": [16],
            "n_train": [96],
            "batch_size": [64],
        },
    )
    with pytest.raises(StopMismatch, match="delete the run directory"):
        run_population(other, tmp_path, progress=False)


def test_two_worker_processes_give_the_rows_of_one(stopped, tmp_path):
    cfg, _, ref_rows = stopped
    rows = run_population(cfg, tmp_path, progress=False, jobs=2)
    drop = ("seconds", "cpu_seconds")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in ref_rows
    ]
    timing = json.loads((tmp_path / "timing.json").read_text())["invocations"]
    assert timing[-1]["jobs"] == 2 and timing[-1]["members"] == 2


def test_stop_config_errors():
    with pytest.raises(ValueError, match="epochs and stop are both set"):
        _cfg(epochs=3)
    with pytest.raises(ValueError, match="give exactly train_loss and max_epochs"):
        _cfg(stop={"train_loss": 0.1})
    with pytest.raises(ValueError, match="stop.train_loss must be a positive number"):
        _cfg(stop={"train_loss": 0, "max_epochs": 3})
    with pytest.raises(ValueError, match="populations must be a positive integer"):
        _cfg(populations=0)
    assert _cfg()["epochs"] == 12  # the runner's train.epochs under a stopping rule


def test_populations_are_reseeded_samples_and_shared_members_train_once():
    cfg = _cfg(
        sampling="star",
        bases=2,
        populations=3,
        space={"optimizer": ["sgd", "sam", "bsam"], "lr": [0.01, 0.05, 0.1], "seed": [0, 1, 2]},
    )
    pops = population_ids(cfg)
    assert len(pops) == 3 and len({tuple(p) for p in pops}) == 3
    assert pops[1] == [m for m in population_ids({**cfg, "sampling_seed": 1, "populations": 1})[0]]
    distinct = {m for p in pops for m in p}
    assert len(member_runs(cfg, "/tmp/unused")) == len(distinct) < sum(map(len, pops))
    with pytest.raises(ValueError, match="population 3 does not exist"):
        plan_population(cfg, 3)


def test_pooled_resamples_reproduce_bootstrap_tau_and_widen_with_disagreement():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    taus = resampled_taus(x, y, samples=300, seed=4)
    ref = bootstrap_tau(x, y, samples=300, seed=4)
    assert np.quantile(taus, [0.025, 0.975]).tolist() == pytest.approx([ref["low"], ref["high"]], abs=1e-12)
    # two populations with opposite relations: each interval excludes 0, the pooled one does not
    pops = [[{"m": a, "g": b} for a, b in zip(x, s * y)] for s in (1.0, -1.0)]
    entries = [
        [
            {
                "measure": "m",
                "target": "g",
                "n": 40,
                **bootstrap_tau(x, s * y, samples=300),
                "Psi": 0.0,
                "psi": {},
                "groups": {},
            }
        ]
        for s in (1.0, -1.0)
    ]
    (e,) = combine(pops, entries, samples=300)
    assert e["excludes_zero"] == 2 and e["low"] < 0 < e["high"] and abs(e["tau"]) < 1e-12


def test_log_ticks_label_narrow_and_wide_ranges():
    assert log_ticks(2.6, 11) == ([3.0, 5.0, 10.0], ["3", "5", "10"])
    assert log_ticks(1e-4, 30)[1] == ["1e-4", "0.001", "0.01", "0.1", "1", "10"]
    ticks, labels = log_ticks(0.45, 1.1)
    assert len(ticks) >= 3 and labels[0] == "0.5" and labels[-1] == "1"


def test_report_command_writes_the_committed_file_set(stopped, tmp_path, capsys):
    from experiments.study.__main__ import main

    _, out, _ = stopped
    paths = {k: tmp_path / f"s.{k}" for k in ("png", "json", "csv", "md")}
    args = ["report", str(out), "--figure", str(paths["png"]), "--json", str(paths["json"])]
    args += ["--csv", str(paths["csv"]), "--markdown", str(paths["md"]), "--bootstrap", "50"]
    assert main(args) == 0
    doc = json.loads(paths["json"].read_text())
    assert capsys.readouterr().out.startswith(doc["headline"])
    assert paths["csv"].read_text() == (out / "population.csv").read_text()
    assert paths["md"].read_text() == (out / "correlation.md").read_text()
    assert paths["png"].stat().st_size > 1000 and doc["timing"]["jobs"] == 1


def test_a_partial_study_too_small_to_correlate_names_the_population(tmp_path):
    # two of three members cannot reach the target in 3 epochs: one correlatable member is left
    cfg = _cfg(
        stop={"train_loss": 2.0, "max_epochs": 3},
        space={
            "optimizer": ["sgd"],
            "lr": [1e-4, 2e-4, 0.4],
            "width": [16],
            "n_train": [96],
            "batch_size": [64],
        },
    )
    rows = run_population(cfg, tmp_path, progress=False)
    assert sorted(r["status"] for r in rows).count("not_converged") == 2
    seed = cfg["sampling_seed"]
    with pytest.raises(
        ValueError, match=rf"population 0 \(sampling seed {seed}\): 1 of 3 members trained"
    ) as err:
        write_report(tmp_path, samples=20)
    assert "study run` command again" in str(err.value)
