"""``torchrun --standalone --nproc_per_node 2`` (gloo, CPU) with the experiment runner: data-parallel
SAM perturbing with the all-reduced gradient equals single-process SAM on the same global batch;
per-device perturbations equal single-process SAM with m = 2 (m-sharpness); grid mode splits the
runs between the ranks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from experiments.cli import main
from tests.torchrun import torchrun_experiments

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
name = "ddp"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
limit_train = 1280          # 10 batches of 128: equal halves on two ranks
[model]
name = "mlp"
kwargs = { sizes = [64, 16, 10], activation = "tanh" }
[train]
epochs = 2
batch_size = 128
lr = 0.1
schedule = "cosine"
optimizer_defaults = { momentum = 0.9, weight_decay = 5e-4 }
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05 }
[evaluation]
every = 0
sharpness = []
"""


def torchrun(config: Path, *overrides: str) -> subprocess.CompletedProcess:
    proc = torchrun_experiments(["run", str(config), *overrides], ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.distributed
def test_data_parallel_sam_equals_single_process_sam(tmp_path):
    cfg = tmp_path / "ddp.toml"
    cfg.write_text(CONFIG)
    # one torchrun launch trains both perturbation options (a sweep over the config key)
    torchrun(cfg, f"out_dir={tmp_path / 'dp'}", "distributed.mode=data_parallel",
             'sweep={"distributed.perturbation" = ["global", "local"]}')  # fmt: skip
    # single-process references: SAM on the global batch, and SAM with m = 2 sub-batches
    assert (
        main(
            [
                "run",
                str(cfg),
                f"out_dir={tmp_path / 'sp'}",
                'sweep={"methods.sam.hyperparameters.m" = [1, 2]}',
            ]
        )
        == 0
    )
    pairs = {"perturbation=global": "m=1", "perturbation=local": "m=2"}
    for dp_variant, sp_variant in pairs.items():
        dp = final_weights(tmp_path / "dp" / "ddp" / dp_variant / "sam" / "seed0")
        sp = final_weights(tmp_path / "sp" / "ddp" / sp_variant / "sam" / "seed0")
        for k in sp:
            # float64; only the order of the summation differs (all_reduce of two halves)
            assert torch.allclose(dp[k], sp[k], rtol=0, atol=1e-11), (
                dp_variant,
                k,
                (dp[k] - sp[k]).abs().max(),
            )
    g = final_weights(tmp_path / "dp" / "ddp" / "perturbation=global" / "sam" / "seed0")
    loc = final_weights(tmp_path / "dp" / "ddp" / "perturbation=local" / "sam" / "seed0")
    assert max(float((g[k] - loc[k]).abs().max()) for k in g) > 1e-6  # the two options really differ
    env = json.loads(
        (tmp_path / "dp" / "ddp" / "perturbation=global" / "sam" / "seed0" / "environment.json").read_text()
    )
    assert env["world_size"] == 2 and env["distributed_mode"] == "data_parallel"


@pytest.mark.distributed
@pytest.mark.slow
def test_grid_mode_splits_runs_between_ranks(tmp_path):
    cfg = tmp_path / "ddp.toml"
    cfg.write_text(CONFIG.replace("seeds = [0]", "seeds = [0, 1]").replace("epochs = 2", "epochs = 1"))
    torchrun(cfg, f"out_dir={tmp_path / 'grid'}")
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'single'}"]) == 0
    for seed in (0, 1):
        d = tmp_path / "grid" / "ddp" / "sam" / f"seed{seed}"
        env = json.loads((d / "environment.json").read_text())
        assert env["rank"] == seed and env["world_size"] == 2  # run r of the grid on rank r
        ref = final_weights(tmp_path / "single" / "ddp" / "sam" / f"seed{seed}")
        got = final_weights(d)
        assert all(torch.allclose(got[k], ref[k], rtol=0, atol=1e-12) for k in ref)
