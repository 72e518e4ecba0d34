"""The single-vector paths (``k = 1``: no vmap, per-parameter results written into one flat vector
and added in place over batches) of the GGN and Hessian operators vs dense float64 references."""

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


def _problem():
    model = ref.UnusedParamNet(d_in=4, d_hidden=5, d_out=3, seed=2)
    x, y = ref.make_classification_data(14)
    return model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [3, 6, 5])


@pytest.mark.parametrize("jvp", ["forward", "linearize", "double_vjp"])
@pytest.mark.parametrize("cache", [True, False])
def test_ggn_single_vector_matches_dense(jvp, cache):
    model, loss, batches = _problem()
    want = ref.dense_ggn(model, loss, batches)
    op = ls.ggn(ls.Objective(model, loss, batches), jvp=jvp, cache=cache)
    for seed in (1, 2):  # the second product runs on the recorded jvp mode (and cached graphs)
        v = _randn(op.shape[0], seed=seed)
        got = op @ v
        assert got.shape == v.shape
        assert _rel(got, want @ v) <= 1e-12
    assert op.config()["jvp_used"] == jvp
    assert op.matvecs == 2


def test_ggn_single_vector_on_a_subset_with_an_unused_parameter():
    model, loss, batches = _problem()
    names = ["fc1.weight", "unused", "fc2.bias"]
    want = ref.dense_ggn(model, loss, batches, names=names)
    op = ls.ggn(ls.Objective(model, loss, batches, params=names))
    v = _randn(op.shape[0], seed=3)
    got = op @ v
    assert _rel(got, want @ v) <= 1e-12
    order = ref.param_names(model, names)
    sizes = dict(model.named_parameters())
    start = sum(sizes[n].numel() for n in order[: order.index("unused")])
    assert torch.equal(got[start : start + 4], torch.zeros(4, dtype=torch.float64))


@pytest.mark.parametrize("engine", ["double_backward", "forward_over_reverse"])
@pytest.mark.parametrize("cache_graph", [True, False])
def test_hessian_single_vector_matches_dense(engine, cache_graph):
    model, loss, batches = _problem()
    names = ["fc1.weight", "unused", "fc2.weight", "fc2.bias"]
    want = ref.dense_hessian(model, loss, batches, names=names)
    op = ls.hessian(ls.Objective(model, loss, batches, params=names), engine=engine, cache_graph=cache_graph)
    for seed in (4, 5):
        v = _randn(op.shape[0], seed=seed)
        assert _rel(op @ v, want @ v) <= 1e-12
    V = _randn(op.shape[0], 3, seed=6)  # a block: uncached, the last column's backward frees the graph
    assert _rel(op @ V, want @ V) <= 1e-12
    # the point is held once: the engines are the operator's own products (no second object)
    assert op.engine == engine and op.engine_used == engine


@pytest.mark.parametrize("batch, kept", [(4, True), (14, False)])
def test_auto_cache_keeps_the_graph_only_when_it_costs_at_most_a_parameter_vector(batch, kept):
    """4-6-3 tanh MLP, float64: the graph saves only tanh's output (``B x 6`` entries; the input, the
    weights and the second layer's input -- tanh's output again -- exist anyway or are shared),
    against ``p = 51`` parameters: kept for ``B = 4`` (192 <= 408 bytes), rebuilt for ``B = 14``."""
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(batch)
    loss = nn.CrossEntropyLoss()
    want = ref.dense_ggn(model, loss, [(x, y)])
    op = ls.ggn(ls.Objective(model, loss, (x, y)))
    for seed in (6, 7):
        v = _randn(op.shape[0], seed=seed)
        assert _rel(op @ v, want @ v) <= 1e-12
    V = _randn(op.shape[0], 4, seed=8)
    assert _rel(op @ V, want @ V) <= 1e-12
    cfg = op.config()
    assert cfg["graph_saved_bytes"] == batch * 6 * 8
    assert cfg["graph_cached"] is kept
    assert (op._kept[0].graph is not None) is kept
