"""Study members are experiment-runner runs: a member's weights equal, bit for bit, those of
``python -m experiments run`` with the equivalent hand-written config; a study killed in the middle of
a member resumes from that member's checkpoint without retraining the finished ones and ends with
the same weights and table; the sharpness subset is shared and lies in every training set; bad
``runner`` tables and optimizer options give clear errors."""

from __future__ import annotations

import json

import pytest
import torch

import experiments.train as train_mod
from experiments.cli import main as runner_main
from experiments.config import ConfigError
from experiments.study import member_runs, resolve_study_config, run_population
from experiments.study.members import load_member, runner_config, sharpness_subset

N_TRAIN, BATCH, EPOCHS = 96, 64, 2  # 2 steps per epoch, 4 per run


def _cfg(**over):
    raw = {
        "sampling": "grid",
        "epochs": EPOCHS,
        "sharpness_subset": 32,
        "space": {
            "model": ["mlp"],
            "optimizer": ["sgd", "bsam"],
            "lr": [0.05],
            "batch_size": [BATCH],
            "weight_decay": [1e-3],
            "width": [8],
            "n_train": [N_TRAIN],
        },
        "optimizer_options": {"bsam": {"lr_scale": 5.0, "rho": 0.02}},
        "measures": [
            {"measure": "lambda_max", "options": {"max_matvecs": 15}},
            {"measure": "average_case", "options": {"samples": 3}},
        ],
    }
    raw.update(over)
    return resolve_study_config(raw)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    cfg = _cfg()
    rows = run_population(cfg, out, progress=False)
    return cfg, out, rows


def _weights(run_dir):
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["model"]


def _assert_same(a, b):
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


# the runner configs of the two members written by hand: SGD (momentum 0.9, L2 = the weight decay)
# and bSAM (lr 0.05 x lr_scale 5; prior precision 1 + weight decay x N = 1 + 1e-3 x 96)
_HAND = """
name = "direct"
seeds = [0]
device = "cpu"
threads = 1
[data]
name = "digits"
kwargs = {{ test_fraction = 0.2 }}
limit_train = 96
[model]
name = "mlp"
kwargs = {{ sizes = [64, 8, 8, 10], activation = "relu" }}
[train]
epochs = 2
batch_size = 64
lr = {lr}
schedule = "constant"
[evaluation]
sharpness = []
[[methods]]
name = "{name}"
optimizer = "{name}"
hyperparameters = {hyper}
"""


def test_member_weights_equal_the_runner_cli_bit_for_bit(study, tmp_path):
    cfg, out, rows = study
    members = dict((p["optimizer"], r) for p, r in member_runs(cfg, out))
    hands = {
        "sgd": (0.05, "{ momentum = 0.9, weight_decay = 0.001 }"),
        "bsam": (0.25, "{ rho = 0.02, prior_precision = 1.096 }"),
    }
    for name, (lr, hyper) in hands.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(_HAND.format(lr=lr, name=name, hyper=hyper))
        assert runner_main(["run", str(path), f"out_dir={tmp_path / 'direct'}", "--no-progress"]) == 0
        direct = tmp_path / "direct" / "direct" / name / "seed0"
        _assert_same(_weights(members[name].run_dir), _weights(direct))
        hp = members[name].cfg["methods"][0]["hyperparameters"]
        if name == "bsam":
            assert hp["prior_precision"] == pytest.approx(1.0 + 1e-3 * N_TRAIN, abs=1e-15)
    # every member's directory holds the runner's files; the row's test error is 1 - the runner's
    # accuracy (two evaluations of the same weights)
    for r in rows:
        doc = json.loads((out / "models" / f"{r['id']}.json").read_text())
        run_dir = out / doc["run_dir"]
        for f in ("config.toml", "environment.json", "log.jsonl", "checkpoint.pt", "results.json"):
            assert (run_dir / f).is_file(), f
        assert r["test_error"] == pytest.approx(1.0 - doc["runner_metrics"]["accuracy"], abs=1e-12)
        assert [h["epoch"] for h in doc["history"]] == [1, 2]
        assert r["final_epoch_loss"] == doc["history"][-1]["train_loss"]


class _Crash(Exception):
    pass


def test_killed_study_resumes_without_retraining(study, tmp_path, monkeypatch):
    cfg, ref_out, ref_rows = study
    out = tmp_path / "killed"
    calls = []

    def crash_in_second_member(step):
        calls.append(step)
        if len(calls) == 2 * EPOCHS + 3:  # member 2, first step of epoch 2 (after its checkpoint)
            raise _Crash

    monkeypatch.setattr(train_mod, "STEP_HOOK", crash_in_second_member)
    with pytest.raises(_Crash):
        run_population(cfg, out, progress=False)
    (first, r1), (second, r2) = member_runs(cfg, out)
    assert sorted(p.name for p in (out / "models").glob("*.json")) == [f"{r1.run_dir.parts[-3]}.json"]
    assert not (r2.run_dir / "results.json").is_file()
    assert torch.load(r2.run_dir / "checkpoint.pt", weights_only=True)["counters"]["step"] == 2
    resumed = []
    monkeypatch.setattr(train_mod, "STEP_HOOK", resumed.append)
    rows = run_population(cfg, out, progress=False)
    assert resumed == [2, 3]  # member 1 not trained again, member 2 from its epoch-1 checkpoint
    for (_, a), (_, b) in zip(member_runs(cfg, out), member_runs(cfg, ref_out)):
        _assert_same(_weights(a.run_dir), _weights(b.run_dir))
    timing = ("seconds", "cpu_seconds")
    for r, ref in zip(rows, ref_rows):
        assert {k: v for k, v in r.items() if k not in timing} == {
            k: v for k, v in ref.items() if k not in timing
        }
    # a third run does nothing at all
    resumed.clear()
    run_population(cfg, out, progress=False)
    assert resumed == []


def test_sharpness_subset_is_shared_and_inside_every_training_set(tmp_path):
    cfg = _cfg(space={"optimizer": ["sgd"], "width": [8], "n_train": [40, 96], "batch_size": [BATCH]})
    cfg["epochs"] = 1
    run_population(cfg, tmp_path, progress=False)
    subsets = []
    for _, run in member_runs(cfg, tmp_path):
        _, data, _ = load_member(run, device=torch.device("cpu"))
        xs, ys = sharpness_subset(run, data, 32)
        rows = {tuple(v.tolist()) for v in data.x_train}
        assert len(xs) == 32 and all(tuple(v.tolist()) in rows for v in xs)
        subsets.append((xs, ys))
    assert len(data.y_train) == 96
    assert torch.equal(subsets[0][0], subsets[1][0]) and torch.equal(subsets[0][1], subsets[1][1])
    with pytest.raises(ValueError, match="is not part of run"):
        sharpness_subset(run, data, 97)


def test_bad_runner_tables_and_options(tmp_path):
    with pytest.raises(ValueError, match=r"\['train.lr'\] are set by the study"):
        _cfg(runner={"train": {"lr": 0.1}})
    with pytest.raises(ValueError, match="runner must be a table"):
        _cfg(runner=3)
    cfg = _cfg(runner={"train": {"shedule": "cosine"}})
    point = {
        "model": "mlp",
        "optimizer": "sgd",
        "lr": 0.05,
        "batch_size": 64,
        "weight_decay": 0.0,
        "width": 8,
        "n_train": 96,
        "seed": 0,
    }
    with pytest.raises(ConfigError, match="runner config: unknown config key 'train.shedule'"):
        runner_config(point, cfg, tmp_path)
    cfg = _cfg(optimizer_options={"sgd": {"weight_decay": 0.1}})
    with pytest.raises(ValueError, match=r"optimizer_options.sgd: \['weight_decay'\] are set by the space"):
        runner_config(point, cfg, tmp_path)
    cfg = _cfg(optimizer_options={"sgd": {"rho": 0.1}})
    with pytest.raises(ConfigError, match="does not accept \\['rho'\\]"):
        member_runs(cfg, tmp_path)
    with pytest.raises(ValueError, match="n_train=5000 exceeds the 1438 training examples"):
        runner_config({**point, "n_train": 5000}, _cfg(), tmp_path)
    # a cosine schedule from the runner table reaches the member's runner config
    cfg = _cfg(runner={"train": {"schedule": "cosine"}, "evaluation": {"bma_samples": 4}})
    rc = runner_config(point, cfg, tmp_path)
    assert (rc["train"]["schedule"], rc["evaluation"]["bma_samples"], rc["train"]["lr"]) == (
        "cosine",
        4,
        0.05,
    )
