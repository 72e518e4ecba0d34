"""Closed-form output Hessians (cross-entropy, MSE, BCE with logits) against autodiff Hessians."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from landscape.curvature.ggn import closed_form_kind, output_hessian

F64 = torch.float64


def _dense_output_hessian(loss_fn, out, y) -> torch.Tensor:
    n = out.numel()
    H = torch.autograd.functional.hessian(lambda o: loss_fn(o.reshape(out.shape), y), out.reshape(-1))
    return H.reshape(n, n)


def _cases():
    g = torch.Generator().manual_seed(0)
    z2 = torch.randn(5, 4, generator=g, dtype=F64)
    z4 = torch.randn(3, 4, 2, 2, generator=g, dtype=F64)
    y2 = torch.randint(0, 4, (5,), generator=g)
    y4 = torch.randint(0, 4, (3, 2, 2), generator=g)
    soft = torch.softmax(torch.randn(5, 4, generator=g, dtype=F64), dim=1)
    reg = torch.randn(5, 4, generator=g, dtype=F64)
    bin_ = torch.randint(0, 2, (5, 4), generator=g).to(F64)
    return [
        ("ce-mean", nn.CrossEntropyLoss(), z2, y2, "cross_entropy"),
        ("ce-sum", nn.CrossEntropyLoss(reduction="sum"), z2, y2, "cross_entropy"),
        ("ce-4d", nn.CrossEntropyLoss(), z4, y4, "cross_entropy"),
        ("ce-soft", nn.CrossEntropyLoss(), z2, soft, "cross_entropy"),
        ("ce-smooth", nn.CrossEntropyLoss(label_smoothing=0.1), z2, y2, "cross_entropy"),
        ("ce-weight", nn.CrossEntropyLoss(weight=torch.rand(4, dtype=F64) + 0.5), z2, y2, "autodiff"),
        ("mse-mean", nn.MSELoss(), z2, reg, "mse"),
        ("mse-sum", nn.MSELoss(reduction="sum"), z2, reg, "mse"),
        ("bce-mean", nn.BCEWithLogitsLoss(), z2, bin_, "bce_logits"),
        ("bce-posw", nn.BCEWithLogitsLoss(pos_weight=torch.full((4,), 2.0, dtype=F64)), z2, bin_, "autodiff"),
        ("huber", nn.HuberLoss(delta=0.3), z2, reg, "autodiff"),
    ]


@pytest.mark.parametrize("name,loss_fn,out,y,kind", _cases(), ids=[c[0] for c in _cases()])
def test_output_hessian_equals_dense_autodiff(name, loss_fn, out, y, kind):
    H = _dense_output_hessian(loss_fn, out, y)
    apply, used = output_hessian(loss_fn, out, y)
    assert used == kind
    U = torch.randn(3, *out.shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    got = apply(U).reshape(3, -1)
    torch.testing.assert_close(got, U.reshape(3, -1) @ H.T, rtol=1e-12, atol=1e-14)


def test_ignore_index_present_falls_back_to_autodiff():
    y = torch.tensor([0, -100, 2])
    assert closed_form_kind(nn.CrossEntropyLoss(), y) is None
    assert closed_form_kind(nn.CrossEntropyLoss(), torch.tensor([0, 1, 2])) == "cross_entropy"
