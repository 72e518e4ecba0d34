"""VOGN with the one-backward per-example moments equals VOGN with the batched per-example Jacobian
(the implementation before issue 41) to 1e-12 in float64, on an MLP, a CNN and models that need the
batched path (a train-mode BatchNorm, a custom parametrised layer)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.lenet import LeNet5
from optimizers.bayes.vogn import VOGN


class Scaled(nn.Module):
    """A parametrised layer without a per-example rule."""

    def __init__(self, n: int):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * self.scale


def _model(kind: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3)), torch.randn(10, 6, generator=g)
    if kind == "cnn":
        return LeNet5(1, 3, input_size=8), torch.randn(10, 1, 8, 8, generator=g)
    if kind == "batchnorm":
        net = nn.Sequential(nn.Linear(6, 9), nn.BatchNorm1d(9), nn.Tanh(), nn.Linear(9, 3))
        return net, torch.randn(10, 6, generator=g)
    net = nn.Sequential(nn.Linear(6, 9), Scaled(9), nn.Tanh(), nn.Linear(9, 3))
    return net, torch.randn(10, 6, generator=g)


@pytest.mark.parametrize(
    "kind, method",
    [("mlp", "layers"), ("cnn", "layers"), ("batchnorm", "batched_backward"), ("custom", "batched_backward")],
)
def test_vogn_steps_equal_the_batched_jacobian_implementation(kind, method):
    runs = []
    for per_example in ("auto", "batched_backward"):
        model, x = _model(kind)
        model = model.double().train()
        x = x.double()
        y = torch.arange(x.shape[0]) % 3
        opt = VOGN(
            model.parameters(),
            lr=0.05,
            num_data=40,
            mc_samples=2,
            seed=3,
            model=model,
            per_example=per_example,
        )
        for _ in range(3):
            opt.step(lambda m=model, x=x, y=y: F.cross_entropy(m(x), y, reduction="none"))
        state = [
            torch.cat([opt.state[p][k].reshape(-1) for p in model.parameters()]) for k in ("s", "momentum")
        ]
        runs.append((torch.cat([p.detach().reshape(-1) for p in model.parameters()]), *state))
        if per_example == "auto":
            cfg = opt.per_example.config()
            assert cfg["method"] == method, cfg
            assert (cfg["reason"] == "") == (method == "layers")
    for new, old in zip(*runs):
        torch.testing.assert_close(new, old, rtol=1e-12, atol=1e-12)
    assert not torch.equal(runs[0][1], torch.ones_like(runs[0][1]))  # s moved


def test_vogn_per_example_option_is_checked():
    model, _ = _model("mlp")
    with pytest.raises(ValueError, match="per_example must be"):
        VOGN(model.parameters(), lr=0.1, num_data=10, model=model, per_example="fast")
    model, x = _model("custom")
    opt = VOGN(model.parameters(), lr=0.1, num_data=10, model=model, per_example="layers")
    with pytest.raises(ValueError, match="method='layers' is not possible for this model: 1: Scaled"):
        opt.step(lambda: F.cross_entropy(model(x), torch.zeros(10, dtype=torch.long), reduction="none"))
