"""Mid-epoch checkpoints: a run stopped by ``Terminated`` (SIGTERM) between two steps of an epoch
writes its checkpoint at that step and resumes at the next one, ending bit-identically to the
uninterrupted run (the reference): weights, optimizer state, every history row but ``seconds``,
``metrics.json``, ``log.jsonl`` / ``log.csv`` and the per-step log ``steps.jsonl``.

The digits (1438 training images, 8 x 8, ``digits-image`` with random crop and flip) in batches of
256 give ``ceil(1438 / 256) = 6`` steps per epoch; ``STEP_HOOK(s)`` runs before global step
``s + 1``, so raising there at ``s`` leaves ``s`` steps done: ``s // 6`` epochs and ``s % 6`` steps
of the next (the counts every test checks in the checkpoint, besides the equality with the
reference)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

import experiments.divergence as dv
import experiments.train as train_mod
from experiments.cli import main
from experiments.config import resolve_config
from experiments.runner import plan_runs
from experiments.train import Trainer
from landscape.cli_common import Terminated, sigterm_raises_interrupt
from tests.runner_helpers import cpu_trainer

STEPS = 6  # ceil(1438 / 256)
CPU = torch.device("cpu")
SGD = {"name": "sgd", "optimizer": "sgd", "hyperparameters": {"momentum": 0.9}}
SAM = {"name": "sam", "optimizer": "sam", "hyperparameters": {"rho": 0.05, "momentum": 0.9}}
BSAM = {"name": "bsam", "optimizer": "bsam", "hyperparameters": {"lr": 0.5, "rho": 0.01}}

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _raw(tmp: Path, method: dict[str, Any], epochs: int = 2, log_every: int = 0) -> dict[str, Any]:
    return {
        "name": "mid",
        "seeds": [3],
        "device": "cpu",
        "threads": 1,
        "progress": False,
        "precision": "float32",
        "out_dir": str(tmp),
        "data": {"name": "digits-image", "augmentation": "crop_flip", "crop_padding": 1},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 12, 10], "activation": "tanh"}},
        "train": {
            "epochs": epochs,
            "batch_size": 256,
            "lr": 0.2,
            "schedule": "cosine",
            "log_every": log_every,
        },
        "methods": [method],
        "evaluation": {"sharpness": [], "every": 1, "metrics": ["accuracy"]},
    }


def _trainer(tmp: Path, method: dict[str, Any], **kw: Any) -> Any:
    (run,) = plan_runs(resolve_config(_raw(tmp, method, **kw)))
    return cpu_trainer(run, fingerprint="mid")


def _stop_at(step: int, hook_calls: list[int] | None = None):
    """A step hook raising ``Terminated`` (what SIGTERM raises) before global step ``step + 1``."""

    def hook(s: int) -> None:
        if hook_calls is not None:
            hook_calls.append(s)
        if s == step:
            raise Terminated("SIGTERM")

    return hook


def _fit(tmp: Path, method: dict[str, Any], stops: list[int], monkeypatch, **kw: Any) -> tuple[Any, list]:
    """Train in ``tmp``, stopped at each global step of ``stops`` in turn and resumed by a new
    trainer (as a requeued task would); the finished trainer and each stop's checkpoint."""
    blobs = []
    for step in stops:
        monkeypatch.setattr(train_mod, "STEP_HOOK", _stop_at(step))
        with pytest.raises(Terminated):
            _trainer(tmp, method, **kw).fit()
        run_dir = next(tmp.rglob("checkpoint.pt"))  # (ensembles: the first member's, see there)
        blobs.append(torch.load(run_dir, weights_only=True))
    calls: list[int] = []
    monkeypatch.setattr(train_mod, "STEP_HOOK", lambda s: calls.append(s))
    t = _trainer(tmp, method, **kw)
    t.fit()
    t.resumed_steps = calls
    return t, blobs


def _rows(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


def _same_run(a: Trainer, b: Trainer) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    oa, ob = a.opt.state_dict()["state"], b.opt.state_dict()["state"]
    assert oa.keys() == ob.keys()
    for i in oa:
        for k, v in oa[i].items():
            w = ob[i][k]
            assert torch.equal(v, w) if isinstance(v, torch.Tensor) else v == w, (i, k)
    assert _rows(a.history) == _rows(b.history) and len(a.history) == 2
    assert a.counters == b.counters


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Trainer]:
    """The uninterrupted runs of SGD, SAM and bSAM (augmentation on, cosine schedule)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for m in (SGD, SAM, BSAM):
            t = _trainer(tmp_path_factory.mktemp(m["name"]), m)
            t.fit()
            out[m["name"]] = t
    finally:
        torch.set_num_threads(old)
    return out


@pytest.mark.parametrize("method", [SGD, SAM, BSAM], ids=lambda m: m["name"])
def test_a_run_stopped_mid_epoch_resumes_at_the_next_step(reference, tmp_path, monkeypatch, method):
    t, (blob,) = _fit(tmp_path, method, [8], monkeypatch)
    # the checkpoint is the one of step 8: epoch 1 done, 2 steps of epoch 2, the losses unread
    assert blob["counters"]["step"] == 8 and blob["counters"]["epoch"] == 1 and blob["counters"]["batch"] == 2
    assert len(blob["history"]) == 1 and blob["partial_epoch"]["losses"]["steps"] == [7, 8]
    assert blob["partial_epoch"]["losses"]["sizes"] == [256, 256]
    assert t.resumed_steps == list(range(8, 2 * STEPS))  # no step redone, none lost
    assert t.history[1]["seconds"] > blob["partial_epoch"]["seconds"] > 0  # both parts of epoch 2
    _same_run(reference[method["name"]], t)


@pytest.mark.parametrize(
    "stops, epoch, batch",
    [([STEPS], 1, 0), ([STEPS - 1], 0, STEPS - 1), ([8, 8, 10], 1, 4)],
    ids=["first-step-of-epoch-2", "last-step-of-epoch-1", "three-stops"],
)
def test_stops_at_epoch_edges_and_in_a_row(reference, tmp_path, monkeypatch, stops, epoch, batch):
    t, blobs = _fit(tmp_path, SGD, stops, monkeypatch)
    assert [b["counters"]["step"] for b in blobs] == stops
    assert (blobs[-1]["counters"]["epoch"], blobs[-1]["counters"]["batch"]) == (epoch, batch)
    assert t.resumed_steps == list(range(stops[-1], 2 * STEPS))
    _same_run(reference["sgd"], t)


def test_reads_of_the_losses_inside_the_epoch_are_kept_across_the_stop(reference, tmp_path, monkeypatch):
    """With a host read every 4 steps (``READ_EVERY``), a stop after step 11 (5 steps of epoch 2,
    read after its 4th) keeps one unread loss and the sum of the 4 read ones."""
    monkeypatch.setattr(dv, "READ_EVERY", 4)
    t, (blob,) = _fit(tmp_path, SGD, [11], monkeypatch)
    losses = blob["partial_epoch"]["losses"]
    assert losses["steps"] == [11] and losses["count"] == 4 * 256
    _same_run(reference["sgd"], t)


def test_a_sigterm_inside_the_last_step_of_an_epoch_checkpoints_after_it(reference, tmp_path, monkeypatch):
    """The signal, sent to this process inside the optimizer step of global step 6 (the last of
    epoch 1), is held until that step is whole: the checkpoint has all 6 steps of epoch 1 but not
    its end (history empty), and the resumed run trains none of them again."""
    t0 = _trainer(tmp_path, SGD)
    step, seen = t0.opt.step, []

    def step_then_sigterm(closure):
        seen.append(len(seen) + 1)
        if len(seen) == STEPS:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(closure)

    monkeypatch.setattr(t0.opt, "step", step_then_sigterm)
    with sigterm_raises_interrupt(), pytest.raises(Terminated):
        t0.fit()
    assert seen == list(range(1, STEPS + 1))
    blob = torch.load(t0.run_dir / "checkpoint.pt", weights_only=True)
    assert (blob["counters"]["step"], blob["counters"]["epoch"], blob["counters"]["batch"]) == (6, 0, 6)
    assert blob["history"] == []
    calls: list[int] = []
    monkeypatch.setattr(train_mod, "STEP_HOOK", lambda s: calls.append(s))
    t = _trainer(tmp_path, SGD)
    t.fit()
    assert calls == list(range(STEPS, 2 * STEPS))
    _same_run(reference["sgd"], t)


def test_an_ensemble_member_stopped_mid_epoch_resumes_there(tmp_path, monkeypatch):
    """Members train in turn (6 steps an epoch, 1 epoch each): a stop before member 1's step 3
    checkpoints member 1 there; the resumed ensemble equals the uninterrupted one member by member."""
    ens = {**SGD, "name": "ens", "ensemble": {"members": 2}}
    a = _trainer(tmp_path / "a", ens, epochs=1)
    a.fit()
    calls: list[int] = []

    def stop(s: int) -> None:
        calls.append(s)
        if len(calls) == STEPS + 3:  # the hook's step is the member's own
            raise Terminated("SIGTERM")

    monkeypatch.setattr(train_mod, "STEP_HOOK", stop)
    with pytest.raises(Terminated):
        _trainer(tmp_path / "b", ens, epochs=1).fit()
    blob = torch.load(next((tmp_path / "b").rglob("member1/checkpoint.pt")), weights_only=True)
    assert (blob["counters"]["step"], blob["counters"]["batch"]) == (2, 2)
    calls.clear()
    monkeypatch.setattr(train_mod, "STEP_HOOK", lambda s: calls.append(s))
    b = _trainer(tmp_path / "b", ens, epochs=1)
    b.fit()
    assert calls == [2, 3, 4, 5]  # member 0 is only loaded; member 1 trains its last 4 steps
    assert len(a.opt.states) == len(b.opt.states) == 2
    for sa, sb in zip(a.opt.states, b.opt.states):
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert _rows(a.history) == _rows(b.history) and a.counters == b.counters


CONFIG = """
name = "mid"
seeds = [3]
device = "cpu"
threads = 1
progress = false
precision = "float32"
[data]
name = "digits-image"
augmentation = "crop_flip"
crop_padding = 1
[model]
name = "mlp"
kwargs = { sizes = [64, 12, 10], activation = "tanh" }
[train]
epochs = 2
batch_size = 256
lr = 0.2
schedule = "cosine"
log_every = 2
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05, momentum = 0.9 }
[evaluation]
every = 1
sharpness = []
"""


def test_the_runner_stopped_mid_epoch_writes_the_same_results_and_logs(tmp_path, monkeypatch):
    """Through the command line (status 143 at the stop): ``metrics.json``, the history, the epoch
    logs without ``seconds`` and the per-step log (steps 1, 3, ..., 11: ``log_every = 2``) equal
    those of the uninterrupted run."""
    cfg = tmp_path / "mid.toml"
    cfg.write_text(CONFIG)
    args = lambda out: ["run", str(cfg), f"out_dir={tmp_path / out}"]  # noqa: E731
    assert main(args("a")) == 0
    monkeypatch.setattr(train_mod, "STEP_HOOK", _stop_at(9))
    with pytest.raises(SystemExit) as exc:
        main(args("b"))
    assert exc.value.code == 143
    run_a, run_b = (tmp_path / d / "mid" / "sam" / "seed3" for d in "ab")
    steps = [json.loads(line)["step"] for line in (run_b / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 3, 5, 7, 9]  # appended at the stop, up to its step
    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    assert main(args("b")) == 0
    for name in ("metrics.json", "steps.jsonl"):
        assert (run_a / name).read_text() == (run_b / name).read_text(), name
    steps = [json.loads(line)["step"] for line in (run_b / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 3, 5, 7, 9, 11]
    la, lb = ([json.loads(x) for x in (r / "log.jsonl").read_text().splitlines()] for r in (run_a, run_b))
    assert _rows(la) == _rows(lb) and len(la) == 2
    ca, cb = ((r / "log.csv").read_text().splitlines() for r in (run_a, run_b))
    col = ca[0].split(",").index("seconds")
    drop = lambda lines: [[v for i, v in enumerate(x.split(",")) if i != col] for x in lines]  # noqa: E731
    assert drop(ca) == drop(cb) and len(ca) == 3
    a = torch.load(run_a / "checkpoint.pt", weights_only=True)
    b = torch.load(run_b / "checkpoint.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert "partial_epoch" not in b and "batch" not in b["counters"]  # an epoch checkpoint again


def test_an_epoch_only_checkpoint_resumes_at_the_epoch_start(reference, tmp_path, monkeypatch):
    """A crash (not a signal) writes nothing mid-epoch: the epoch-1 checkpoint (no ``batch`` key,
    as in the older format) is resumed from the start of epoch 2, to the same end."""

    def crash(s: int) -> None:
        if s == 8:
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(train_mod, "STEP_HOOK", crash)
    with pytest.raises(RuntimeError):
        _trainer(tmp_path, SGD).fit()
    blob = torch.load(next(tmp_path.rglob("checkpoint.pt")), weights_only=True)
    assert blob["counters"]["epoch"] == 1 and "batch" not in blob["counters"] and "partial_epoch" not in blob
    calls: list[int] = []
    monkeypatch.setattr(train_mod, "STEP_HOOK", lambda s: calls.append(s))
    t = _trainer(tmp_path, SGD)
    t.fit()
    assert calls == list(range(STEPS, 2 * STEPS))
    _same_run(reference["sgd"], t)
