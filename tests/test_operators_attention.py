"""Second-order products through attention: a tiny ``nn.TransformerEncoderLayer`` (flash SDPA and the
fused encoder path by default on CPU, neither twice differentiable) vs dense float64 references
computed on the math backend."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import landscape as ls
from tests import references as ref

sdpa = pytest.importorskip("torch.nn.attention")


@contextlib.contextmanager
def _math_reference():
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa.sdpa_kernel(sdpa.SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


class _TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 3)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(x).mean(dim=1))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, 4, 8, generator=g, dtype=torch.float64), torch.randint(0, 3, (5,), generator=g)


def test_the_default_attention_kernel_has_no_double_backward():
    """The failure the operators avoid (if torch implements it one day, this test says so)."""
    model = _TinyTransformer().eval()
    x, y = _data()
    loss = nn.functional.cross_entropy(model(x), y)
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, create_graph=True)
    with pytest.raises(RuntimeError, match="scaled_dot_product"):
        torch.autograd.grad(sum((g * g).sum() for g in grads), params)


def test_hessian_ggn_fisher_through_attention_match_dense():
    model = _TinyTransformer().eval()
    x, y = _data()
    loss = nn.CrossEntropyLoss()
    with _math_reference():
        H = ref.dense_hessian(model, loss, [(x, y)])
        G = ref.dense_ggn(model, loss, [(x, y)])
        F = ref.dense_empirical_fisher(model, loss, [(x, y)])
    obj = ls.Objective(model, loss, (x, y))
    V = torch.randn(obj.num_params, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for engine in ("auto", "double_backward", "forward_over_reverse"):
        op = ls.hessian(obj, engine=engine)
        assert _rel(op @ V, H @ V) <= 1e-10, engine
        assert _rel(op @ V[:, 0], H @ V[:, 0]) <= 1e-10, engine
    ggn = ls.ggn(obj)
    assert _rel(ggn @ V, G @ V) <= 1e-10 and ggn.config()["jvp_used"] == "forward"
    ef = ls.empirical_fisher(obj)
    assert _rel(ef @ V, F @ V) <= 1e-10 and ef.config()["method_used"] == "output_space"
    # the process-wide switches are back as they were
    assert torch.backends.mha.get_fastpath_enabled() and torch.backends.cuda.flash_sdp_enabled()
