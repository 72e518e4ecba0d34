"""``distributed.sync_batchnorm`` under ``torchrun --nproc_per_node 2`` (gloo, CPU): a data-parallel
run of an MLP with BatchNorm equals the single-process run on the same global batches (weights and
running statistics, float64), also with shards of unequal size (batches of 127 split 64 / 63) and
for SAM's two passes; without the option the ranks normalise with their own halves and the runs
differ."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from experiments.cli import main
from tests.torchrun import torchrun_experiments

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
name = "sbn"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
limit_train = 1270          # 10 batches of 127: shards of 64 and 63 examples
[model]
name = "mlp"
kwargs = { sizes = [64, 16, 10], activation = "tanh", norm = "batch" }
[train]
epochs = 2
batch_size = 127
lr = 0.1
schedule = "cosine"
optimizer_defaults = { momentum = 0.9 }
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05 }
[evaluation]
every = 0
sharpness = []
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def final_state(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.distributed
def test_synchronised_batchnorm_makes_two_ranks_equal_one_process(tmp_path):
    cfg = tmp_path / "sbn.toml"
    cfg.write_text(CONFIG)
    sweep = 'sweep={"distributed.sync_batchnorm" = [true, false]}'
    proc = torchrun_experiments(
        ["run", str(cfg), f"out_dir={tmp_path / 'dp'}", "distributed.mode=data_parallel", sweep], ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'sp'}"]) == 0
    for method in ("sgd", "sam"):
        sp = final_state(tmp_path / "sp" / "sbn" / method / "seed0")
        synced = final_state(tmp_path / "dp" / "sbn" / "sync_batchnorm=True" / method / "seed0")
        plain = final_state(tmp_path / "dp" / "sbn" / "sync_batchnorm=False" / method / "seed0")
        assert any("running_mean" in k for k in sp) and sp.keys() == synced.keys()
        for k in sp:
            # float64; only the order of the summation differs (all-reduced sums of two shards)
            assert torch.allclose(synced[k], sp[k], rtol=0, atol=1e-11), (
                method,
                k,
                (synced[k] - sp[k]).abs().max(),
            )
        # without synchronisation each rank normalises with its own half: the runs really differ
        assert max(float((plain[k].double() - sp[k].double()).abs().max()) for k in sp) > 1e-4, method
        tracked = [k for k in sp if k.endswith("num_batches_tracked")]
        assert len(tracked) == 1 and int(synced[tracked[0]]) == int(sp[tracked[0]]) == 20
