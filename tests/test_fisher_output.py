"""Empirical and Monte-Carlo Fisher in output space (``F v = c J^T Lambda J v``) vs dense float64
references built from per-example gradients (tests/references.py), the per-example method, and the
fallback for models whose batch output is not one row per example."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import landscape as ls
from tests import references as ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize(
    "loss, targets, sizes",
    [
        (nn.CrossEntropyLoss(), "labels", [4, 9, 3]),
        (nn.CrossEntropyLoss(reduction="sum"), "labels", [16]),
        (nn.MSELoss(), "real", [7, 9]),
        (nn.BCEWithLogitsLoss(reduction="sum"), "binary", [16]),
    ],
)
def test_output_space_empirical_fisher_matches_dense(loss, targets, sizes):
    model = ref.make_mlp((4, 5, 3), "tanh", seed=1)
    x, y = ref.make_classification_data(16)
    if targets == "real":
        y = _randn(16, 3, seed=2)
    elif targets == "binary":
        y = (_randn(16, 3, seed=3) > 0).double()
    batches = ref.split_batches(x, y, sizes)
    want = ref.dense_empirical_fisher(model, loss, batches, reduction=loss.reduction)
    obj = ls.Objective(model, loss, batches)
    for cache in (True, False):
        op = ls.empirical_fisher(obj, cache=cache)
        V = _randn(obj.num_params, 6, seed=4)
        assert _rel(op @ V, want @ V) <= 1e-12
        assert _rel(op @ V[:, 0], want @ V[:, 0]) <= 1e-12  # the single-vector path
        cfg = op.config()
        assert cfg["method_used"] == "output_space" and cfg["fallback_reason"] is None
        assert all(b.grads is None for b in op._kept or [])  # no per-example gradients kept
    per_example = ls.empirical_fisher(obj, method="per_example")
    assert _rel(per_example.to_dense(), want) <= 1e-12
    assert per_example.config()["method_used"] == "per_example"


@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_output_space_mc_fisher_equals_per_example_and_dense(likelihood):
    model = ref.make_mlp((3, 4, 3), seed=2)
    x, y = ref.make_classification_data(10, d=3)
    loss = nn.CrossEntropyLoss() if likelihood == "categorical" else nn.MSELoss(reduction="sum")
    if likelihood == "gaussian":
        y = _randn(10, 3, seed=5)
    batches = ref.split_batches(x, y, [4, 6])
    S, seed = 4, 3
    obj = ls.Objective(model, loss, batches)
    op = ls.fisher(obj, samples=S, seed=seed)
    pe = ls.fisher(obj, samples=S, seed=seed, method="per_example")
    # independent: the same draws (one generator, batches in order) as S extra copies of the data
    g = torch.Generator().manual_seed(seed)
    augmented = []
    for xb, _ in batches:
        with torch.no_grad():
            out = model(xb)
        if likelihood == "categorical":
            draws = torch.multinomial(torch.softmax(out, 1), S, replacement=True, generator=g).T
        else:
            # MSE is the negative log-likelihood of N(f, 1/2)
            draws = out + 0.5**0.5 * torch.randn((S, *out.shape), generator=g, dtype=torch.float64)
        augmented += [(xb, draws[s]) for s in range(S)]
    dense = ref.dense_empirical_fisher(model, loss, augmented, reduction=loss.reduction)
    if loss.reduction == "sum":
        dense = dense / S
    assert _rel(op.to_dense(), dense) <= 1e-12
    assert _rel(pe.to_dense(), dense) <= 1e-12
    v = _randn(obj.num_params, seed=6)
    assert _rel(op @ v, dense @ v) <= 1e-12
    assert op.config()["method_used"] == "output_space"


class _Centred(nn.Module):
    """Subtracts the batch mean of the hidden layer: row n of the output depends on every example."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ref.make_mlp((4, 5, 3), seed=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.net[0](x)
        return self.net[2](torch.tanh(h - 0.5 * h.mean(dim=0, keepdim=True)))


class _ClassesFirst(nn.Module):
    """Returns ``[C, B]`` logits (the loss transposes them back)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ref.make_mlp((4, 5, 3), seed=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).T


def test_coupled_or_transposed_outputs_fall_back_to_per_example():
    x, y = ref.make_classification_data(8)
    ce = nn.CrossEntropyLoss()
    for model, loss, fragment in (
        (_Centred(), ce, "couples the examples"),
        (_ClassesFirst(), lambda o, t: nn.functional.cross_entropy(o.T, t), "one row per example"),
    ):
        batches = [(x, y)]
        want = ref.dense_empirical_fisher(model, loss, batches)  # each example alone
        op = ls.empirical_fisher(ls.Objective(model, loss, batches))
        assert _rel(op.to_dense(), want) <= 1e-12
        cfg = op.config()
        assert cfg["method_used"] == "per_example" and fragment in cfg["fallback_reason"]


def test_method_is_validated():
    model = ref.make_mlp((4, 5, 3))
    obj = ls.Objective(model, nn.CrossEntropyLoss(), ref.make_classification_data(6))
    with pytest.raises(ValueError, match="method must be one of"):
        ls.empirical_fisher(obj, method="cache")
    with pytest.raises(ValueError, match="method must be one of"):
        ls.fisher(obj, method="dense")
