"""Runs and a study through a real one-node Slurm cluster (:mod:`tests.slurm_cluster`): a 6-run
digits config and a 20-member study complete with the results of a local run, a task signalled
mid-epoch (``scancel --signal=USR2``: the time-limit warning; ``scontrol requeue``: SIGTERM) is
requeued and resumes bit-identically, a killed task is reported failed with its log, and the same
command submits only what is left.

Skipped with the reason where a cluster cannot start (Slurm not installed, not root), unless
``SHARPSCAPE_REQUIRE_SLURM=1`` (``.ci/run``, which installs Slurm) makes that a failure; the
submission path itself is also tested on submitit's local executor (``test_cluster.py``)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch

from experiments.cli import main as runner_main
from experiments.cluster import read_job
from experiments.status import run_states
from experiments.study import run_population
from experiments.study.__main__ import main as study_main
from experiments.study.config import load_study_config
from tests import slurm_cluster

#: about six minutes in all: slow (.ci/run runs the slow tests, with Slurm installed and required);
#: the waits below are generous (a loaded machine), and pytest's own limit exceeds them; under
#: pytest-xdist (--dist loadgroup) the module stays on one worker, so that one cluster serves it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.xdist_group("slurm_cluster")]

CONFIG = "digits_sam_vs_sgd"
#: the long run a task is signalled in: batches of 8 make an epoch 180 steps (about 0.3 s here), so
#: the few milliseconds between two epochs (checks, checkpoint, log line) are a small target, and a
#: signal sent half an epoch after an epoch's log line lands mid-epoch (:func:`_signal_mid_epoch`)
EPOCHS = 30
BATCH = 8
SMALL = ["seeds=[0,1]", "train.epochs=3", "evaluation.sharpness=[]", "threads=1"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.unavailable()
    if why is None and importlib.util.find_spec("submitit") is None:
        why = "submitit is not installed (pip install submitit; it is in the test extra)"
    if why is not None:
        if os.environ.get("SHARPSCAPE_REQUIRE_SLURM") == "1":
            pytest.fail(f"SHARPSCAPE_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    try:
        c = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except RuntimeError as exc:
        if os.environ.get("SHARPSCAPE_REQUIRE_SLURM") == "1":
            raise
        pytest.skip(str(exc).splitlines()[0])
    yield c
    c.stop()


@pytest.fixture
def slurm_env(cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    return cluster


def _states(root: Path) -> dict[str, str]:
    return {Path(s.dir).relative_to(root.resolve()).as_posix(): s.state for s in run_states([root])}


def _all_finished(root: Path):
    states = _states(root)
    return states if states and all(v in ("done", "diverged", "failed") for v in states.values()) else None


def _metrics(root: Path) -> dict[str, dict]:
    return {
        p.parent.relative_to(root).as_posix(): json.loads(p.read_text())
        for p in sorted(root.rglob("metrics.json"))
    }


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert list(wa) == list(wb)
    for k in wa:
        assert torch.equal(wa[k], wb[k]), (a, k)


def _history(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_the_module_stays_on_one_worker(request):
    """Under ``--dist loadgroup`` (``.ci/run``) every test here carries its group in its id, so one
    worker runs them all on one cluster (pytest 9.2 broke that renaming: pyproject pins below it)."""
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@slurm_cluster"), request.node.nodeid


def test_the_daemons_listen_on_loopback_only(cluster):
    host = socket.gethostname().split(".")[0]
    if not slurm_cluster._resolves_to_loopback(host):
        pytest.skip(f"{host} resolves to {socket.gethostbyname(host)}: the daemons listen on all interfaces")
    assert cluster.listening() == {"slurmctld": "127.0.0.1", "slurmd": "127.0.0.1"}


def test_six_run_config_completes_with_the_results_of_a_local_run(slurm_env, tmp_path, capsys):
    out = tmp_path / "slurm"
    assert runner_main(["run", CONFIG, *SMALL, f"out_dir={out}", "--slurm", "slurm.time=10"]) == 0
    assert "submitted 6 of 6 runs as Slurm job array" in capsys.readouterr().out
    root = out / CONFIG
    jobs = {read_job(d.parent)["id"] for d in root.rglob("job.json")}
    assert len(jobs) == 6 and len({j.split("_")[0] for j in jobs}) == 1  # one array, six tasks
    states = slurm_cluster.wait_until(lambda: _all_finished(root), 600, "six tasks", slurm_env)
    assert set(states.values()) == {"done"}, states
    # a run's result (metrics.json) is written a moment before its task records how it ended
    run_dirs = sorted(root.glob("*/seed*"))
    slurm_cluster.wait_until(
        lambda: all(read_job(d)["state"] != "running" for d in run_dirs), 60, "the tasks' records", slurm_env
    )
    for run_dir in run_dirs:
        assert read_job(run_dir)["state"] == "finished"
        assert (root / "slurm" / Path(read_job(run_dir)["stderr"]).name).is_file()  # logs beside the runs
    # the same command again submits nothing (every run has its result)
    assert runner_main(["run", CONFIG, *SMALL, f"out_dir={out}", "--slurm"]) == 0
    assert "nothing to submit" in capsys.readouterr().out
    local = tmp_path / "local"
    assert runner_main(["run", CONFIG, *SMALL, f"out_dir={local}", "--no-progress"]) == 0
    remote, here = _metrics(root), _metrics(local / CONFIG)
    assert sorted(remote) == sorted(here) and len(here) == 6
    for key in here:
        assert remote[key] == here[key], key
        _same_weights(root / key, local / CONFIG / key)


def _long_run(out: Path) -> list[str]:
    return [
        "run", CONFIG, "seeds=[0]", 'methods=[{name="sam",optimizer="sam",hyperparameters={rho=0.05}}]',
        f"train.epochs={EPOCHS}", f"train.batch_size={BATCH}", "evaluation.sharpness=[]",
        "evaluation.every=0", "threads=1", f"out_dir={out}",
    ]  # fmt: skip


def _epochs_done(run_dir: Path) -> int:
    log = run_dir / "log.jsonl"
    return len(log.read_text().splitlines()) if log.is_file() else 0


def _signal_mid_epoch(cluster, job: str, run_dir: Path, after: int, *args: str) -> None:
    """Wait for epoch ``after``'s log line, then half as long as that epoch took, then send
    ``args`` (``scancel --signal=USR2``, ``scontrol requeue``) to ``job``: the task is then
    about half-way through the next epoch, far from its boundaries."""
    slurm_cluster.wait_until(
        lambda: _epochs_done(run_dir) >= after, 300, f"{after} epochs", cluster, every=0.02
    )
    time.sleep(json.loads((run_dir / "log.jsonl").read_text().splitlines()[-1])["seconds"] / 2)
    cluster.command(*args)


def _release(cluster, job: str) -> None:
    """A requeued job waits for a begin time Slurm sets about two minutes ahead; start it now."""
    slurm_env_wait = slurm_cluster.wait_until(
        lambda: "PENDING" in cluster.command("squeue", "--noheader", "-j", job, "--format=%T", check=False),
        180, f"job {job} to be requeued", cluster,
    )  # fmt: skip
    assert slurm_env_wait
    cluster.command("scontrol", "update", f"jobid={job}", "StartTime=now")


def test_a_task_signalled_mid_epoch_is_requeued_and_resumes_bit_identically(slurm_env, tmp_path):
    out = tmp_path / "slurm"
    assert runner_main([*_long_run(out), "--slurm", "slurm.time=10"]) == 0
    run_dir = out / CONFIG / "sam" / "seed0"
    job = read_job(run_dir)["id"]
    # the time-limit warning (SIGUSR2), by hand: the task checkpoints at the step and requeues itself
    _signal_mid_epoch(slurm_env, job, run_dir, 5, "scancel", "--signal=USR2", job)
    slurm_cluster.wait_until(lambda: read_job(run_dir)["state"] == "requeued", 180, "the requeue", slurm_env)
    assert read_job(run_dir)["signal"] == "SIGUSR2"
    blob = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert blob["counters"].get("batch", 0) > 0, "the checkpoint was written mid-epoch"
    slurm_cluster.wait_until(
        lambda: _states(out / CONFIG) == {"sam/seed0": "queued"}, 180, "queued", slurm_env
    )
    _release(slurm_env, job)
    # a requeue by the scheduler (SIGTERM, as a preemption): Slurm brings the task back itself
    slurm_cluster.wait_until(lambda: read_job(run_dir)["state"] == "running", 120, "the resume", slurm_env)
    _signal_mid_epoch(slurm_env, job, run_dir, 15, "scontrol", "requeue", job)
    slurm_cluster.wait_until(
        lambda: read_job(run_dir)["state"] == "stopped", 180, "the SIGTERM stop", slurm_env
    )
    blob = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert blob["counters"]["epoch"] >= 15 and blob["counters"].get("batch", 0) > 0, "mid-epoch again"
    _release(slurm_env, job)
    assert slurm_cluster.wait_until(lambda: _all_finished(out / CONFIG), 600, "the run", slurm_env) == {
        "sam/seed0": "done"
    }
    assert read_job(run_dir)["restarts"] == 2
    local = tmp_path / "local"
    assert runner_main([*_long_run(local), "--no-progress"]) == 0
    ref = local / CONFIG / "sam" / "seed0"
    _same_weights(run_dir, ref)
    assert _history(run_dir) == _history(ref)
    assert json.loads((run_dir / "metrics.json").read_text()) == json.loads(
        (ref / "metrics.json").read_text()
    )


def test_a_killed_task_is_reported_failed_with_its_log_and_resubmitted(slurm_env, tmp_path, capsys):
    out = tmp_path / "slurm"
    assert runner_main([*_long_run(out), "--slurm", "slurm.time=10"]) == 0
    root, run_dir = out / CONFIG, out / CONFIG / "sam" / "seed0"
    job = read_job(run_dir)["id"]
    slurm_cluster.wait_until(lambda: _epochs_done(run_dir) >= 3, 300, "3 epochs", slurm_env, every=0.1)
    slurm_env.command("scancel", "--signal=KILL", "--full", job)  # no warning: nothing is written
    (state,) = slurm_cluster.wait_until(
        lambda: [s for s in run_states([root]) if s.state == "failed"], 180, "the failure", slurm_env
    )
    assert state.log == read_job(run_dir)["stderr"] and Path(state.log).is_file()
    assert "ended without a result" in state.detail
    capsys.readouterr()
    assert runner_main(["status", str(root)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("failed") and f"(log: {state.log})" in text and "1 run: 1 failed" in text
    # the same command submits it again; it resumes from its last checkpoint (the lock the killed
    # task left is recognised by its Slurm job id)
    epochs_before = len(torch.load(run_dir / "checkpoint.pt", weights_only=True)["history"])
    assert epochs_before >= 3
    assert runner_main([*_long_run(out), "--slurm", "slurm.time=10"]) == 0
    assert read_job(run_dir)["id"] != job
    assert slurm_cluster.wait_until(lambda: _all_finished(root), 600, "the resubmitted run", slurm_env) == {
        "sam/seed0": "done"
    }
    assert read_job(run_dir)["restarts"] == 0 and len(_history(run_dir)) == EPOCHS


#: 2 optimizers x 5 learning rates x 2 seeds = 20 members, 2 epochs of 2 steps each
STUDY = """
name = "tiny"
sampling = "grid"
epochs = 2
sharpness_subset = 32
threads = 1
[space]
model = ["mlp"]
optimizer = ["sgd", "sam"]
lr = [0.01, 0.02, 0.03, 0.04, 0.05]
batch_size = [64]
weight_decay = [0.0]
width = [8]
n_train = [96]
seed = [0, 1]
[[measures]]
name = "lambda_max"
measure = "lambda_max"
options = { max_matvecs = 10 }
"""


def test_a_twenty_member_study_completes_with_the_results_of_a_local_run(slurm_env, tmp_path, capsys):
    path = tmp_path / "study.toml"
    path.write_text(STUDY)
    out = tmp_path / "slurm"
    assert study_main(["run", str(path), "--out", str(out), "--slurm", "slurm.time=10"]) == 0
    assert "submitted 20 of 20 members" in capsys.readouterr().out
    slurm_cluster.wait_until(lambda: _all_finished(out), 900, "20 members", slurm_env, every=1.0)
    assert set(_states(out).values()) == {"done"}
    local = tmp_path / "local"
    rows = run_population(load_study_config(path), local, progress=False)
    assert len(rows) == 20
    drop = ("seconds", "cpu_seconds")
    for row in rows:
        a = json.loads((out / "models" / f"{row['id']}.json").read_text())["row"]
        assert {k: v for k, v in a.items() if k not in drop} == {
            k: v for k, v in row.items() if k not in drop
        }
