"""Cluster runs without a cluster (:mod:`experiments.cluster`, :mod:`experiments.status`): ``--shard
I/N`` over three shells gives the table of one process; submission through submitit's local
executor gives the local results; a task's ``job.json`` records a failure, a requeue after SIGUSR2
(through a stand-in ``scontrol``) and the requeue limit; ``status`` tells each state from a run
directory and a queue; a Slurm task's predecessor's lock is stale; the ``[slurm]`` table is checked
and changes no run's identity. The real scheduler is ``test_cluster_slurm.py``'s."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments import cluster
from experiments.cli import main as runner_main
from experiments.cluster import Work, execute, parse_shard, read_job, shard, submit, write_job
from experiments.config import SLURM_DEFAULTS, ConfigError, load_config, resolve_config
from experiments.run_identity import fingerprint
from experiments.run_lock import RunLocked, acquire, lock_state
from experiments.runner import plan_runs, run_task
from experiments.status import format_status, run_states, write_plan
from landscape.cli_common import Terminated

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "digits_sam_vs_sgd"
SMALL = ["seeds=[0,1]", "train.epochs=2", "evaluation.sharpness=[]", "threads=1"]


# ------------------------------------------------------------------------------------------ shards
def test_shard_parses_i_of_n_and_refuses_anything_else():
    assert parse_shard("0/3") == (0, 3) and parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "-1/3", "1/0", "1", "a/b", "1/3/4", ""):
        with pytest.raises(ValueError, match="give I/N with 0 <= I < N"):
            parse_shard(bad)


@pytest.mark.parametrize("n_items, count", [(6, 3), (7, 3), (2, 5), (0, 2)])
def test_shards_are_disjoint_and_cover_every_item_once(n_items, count):
    items = list(range(n_items))
    parts = [shard(items, i, count) for i in range(count)]
    assert sorted(x for p in parts for x in p) == items
    assert parts[0] == items[0::count]  # runs I, I + N, I + 2N, ... in the grid's order


def test_three_shard_shells_give_the_table_of_one_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = [sys.executable, "-m", "experiments", "run", CONFIG, *SMALL, "--no-progress"]
    shells = [
        subprocess.Popen([*base, f"out_dir={tmp_path / 'sharded'}", "--shard", f"{i}/3"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(3)
    ]  # fmt: skip
    for p in shells:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    assert runner_main(["run", CONFIG, *SMALL, f"out_dir={tmp_path / 'one'}", "--no-progress"]) == 0
    tables = []
    for name in ("sharded", "one"):
        out = tmp_path / f"{name}.md"
        assert runner_main(["table", str(tmp_path / name / CONFIG), "--out", str(out)]) == 0
        tables.append(out.read_text())
    assert tables[0] == tables[1] and "| sam | 2 |" in tables[0]
    runs = sorted(p.relative_to(tmp_path / "sharded") for p in (tmp_path / "sharded").rglob("metrics.json"))
    assert len(runs) == 6
    for rel in runs:
        assert (tmp_path / "sharded" / rel).read_text() == (tmp_path / "one" / rel).read_text()


def test_shard_command_line_errors(tmp_path, capsys):
    for extra, message in (
        (["--shard", "3/3"], "error: --shard '3/3': give I/N with 0 <= I < N"),
        (["--shard", "0/2", "--slurm"], "error: --shard and --slurm cannot be combined"),
    ):
        with pytest.raises(SystemExit) as exc:
            runner_main(["run", CONFIG, *SMALL, f"out_dir={tmp_path}", *extra])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(message), err
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------------- local executor
def test_submission_through_submitits_local_executor_gives_the_local_results(tmp_path):
    if importlib.util.find_spec("submitit") is None:  # in the test extra; not a peer cross-check
        pytest.skip("submitit is not installed (pip install submitit)")
    cfg = load_config(ROOT / "configs" / f"{CONFIG}.toml", [*SMALL, "seeds=[0]", f"out_dir={tmp_path / 'q'}"])
    runs = [r for r in plan_runs(cfg) if r.method in ("sgd", "sam")]
    works = [Work(r.run_dir, run_task, (r,), r.method) for r in runs]
    ids = submit(works, cfg["slurm"], tmp_path / "q" / "logs", name="local", executor="local")
    assert len(ids) == 2
    for r in runs:
        job = read_job(r.run_dir)
        assert job["scheduler"] == "local" and job["id"] in ids and job["stderr"].startswith(str(tmp_path))
    end = time.monotonic() + 300
    while time.monotonic() < end and any(
        (read_job(r.run_dir) or {}).get("state") != "finished" for r in runs
    ):
        time.sleep(0.5)
    assert [read_job(r.run_dir)["state"] for r in runs] == ["finished", "finished"]
    local = load_config(
        ROOT / "configs" / f"{CONFIG}.toml", [*SMALL, "seeds=[0]", f"out_dir={tmp_path / 'l'}"]
    )
    for r, here in zip(runs, [r for r in plan_runs(local) if r.method in ("sgd", "sam")]):
        run_task(here)
        assert (r.run_dir / "metrics.json").read_text() == (here.run_dir / "metrics.json").read_text()
        a = torch.load(r.run_dir / "checkpoint.pt", weights_only=True)["model"]
        b = torch.load(here.run_dir / "checkpoint.pt", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_task_runs_with_the_configured_threads_whatever_its_process_had(tmp_path, monkeypatch):
    """A Slurm task is a fresh process whose torch threads are the node's default (and whatever
    OMP_NUM_THREADS the submitting shell exported): a run's and a study member's task set the
    config's ``threads`` themselves, so their numbers equal a local run's bit for bit."""
    from experiments import runner
    from experiments.study import population

    seen = []
    monkeypatch.setattr(runner, "run_one", lambda *a, **k: seen.append(torch.get_num_threads()) or {})
    monkeypatch.setattr(
        population, "train_and_measure", lambda *a, **k: seen.append(torch.get_num_threads()) or {"row": {}}
    )
    cfg = load_config(ROOT / "configs" / f"{CONFIG}.toml", [*SMALL, f"out_dir={tmp_path}"])
    run = plan_runs(cfg)[0]
    point = {"model": "mlp", "optimizer": "sgd", "lr": 0.1, "batch_size": 8, "weight_decay": 0.0}
    point |= {"width": 8, "n_train": 32, "seed": 0}
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run_task(run)
        torch.set_num_threads(2)
        population.member_task((point, {"threads": 1}, run, str(tmp_path), "fp", False))
    finally:
        torch.set_num_threads(old)
    assert seen == [1, 1]


# ---------------------------------------------------------------------------------- task records
def _fail(message):
    raise ValueError(message)


def _stop(name):
    raise Terminated(name)


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """A Slurm task's environment and a stand-in ``scontrol`` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls.txt"
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1230")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    return calls


def test_a_failing_task_records_its_one_line_error(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError):
        execute(Work(run_dir, _fail, ("model.name 'x' is not a registered model — use mlp",)))
    job = read_job(run_dir)
    assert job["state"] == "failed" and job["error"] == "model.name 'x' is not a registered model — use mlp"
    assert job["pid"] == os.getpid() and job["host"] == socket.gethostname()


def test_sigusr2_requeues_the_task_through_scontrol_until_the_limit(tmp_path, fake_slurm):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        execute(Work(run_dir, _stop, ("SIGUSR2",), max_requeues=3))
    assert exc.value.code == 143
    job = read_job(run_dir)
    assert job["state"] == "requeued" and job["signal"] == "SIGUSR2" and job["restarts"] == 2
    assert fake_slurm.read_text().split() == ["requeue", "1230_4"]  # the array task, not the array
    with pytest.raises(SystemExit):  # the third restart is the last one allowed
        execute(Work(run_dir, _stop, ("SIGUSR2",), max_requeues=2))
    job = read_job(run_dir)
    assert job["state"] == "failed" and "after 2 requeues (slurm.max_requeues = 2)" in job["error"]
    assert fake_slurm.read_text().split() == ["requeue", "1230_4"]  # not called again
    with pytest.raises(SystemExit):  # SIGTERM: preemption or scancel; Slurm decides, no requeue here
        execute(Work(run_dir, _stop, ("SIGTERM",)))
    assert read_job(run_dir)["state"] == "stopped"
    assert fake_slurm.read_text().split() == ["requeue", "1230_4"]


def test_a_lock_of_this_slurm_job_is_its_killed_predecessors(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = {"pid": 1, "host": "another-node", "started": "x", "command": ["python"], "slurm_job": "1234"}
    (run_dir / ".lock").write_text(json.dumps(holder))
    assert lock_state(run_dir)[0] == "remote"
    monkeypatch.setenv("SLURM_JOB_ID", "1233")  # another job: cannot tell, refused
    with pytest.raises(RunLocked, match="another host"):
        acquire(run_dir)
    monkeypatch.setenv("SLURM_JOB_ID", "1234")  # the same job, requeued: the old lock is stale
    assert lock_state(run_dir)[0] == "stale"
    lock = acquire(run_dir)
    assert json.loads((run_dir / ".lock").read_text())["slurm_job"] == "1234"
    lock.release()


# ------------------------------------------------------------------------------------------- status
def _run_dir(root: Path, name: str, *, seconds=(), result=None, checkpoint=False, job=None, lock=None):
    d = root / name
    d.mkdir(parents=True)
    if seconds:
        rows = [{"epoch": i + 1, "train_loss": 1.0, "seconds": s} for i, s in enumerate(seconds)]
        (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if result is not None:
        (d / "results.json").write_text(json.dumps(result))
    if checkpoint:
        (d / "checkpoint.pt").write_bytes(b"x")
    if job is not None:
        write_job(d, **job)
    if lock is not None:
        (d / ".lock").write_text(json.dumps(lock))
    return d


def test_status_tells_every_state_from_the_run_directories_and_the_queue(tmp_path):
    root = tmp_path / "grid"
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": "x", "command": ["python"]}
    err = tmp_path / "7_2_0_log.err"
    err.write_text("epoch 1\rstep 3/9\nTraceback ...\nRuntimeError: CUDA out of memory\n\n")
    _run_dir(root, "a", result={"status": "completed"})
    _run_dir(root, "b", result={"status": "diverged", "divergence": {"reason": "non-finite loss"}})
    _run_dir(root, "c", job={"id": "7_1", "state": "failed", "error": "model.name 'x' is unknown"})
    _run_dir(root, "d", job={"id": "7_2", "state": "running", "stderr": str(err)})  # killed: gone from queue
    _run_dir(root, "e", seconds=(2.0, 4.0), lock=me)  # 2 of 10 epochs at 3 s: 24 s left
    _run_dir(root, "f", job={"id": "7_5", "state": "queued"})
    _run_dir(root, "g", seconds=(1.0,), checkpoint=True)
    _run_dir(root, "h", job={"id": "7_7", "state": "running"}, seconds=(5.0,))
    names = "abcdefghi"
    write_plan(root, [{"dir": n, "label": n, "epochs": 10, "done": ""} for n in names])
    states = run_states([root], queue={"7_5": "PENDING", "7_7": "RUNNING", "7_2": "FAILED"})
    assert [(s.label, s.state) for s in states] == [
        ("a", "done"), ("b", "diverged"), ("c", "failed"), ("d", "failed"), ("e", "running"),
        ("f", "queued"), ("g", "stopped"), ("h", "running"), ("i", "not started"),
    ]  # fmt: skip
    by = {s.label: s for s in states}
    assert by["b"].detail == "non-finite loss" and by["c"].detail == "model.name 'x' is unknown"
    assert (
        by["d"].detail == "the task ended without a result (Slurm: failed): RuntimeError: CUDA out of memory"
    )
    assert by["d"].log == str(err)
    assert by["e"].epoch == 2 and by["e"].seconds_left == pytest.approx(24.0)
    assert by["h"].seconds_left == pytest.approx(45.0) and by["f"].detail == "job 7_5 (pending)"
    text = format_status(states)
    assert f"failed       d  {by['d'].detail} (log: {err})" in text
    assert "9 runs: 1 done, 1 diverged, 2 failed, 2 running, 1 queued, 1 stopped, 1 not started" in text
    assert "left: 7 runs; the running ones need about 45 s more" in text
    doc = json.loads(format_status(states, "json"))
    assert doc["counts"]["failed"] == 2 and len(doc["runs"]) == 9
    # without a scheduler: the job records alone
    alone = {s.label: s.state for s in run_states([root], queue=None)}
    assert alone["d"] == "running" and alone["f"] == "queued"
    # one run directory below the plan: only that run
    assert [s.label for s in run_states([root / "g"], queue=None)] == ["g"]


def test_table_names_the_planned_runs_it_lacks(tmp_path, capsys):
    out = tmp_path / "runs"
    assert (
        runner_main(["run", CONFIG, *SMALL, "seeds=[0]", f"out_dir={out}", "--shard", "0/2", "--no-progress"])
        == 0
    )
    capsys.readouterr()
    assert runner_main(["table", str(out / CONFIG)]) == 0
    text = capsys.readouterr().out
    assert "note: the table lacks 1 planned run (1 not started): sam/seed0;" in text
    assert "| sgd | 1 |" in text and "| bsam | 1 |" in text
    assert runner_main(["status", str(out / CONFIG)]) == 0
    text = capsys.readouterr().out
    assert "not started  sam/seed0" in text and "3 runs: 2 done, 1 not started" in text


# -------------------------------------------------------------------------------------------- config
def test_the_slurm_table_is_checked_and_changes_no_runs_identity():
    base = {"methods": [{"name": "sgd", "optimizer": "sgd"}]}
    cfg = resolve_config({**base, "slurm": {"time": 30, "partition": "gpu", "sbatch": {"exclude": "n7"}}})
    assert cfg["slurm"] == {**SLURM_DEFAULTS, "time": 30, "partition": "gpu", "sbatch": {"exclude": "n7"}}
    assert fingerprint(cfg, training_only=False) == fingerprint(resolve_config(base), training_only=False)
    for bad, message in (
        ({"time": 0}, "slurm.time must be >= 1"),
        ({"max_requeues": -1}, "slurm.max_requeues must be >= 0"),
        ({"setup": [1]}, "slurm.setup must be a list of shell lines"),
        ({"sbatch": {"bad key": "x"}}, "give sbatch options as name = value"),
        ({"sbatch": {"exclude": ["n1"]}}, "give sbatch options as name = value"),
        ({"partiton": "gpu"}, "did you mean 'partition'"),
    ):
        with pytest.raises(ConfigError, match=message):
            resolve_config({**base, "slurm": bad})


def test_queue_states_read_squeue_under_both_ids_and_none_without_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text(
        '#!/bin/sh\necho "$@" > '
        + str(tmp_path / "args")
        + "\nprintf '1230_4 1234 RUNNING\\n99 99 PENDING\\n'\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert cluster.queue_states() == {"1230_4": "RUNNING", "1234": "RUNNING", "99": "PENDING"}
    assert "--states=all" in (tmp_path / "args").read_text()
    script.write_text(
        "#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n"
    )
    assert cluster.queue_states() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert cluster.queue_states() is None


def test_the_guides_slurm_table_lists_every_key_with_its_default():
    import tomllib

    text = (ROOT / "docs" / "cluster.md").read_text()
    rows = [ln.split("|")[1:3] for ln in text.splitlines() if ln.startswith("| `")]
    listed = {k.strip().strip("`"): tomllib.loads(f"v = {d.strip().strip('`')}")["v"] for k, d in rows}
    assert listed == SLURM_DEFAULTS


def test_the_same_submission_again_leaves_out_finished_queued_and_running_runs(tmp_path, monkeypatch):
    works = [Work(tmp_path / n, _fail, (), n) for n in "abcde"]
    write_job(tmp_path / "b", id="7_1", state="queued")
    write_job(tmp_path / "c", id="7_2", state="running")
    write_job(tmp_path / "d", id="7_3", state="running")  # killed: gone from the queue
    done = {tmp_path / "a"}
    monkeypatch.setattr(
        cluster, "queue_states", lambda: {"7_1": "PENDING", "7_2": "RUNNING", "7_3": "FAILED"}
    )
    todo, notes = cluster.pending_work(works, lambda w: w.run_dir in done)
    assert [w.label for w in todo] == ["d", "e"]
    assert notes == ["b: already pending as job 7_1", "c: already running as job 7_2"]
    monkeypatch.setattr(cluster, "queue_states", lambda: None)  # no scheduler to ask: trust the records
    todo, notes = cluster.pending_work(works, lambda w: w.run_dir in done)
    assert [w.label for w in todo] == ["e"] and len(notes) == 3
    assert "squeue cannot be asked" in notes[0]
