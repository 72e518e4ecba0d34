"""Per-example gradient moments (optimizers.per_example) against one backward pass per example."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.norms import FilterResponseNorm2d
from optimizers.per_example import (
    PerExampleGradients,
    empirical_fisher_diagonal,
    per_example_moments,
)

B = 6


def _loop(model, params, losses_fn):
    """Reference: one ordinary backward pass per example."""
    losses = losses_fn()
    rows = []
    for i in range(losses.shape[0]):
        gs = torch.autograd.grad(losses[i], params, retain_graph=True, allow_unused=True)
        rows.append([torch.zeros_like(p) if g is None else g for g, p in zip(gs, params)])
    G = [torch.stack([r[j] for r in rows]) for j in range(len(params))]
    norms = torch.cat([g.reshape(len(rows), -1) for g in G], 1).norm(dim=1)
    return [g.sum(0) for g in G], [g.square().sum(0) for g in G], norms


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.mid(torch.tanh(self.mid(torch.tanh(self.inp(x)))))))


class EmbedBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 4, padding_idx=0)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 3)

    def forward(self, idx):
        return self.head(self.norm(self.emb(idx))).sum(1)  # [B, T, 3] -> [B, 3]


def _seq():  # Linear on [B, T, d] (sum over T before squaring) with LayerNorm over the last two dims
    return nn.Sequential(
        nn.Linear(5, 6), nn.LayerNorm([4, 6]), nn.GELU(), nn.Linear(6, 3), nn.Flatten(), nn.Linear(12, 3)
    )


def _cnn2d():
    bn = nn.BatchNorm2d(4)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1, dilation=1),
        bn.eval(),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 6, 3, padding="same", dilation=2, groups=2, padding_mode="reflect"),
        nn.GroupNorm(3, 6),
        nn.Conv2d(6, 4, 2, padding="same", bias=False),  # asymmetric 'same'
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 3),
    )


def _frn():  # the bSAM paper's normalisation (threshold tau; a tie split as autograd splits it)
    frn = FilterResponseNorm2d(4)
    with torch.no_grad():
        frn.weight.uniform_(0.5, 1.5), frn.bias.uniform_(-0.3, 0.3), frn.tau.uniform_(-0.2, 0.2)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), frn, nn.Conv2d(4, 3, 3, stride=2), FilterResponseNorm2d(3, tlu=False),
        nn.Flatten(), nn.Linear(3 * 3 * 3, 3),
    )  # fmt: skip


def _frn_tie():  # gamma 0 and beta = tau: every output a tie, each branch gets half the gradient
    frn = FilterResponseNorm2d(4)
    with torch.no_grad():
        frn.weight.zero_(), frn.bias.fill_(0.25), frn.tau.fill_(0.25)
    return nn.Sequential(nn.Conv2d(2, 4, 3), frn, nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _cnn1d():
    return nn.Sequential(
        nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular"),
        nn.Tanh(),
        nn.Conv1d(4, 4, 2, stride=2, groups=2),
        nn.Flatten(),
        nn.Linear(4 * 5, 3),
    )


CASES = {
    "mlp": (lambda: nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)), (B, 5)),
    "seq": (_seq, (B, 4, 5)),
    "cnn2d": (_cnn2d, (B, 2, 8, 8)),
    "cnn1d": (_cnn1d, (B, 3, 10)),
    "frn": (_frn, (B, 2, 8, 8)),
    "frn_tie": (_frn_tie, (B, 2, 8, 8)),
    "tied": (Tied, (B, 5)),
    "embedding": (EmbedBag, None),
}


def _problem(name, seed=0):
    torch.manual_seed(seed)
    make, shape = CASES[name]
    model = make().double()
    g = torch.Generator().manual_seed(seed)
    x = (
        torch.randint(0, 11, (B, 7), generator=g)
        if shape is None
        else torch.randn(shape, generator=g, dtype=torch.float64)
    )
    if shape is None:
        x[0, :3] = 0  # padding_idx rows get no gradient
        x[1, :] = 5  # one index looked up several times by one example
    y = torch.randint(0, 3, (B,), generator=g)
    return model, x, y


@pytest.mark.parametrize("name", list(CASES))
def test_layer_rules_equal_the_per_example_loop(name):
    model, x, y = _problem(name)
    params = list(model.parameters())
    fn = lambda: F.cross_entropy(model(x), y, reduction="none")  # noqa: E731
    engine = PerExampleGradients(params, model)
    assert engine.method == "layers", engine.reason
    with engine.capture():
        losses = fn()
    got = engine.moments(losses)
    assert got.method == "layers" and engine.verified and engine.method == "layers"
    s, sq, norms = _loop(model, params, fn)
    for a, b in zip(got.sum, s):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(got.sum_sq, sq):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got.norms, norms, rtol=1e-12, atol=1e-14)


class Scaled(nn.Module):  # a custom parametrised layer: no rule
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return x * self.scale


class Centred(nn.Module):  # couples the examples in functional code the module tree cannot show
    def forward(self, x):
        return x - x.mean(0)


FALLBACKS = {
    "batchnorm-train": (
        lambda: nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)),
        "batch statistics",
    ),
    "custom-layer": (
        lambda: nn.Sequential(nn.Linear(5, 8), Scaled(), nn.Tanh(), nn.Linear(8, 3)),
        "no per-example rule",
    ),
    "coupled": (lambda: nn.Sequential(nn.Linear(5, 8), Centred(), nn.Tanh(), nn.Linear(8, 3)), "disagree"),
}


@pytest.mark.parametrize("name", list(FALLBACKS))
def test_models_the_rules_do_not_cover_fall_back_with_the_reason(name):
    make, reason = FALLBACKS[name]
    torch.manual_seed(1)
    model = make().double().train()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(B, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (B,), generator=g)
    params = list(model.parameters())
    fn = lambda: F.cross_entropy(model(x), y, reduction="none")  # noqa: E731
    engine = PerExampleGradients(params, model)
    for _ in range(2):  # the second call runs the chosen method alone
        with engine.capture():
            losses = fn()
        got = engine.moments(losses)
        assert got.method == "batched_backward" and reason in engine.config()["reason"]
        s, sq, norms = _loop(model, params, fn)
        for a, b in zip(got.sum_sq, sq):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(got.norms, norms, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="method='layers' is not possible"):
        engine = PerExampleGradients(params, model, method="layers")
        with engine.capture():
            losses = fn()
        engine.moments(losses)


def test_a_batch_that_is_not_dimension_zero_falls_back():
    torch.manual_seed(2)
    lin = nn.Linear(4, 3).double()
    x = torch.randn(5, 6, 4, dtype=torch.float64)  # [T, B, d]: losses per column
    engine = PerExampleGradients(list(lin.parameters()), lin)
    with engine.capture():
        losses = lin(x).square().sum((0, 2))
    got = engine.moments(losses)
    assert got.method == "batched_backward" and "not dimension 0" in engine.reason
    s, sq, _ = _loop(lin, list(lin.parameters()), lambda: lin(x).square().sum((0, 2)))
    torch.testing.assert_close(got.sum_sq[0], sq[0], rtol=1e-12, atol=1e-14)


def test_empirical_fisher_diagonal_equals_the_landscape_dense_fisher():
    import landscape as ls

    model, x, y = _problem("mlp")
    obj = ls.Objective(model, nn.CrossEntropyLoss(), [(x[:3], y[:3]), (x[3:], y[3:])], dtype=torch.float64)
    dense = ls.empirical_fisher(obj).to_dense().diagonal()
    got = empirical_fisher_diagonal(
        model, nn.CrossEntropyLoss(reduction="none"), [(x[:3], y[:3]), (x[3:], y[3:])]
    )
    torch.testing.assert_close(torch.cat([g.reshape(-1) for g in got]), dense, rtol=1e-12, atol=1e-15)


def test_mean_loss_maps_to_scaled_moments_and_bad_input_is_named():
    model, x, y = _problem("mlp")
    got = per_example_moments(model, lambda: F.cross_entropy(model(x), y, reduction="none"))
    mean = per_example_moments(model, lambda: F.cross_entropy(model(x), y, reduction="none") / B)
    torch.testing.assert_close(mean.sum_sq[0], got.sum_sq[0] / B**2, rtol=1e-13, atol=0)
    torch.testing.assert_close(mean.norms, got.norms / B, rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="per-example losses"):
        per_example_moments(model, lambda: F.cross_entropy(model(x), y))
    with pytest.raises(ValueError, match="method must be one of"):
        PerExampleGradients(list(model.parameters()), model, method="fast")
