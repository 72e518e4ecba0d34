"""``optimizers.LossScaler``: a scaled float32 step equals the unscaled one bit for bit (the scale is a
power of two), an overflow skips the step with the weights untouched and halves the scale, and
m-sharpness gets ``forward(chunk)``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimizers import SAM, BayesianSAM, LossScaler, SkipStep
from optimizers.perturbation import make_closure


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))


def _data(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(32, 8, generator=g), torch.randint(0, 3, (32,), generator=g)


MAKERS = {
    "sam": lambda ps, m=1: SAM(ps, torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, m=m),
    "bsam": lambda ps, m=1: BayesianSAM(ps, lr=0.1, num_data=64, rho=0.05, seed=2, m=m),
}


@pytest.mark.parametrize("method", list(MAKERS))
def test_scaled_float32_step_equals_the_unscaled_step(method):
    a, b = _net(), _net()
    opt_a, opt_b = MAKERS[method](a.parameters()), MAKERS[method](b.parameters())
    scaler = LossScaler(init_scale=2.0**16)
    loss_fn = nn.CrossEntropyLoss()
    for t in range(3):
        x, y = _data(t)
        ref = opt_a.step(make_closure(opt_a, a, loss_fn, x, y))
        got = scaler.step(opt_b, lambda x=x, y=y: loss_fn(b(x), y))
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(ref))
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert scaler.scale == 2.0**16 and scaler.good_steps == 3 and scaler.skipped == 0


def test_overflow_skips_the_step_and_halves_the_scale():
    model = _net()
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    scaler = LossScaler(init_scale=2.0**24)
    x, y = _data()
    before = [p.detach().clone() for p in model.parameters()]

    def forward():
        with torch.autocast("cpu", dtype=torch.float16):  # float16 gradients overflow at 2^24
            return nn.CrossEntropyLoss()(model(x) * 1e3, y)

    assert scaler.step(opt, forward) is None
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert scaler.scale == 2.0**23 and scaler.skipped == 1
    assert not opt.base_optimizer.state  # no momentum buffer: the base optimizer never stepped
    with pytest.raises(SkipStep, match="overflow at loss scale"):
        scaler.scale_loss(forward()).backward()
        scaler.unscale_(list(model.parameters()))


def test_m_sharpness_gets_the_sub_batch_index():
    a, b = _net(), _net()
    opt_a, opt_b = MAKERS["sam"](a.parameters(), m=4), MAKERS["sam"](b.parameters(), m=4)
    x, y = _data()
    xs, ys = torch.tensor_split(x, 4), torch.tensor_split(y, 4)
    loss_fn = nn.CrossEntropyLoss()
    opt_a.step(make_closure(opt_a, a, loss_fn, x, y))
    LossScaler().step(opt_b, lambda k: loss_fn(b(xs[k]), ys[k]))
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6)  # batched (vmap) path vs this loop
    with pytest.raises(TypeError, match="forward must accept a sub-batch index"):
        LossScaler().step(opt_b, lambda: loss_fn(b(x), y))
