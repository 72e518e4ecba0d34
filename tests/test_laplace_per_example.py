"""DiagLaplace's GGN diagonal through ``optimizers.per_example`` (one backward pass per batch) equals
the ``vmap(jacrev)`` Jacobian form and the dense GGN's diagonal (``tests.references.dense_ggn``) in
float64 to 1e-12, with the layer rules and with the batched-backward fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimizers.bayes.laplace import DiagLaplace
from tests.references import dense_ggn, make_classification_data, make_cnn_bn, make_mlp, split_batches


class _Scaled(nn.Module):
    """An MLP whose hidden activation is a parameter-free functional op of a parameter outside any
    layer rule (``alpha``): the per-example engine falls back to the batched backward."""

    def __init__(self):
        super().__init__()
        self.net = make_mlp((4, 5, 3), seed=0)
        self.alpha = nn.Parameter(torch.tensor(1.3, dtype=torch.float64))

    def forward(self, x):
        return self.net(x) * self.alpha


def _case(kind: str):
    if kind == "cnn":
        model = make_cnn_bn(in_channels=1, n_classes=3, seed=0).eval()
        x, y = make_classification_data(n=12, n_classes=3, seed=2, image=True)
        return model, nn.CrossEntropyLoss(), x, y
    if kind == "bce":
        x, y = make_classification_data(n=14, d=4, n_classes=2, seed=1)
        return make_mlp((4, 5, 1), seed=0), nn.BCEWithLogitsLoss(), x, y.to(torch.float64).reshape(-1, 1)
    x, y = make_classification_data(n=14, d=4, n_classes=3, seed=1)
    model = _Scaled() if kind == "fallback" else make_mlp((4, 5, 3), seed=0)
    return model, nn.CrossEntropyLoss(), x, y


@pytest.mark.parametrize(
    ("kind", "method"),
    [("mlp", "layers"), ("bce", "layers"), ("cnn", "layers"), ("fallback", "batched_backward")],
)
@pytest.mark.parametrize("chunk_size", [None, 5])
def test_per_example_diagonal_equals_jacobian_and_dense(kind, method, chunk_size):
    model, loss, x, y = _case(kind)
    data = split_batches(x, y, [6, len(y) - 6])
    fast = DiagLaplace(model, loss, data, chunk_size=chunk_size)
    ref = DiagLaplace(model, loss, data, chunk_size=chunk_size, curvature="jacobian")
    assert fast.config["curvature"] == "per_example"
    assert fast.config["per_example"]["method"] == method
    torch.testing.assert_close(fast.ggn_diagonal, ref.ggn_diagonal, rtol=1e-12, atol=1e-14)
    assert fast.nll == pytest.approx(ref.nll, rel=1e-14)
    sum_loss = type(loss)(reduction="sum")
    G = dense_ggn(model, sum_loss, [(x, y)], reduction="sum")
    torch.testing.assert_close(fast.ggn_diagonal, G.diagonal(), rtol=1e-12, atol=1e-13)


def test_bad_curvature_is_refused():
    model, loss, x, y = _case("mlp")
    with pytest.raises(ValueError, match="curvature"):
        DiagLaplace(model, loss, (x, y), curvature="vmap")
