"""The dense references themselves, against closed forms (<= 1e-12 in float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests import references as ref

TOL = 1e-12


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _design(x: torch.Tensor) -> torch.Tensor:
    """Design matrix with the bias column last, matching nn.Linear's (weight, bias) flattening."""
    return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)


@pytest.fixture
def regression_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(30, 4, generator=g, dtype=torch.float64)
    y = torch.randn(30, 1, generator=g, dtype=torch.float64)
    return x, y


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("sizes", [[30], [7, 13, 10]])
def test_linear_regression_hessian_closed_form(regression_data, reduction, sizes):
    x, y = regression_data
    torch.manual_seed(0)
    model = nn.Linear(4, 1).double()
    loss_fn = nn.MSELoss(reduction=reduction)
    batches = ref.split_batches(x, y, sizes)
    xt = _design(x)
    # L = c * sum_n (w.x_n + b - y_n)^2, c = 1/N (mean) or 1 (sum)  ->  H = 2 c X~^T X~
    c = 1.0 / len(x) if reduction == "mean" else 1.0
    expected = 2 * c * xt.T @ xt
    for fn in (ref.dense_hessian, ref.dense_ggn):
        assert _rel(fn(model, loss_fn, batches, reduction=reduction), expected) <= TOL


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_logistic_regression_hessian_ggn_fisher_closed_form(reduction):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(40, 1, generator=g, dtype=torch.float64) < 0.5).double()
    torch.manual_seed(3)
    model = nn.Linear(3, 1).double()
    loss_fn = nn.BCEWithLogitsLoss(reduction=reduction)
    batches = ref.split_batches(x, y, [11, 29])
    xt = _design(x)
    with torch.no_grad():
        prob = torch.sigmoid(model(x)).squeeze(1)
    c = 1.0 / len(x) if reduction == "mean" else 1.0
    h_expected = c * xt.T @ torch.diag(prob * (1 - prob)) @ xt
    assert _rel(ref.dense_hessian(model, loss_fn, batches, reduction=reduction), h_expected) <= TOL
    assert _rel(ref.dense_ggn(model, loss_fn, batches, reduction=reduction), h_expected) <= TOL
    # per-example gradient of the logistic loss: (p_n - y_n) x~_n
    r = prob - y.squeeze(1)
    ef_expected = c * xt.T @ torch.diag(r**2) @ xt
    assert _rel(ref.dense_empirical_fisher(model, loss_fn, batches, reduction=reduction), ef_expected) <= TOL
    grads = ref.per_example_gradients(model, loss_fn, batches)
    assert _rel(grads, r[:, None] * xt) <= TOL


def test_softmax_regression_hessian_closed_form():
    """Multiclass: H = (1/N) sum_n (diag(p_n) - p_n p_n^T) kron x~_n x~_n^T (weight rows first)."""
    x, y = ref.make_classification_data(n=20, d=3, n_classes=4, seed=5)
    torch.manual_seed(4)
    model = nn.Linear(3, 4).double()
    loss_fn = nn.CrossEntropyLoss()
    batches = ref.split_batches(x, y, [20])
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1)
    n, d, k = 20, 3, 4
    # parameter order: W (k x d, row-major) then b (k)
    p_total = k * d + k
    expected = torch.zeros(p_total, p_total, dtype=torch.float64)
    for i in range(n):
        a = torch.diag(probs[i]) - torch.outer(probs[i], probs[i])
        xi = x[i]
        # d logits_c / d W[c, j] = x_j ; d logits_c / d b_c = 1
        jac = torch.zeros(k, p_total, dtype=torch.float64)
        for c in range(k):
            jac[c, c * d : (c + 1) * d] = xi
            jac[c, k * d + c] = 1.0
        expected += jac.T @ a @ jac / n
    assert _rel(ref.dense_hessian(model, loss_fn, batches), expected) <= TOL
    assert _rel(ref.dense_ggn(model, loss_fn, batches), expected) <= TOL


def test_subset_hessian_is_submatrix_and_chunking_is_exact():
    x, y = ref.make_classification_data(n=16, d=4, n_classes=3, seed=7)
    model = ref.make_mlp((4, 5, 3), "tanh", seed=1)
    loss_fn = nn.CrossEntropyLoss()
    batches = ref.split_batches(x, y, [5, 11])
    full = ref.dense_hessian(model, loss_fn, batches, chunk_size=7)
    full_one_chunk = ref.dense_hessian(model, loss_fn, batches, chunk_size=10_000)
    assert _rel(full, full_one_chunk) <= TOL
    names = ["2.weight", "2.bias"]
    sub = ref.dense_hessian(model, loss_fn, batches, names=names)
    n_first = 4 * 5 + 5
    assert _rel(sub, full[n_first:, n_first:]) <= TOL
    # batching invariance of the whole-dataset Hessian
    one_batch = ref.dense_hessian(model, loss_fn, ref.split_batches(x, y, [16]))
    assert _rel(full, one_batch) <= TOL


def test_unused_parameter_has_zero_rows():
    x, y = ref.make_classification_data(n=10, d=4, n_classes=3, seed=8)
    model = ref.UnusedParamNet()
    h = ref.dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    # named_parameters() lists the module's own parameters first: "unused" occupies entries 0..3
    assert ref.param_names(model)[0] == "unused"
    assert torch.count_nonzero(h[:4]) == 0 and torch.count_nonzero(h[:, :4]) == 0
    assert h[4:, 4:].abs().max() > 0


def test_cnn_bn_eval_hessian_is_symmetric_and_matches_finite_differences():
    """CNN with BN (eval): the reference Hessian's columns equal central differences of the gradient."""
    x, y = ref.make_classification_data(n=8, n_classes=3, seed=9, image=True)
    model = ref.make_cnn_bn().eval()
    loss_fn = nn.CrossEntropyLoss()
    h = ref.dense_hessian(model, loss_fn, [(x, y)])
    loss, theta0 = ref.total_loss_fn(model, loss_fn, [(x, y)])
    grad = torch.func.grad(loss)
    eps = 1e-5
    for i in (0, 17, theta0.numel() - 1):
        e = torch.zeros_like(theta0)
        e[i] = eps
        fd = (grad(theta0 + e) - grad(theta0 - e)) / (2 * eps)
        assert torch.allclose(h[:, i], fd, atol=1e-8, rtol=1e-6)
