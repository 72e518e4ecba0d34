"""The runner's lean step pieces against what they replace: ``foreach`` base optimizers (bit-identical
updates) and :class:`experiments.schedules.FactorSchedule` (``LambdaLR``'s rates and checkpoints)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from experiments.methods import prefer_foreach
from experiments.schedules import FactorSchedule
from optimizers import SAM

BASES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2),
    "sam_sgd": lambda ps: SAM(ps, torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9),
}


def _steps(opt, model, steps: int = 4) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)

        def closure(x=x, y=y):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)


@pytest.mark.parametrize("name", sorted(BASES))
def test_prefer_foreach_gives_bit_identical_updates(name: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    twin = copy.deepcopy(model)
    fast, plain = BASES[name](model.parameters()), BASES[name](twin.parameters())
    prefer_foreach(fast)
    inner = getattr(fast, "base_optimizer", fast)
    assert all(group["foreach"] is True for group in inner.param_groups)
    assert all(group["foreach"] is None for group in getattr(plain, "base_optimizer", plain).param_groups)
    _steps(fast, model)
    _steps(plain, twin)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_prefer_foreach_leaves_explicit_choices_alone() -> None:
    ps = [nn.Parameter(torch.ones(3))]
    off = torch.optim.SGD(ps, lr=0.1, foreach=False)
    prefer_foreach(off)
    assert off.param_groups[0]["foreach"] is False


def test_factor_schedule_equals_lambda_lr_and_loads_its_checkpoint() -> None:
    def factor(t: int) -> float:
        return 0.5 * (1 + torch.cos(torch.tensor(torch.pi * t / 10)).item()) * min(1.0, (t + 1) / 3)

    ps_a, ps_b = [nn.Parameter(torch.ones(2))], [nn.Parameter(torch.ones(2))]
    opt_a = torch.optim.SGD([{"params": ps_a, "lr": 0.1}], lr=0.1)
    opt_b = torch.optim.SGD([{"params": ps_b, "lr": 0.1}], lr=0.1)
    ours, ref = FactorSchedule(opt_a, factor), torch.optim.lr_scheduler.LambdaLR(opt_b, factor)
    for _ in range(12):
        assert opt_a.param_groups[0]["lr"] == opt_b.param_groups[0]["lr"]  # the same products
        assert ours.get_last_lr() == ref.get_last_lr()
        opt_a.step()
        opt_b.step()
        ours.step()
        ref.step()
    assert opt_a.param_groups[0]["initial_lr"] == opt_b.param_groups[0]["initial_lr"] == 0.1
    # a LambdaLR checkpoint (the runner's format before) resumes at the same step and rates
    resumed_opt = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)
    resumed_opt.load_state_dict(opt_b.state_dict())
    resumed = FactorSchedule(resumed_opt, factor)
    resumed.load_state_dict(ref.state_dict())
    assert resumed.last_epoch == ref.last_epoch == 12
    resumed.step()
    ref.step()
    assert resumed_opt.param_groups[0]["lr"] == opt_b.param_groups[0]["lr"]
    assert set(ours.state_dict()) <= set(ref.state_dict())
