"""``train.compile``: the runner's compiled training step moves the weights as the eager step does,
within float32 rounding, for SGD, SAM (m = 1 and the sub-batch loop with m = 2) and bSAM; refused
where it cannot differentiate twice.

The reference is the same Trainer with ``train.compile = "off"`` (the eager closure and update),
from the same seed, data order and initial weights.
"""

from __future__ import annotations

import pytest
import torch

from experiments.config import ConfigError, resolve_config
from experiments.train import Trainer
from tests.runner_helpers import cpu_trainer, planned_run

METHODS = {
    "sgd": {"optimizer": "sgd"},
    "sam": {"optimizer": "sam", "hyperparameters": {"rho": 0.05}},
    "sam-m2-loop": {"optimizer": "sam", "hyperparameters": {"rho": 0.05, "m": 2, "batched_m": False}},
    "bsam": {"optimizer": "bsam", "hyperparameters": {"lr": 0.5, "rho": 0.01, "prior_precision": 1.0}},
}


def _trainer(tmp_path, method: dict, compile_mode: str, **train) -> Trainer:
    raw = {
        "name": "compiled",
        "seeds": [0],
        "device": "cpu",
        "progress": False,
        "precision": "float32",
        "out_dir": str(tmp_path),
        "data": {"name": "digits", "limit_train": 192},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 32, 10], "activation": "tanh"}},
        "train": {
            "epochs": 1,
            "batch_size": 64,
            "lr": 0.05,
            "schedule": "constant",
            "drop_last": True,
            "compile": compile_mode,
            "optimizer_defaults": {"momentum": 0.9},
            **train,
        },
        "methods": [{"name": "m", **method}],
        "evaluation": {"every": 0, "sharpness": []},
    }
    run = planned_run(resolve_config(raw))
    run_dir = tmp_path / f"{compile_mode}-{method['optimizer']}"
    return cpu_trainer(run, run_dir, seed=0)


@pytest.mark.parametrize("key", list(METHODS))
def test_compiled_step_equals_eager_within_float32_rounding(tmp_path, key):
    torch._dynamo.reset()
    eager = _trainer(tmp_path, METHODS[key], "off")
    compiled = _trainer(tmp_path, METHODS[key], "default")
    assert compiled.forward is not compiled.model  # the compiled callable drives the closure
    for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
        assert torch.equal(a, b)  # same initial weights
    initial = [p.detach().clone() for p in eager.model.parameters()]
    for _ in range(2):  # 2 epochs x 3 steps
        eager._train_epoch(0)
        compiled._train_epoch(0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # compiled code did run
    moved = max(float((a.detach() - a0).abs().max()) for a, a0 in zip(eager.model.parameters(), initial))
    assert moved > 1e-3  # the steps did move the weights
    for a, b in zip(eager.model.parameters(), compiled.model.parameters()):
        torch.testing.assert_close(b, a, rtol=2e-5, atol=2e-6)
    # the module the checkpoint saves is the eager one: no "_orig_mod." prefixes
    assert set(compiled.model.state_dict()) == set(eager.model.state_dict())


def test_compile_is_refused_with_double_backward(tmp_path):
    method = {"optimizer": "gtracer", "hyperparameters": {"hvp": "exact"}}
    with pytest.raises(ConfigError, match=r'train.compile = "default" cannot differentiate twice'):
        _trainer(tmp_path, method, "default")


def test_unknown_compile_mode_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="train.compile"):
        _trainer(tmp_path, METHODS["sgd"], "fast")
