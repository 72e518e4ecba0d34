"""Run-directory safety of the experiment runner (issue 24): one writer per run directory (a lock file
naming its holder; a stale one is taken over), no resume or re-evaluation under another
configuration (every result-relevant key, evaluation keys included) or on other data, no test split
used as training split, one-line checkpoint errors (a pickle with code is refused without running it;
a full disk names path, bytes and free space and keeps the previous checkpoint), and no write to the
checkout's ``.git/index``."""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch

import experiments.train as train_mod
from experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]

BASE = """
name = "tiny"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "{data}"
[model]
name = "mlp"
kwargs = {{ sizes = [{inputs}, 8, 10], activation = "tanh" }}
[train]
epochs = {epochs}
batch_size = {batch}
lr = 0.2
schedule = "constant"
[[methods]]
name = "sgd"
optimizer = "sgd"
[evaluation]
sharpness = []
every = 1
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def config(tmp: Path, *, epochs: int = 2, data: str = "digits", inputs: int = 64, batch: int = 256) -> Path:
    path = tmp / "tiny.toml"
    path.write_text(BASE.format(epochs=epochs, data=data, inputs=inputs, batch=batch))
    return path


def run(cfg: Path, out: Path, *overrides: str) -> int:
    """``main`` on the config; the exit status (0, or the ``SystemExit`` code)."""
    try:
        return main(["run", str(cfg), f"out_dir={out}", *overrides])
    except SystemExit as exc:
        return int(exc.code)


def error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def crash_after_first_epoch(monkeypatch, steps_per_epoch: int) -> None:
    def hook(step: int) -> None:
        if step == steps_per_epoch + 1:  # mid-epoch 2, after epoch 1's checkpoint
            raise RuntimeError("simulated kill")

    monkeypatch.setattr(train_mod, "STEP_HOOK", hook)


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ the lock
HOLDER = r"""
import sys, time
from pathlib import Path
import experiments.train as t
from experiments.cli import main
started, go = Path(sys.argv[1]), Path(sys.argv[2])
def hook(step):
    if step == 0:
        started.write_text("holding")
        end = time.time() + 120
        while not go.exists() and time.time() < end:
            time.sleep(0.02)
t.STEP_HOOK = hook
sys.exit(main(sys.argv[3:]))
"""


def test_a_second_runner_on_a_held_run_refuses_and_writes_nothing(tmp_path, capsys):
    cfg, out = config(tmp_path, epochs=1), tmp_path / "out"
    started, go = tmp_path / "started", tmp_path / "go"
    args = [str(started), str(go), "run", str(cfg), f"out_dir={out}", "train.lr=0.15"]
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate()
        run_dir = out / "tiny" / "sgd" / "seed0"
        lock = json.loads((run_dir / ".lock").read_text())
        assert lock["pid"] == proc.pid and lock["host"] == socket.gethostname()
        before = snapshot(run_dir)
        for overrides in (["train.lr=0.3"], ["evaluation.n_bins=10"], ["train.lr=0.15"]):
            assert run(cfg, out, *overrides) == 1
            line = error_line(capsys)
            assert f"PID {proc.pid} on host {socket.gethostname()}, started {lock['started']}" in line
            assert "in use by another runner" in line and str(run_dir / ".lock") in line
            assert "wait for that run to finish" in line and "delete the lock file" in line
            assert snapshot(run_dir) == before  # nothing written, nothing replaced
        go.write_text("go")
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (run_dir / ".lock").exists()
    assert tomllib.loads((run_dir / "config.toml").read_text())["train"]["lr"] == 0.15
    result = json.loads((run_dir / "results.json").read_text())
    assert result["config"]["train"]["lr"] == 0.15 and result["config"]["evaluation"]["n_bins"] == 20
    assert "train.lr=0.15" in json.loads((run_dir / "environment.json").read_text())["command"]
    assert len((run_dir / "log.jsonl").read_text().splitlines()) == 1  # one epoch, one writer
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 1


def _lock(run_dir: Path, pid: int, host: str | None = None, **extra) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    info = {"pid": pid, "host": host or socket.gethostname(), "started": "2024-01-01T00:00:00+0000"}
    (run_dir / ".lock").write_text(json.dumps({**info, "command": ["python", "-m", "experiments"], **extra}))
    return run_dir / ".lock"


def test_stale_locks_are_taken_over_live_and_foreign_ones_refused(tmp_path, capsys):
    cfg, out = config(tmp_path, epochs=1), tmp_path / "out"
    run_dir = out / "tiny" / "sgd" / "seed0"
    live = subprocess.Popen(["sleep", "60"])
    try:
        lock = _lock(run_dir, live.pid)
        assert run(cfg, out) == 1
        line = error_line(capsys)
        assert f"PID {live.pid} on host {socket.gethostname()}, started 2024-01-01T00:00:00+0000" in line
        lock = _lock(run_dir, live.pid, host="elsewhere.example")
        assert run(cfg, out) == 1
        line = error_line(capsys)
        assert "on another host" in line and "elsewhere.example" in line and f"delete {lock}" in line
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written beside it
        if Path(f"/proc/{live.pid}/stat").exists():  # the PID runs, but it is another process now
            _lock(run_dir, live.pid, proc_start=1)
            assert run(cfg, out) == 0
            assert "taking over the stale lock" in capsys.readouterr().out
            shutil.rmtree(run_dir)
    finally:
        live.kill()
        live.wait()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _lock(run_dir, dead.pid)
    assert run(cfg, out) == 0
    noted = capsys.readouterr().out
    assert f"taking over the stale lock {run_dir / '.lock'}" in noted and f"(PID {dead.pid} on host" in noted
    assert json.loads((run_dir / "metrics.json").read_text())["method"] == "sgd"
    assert not (run_dir / ".lock").exists() and not list(run_dir.glob(".lock.*"))


def test_the_lock_is_released_on_sigterm_and_kept_from_a_nested_run(tmp_path):
    from experiments.run_lock import RunLocked, run_dir_lock
    from landscape.cli_common import Terminated

    lock = tmp_path / "r" / ".lock"
    with pytest.raises(Terminated), run_dir_lock(tmp_path / "r"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RunLocked, match="in use by another runner"), run_dir_lock(tmp_path / "r"):
            pass
        assert lock.exists()  # the refused nested attempt leaves the holder's lock alone
        raise Terminated("SIGTERM")  # what the command line raises on SIGTERM
    assert not lock.exists()


# -------------------------------------------------------------------------------- configuration
def test_resume_or_rerun_with_another_evaluation_or_training_key_refuses(tmp_path, capsys, monkeypatch):
    cfg, out = config(tmp_path), tmp_path / "out"
    run_dir = out / "tiny" / "sgd" / "seed0"
    crash_after_first_epoch(monkeypatch, 6)  # 1438 digits, batches of 256
    assert run(cfg, out) == 1
    capsys.readouterr()
    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    killed = snapshot(run_dir)
    assert run(cfg, out, "evaluation.n_bins=10") == 1
    line = error_line(capsys)
    assert "another configuration" in line and "config.toml" in line
    assert "evaluation.n_bins = 20 there, 10 now" in line and "use another out_dir" in line
    assert run(cfg, out, "train.lr=0.3", "evaluation.n_bins=10") == 1
    line = error_line(capsys)
    assert "evaluation.n_bins = 20 there, 10 now" in line and "train.lr = 0.2 there, 0.3 now" in line
    assert snapshot(run_dir) == killed
    assert run(cfg, out, "progress=true", "threads=1") == 0  # keys that change no result do not count
    capsys.readouterr()
    finished = snapshot(run_dir)
    assert run(cfg, out, "evaluation.n_bins=10") == 1  # a finished run is not re-evaluated either
    assert "evaluation.n_bins = 20 there, 10 now" in error_line(capsys)
    (run_dir / "config.toml").unlink()  # the results file alone still tells
    assert run(cfg, out, "evaluation.n_bins=10") == 1
    line = error_line(capsys)
    assert "its results.json: evaluation.n_bins = 20 there, 10 now" in line
    finished.pop("config.toml")
    assert snapshot(run_dir) == finished


# ----------------------------------------------------------------------------------------------- data
def _cifar_batch(path: Path, seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    batch = {
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"labels": rng.integers(0, 10, n).tolist(),
    }
    path.write_bytes(pickle.dumps(batch))


def test_data_replaced_between_a_kill_and_the_resume_is_refused(tmp_path, capsys, monkeypatch):
    data = tmp_path / "cifar10"
    data.mkdir()
    for i in range(1, 6):
        _cifar_batch(data / f"data_batch_{i}", i, 8)
    _cifar_batch(data / "test_batch", 0, 16)
    cfg, out = config(tmp_path, data=f"cifar10:{data}", inputs=3072, batch=16), tmp_path / "out"
    run_dir = out / "tiny" / "sgd" / "seed0"
    crash_after_first_epoch(monkeypatch, 3)  # 40 images, batches of 16
    assert run(cfg, out) == 1
    capsys.readouterr()
    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    ckpt = (run_dir / "checkpoint.pt").read_bytes()
    original = (data / "data_batch_3").read_bytes()
    _cifar_batch(data / "data_batch_3", 99, 8)  # new pixels and labels, same shapes
    assert run(cfg, out) == 1
    line = error_line(capsys)
    assert str(run_dir / "checkpoint.pt") in line and "written on other data" in line
    assert "the training set (sha256" in line and "test set" not in line
    assert "put the original data back" in line
    assert (run_dir / "checkpoint.pt").read_bytes() == ckpt and not (run_dir / "results.json").exists()
    (data / "data_batch_3").write_bytes(original)
    assert run(cfg, out) == 0  # the original data: the resume goes on
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 2


def test_the_test_split_as_training_split_needs_the_allow_key(tmp_path, capsys):
    cfg, out = config(tmp_path, epochs=1), tmp_path / "out"
    assert run(cfg, out, "data.test_split=train") == 2
    line = error_line(capsys)
    assert "data.train_split and data.test_split are both 'train'" in line
    assert "data.allow_test_as_train = true" in line
    assert run(cfg, out, "data.train_split=all") == 2  # every test example is also a training one
    line = error_line(capsys)
    assert "359 of the 359 test inputs (100.0 %)" in line and "1797 training inputs" in line
    assert not (out / "tiny" / "sgd" / "seed0" / "checkpoint.pt").exists()
    assert run(cfg, out, "data.test_split=train", "data.allow_test_as_train=true") == 0
    result = json.loads((out / "tiny" / "sgd" / "seed0" / "results.json").read_text())
    assert result["effective"]["n_train"] == result["effective"]["n_test"] == 1438


def test_overlap_is_counted_exactly():
    from experiments.data import count_overlap

    gen = torch.Generator().manual_seed(0)
    train, test = torch.randn(50, 3, 4, generator=gen), torch.randn(20, 3, 4, generator=gen)
    assert count_overlap(train, test) == 0
    test[[2, 7, 19]] = train[[0, 33, 49]]
    assert count_overlap(train, test) == 3


# ------------------------------------------------------------------------------------- checkpoints
class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle.dump"])
def test_a_checkpoint_holding_code_is_refused_in_one_line_without_running_it(tmp_path, capsys, how):
    cfg, out = config(tmp_path, epochs=1), tmp_path / "out"
    run_dir = out / "tiny" / "sgd" / "seed0"
    run_dir.mkdir(parents=True)
    marker = tmp_path / "pwned"
    evil = {"format": "experiments-checkpoint-1", "model": _Payload(marker)}
    with open(run_dir / "checkpoint.pt", "wb") as fh:
        torch.save(evil, fh) if how == "torch.save" else pickle.dump(evil, fh, protocol=2)
    assert run(cfg, out) == 1
    line = error_line(capsys)
    assert f"{run_dir / 'checkpoint.pt'}: refused to load" in line
    assert "posix.system" in line and "this runner did not write it" in line and "delete it" in line
    assert "Weights only load failed" not in line
    assert not marker.exists()
    assert not (run_dir / "results.json").exists()


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 3982"),
    ],
    ids=["ENOSPC", "torch-zip"],
)
def test_a_full_disk_names_path_bytes_and_free_space_and_keeps_the_checkpoint(
    tmp_path, capsys, monkeypatch, failure
):
    cfg, out = config(tmp_path), tmp_path / "out"
    run_dir = out / "tiny" / "sgd" / "seed0"
    crash_after_first_epoch(monkeypatch, 6)
    assert run(cfg, out) == 1
    capsys.readouterr()
    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    before = (run_dir / "checkpoint.pt").read_bytes()

    def full(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 partial")  # the disk fills mid-write
        raise failure

    monkeypatch.setattr(torch, "save", full)
    assert run(cfg, out) == 1
    line = error_line(capsys)
    assert f"could not write the checkpoint {run_dir / 'checkpoint.pt'}" in line
    need = int(re.search(r"needs about ([\d,]+) bytes", line).group(1).replace(",", ""))
    params = 64 * 8 + 8 + 8 * 10 + 10  # the model's float64 parameters, which the checkpoint holds
    assert params * 8 < need < 10**6
    assert re.search(r"has [\d,]+ bytes \([\d.,]+ MiB\) free", line)
    assert "the previous checkpoint is intact" in line
    assert (run_dir / "checkpoint.pt").read_bytes() == before
    assert torch.load(run_dir / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 1
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


# -------------------------------------------------------------------------------------------- git
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_git_state_is_read_without_writing_the_index(tmp_path):
    from experiments.runner import _git_commit

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    git = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True)  # noqa: E731
    (repo / "a.txt").write_text("a\n")
    git("init", "-q")
    git("add", "a.txt")
    git("commit", "-q", "-m", "a")
    index = repo / ".git" / "index"

    def touch() -> None:  # same content, newer stat: a refreshing `git status` rewrites the index
        t = time.time() + 5
        os.utime(repo / "a.txt", (t, t))
        os.utime(index, (t - 100, t - 100))

    def state() -> tuple[bytes, int]:
        return index.read_bytes(), index.stat().st_mtime_ns

    touch()
    before = state()
    info = _git_commit(repo)
    assert state() == before
    assert info["git_commit"] == git("rev-parse", "HEAD").stdout.decode().strip()
    assert info["git_dirty"] is False
    (repo / "a.txt").write_text("b\n")
    touch()
    before = state()
    assert _git_commit(repo)["git_dirty"] is True
    assert state() == before
    subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, check=True)
    assert state() != before  # the control: without GIT_OPTIONAL_LOCKS=0 git does rewrite it
