"""``train.log_every``: the optimizer's per-step diagnostics (``opt.last``) in ``steps.jsonl``.

A tiny digits MLP trained with SAM for 2 epochs x 3 steps: with ``log_every = 2`` the steps 1, 3
and 5 are logged, each record equal to ``opt.last`` after that step (captured through
``experiments.train.STEP_HOOK``) and the first ``grad_norm`` equal to the norm of the first batch's
gradient computed by hand; with ``log_every = 0`` nothing is written, nothing is read from the
optimizer, and the trained weights are bit-identical to the logged run's.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import experiments.logs as logs
import experiments.train as train_mod
from experiments.config import ConfigError, resolve_config
from experiments.logs import StepLogger, step_scalars
from experiments.train import Trainer
from tests.runner_helpers import cpu_trainer, planned_run


def _raw(tmp_path, **train):
    return {
        "name": "steps",
        "seeds": [0],
        "device": "cpu",
        "progress": False,
        "precision": "float64",
        "out_dir": str(tmp_path),
        "data": {"name": "digits", "limit_train": 192},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 16, 10], "activation": "tanh"}},
        "train": {
            "epochs": 2,
            "batch_size": 64,
            "lr": 0.05,
            "schedule": "constant",
            "drop_last": True,
            "optimizer_defaults": {"momentum": 0.9},
            **train,
        },
        "methods": [{"name": "sam", "optimizer": "sam", "hyperparameters": {"rho": 0.05}}],
        "evaluation": {"every": 0, "sharpness": []},
    }


def _trainer(tmp_path, log_every: int) -> Trainer:
    run = planned_run(resolve_config(_raw(tmp_path, log_every=log_every)))
    run_dir = tmp_path / f"every{log_every}"
    run_dir.mkdir()
    return cpu_trainer(run, run_dir, seed=0)


def _records(trainer: Trainer) -> list[dict]:
    path = trainer.run_dir / "steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_log_every_writes_the_optimizers_diagnostics_and_changes_nothing(tmp_path, monkeypatch):
    logged = _trainer(tmp_path, 2)
    assert logged.steps_per_epoch == 3
    seen: dict[int, dict] = {}
    first: dict = {}

    def hook(step: int) -> None:  # runs before step + 1: opt.last is that of step `step`
        if step == 0:
            first["weights"] = [p.detach().clone() for p in logged.model.parameters()]
        else:
            seen[step] = dict(logged.opt.last)

    monkeypatch.setattr(train_mod, "STEP_HOOK", hook)
    logged.fit()
    seen[logged.counters["step"]] = dict(logged.opt.last)
    assert logged.counters["step"] == 6

    recs = _records(logged)
    assert [r["step"] for r in recs] == [1, 3, 5]
    for r in recs:
        last = seen[r["step"]]
        assert set(r) == {"step", "loss", "grad_norm", "eps_norm", "loss_perturbed"}
        for key in ("loss", "grad_norm", "eps_norm", "loss_perturbed"):
            assert r[key] == last[key].item()  # float64 run: the exact value
    # the first record's grad_norm by hand: the gradient of the first batch's loss at the initial
    # weights (the epoch's order is the first permutation drawn from the data generator)
    model = logged.model
    idx = torch.randperm(logged.n, generator=torch.Generator().manual_seed(0))[: logged.batch_size]
    with torch.no_grad():
        trained = [p.detach().clone() for p in model.parameters()]
        for p, w in zip(model.parameters(), first["weights"]):
            p.copy_(w)
    model.zero_grad()
    F.cross_entropy(model(logged.x_train[idx]), logged.y_train[idx]).backward()
    by_hand = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm().item()
    assert recs[0]["grad_norm"] == pytest.approx(by_hand, rel=1e-12)
    assert recs[0]["loss"] == pytest.approx(seen[1]["loss"].item(), rel=0)

    # off: no file, no read of the optimizer's diagnostics, the same weights bit for bit
    def no_read(_last):
        raise AssertionError("step diagnostics read with log_every = 0")

    monkeypatch.setattr(train_mod, "STEP_HOOK", None)
    monkeypatch.setattr(logs, "step_scalars", no_read)
    off = _trainer(tmp_path, 0)
    off.fit()
    assert off.step_log is None and not (off.run_dir / "steps.jsonl").exists()
    for a, b in zip(off.model.parameters(), trained):
        assert torch.equal(a, b)


def test_step_scalars_keeps_scalars_only_with_one_read():
    last = {
        "loss": torch.tensor(1.5, dtype=torch.float64),
        "grad_norm": torch.tensor(0.25),
        "n_collected": 3,
        "lr": 0.1,
        "m_sharpness": "batched",
        "per_chunk": [{"loss": torch.tensor(1.0)}],
        "flag": True,
        "vector": torch.ones(2),
    }
    out = step_scalars(last)
    assert out == {"loss": 1.5, "grad_norm": 0.25, "n_collected": 3, "lr": 0.1}
    assert list(out) == ["loss", "grad_norm", "n_collected", "lr"]
    assert step_scalars({}) == {}


def test_resumed_step_log_drops_the_records_past_the_checkpoint(tmp_path):
    class Opt:
        last = {"grad_norm": torch.tensor(2.0)}

    log = StepLogger(tmp_path, 2, tensorboard=False)
    for step in range(1, 10):
        log.record(step, Opt())
    log.flush()
    assert [json.loads(x)["step"] for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == [
        1,
        3,
        5,
        7,
        9,
    ]
    with open(tmp_path / "steps.jsonl", "a") as f:
        f.write('{"step": 11, "grad_')  # a line torn by a crash
    StepLogger(tmp_path, 2, start_step=5, tensorboard=False)  # resumed from the checkpoint of step 5
    assert [json.loads(x)["step"] for x in (tmp_path / "steps.jsonl").read_text().splitlines()] == [1, 3, 5]


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_log_every_is_validated(tmp_path, bad):
    with pytest.raises(ConfigError, match="train.log_every"):
        resolve_config(_raw(tmp_path, log_every=bad))
