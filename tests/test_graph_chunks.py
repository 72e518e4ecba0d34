"""The cached Hessian graph split into sub-graphs over the examples (``graph_chunks``): products equal
to the dense float64 Hessian, and no split where the examples' losses do not add up."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature import graph_split
from tests.references import dense_hessian


@pytest.fixture(autouse=True)
def small_subgraphs_split(monkeypatch, request):
    """The nets here are small: their sub-graphs are under ``MIN_SUBGRAPH_BYTES``, which the
    ``"auto"`` rule would keep whole; the splitting itself is what these tests check (except the
    test of that size rule, marked ``real_size_rule``)."""
    if "real_size_rule" not in request.keywords:
        monkeypatch.setattr(graph_split, "MIN_SUBGRAPH_BYTES", 0)


def _conv_net(seed: int = 0) -> nn.Module:
    """Few parameters, activations that outweigh them: what ``graph_chunks="auto"`` splits."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(144, 3)
    ).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def _data(n: int = 100, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _probes(p: int, k: int = 2) -> torch.Tensor:
    return torch.randn(p, k, generator=torch.Generator().manual_seed(7), dtype=torch.float64)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunks", ["auto", 3, 7])
def test_split_graph_products_equal_the_dense_hessian(chunks, reduction):
    model, (x, y) = _conv_net(), _data()
    loss_fn = nn.CrossEntropyLoss(reduction=reduction)
    obj = ls.Objective(model, loss_fn, (x, y))
    op = ls.hessian(obj, graph_chunks=chunks)
    V = _probes(obj.num_params)
    H = dense_hessian(model, loss_fn, [(x, y)], reduction=reduction)
    torch.testing.assert_close(op @ V, H @ V, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(op @ V[:, 0], H @ V[:, 0], rtol=1e-10, atol=1e-12)  # cached again
    cfg = op.config()
    assert cfg["graph_chunks_used"] == (4 if chunks == "auto" else chunks)  # auto: min(4, 100 // 16)
    assert cfg["graph_chunks_reason"] is None


def test_class_weighted_mean_couples_the_examples():
    """``CrossEntropyLoss(weight=c)`` divides by the batch's summed class weights: not a sum over
    examples with weights |c|/n, so splitting would be wrong; the loss check catches it."""
    model, (x, y) = _conv_net(), _data()
    loss_fn = nn.CrossEntropyLoss(weight=torch.tensor([0.2, 1.0, 3.0], dtype=torch.float64))
    obj = ls.Objective(model, loss_fn, (x, y))
    H = dense_hessian(model, loss_fn, [(x, y)])
    V = _probes(obj.num_params)
    op = ls.hessian(obj)  # auto: falls back to one graph, and says why
    torch.testing.assert_close(op @ V, H @ V, rtol=1e-10, atol=1e-12)
    assert op.config()["graph_chunks_used"] == 1
    assert "couples the examples" in op.config()["graph_chunks_reason"]
    with pytest.raises(ValueError, match=r"graph_chunks=3: .*couples the examples.*use graph_chunks=1"):
        ls.hessian(obj, graph_chunks=3) @ V


def test_batch_statistics_and_random_forwards_are_never_split():
    model, (x, y) = _conv_net(), _data()
    train_obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y), mode="train")
    op = ls.hessian(train_obj)
    op @ _probes(train_obj.num_params)
    assert op.config()["graph_chunks_used"] == 1 and "batch statistics" in op.config()["graph_chunks_reason"]
    with pytest.raises(ValueError, match="batch statistics.*use graph_chunks=1"):
        ls.hessian(train_obj, graph_chunks=2) @ _probes(train_obj.num_params)

    drop = nn.Sequential(nn.Flatten(), nn.Linear(36, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 3))
    drop = drop.double()
    rnd = ls.Objective(drop, nn.CrossEntropyLoss(), (x, y), mode="train", stochastic="fixed", seed=0)
    op = ls.hessian(rnd)
    V = _probes(rnd.num_params)
    # one graph: the products of the fixed-mask objective itself (an uncached graph per product)
    torch.testing.assert_close(op @ V, ls.hessian(rnd, cache_graph=False) @ V, rtol=1e-12, atol=1e-14)
    assert op.config()["graph_chunks_used"] == 1 and "random numbers" in op.config()["graph_chunks_reason"]


def test_small_batches_and_parameter_heavy_models_keep_one_graph():
    model, (x, y) = _conv_net(), _data(n=24)
    op = ls.hessian(ls.Objective(model, nn.CrossEntropyLoss(), (x, y)))
    op @ _probes(op.shape[0])
    assert op.config()["graph_chunks_used"] == 1 and "24 examples" in op.config()["graph_chunks_reason"]

    wide = nn.Sequential(nn.Flatten(), nn.Linear(36, 256), nn.Tanh(), nn.Linear(256, 3)).double()
    x2, y2 = _data(n=128)
    op = ls.hessian(ls.Objective(wide, nn.CrossEntropyLoss(), (x2, y2)))
    op @ _probes(op.shape[0])
    cfg = op.config()
    assert cfg["graph_chunks_used"] == 1 and "small against the parameters" in cfg["graph_chunks_reason"]


def _saved_bytes_of_first_quarter(model, x, y) -> int:
    """What autograd saves for the gradient graph of the first of 4 sub-batches (weights included),
    counted independently of graph_split: every distinct storage the graph holds."""
    leaves = [p.detach().requires_grad_(True) for p in model.parameters()]
    names = [n for n, _ in model.named_parameters()]
    held: dict[int, int] = {}

    def pack(t):
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    q = x.shape[0] // 4
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = torch.func.functional_call(model, dict(zip(names, leaves)), (x[:q],))
        loss = nn.functional.cross_entropy(out, y[:q]) * q / x.shape[0]
        torch.autograd.grad(loss, leaves, create_graph=True)
    return sum(held.values())


@pytest.mark.real_size_rule
def test_sub_graphs_under_the_size_threshold_keep_one_graph(monkeypatch):
    """``"auto"`` keeps one graph when the first sub-graph would save less than MIN_SUBGRAPH_BYTES
        (1 MiB, the saved bytes counted here on their own) and splits the same batch once the threshold
    is below that; the products equal the dense
        Hessian either way."""
    model, (x, y) = _conv_net(), _data()
    saved = _saved_bytes_of_first_quarter(model, x, y)
    assert saved < graph_split.MIN_SUBGRAPH_BYTES == 2**20
    obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y))
    H = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    V = _probes(obj.num_params)
    op = ls.hessian(obj)
    torch.testing.assert_close(op @ V, H @ V, rtol=1e-10, atol=1e-12)
    cfg = op.config()
    assert cfg["graph_chunks_used"] == 1
    assert f"would save {saved / 2**20:.2f} MB, under 1 MB" in cfg["graph_chunks_reason"]
    monkeypatch.setattr(graph_split, "MIN_SUBGRAPH_BYTES", saved // 2)  # below the sub-graph: split
    op = ls.hessian(obj)
    torch.testing.assert_close(op @ V, H @ V, rtol=1e-10, atol=1e-12)
    assert op.config()["graph_chunks_used"] == 4 and op.config()["graph_chunks_reason"] is None


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "four"])
def test_bad_graph_chunks_values_are_refused(bad):
    model, (x, y) = _conv_net(), _data()
    with pytest.raises(ValueError, match="graph_chunks must be 'auto' or a positive int"):
        ls.hessian(ls.Objective(model, nn.CrossEntropyLoss(), (x, y)), graph_chunks=bad)


class _PairMaskNet(nn.Module):
    """Takes a second input that is not batch-first (a [6, 6] mask): sub-batches cannot be sliced."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(144, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x * mask)).flatten(1))


def test_inputs_that_are_not_batch_first_keep_one_graph():
    torch.manual_seed(0)
    model = _PairMaskNet().double()
    x, y = _data()
    mask = (torch.arange(36).reshape(6, 6) % 3 != 0).double()
    obj = ls.Objective(model, nn.CrossEntropyLoss(), ((x, mask), y))
    op = ls.hessian(obj)
    V = _probes(obj.num_params)
    out = op @ V
    torch.testing.assert_close(out, ls.hessian(obj, cache_graph=False) @ V, rtol=1e-10, atol=1e-12)
    assert op.config()["graph_chunks_used"] == 1 and "sub-batch failed" in op.config()["graph_chunks_reason"]
