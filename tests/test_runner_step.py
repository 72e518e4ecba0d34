"""The runner's step loop reads the training losses back to the host once every ``READ_EVERY`` steps
(the divergence monitor's window) and at the end of each epoch, not once per step
(experiments/train.py ``Trainer._epoch``, experiments/divergence.py ``StepLosses``): the weights,
history, checkpointed monitor state and divergence records equal those of a read every step."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import experiments.divergence as dv
from experiments.config import resolve_config
from experiments.parallel import DistContext
from experiments.runner import plan_runs, run_one

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _run(
    out,
    *,
    every,
    optimizer="sgd",
    lr=0.1,
    act="tanh",
    precision="float64",
    monkeypatch,
    overrides=None,
    **train,
):
    monkeypatch.setattr(dv, "READ_EVERY", every)
    raw = {
        "name": "step",
        "seeds": [0],
        "device": "cpu",
        "threads": 1,
        "progress": False,
        "precision": precision,
        "out_dir": str(out),
        "data": {"name": "digits"},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 12, 10], "activation": act}},
        "train": {"epochs": 2, "batch_size": 64, "lr": lr, "schedule": "cosine", **train},
        "methods": [{"name": optimizer, "optimizer": optimizer}],
        "evaluation": {"sharpness": [], "every": 1, "metrics": ["accuracy", "nll"]},
        **(overrides or {}),
    }
    (run,) = plan_runs(resolve_config(raw))
    run_one(run, device=CPU, ctx=DistContext())
    res = json.loads((run.run_dir / "results.json").read_text())
    ckpt = run.run_dir / "checkpoint.pt"
    state = torch.load(ckpt, weights_only=True) if ckpt.exists() else None
    history = [{k: v for k, v in row.items() if k != "seconds"} for row in res["history"]]
    return res, history, state


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_reads_every_window_equal_reads_every_step(tmp_path, monkeypatch, optimizer):
    """Final weights, history (train_loss included) and the checkpointed counters (monitor state)
    of a 2-epoch float64 run are bit-identical with a read every step and every 10 steps."""
    res1, hist1, state1 = _run(tmp_path / "a", every=1, optimizer=optimizer, monkeypatch=monkeypatch)
    resk, histk, statek = _run(tmp_path / "b", every=None, optimizer=optimizer, monkeypatch=monkeypatch)
    assert res1["status"] == resk["status"] == "completed"
    assert hist1 == histk and len(histk) == 2 and all(math.isfinite(r["train_loss"]) for r in histk)
    assert state1["counters"] == statek["counters"] and statek["counters"]["step"] == 46
    assert len(statek["counters"]["divergence"]["recent"]) == 10
    assert state1["model"].keys() == statek["model"].keys()
    for name, w in state1["model"].items():
        assert torch.equal(w, statek["model"][name]), name
    assert res1["metrics"] == resk["metrics"]


@pytest.mark.parametrize(
    "every, reads", [(None, 2 * math.ceil(23 / 10)), (1, 46), (7, 2 * math.ceil(23 / 7))]
)
def test_host_reads_per_epoch_are_ceil_steps_over_k(tmp_path, monkeypatch, every, reads):
    calls = []
    original = dv.StepLosses.read

    def counting(self, monitor, epoch):
        calls.append(len(self.losses))
        return original(self, monitor, epoch)

    monkeypatch.setattr(dv.StepLosses, "read", counting)
    _, history, _ = _run(tmp_path, every=every, monkeypatch=monkeypatch)
    assert len(history) == 2 and history[-1]["step"] == 46  # 1438 digits in batches of 64: 23 steps
    assert len(calls) == reads and sum(calls) == 46


@pytest.mark.parametrize(
    "kw, reason, step",
    [
        ({"lr": 1e6}, dv.GROWTH, 10),  # tanh MLP: finite blow-up, the first full window
        ({"lr": 1e6, "act": "relu", "precision": "float32"}, dv.NONFINITE_LOSS, 5),  # NaN at step 5
    ],
)
def test_blow_up_records_the_same_divergence_as_reads_every_step(tmp_path, monkeypatch, kw, reason, step):
    records = {}
    for every in (1, None, 7):
        res, history, state = _run(tmp_path / str(every), every=every, monkeypatch=monkeypatch, **kw)
        assert res["status"] == "diverged" and history == [] and state is None
        records[every] = res["divergence"]
    assert records[1]["reason"] == reason and records[1]["step"] == step and records[1]["epoch"] == 1
    assert records[None] == records[1] and records[7] == records[1]


def test_step_losses_skip_gaps_and_pending_match_per_step_feeding():
    """Skipped steps (fp16 loss scaling: no loss) split the losses into runs of consecutive steps;
    the record, the monitor's state and the finite mean equal one update per step."""
    losses = {1: 2.0, 2: 1.5, 4: 1.0, 5: math.inf, 6: 30.0, 8: 40.0, 9: 60.0, 10: 80.0, 11: 90.0}
    per_step = dv.DivergenceMonitor(10.0, window=3)
    first = None
    for s, v in losses.items():
        found = per_step.update([v], step=s, epoch=1) if first is None else None
        first = first or found
    batched, buf = dv.DivergenceMonitor(10.0, window=3), dv.StepLosses()
    got = None
    for s, v in losses.items():
        buf.add(torch.tensor(v, dtype=torch.float32), s, 2)
        if s % 4 == 0 or s == 11:
            rec = buf.read(batched if got is None else None, 1)
            got = got or rec
    assert got == first and got.reason == dv.NONFINITE_LOSS and got.step == 5
    assert batched.state_dict() == per_step.state_dict()
    finite = [v for v in losses.values() if math.isfinite(v)]
    assert buf.mean() == sum(v * 2 for v in finite) / (2 * len(finite)) and buf.losses == []
    # growth with a gap inside the window: steps are numbered per run of consecutive steps
    mon1, mon2, buf = (
        dv.DivergenceMonitor(10.0, window=3),
        dv.DivergenceMonitor(10.0, window=3),
        dv.StepLosses(),
    )
    seq = {1: 2.0, 2: 1.5, 3: 30.0, 4: 40.0, 6: 1.0, 7: 1.0}  # trips at step 4, before the gap
    ref = []
    for s, v in seq.items():
        ref.append(mon1.update([v], step=s, epoch=2) if not any(ref) else None)
    for s, v in seq.items():
        buf.add(torch.tensor(v), s, 1)
    assert (
        buf.read(mon2, 2) == next(r for r in ref if r is not None) and mon2.state_dict() == mon1.state_dict()
    )
    assert ref[3].step == 4 and ref[3].reason == dv.GROWTH
    assert dv.StepLosses().read(mon2, 2) is None and math.isnan(dv.StepLosses().mean())
    mixed = dv.StepLosses()  # one-element losses of other shapes, dtypes or a Python float
    for s, v in enumerate([torch.tensor([1.5]), torch.tensor(2.5, dtype=torch.float64), 3.5]):
        mixed.add(v, s + 1, 2)
    assert mixed.read(None, 1) is None and mixed.mean() == 2.5


@pytest.mark.parametrize(
    "train, problem",
    [
        ({"batch_size": 4}, "train.batch_size = 4 leaves some of them empty"),
        (
            {"batch_size": 287},
            "the last batch of each epoch has 3 examples (1438 training examples, batch size 287), too few",
        ),
    ],
)
def test_sub_batches_without_examples_are_a_config_error(tmp_path, monkeypatch, train, problem):
    """m-sharpness with fewer examples than sub-batches (the whole batch, or the epoch's last one)
    would give an empty sub-batch, a NaN loss and a spurious divergence: refused up front."""
    from experiments.config import ConfigError

    hyper = {"methods": [{"name": "sam", "optimizer": "sam", "hyperparameters": {"m": 8}}]}
    with pytest.raises(ConfigError, match=re.escape(problem)):
        _run(tmp_path / "a", every=None, monkeypatch=monkeypatch, overrides=hyper, **train)
    # the epoch's last batch dropped: 5 full batches of 287, every sub-batch has 35 or 36 examples
    res, history, _ = _run(
        tmp_path / "b", every=None, monkeypatch=monkeypatch, overrides=hyper, batch_size=287, drop_last=True
    )
    assert res["status"] == "completed" and history[-1]["step"] == 10
    assert all(math.isfinite(r["train_loss"]) for r in history)


def test_sub_batches_per_rank_under_data_parallelism():
    """Each rank splits its share of the batch (``torch.tensor_split``: the smallest share is
    ``batch // world``) into m sub-batches."""
    from experiments.closures import check_sub_batches
    from experiments.config import ConfigError

    check_sub_batches(8, 1024, 32, False, "sam", world=4)  # shares of 8: one example per sub-batch
    check_sub_batches(8, 1000, 32, True, "sam", world=4)  # the short last batch dropped
    with pytest.raises(ConfigError, match="each batch on each of 4 ranks into m = 8 sub-batches"):
        check_sub_batches(8, 1024, 28, False, "sam", world=4)  # shares of 7
    with pytest.raises(ConfigError, match="too few for the m = 8 sub-batches on each of 4 ranks"):
        check_sub_batches(8, 1000, 32, False, "sam", world=4)  # last batch 8: shares of 2
