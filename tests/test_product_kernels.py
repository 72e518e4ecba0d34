"""Eval-mode batch norm as its affine map during curvature products (``product_kernels``): the same
values, gradients and second derivatives as ``F.batch_norm`` on running statistics, everything else
passed through, and Hessian/GGN products of a BatchNorm CNN equal to the dense float64 matrices."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import landscape as ls
from landscape.curvature.base import _eval_batch_norm, product_kernels
from tests.references import dense_ggn, dense_hessian, make_classification_data, make_cnn_bn


def _bn_inputs(dims: int, affine: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 3) + (5,) * (dims - 2)
    # channel means far from 0 so that a non-centred formula would show its cancellation
    x = (torch.randn(shape, generator=g, dtype=torch.float64) + 40.0).requires_grad_(True)
    mean = 40.0 + torch.randn(3, generator=g, dtype=torch.float64)
    var = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    w = (torch.randn(3, generator=g, dtype=torch.float64)).requires_grad_(True) if affine else None
    b = (torch.randn(3, generator=g, dtype=torch.float64)).requires_grad_(True) if affine else None
    return x, mean, var, w, b


@pytest.mark.parametrize("dims", [2, 3, 4, 5])
@pytest.mark.parametrize("affine", [True, False])
def test_affine_map_equals_native_batch_norm_to_second_order(dims, affine):
    x, mean, var, w, b = _bn_inputs(dims, affine)
    leaves = [t for t in (x, w, b) if t is not None]

    def second_order(fn):
        y = fn(x, mean, var, w, b, False, 0.1, 1e-3)
        probe = torch.sin(torch.arange(y.numel(), dtype=y.dtype)).view_as(y)
        grads = torch.autograd.grad((y * probe).sum() + (y**2).sum(), leaves, create_graph=True)
        vs = [torch.cos(torch.arange(t.numel(), dtype=t.dtype)).view_as(t) for t in leaves]
        hv = torch.autograd.grad(grads, leaves, vs)
        return [y, *grads, *hv]

    ours = second_order(_eval_batch_norm)
    native = second_order(F.batch_norm)
    for a, n in zip(ours, native):
        torch.testing.assert_close(a, n, rtol=1e-12, atol=1e-10)


def test_native_kernel_runs_where_the_map_does_not_apply():
    x, mean, var, w, b = _bn_inputs(4, True)
    assert _eval_batch_norm(x, mean, var, w, b, training=True) is None  # batch statistics
    assert _eval_batch_norm(x, None, None, w, b, training=False) is None  # no running statistics
    assert _eval_batch_norm(x, mean.float(), var.float(), w, b, training=False) is None  # mixed dtypes
    # train mode inside the context: the native kernel, which updates the running statistics
    bn = nn.BatchNorm2d(3).double().train()
    with product_kernels():
        out = bn(x.detach())
    torch.testing.assert_close(out, F.batch_norm(x.detach(), None, None, bn.weight, bn.bias, True))
    assert int(bn.num_batches_tracked) == 1
    torch.testing.assert_close(bn.running_mean, 0.1 * x.detach().mean(dim=(0, 2, 3)))


@pytest.mark.parametrize("engine", ["double_backward", "forward_over_reverse"])
def test_products_of_an_eval_batchnorm_cnn_equal_the_dense_matrices(engine):
    model = make_cnn_bn(seed=3).eval()
    x, y = make_classification_data(12, n_classes=3, seed=1, image=True)
    loss_fn = nn.CrossEntropyLoss()
    obj = ls.Objective(model, loss_fn, (x, y), dtype=torch.float64)
    V = torch.randn(obj.num_params, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    H = dense_hessian(model, loss_fn, [(x, y)])
    G = dense_ggn(model, loss_fn, [(x, y)])
    torch.testing.assert_close(ls.hessian(obj, engine=engine) @ V, H @ V, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ls.ggn(obj) @ V, G @ V, rtol=1e-10, atol=1e-12)
