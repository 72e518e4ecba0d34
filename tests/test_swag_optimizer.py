"""SWAG is a ``torch.optim.Optimizer``: LR schedulers attach to it and drive the wrapped optimizer."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimizers import SAM, SWAG, f_swag
from tests.references import make_classification_data

DT = torch.float64


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).to(DT)
    x, y = make_classification_data(n=16, d=4, seed=1)
    return model, x, y


def _closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_swag_is_an_optimizer_sharing_the_param_groups():
    model, _, _ = _setup()
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.1), rank=3)
    assert isinstance(swag, torch.optim.Optimizer)
    assert swag.param_groups is swag.optimizer.param_groups
    fs = f_swag(model.parameters(), lr=0.1, rank=3)
    assert isinstance(fs, torch.optim.Optimizer)
    assert fs.param_groups is fs.optimizer.param_groups is fs.optimizer.base_optimizer.param_groups


@pytest.mark.parametrize("wrapped", ["sgd", "sam"])
def test_step_lr_on_swag_halves_the_wrapped_optimizers_lr(wrapped):
    model, x, y = _setup()
    if wrapped == "sgd":
        swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), rank=3)
        inner = swag.optimizer
    else:
        swag = f_swag(model.parameters(), lr=0.2, momentum=0.9, rank=3)
        inner = swag.optimizer.base_optimizer  # the SGD that SAM steps with
    sched = torch.optim.lr_scheduler.StepLR(swag, 1, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "lr_scheduler.step() before optimizer.step()" warning
        swag.step(_closure(swag, model, x, y))
        sched.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(0.1, abs=0)
    swag.step(_closure(swag, model, x, y))
    sched.step()
    assert inner.param_groups[0]["lr"] == 0.05 and swag.n_steps == 2


def test_swag_with_scheduler_equals_base_optimizer_with_scheduler_and_manual_collection():
    steps, start, every, rank = 12, 3, 2, 3
    model, x, y = _setup()
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9), rank=rank, collect_every=every,
                start_step=start)  # fmt: skip
    sched = torch.optim.lr_scheduler.StepLR(swag, 2, 0.7)
    for _ in range(steps):
        swag.step(_closure(swag, model, x, y))
        sched.step()

    ref, x, y = _setup()
    base = torch.optim.SGD(ref.parameters(), lr=0.3, momentum=0.9)
    ref_sched = torch.optim.lr_scheduler.StepLR(base, 2, 0.7)
    collected = []
    for t in range(1, steps + 1):
        base.step(_closure(base, ref, x, y))
        ref_sched.step()
        if t > start and (t - start) % every == 0:
            collected.append(_flat(ref).clone())
    assert torch.equal(_flat(model), _flat(ref))
    assert swag.optimizer.param_groups[0]["lr"] == base.param_groups[0]["lr"]
    it = torch.stack(collected)
    n = len(collected)
    assert swag.n_collected == n == (steps - start) // every
    torch.testing.assert_close(swag.mean, it.mean(0), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(swag.sq_mean, it.square().mean(0), rtol=1e-13, atol=1e-15)
    running = torch.cumsum(it, 0) / torch.arange(1, n + 1, dtype=DT)[:, None]
    torch.testing.assert_close(swag.deviations, (it - running)[-rank:].T, rtol=1e-12, atol=1e-14)


def _build(model):
    opt = f_swag(model.parameters(), lr=0.2, momentum=0.9, rank=3, seed=5)
    return opt, torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)


def test_state_dict_round_trip_mid_training_resumes_bit_exactly():
    model, x, y = _setup()
    opt, sched = _build(model)
    for _ in range(4):
        opt.step(_closure(opt, model, x, y))
        sched.step()
    saved_w = copy.deepcopy(model.state_dict())
    saved_opt, saved_sched = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    for _ in range(5):
        opt.step(_closure(opt, model, x, y))
        sched.step()

    fresh, _, _ = _setup(seed=3)
    fresh.load_state_dict(saved_w)
    opt2, sched2 = _build(fresh)
    opt2.load_state_dict(saved_opt)
    sched2.load_state_dict(saved_sched)
    assert opt2.param_groups is opt2.optimizer.param_groups  # still shared after the load
    for _ in range(5):
        opt2.step(_closure(opt2, fresh, x, y))
        sched2.step()
    assert torch.equal(_flat(fresh), _flat(model))
    assert (
        opt2.optimizer.base_optimizer.param_groups[0]["lr"]
        == opt.optimizer.base_optimizer.param_groups[0]["lr"]
    )
    assert opt2.n_steps == opt.n_steps == 9 and opt2.n_collected == opt.n_collected
    for attr in ("mean", "sq_mean", "deviations"):
        assert torch.equal(getattr(opt2, attr), getattr(opt, attr))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert torch.equal(opt.sample_weights(g1), opt2.sample_weights(g2))


def test_deepcopy_keeps_the_whole_swag():
    model, x, y = _setup()
    swag = SWAG(SAM(model.parameters(), torch.optim.SGD, 0.05, lr=0.1), rank=3)
    torch.optim.lr_scheduler.StepLR(swag, 1, 0.5)
    swag.step(_closure(swag, model, x, y))
    c = copy.deepcopy(swag)
    assert isinstance(c.optimizer, SAM) and c.n_collected == 1 and "step" not in c.__dict__
    assert c.param_groups is c.optimizer.param_groups and c.param_groups is not swag.param_groups
    assert torch.equal(c.mean, swag.mean)
