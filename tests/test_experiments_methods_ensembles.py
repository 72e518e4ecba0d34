"""Deep ensembles as a method of the experiment runner: each member is the run of its derived seed
(bit-identical to a single run with that seed), the ensemble's predictive is the mean of the
members' softmax computed directly from their checkpoints, and an ensemble killed in the middle of
a member's epoch resumes to the uninterrupted ensemble, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import experiments.train as train_mod
from experiments.cli import main
from experiments.members import member_seed
from landscape.data import load_digits
from landscape.models import model_factory

CONFIG = """
name = "de"
seeds = [1]
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
batch_size = 256
lr = 0.2
schedule = "cosine"
optimizer_defaults = { momentum = 0.9 }
[[methods]]
name = "ens"
optimizer = "sgd"
ensemble = { members = 2 }
[evaluation]
every = 1
sharpness = []
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("de")
    (tmp / "de.toml").write_text(CONFIG)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["run", str(tmp / "de.toml"), f"out_dir={tmp / 'a'}"]) == 0
    finally:
        torch.set_num_threads(old)
    return tmp


def state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "checkpoint.pt", weights_only=True)["model"]


def test_members_are_the_runs_of_their_seeds(ensemble, tmp_path):
    run = ensemble / "a" / "de" / "ens" / "seed1"
    assert [member_seed(1, k, 2) for k in range(2)] == [2, 3]
    single = tmp_path / "single.toml"
    single.write_text(
        CONFIG.replace("seeds = [1]", "seeds = [2, 3]").replace("ensemble = { members = 2 }", "")
    )
    assert main(["run", str(single), f"out_dir={tmp_path / 's'}"]) == 0
    for k, seed in enumerate((2, 3)):
        ref = state(tmp_path / "s" / "de" / "ens" / f"seed{seed}")
        got = state(run / f"member{k}")
        assert ref.keys() == got.keys() and all(torch.equal(ref[n], got[n]) for n in ref), k
    # the point metrics are member 0's, i.e. the single run with seed 2
    ref_metrics = json.loads((tmp_path / "s" / "de" / "ens" / "seed2" / "metrics.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["accuracy"] == ref_metrics["accuracy"] and metrics["nll"] == ref_metrics["nll"]
    results = json.loads((run / "results.json").read_text())
    assert [m["seed"] for m in results["details"]["members"]] == [2, 3]
    assert results["details"]["members"][0]["nll"] == pytest.approx(ref_metrics["nll"], rel=1e-13)
    assert [(r["member"], r["epoch"]) for r in results["history"]] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert results["effective"]["steps"] == 2 * 2 * 6 and results["optimizer_arguments"]["member_seeds"] == [
        2,
        3,
    ]


def test_the_ensemble_predictive_is_the_mean_of_the_members_softmax(ensemble):
    run = ensemble / "a" / "de" / "ens" / "seed1"
    xt, yt = load_digits("test", dtype=torch.float64)
    probs = []
    for k in range(2):
        model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
        model.load_state_dict(state(run / f"member{k}"))
        with torch.no_grad():
            logits = model(xt).numpy()
        e = np.exp(logits - logits.max(1, keepdims=True))
        probs.append(e / e.sum(1, keepdims=True))
    avg, y = (probs[0] + probs[1]) / 2, yt.numpy()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["bma_accuracy"] == pytest.approx(float((avg.argmax(1) == y).mean()), abs=1e-12)
    assert metrics["bma_nll"] == pytest.approx(float(-np.log(avg[np.arange(len(y)), y]).mean()), rel=1e-12)
    brier = float(((avg - np.eye(10)[y]) ** 2).sum(1).mean())
    assert metrics["bma_brier"] == pytest.approx(brier, rel=1e-12)
    member_nll = [float(-np.log(p[np.arange(len(y)), y]).mean()) for p in probs]
    # -log is convex (Jensen): the average's NLL is below the members' mean NLL, and differs from both
    assert (
        metrics["bma_nll"] < sum(member_nll) / 2
        and min(abs(metrics["bma_nll"] - v) for v in member_nll) > 1e-4
    )


def test_an_ensemble_killed_mid_epoch_resumes_bit_identically(ensemble):
    calls = {"n": 0}

    def crash(step: int) -> None:
        calls["n"] += 1
        if calls["n"] == 12 + 3:  # after member 0's 12 steps: member 1, step 3 of its first epoch
            raise RuntimeError("simulated crash")

    cfg, out = ensemble / "de.toml", ensemble / "b"
    train_mod.STEP_HOOK = crash
    try:
        with pytest.raises(SystemExit) as exc:
            main(["run", str(cfg), f"out_dir={out}"])
        assert exc.value.code == 1
    finally:
        train_mod.STEP_HOOK = None
    run_b, run_a = out / "de" / "ens" / "seed1", ensemble / "a" / "de" / "ens" / "seed1"
    assert torch.load(run_b / "member0" / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 2
    assert not (run_b / "member1" / "checkpoint.pt").exists() and not (run_b / "results.json").exists()
    calls["n"] = 0
    assert main(["run", str(cfg), f"out_dir={out}"]) == 0
    for k in range(2):
        a, b = state(run_a / f"member{k}"), state(run_b / f"member{k}")
        assert all(torch.equal(a[n], b[n]) for n in a), k
    assert json.loads((run_a / "metrics.json").read_text()) == json.loads(
        (run_b / "metrics.json").read_text()
    )


def test_a_member_killed_after_its_first_epoch_resumes_from_that_checkpoint(ensemble):
    calls = {"n": 0}

    def crash(step: int) -> None:
        calls["n"] += 1
        if calls["n"] == 12 + 8:  # member 1, step 2 of epoch 2
            raise RuntimeError("simulated crash")

    cfg, out = ensemble / "de.toml", ensemble / "c"
    train_mod.STEP_HOOK = crash
    try:
        with pytest.raises(SystemExit):
            main(["run", str(cfg), f"out_dir={out}"])
    finally:
        train_mod.STEP_HOOK = None
    run_c = out / "de" / "ens" / "seed1"
    assert torch.load(run_c / "member1" / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 1
    assert main(["run", str(cfg), f"out_dir={out}"]) == 0
    a, c = state(ensemble / "a" / "de" / "ens" / "seed1" / "member1"), state(run_c / "member1")
    assert all(torch.equal(a[n], c[n]) for n in a)
    with pytest.raises(SystemExit) as exc:  # the member checkpoints belong to this configuration
        main(["run", str(cfg), f"out_dir={out}", "train.lr=0.3"])
    assert exc.value.code == 1


def test_the_dashboard_reads_an_ensembles_point_model_from_member_0(ensemble):
    from app.dashboard.experiments_view import run_probs

    run = ensemble / "a" / "de" / "ens" / "seed1"
    probs, y, row = run_probs(run)
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
    model.load_state_dict(state(run / "member0"))
    xt, yt = load_digits("test", dtype=torch.float64)
    with torch.no_grad():
        ref = torch.softmax(model(xt), -1)
    torch.testing.assert_close(probs, ref, rtol=1e-12, atol=1e-14)
    assert torch.equal(y, yt) and row["accuracy"] == pytest.approx(
        float((ref.argmax(1) == yt).double().mean())
    )
