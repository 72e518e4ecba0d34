"""SWAG's collection schedules: the per-step default against the paper's once-per-epoch rule."""

import torch
import torch.nn.functional as F
from torch import nn

from optimizers.bayes.swag import SWAG
from tests.references import make_classification_data

DT = torch.float64


def _run(epochs: int, steps_per_epoch: int, **kw):
    torch.manual_seed(0)
    model = nn.Linear(4, 3).to(DT)
    x, y = make_classification_data(n=12, d=4, seed=1)
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.3), rank=3, **kw)
    iterates = []

    def closure():
        swag.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(epochs):
        for _ in range(steps_per_epoch):
            swag.step(closure)
            iterates.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
        swag.on_epoch_end()
    return swag, torch.stack(iterates)


def test_default_collects_after_every_step():
    swag, it = _run(3, 4)
    assert swag.config["collect"] == "step" and swag.n_collected == swag.n_steps == 12
    torch.testing.assert_close(swag.mean, it.mean(0), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(swag.sq_mean, it.square().mean(0), rtol=1e-13, atol=1e-15)
    # the deviations are those of the last 3 steps, against the running mean at each step
    running = torch.cumsum(it, 0) / torch.arange(1, 13, dtype=DT)[:, None]
    torch.testing.assert_close(swag.deviations, (it - running)[-3:].T, rtol=1e-12, atol=1e-14)


def test_per_epoch_rule_equals_steps_per_epoch_collection():
    # the paper's schedule (collect="epoch", start_epoch) and the step rule at one collection per
    # epoch (what the experiments runner builds) collect the same iterates: identical moments
    s, e0 = 4, 2
    by_epoch, it = _run(6, s, collect="epoch", start_epoch=e0)
    by_step, it2 = _run(6, s, collect_every=s, start_step=e0 * s)
    assert torch.equal(it, it2) and by_epoch.n_collected == by_step.n_collected == 4
    ends = it[s - 1 :: s][e0:]  # weights at the end of epochs 3..6
    torch.testing.assert_close(by_epoch.mean, ends.mean(0), rtol=1e-13, atol=1e-15)
    for attr in ("mean", "sq_mean", "deviations"):
        assert torch.equal(getattr(by_epoch, attr), getattr(by_step, attr))
