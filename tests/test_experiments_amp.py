"""Mixed precision in the experiment runner: the loss scaler unscales inside the closure, before the
SAM family computes its perturbation (a power-of-two scale gives bit-identical SAM and Fisher-SAM
steps), overflowing steps are skipped, and bfloat16 / float16 autocast on the CPU stays close to
float32 SAM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn.utils import parameters_to_vector

from experiments import divergence as dv
from experiments.config import load_config
from experiments.train import Trainer
from landscape.models import model_factory
from optimizers.amp import LossScaler
from tests.runner_helpers import cpu_trainer, planned_run

CONFIG = """
name = "amp"
seeds = [0]
device = "cpu"
progress = false
[data]
name = "digits"
[model]
name = "mlp"
kwargs = { sizes = [64, 12, 10], activation = "tanh" }
[train]
epochs = 2
batch_size = 256
lr = 0.2
schedule = "constant"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05, momentum = 0.9 }
[[methods]]
name = "fsam"
optimizer = "fsam"
hyperparameters = { rho = 0.1, eta = 1.0, momentum = 0.9 }
[evaluation]
every = 0
sharpness = []
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def trainer(tmp: Path, method: str, *overrides: str) -> Trainer:
    path = tmp / "amp.toml"
    path.write_text(CONFIG)
    cfg = load_config(path, [f"out_dir={tmp / 'runs' / '_'.join((method, *overrides))}", *overrides])
    return cpu_trainer(planned_run(cfg, method), seed=0)


def weights(t: Trainer) -> torch.Tensor:
    return parameters_to_vector(t.model.parameters()).detach().clone()


@pytest.mark.parametrize("method", ["sam", "fsam"])
def test_power_of_two_loss_scale_gives_bit_identical_two_pass_steps(tmp_path, method):
    plain = trainer(tmp_path, method)
    plain.fit()
    scaled = trainer(tmp_path, method, "seeds=[0]")  # same run, another directory
    scaled.scaler = LossScaler(enabled=True, init_scale=2.0**12)
    scaled.fit()
    # Fisher-SAM's eps depends on the gradient's scale (F = 1 + eta g^2): an unscaled gradient at w
    # would change every step; the closure unscales before the optimizer sees it
    assert torch.equal(weights(plain), weights(scaled))
    assert scaled.scaler.scale == 2.0**12 and scaled.counters["skipped"] == 0


def test_overflowing_steps_are_skipped_and_the_scale_lowered(tmp_path):
    t = trainer(tmp_path, "sam")

    class Overflowing(LossScaler):
        def scale_loss(self, loss):  # 2**20 times the scale: beyond float32, every gradient is inf
            return loss * (self.scale * 2.0**20)

    t.scaler = Overflowing(enabled=True, init_scale=2.0**120)
    before = weights(t)
    t.fit()
    steps = t.counters["step"]
    assert steps == 12 and t.counters["skipped"] == steps
    assert torch.equal(weights(t), before)  # parameters restored by the optimizer, no update
    assert len(t.inner.base_optimizer.state) == 0  # no momentum buffer was created
    assert t.scaler.scale == 2.0 ** (120 - steps)
    assert [r["skipped_steps"] for r in t.history] == [6, 6]


def test_gradients_non_finite_at_every_scale_record_the_run_as_diverged(tmp_path):
    """A scale that would fall below min_scale (every gradient inf at 4, 2 and 1) stops the run as
    diverged with reason "non-finite gradient" at the step that tripped it, the weights untouched."""
    t = trainer(tmp_path, "sam")

    class Overflowing(LossScaler):
        def scale_loss(self, loss):
            return loss * (self.scale * 2.0**200)

    t.scaler = Overflowing(enabled=True, init_scale=4.0)
    before = weights(t)
    with pytest.raises(dv.Diverged, match="non-finite gradient at step 3") as err:
        t.fit()
    assert err.value.record.reason == dv.NONFINITE_GRADIENT and "below min_scale=1" in err.value.record.detail
    assert t.scaler.scale == 1.0 and t.scaler.skipped == 2
    assert torch.equal(weights(t), before)


def test_loss_scaler_grows_and_backs_off_like_grad_scaler():
    s = LossScaler(init_scale=8.0, growth_interval=3)
    for _ in range(3):
        s.update(skipped=False)
    assert s.scale == 16.0 and s.good_steps == 0
    s.update(skipped=False)
    s.update(skipped=True)
    assert s.scale == 8.0 and s.good_steps == 0 and s.skipped == 1
    s2 = LossScaler()
    s2.load_state_dict(s.state_dict())
    assert s2.state_dict() == s.state_dict()
    off = LossScaler(enabled=False)
    loss = torch.tensor(1.5)
    assert off.scale_loss(loss) is loss and off.scale == 1.0


@pytest.mark.parametrize(("precision", "tol"), [("bf16", 1e-2), ("fp16", 2e-3)])
def test_cpu_autocast_sam_stays_close_to_float32_sam(tmp_path, precision, tol):
    """12 SAM steps: ||w_amp - w_32|| <= tol ||w_32 - w_0||. bfloat16 keeps 8 significant bits
    (unit roundoff 2^-9 ~ 2e-3); the observed relative deviation is ~1e-3 (bf16) and ~2e-4 (fp16)."""
    w0 = parameters_to_vector(
        model_factory("mlp", sizes=[64, 12, 10], activation="tanh", seed=0).parameters()
    )
    ref = trainer(tmp_path, "sam")
    ref.fit()
    amp = trainer(tmp_path, "sam", f"precision={precision}")
    amp.fit()
    assert next(amp.model.parameters()).dtype == torch.float32  # autocast keeps float32 master weights
    dev = float((weights(amp) - weights(ref)).norm() / (weights(ref) - w0.detach()).norm())
    assert 0.0 < dev <= tol  # > 0: the forward pass really ran in reduced precision
    assert amp.scaler.enabled == (precision == "fp16")


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_bfloat16_instructions_warns_once_per_run(tmp_path, monkeypatch, native):
    """The runner says why a bf16 run on such a CPU is slow and what to set instead; a CPU with
    bfloat16 instructions, float32 / fp16 and a CUDA device get no warning."""
    import warnings

    from experiments import amp

    monkeypatch.setattr(amp, "_native_cpu_bfloat16", lambda: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, "sam", "precision=bf16")
        trainer(tmp_path, "sam", "precision=float32")
    slow = [w for w in caught if "bfloat16 instructions" in str(w.message)]
    assert len(slow) == (0 if native else 1)
    if slow:
        assert issubclass(slow[0].category, RuntimeWarning)
        assert torch.backends.cpu.get_cpu_capability() in str(slow[0].message)
        assert 'set precision = "float32"' in str(slow[0].message)
    cuda = torch.device("cuda")
    assert amp.slow_autocast_warning("bf16", cuda) is None
    assert amp.slow_autocast_warning("fp16", torch.device("cpu")) is None
