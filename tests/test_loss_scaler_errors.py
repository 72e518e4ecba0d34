"""``optimizers.LossScaler`` refuses settings and loaded states it cannot use (the scaler left
unchanged; scales and factors that are not powers of two, whose unscaling is inexact), stops with
:class:`ScaleUnderflow` instead of skipping forever when the gradients are non-finite at every
scale, stops growing at ``2**127`` with one warning, and refuses a ``forward`` whose return value
it cannot scale or that runs its own backward pass (the weights untouched)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from optimizers import SAM, LossScaler
from optimizers.amp import MAX_SCALE, ScaleUnderflow


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"init_scale": math.nan}, "init_scale"),
        ({"init_scale": math.inf}, "init_scale"),
        ({"init_scale": 0.0}, "init_scale"),
        ({"init_scale": -2.0}, "init_scale"),
        ({"init_scale": 2.0**200}, "init_scale"),
        ({"growth_factor": math.nan}, "growth_factor"),
        ({"growth_factor": math.inf}, "growth_factor"),
        ({"growth_factor": 0.5}, "growth_factor"),
        ({"backoff_factor": math.nan}, "backoff_factor"),
        ({"backoff_factor": 0.0}, "backoff_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"growth_interval": 2.5}, "growth_interval"),
        ({"growth_interval": True}, "growth_interval"),
        ({"enabled": "yes"}, "enabled"),
        ({"min_scale": 0.0}, "min_scale"),
        ({"min_scale": math.nan}, "min_scale"),
        ({"init_scale": 0.5}, "below min_scale"),
        ({"init_scale": 3.0}, r"init_scale must be a power of two \(e.g. 4\), got 3.0"),
        ({"growth_factor": 3.0}, "growth_factor must be a power of two"),
        ({"backoff_factor": 0.3}, r"backoff_factor must be a power of two \(e.g. 0.25\)"),
        ({"enabled": 1}, "enabled must be True or False, got int"),
    ],
)
def test_settings_it_cannot_use_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LossScaler(**kwargs)


GOOD = {"enabled": True, "scale": 1024.0, "good_steps": 3, "skipped": 1}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"scale": math.nan}, "'scale'"),
        ({"scale": math.inf}, "'scale'"),
        ({"scale": 0.0}, "'scale'"),
        ({"scale": 0.25}, "below this scaler's min_scale"),
        ({"good_steps": -1}, "'good_steps'"),
        ({"skipped": 1.5}, "'skipped'"),
        ({"enabled": 1}, "'enabled'"),
        ({"extra": 0}, "expected a dict with keys"),
        ({"scale": 1000.0}, "'scale' must be a power of two"),
    ],
)
def test_a_state_dict_it_cannot_use_is_refused_and_nothing_changes(change, match):
    scaler = LossScaler(init_scale=64.0)
    scaler.update(False)
    before = scaler.state_dict()
    with pytest.raises(ValueError, match=match):
        scaler.load_state_dict({**GOOD, **change})
    with pytest.raises(ValueError, match="expected a dict with keys"):
        scaler.load_state_dict({k: v for k, v in GOOD.items() if k != "skipped"})
    assert scaler.state_dict() == before
    scaler.load_state_dict(GOOD)
    assert scaler.state_dict() == GOOD


def test_gradients_nan_at_every_scale_stop_at_min_scale_with_the_weights_untouched():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    x[0, 0] = math.nan  # a NaN input: NaN gradients whatever the scale
    scaler = LossScaler(init_scale=16.0)  # min_scale 1: 16 -> 8 -> 4 -> 2 -> 1, then stop
    for expected in (8.0, 4.0, 2.0, 1.0):
        assert scaler.step(opt, lambda: nn.functional.cross_entropy(model(x), y)) is None
        assert scaler.scale == expected
    with pytest.raises(ScaleUnderflow, match=r"below min_scale=1 \(5 skipped steps in all\)"):
        scaler.step(opt, lambda: nn.functional.cross_entropy(model(x), y))
    assert scaler.scale == 1.0 and scaler.skipped == 4
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_growth_stops_at_the_ceiling_with_one_warning():
    scaler = LossScaler(init_scale=2.0**126, growth_interval=1)
    scaler.update(False)
    assert scaler.scale == MAX_SCALE == 2.0**127
    with pytest.warns(RuntimeWarning, match="ceiling 2\\*\\*127"):
        scaler.update(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.update(False)  # warned once
    assert scaler.scale == 2.0**127 and math.isfinite(scaler.scale_loss(torch.tensor(1.0)).item())


def test_update_takes_a_bool():
    scaler = LossScaler()
    with pytest.raises(TypeError, match="skipped must be True or False"):
        scaler.update(0)
    assert scaler.state_dict() == LossScaler().state_dict()


def test_a_disabled_scaler_stays_at_one_and_still_validates():
    scaler = LossScaler(enabled=False)
    scaler.update(True)
    assert scaler.scale == 1.0 and scaler.skipped == 0
    with pytest.raises(ValueError, match="backoff_factor"):
        LossScaler(enabled=False, backoff_factor=2.0)


# ---- fresh cases (probe 2) ------------------------------------------------------------------------
def _sam_setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    return model, opt, torch.randn(8, 4), torch.randint(0, 3, (8,))


def _no_grad_loss(model, x, y):
    with torch.no_grad():
        return nn.functional.cross_entropy(model(x), y)


def _own_backward(model, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)  # an unscaled gradient the scaled one would be added to
    return loss


@pytest.mark.parametrize(
    "forward, exc, match",
    [
        (lambda m, x, y: nn.functional.cross_entropy(m(x), y, reduction="none"), ValueError,
         r"forward returned a torch.float32 tensor of shape \[8\].*\.mean\(\)"),
        (lambda m, x, y: float(nn.functional.cross_entropy(m(x), y).detach()), TypeError,
         r"forward returned a float, not a tensor.*not loss.item\(\)"),
        (_no_grad_loss, ValueError, r"does not require grad \(computed under torch.no_grad\(\)"),
        (_own_backward, ValueError, "forward ran a backward pass itself"),
    ],
    ids=["per-example", "float", "no-grad", "own-backward"],
)  # fmt: skip
def test_a_forward_the_scaler_cannot_use_is_named_with_the_weights_untouched(forward, exc, match):
    model, opt, x, y = _sam_setup()
    before = [p.detach().clone() for p in model.parameters()]
    scaler = LossScaler(init_scale=64.0)
    with pytest.raises(exc, match=match):
        scaler.step(opt, lambda: forward(model, x, y))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.step_state == "idle" and scaler.state_dict() == LossScaler(init_scale=64.0).state_dict()


def test_unscale_refuses_a_single_tensor_and_takes_numpy_bools():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 8.0)
    scaler = LossScaler(init_scale=2.0, enabled=np.bool_(True))
    with pytest.raises(
        TypeError, match=r"params must be an iterable of parameters .* got a single tensor; pass \[p\]"
    ):
        scaler.unscale_(p)  # iterating the tensor would give its rows, which have no .grad: no-op
    assert torch.equal(p.grad, torch.full((3,), 8.0))
    assert scaler.unscale_([p]) and torch.equal(p.grad, torch.full((3,), 4.0))
    scaler.update(np.bool_(True))
    assert scaler.scale == 1.0 and scaler.skipped == 1
