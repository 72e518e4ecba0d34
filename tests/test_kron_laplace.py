"""KronLaplace against closed forms (Bayesian linear regression) and dense float64 matrices.

References: the evidence and predictive of Bayesian linear regression (Bishop 2006, "Pattern
recognition and machine learning", eqs. 3.58-3.59 and 3.86: the Laplace approximation is exact for a
linear-Gaussian model, and KFAC is exact for one linear layer with a squared loss); otherwise the
dense matrix ``ls.kfac(obj).to_dense() + delta I`` with ``torch.linalg`` (slogdet, inv, eigh), the
Jacobian by ``jacrev`` and the network evaluated by ``functional_call``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

import landscape as ls
from optimizers.bayes.laplace import KronLaplace
from tests.references import flatten_params, make_classification_data, make_cnn_bn, make_mlp, split_batches
from tests.test_laplace import _dense_jacobian


def _regression(n: int = 30, d: int = 3, c: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Linear(d, c).to(torch.float64)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = torch.randn(n, c, generator=g, dtype=torch.float64)
    return model, x, y


# ============================================================================================
# the exact case: one linear layer, Gaussian likelihood = Bayesian linear regression
# ============================================================================================
@pytest.mark.parametrize("sigma", [1.0, 0.7])
def test_linear_regression_evidence_and_predictive_are_the_closed_form(sigma):
    model, x, y = _regression()
    delta = 0.9
    la = KronLaplace(
        model, nn.MSELoss(), split_batches(x, y, [12, 18]), delta, sigma_noise=sigma, separate_bias=False
    )
    # posterior precision of [W, b] per output row: Phi^T Phi / sigma^2 + delta I (Bishop eq. 3.54)
    phi = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)
    D = phi.shape[1]
    prec_row = phi.T @ phi / sigma**2 + delta * torch.eye(D, dtype=x.dtype)
    prec = torch.kron(torch.eye(2, dtype=x.dtype), prec_row)
    # our order: W row-major then b; the closed form's: per output row [w_c, b_c]
    perm = torch.tensor([0, 1, 2, 4, 5, 6, 3, 7])
    assert torch.allclose(la.posterior_precision(), prec[perm][:, perm], rtol=0, atol=1e-12)
    # the Laplace evidence at theta* = log N(y | Phi theta*, ...) only when theta* is the MAP, but the
    # Laplace formula itself is exact in theta: check it against the Gaussian integral directly
    theta = flatten_params(model)
    with torch.no_grad():
        r = y - model(x)
    nll = 0.5 * float(r.square().sum()) / sigma**2 + len(x) * 2 * math.log(sigma * math.sqrt(2 * math.pi))
    assert la.nll == pytest.approx(nll, rel=1e-13)
    lml = -nll - 0.5 * delta * float(theta @ theta) + 0.5 * 8 * math.log(delta)
    lml -= 0.5 * float(torch.linalg.slogdet(prec)[1])
    assert la.log_marginal_likelihood() == pytest.approx(lml, rel=1e-12)
    # at the MAP the Laplace evidence is the exact evidence log N(y_c | 0, sigma^2 I + Phi Phi^T / delta)
    w_map = torch.linalg.solve(prec_row, phi.T @ y / sigma**2)  # [D, C]
    with torch.no_grad():
        model.weight.copy_(w_map[:-1].T)
        model.bias.copy_(w_map[-1])
    la_map = KronLaplace(model, nn.MSELoss(), (x, y), delta, sigma_noise=sigma, separate_bias=False)
    cov_y = sigma**2 * torch.eye(len(x), dtype=x.dtype) + phi @ phi.T / delta
    mvn = torch.distributions.MultivariateNormal(torch.zeros(len(x), dtype=x.dtype), cov_y)
    exact = float(mvn.log_prob(y.T).sum())
    assert la_map.log_marginal_likelihood() == pytest.approx(exact, rel=1e-11)
    # GLM predictive = the exact posterior predictive of f: phi*^T S phi* per output (eq. 3.59)
    xs = torch.randn(5, 3, generator=torch.Generator().manual_seed(3), dtype=x.dtype)
    mean, cov = la_map.predictive_mean_and_covariance(xs)
    phis = torch.cat([xs, torch.ones(5, 1, dtype=x.dtype)], 1)
    var = torch.einsum("bd,de,be->b", phis, torch.linalg.inv(prec_row), phis)
    assert torch.allclose(mean, phis @ w_map, rtol=0, atol=1e-12)
    expect = var[:, None, None] * torch.eye(2, dtype=x.dtype)
    assert torch.allclose(cov, expect, rtol=0, atol=1e-12)


def test_evidence_optimum_is_bishops_fixed_point():
    """The fitted prior precision satisfies ``delta = gamma / ||theta||^2`` (Bishop eq. 3.92), with
    ``gamma = sum_i l_i / (l_i + delta)`` over the dense matrix's eigenvalues."""
    model, x, y = _regression()
    la = KronLaplace(model, nn.MSELoss(), (x, y), separate_bias=False)
    d = la.optimize_prior_precision()
    lam = torch.linalg.eigvalsh(la.posterior_precision(1.0)) - 1.0
    gamma = float((lam / (lam + d)).sum())
    theta = flatten_params(model)
    assert d == pytest.approx(gamma / float(theta @ theta), rel=1e-10)


# ============================================================================================
# a classifier: everything against the dense KFAC matrix
# ============================================================================================
def _classifier(kind: str = "ce"):
    C = 3 if kind == "ce" else 1
    model = make_mlp((4, 5, C), seed=0)
    x, y = make_classification_data(n=20, d=4, n_classes=3 if kind == "ce" else 2, seed=1)
    if kind == "bce":
        y = y.to(torch.float64).reshape(-1, 1)
    loss = nn.CrossEntropyLoss() if kind == "ce" else nn.BCEWithLogitsLoss()
    sum_loss = nn.CrossEntropyLoss(reduction="sum") if kind == "ce" else nn.BCEWithLogitsLoss(reduction="sum")
    return model, loss, sum_loss, x, y


@pytest.mark.parametrize("kind", ["ce", "bce"])
@pytest.mark.parametrize("separate_bias", [True, False])
def test_precision_evidence_and_glm_predictive_equal_the_dense_matrix(kind, separate_bias):
    model, loss, sum_loss, x, y = _classifier(kind)
    delta = 0.6
    la = KronLaplace(model, loss, split_batches(x, y, [8, 12]), delta, separate_bias=separate_bias)
    K = ls.kfac(ls.Objective(model, sum_loss, (x, y)), separate_bias=separate_bias).to_dense()
    P = K.shape[0]
    prec = K + delta * torch.eye(P, dtype=K.dtype)
    assert torch.allclose(la.posterior_precision(), prec, rtol=0, atol=1e-12)
    cov_w = torch.linalg.inv(prec)
    assert torch.allclose(la.posterior_covariance(), cov_w, rtol=0, atol=1e-12)
    assert la.log_det_posterior_precision() == pytest.approx(float(torch.linalg.slogdet(prec)[1]), rel=1e-12)
    theta = flatten_params(model)
    with torch.no_grad():
        nll = float(sum_loss(model(x), y))
    lml = -nll - 0.5 * delta * float(theta @ theta) + 0.5 * P * math.log(delta)
    lml -= 0.5 * float(torch.linalg.slogdet(prec)[1])
    assert la.log_marginal_likelihood() == pytest.approx(lml, rel=1e-12)
    # GLM predictive: J Sigma J^T with the dense Jacobian; probit by hand
    xs = x[:6]
    J = _dense_jacobian(model, [n for n, _ in model.named_parameters()], xs)
    mean, cov = la.predictive_mean_and_covariance(xs)
    assert torch.allclose(cov, J @ cov_w @ J.transpose(1, 2), rtol=0, atol=1e-12)
    with torch.no_grad():
        f = model(xs).reshape(6, -1)
    assert torch.allclose(mean, f, rtol=0, atol=1e-13)
    z = f / torch.sqrt(1 + math.pi / 8 * torch.diagonal(J @ cov_w @ J.transpose(1, 2), dim1=1, dim2=2))
    probit = torch.sigmoid(z) if kind == "bce" else torch.softmax(z, 1)
    assert torch.allclose(la.predictive(xs), probit, rtol=0, atol=1e-13)


def test_samples_and_weight_space_mc_predictive():
    """``sample`` is ``theta + P^-1/2 z`` with the symmetric root of the dense precision, ``z`` the
    generator's ``randn(S, P)``; the MC predictive averages the softmax of the network at them."""
    model, loss, _, x, y = _classifier("ce")
    la = KronLaplace(model, loss, (x, y), 2.0)
    prec = la.posterior_precision()
    ev, V = torch.linalg.eigh(prec)
    root = (V * ev.rsqrt()) @ V.T
    z = torch.randn(7, prec.shape[0], generator=torch.Generator().manual_seed(5), dtype=prec.dtype)
    draws = la.sample(7, generator=torch.Generator().manual_seed(5))
    theta = flatten_params(model)
    assert torch.allclose(draws, theta + z @ root, rtol=0, atol=1e-12)
    probs = la.predictive(x[:4], pred_type="mc", samples=7, generator=torch.Generator().manual_seed(5))
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    expect = 0
    for d in draws:
        parts = torch.split(d, [s.numel() for s in shapes])
        params = {n: t.reshape(s) for n, t, s in zip(names, parts, shapes)}
        expect = expect + torch.softmax(functional_call(model, params, (x[:4],)), 1) / 7
    assert torch.allclose(probs, expect, rtol=0, atol=1e-13)


def test_conv_network_with_selection_and_refusal_by_name():
    """A CNN with BatchNorm: refused naming the layer; with ``params=`` leaving BatchNorm out, the
    precision equals the dense KFAC of the same selection."""
    model = make_cnn_bn(in_channels=1, n_classes=3, seed=0)
    model.eval()
    x, y = make_classification_data(n=10, n_classes=3, seed=2, image=True)
    with pytest.raises(ValueError, match=r"KronLaplace: .*Kronecker form .*BatchNorm2d.*params="):
        KronLaplace(model, nn.CrossEntropyLoss(), (x, y))
    bn = {n for n, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    keep = [n for n, _ in model.named_parameters() if n.rpartition(".")[0] not in bn]
    la = KronLaplace(model, nn.CrossEntropyLoss(), (x, y), 0.5, params=keep)
    obj = ls.Objective(model, nn.CrossEntropyLoss(reduction="sum"), (x, y), params=keep)
    K = ls.kfac(obj, separate_bias=True).to_dense()
    prec = K + 0.5 * torch.eye(K.shape[0], dtype=K.dtype)
    assert torch.allclose(la.posterior_precision(), prec, rtol=0, atol=1e-12)
    assert la.log_det_posterior_precision() == pytest.approx(float(torch.linalg.slogdet(prec)[1]), rel=1e-12)
    J = _dense_jacobian(model, keep, x[:3])
    _, cov = la.predictive_mean_and_covariance(x[:3])
    assert torch.allclose(cov, J @ torch.linalg.inv(prec) @ J.transpose(1, 2), rtol=0, atol=1e-12)


def test_bad_arguments_are_refused_with_the_fix():
    model, loss, _, x, y = _classifier("ce")
    with pytest.raises(ValueError, match="sigma_noise"):
        KronLaplace(model, loss, (x, y), sigma_noise=2.0)
    with pytest.raises(ValueError, match="KronLaplace supports"):
        KronLaplace(model, nn.L1Loss(), (x, y))
    la = KronLaplace(model, loss, (x, y))
    with pytest.raises(ValueError, match="pred_type"):
        la.predictive(x, pred_type="nn")
    reg, xr, yr = _regression()
    with pytest.raises(ValueError, match="predictive_mean_and_covariance"):
        KronLaplace(reg, nn.MSELoss(), (xr, yr)).predictive(xr)
