"""Diagonal and last-layer Laplace against dense float64 GGNs, hand-written evidences and predictives."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from optimizers.bayes.laplace import DiagLaplace, LastLayerLaplace
from tests.references import dense_ggn, flatten_params, make_classification_data, make_mlp, split_batches


def _problem(kind: str = "ce", n: int = 20):
    """A 4-5-C tanh net and data in two uneven batches; ``kind`` ``ce`` (3 classes) or ``bce`` (one logit)."""
    C = 3 if kind == "ce" else 1
    model = make_mlp((4, 5, C), seed=0)
    x, y = make_classification_data(n=n, d=4, n_classes=3 if kind == "ce" else 2, seed=1)
    if kind == "bce":
        y = y.to(torch.float64).reshape(-1, 1)
    loss = nn.CrossEntropyLoss() if kind == "ce" else nn.BCEWithLogitsLoss()
    sum_loss = nn.CrossEntropyLoss(reduction="sum") if kind == "ce" else nn.BCEWithLogitsLoss(reduction="sum")
    return model, loss, sum_loss, split_batches(x, y, [8, 12]), x, y


LAST = ["2.weight", "2.bias"]


def _hand_lml(sum_loss, model, x, y, names, G, delta) -> float:
    """``log p(D|theta*) - delta/2 ||theta*||^2 + P/2 log delta - 1/2 log det(G + delta I)`` densely."""
    theta = flatten_params(model, names)
    P = theta.numel()
    with torch.no_grad():
        nll = float(sum_loss(model(x), y))
    logdet = torch.linalg.slogdet(G + delta * torch.eye(P, dtype=G.dtype))[1]
    return -nll - 0.5 * delta * float(theta @ theta) + 0.5 * P * math.log(delta) - 0.5 * float(logdet)


def _dense_jacobian(model, names, x) -> torch.Tensor:
    """``[B, C, P]``: d logits / d (selected weights), by ``jacrev`` on the whole batch."""
    params = dict(model.named_parameters())
    theta = flatten_params(model, names)

    def f(t):
        full, off = {k: v.detach() for k, v in params.items()}, 0
        for n in names:
            full[n] = t[off : off + params[n].numel()].reshape(params[n].shape)
            off += params[n].numel()
        out = functional_call(model, full, (x,))
        return out.reshape(out.shape[0], -1)

    return jacrev(f)(theta)


# ============================================================================================
# curvature
# ============================================================================================
@pytest.mark.parametrize("kind", ["ce", "bce"])
def test_last_layer_ggn_equals_dense_ggn_of_the_last_layer(kind):
    model, loss, sum_loss, batches, _, _ = _problem(kind)
    lap = LastLayerLaplace(model, loss, batches)
    assert lap.param_names == LAST
    G = dense_ggn(model, sum_loss, batches, names=LAST, reduction="sum")
    torch.testing.assert_close(lap.ggn, G, rtol=1e-12, atol=1e-12)


def test_last_layer_without_bias_and_named_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3, bias=False)).double()
    x, y = make_classification_data(n=15, d=4, seed=2)
    lap = LastLayerLaplace(model, nn.CrossEntropyLoss(), (x, y), last_layer="2")
    G = dense_ggn(model, nn.CrossEntropyLoss(reduction="sum"), [(x, y)], names=["2.weight"], reduction="sum")
    torch.testing.assert_close(lap.ggn, G, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["ce", "bce"])
def test_diag_laplace_equals_dense_ggn_diagonal(kind):
    model, loss, sum_loss, batches, _, _ = _problem(kind)
    lap = DiagLaplace(model, loss, batches, chunk_size=5)
    G = dense_ggn(model, sum_loss, batches, reduction="sum")
    torch.testing.assert_close(lap.ggn_diagonal, G.diagonal(), rtol=1e-12, atol=1e-13)
    sub = DiagLaplace(model, loss, batches, params="0")  # first layer only
    Gs = dense_ggn(model, sum_loss, batches, names=["0.weight", "0.bias"], reduction="sum")
    torch.testing.assert_close(sub.ggn_diagonal, Gs.diagonal(), rtol=1e-12, atol=1e-13)


# ============================================================================================
# evidence and prior precision
# ============================================================================================
@pytest.mark.parametrize("which", ["last", "diag"])
def test_log_marginal_likelihood_matches_dense_slogdet_and_fit_maximises_it(which):
    model, loss, sum_loss, batches, x, y = _problem("ce")
    if which == "last":
        lap, names = LastLayerLaplace(model, loss, batches), LAST
        G = dense_ggn(model, sum_loss, batches, names=LAST, reduction="sum")
    else:
        lap, names = DiagLaplace(model, loss, batches), None
        G = torch.diag(dense_ggn(model, sum_loss, batches, reduction="sum").diagonal())
    for delta in (0.3, 2.0, 11.0):
        want = _hand_lml(sum_loss, model, x, y, names, G, delta)
        assert lap.log_marginal_likelihood(delta) == pytest.approx(want, rel=1e-12, abs=1e-10)
    best = lap.optimize_prior_precision()
    assert lap.prior_precision == best
    at_best = _hand_lml(sum_loss, model, x, y, names, G, best)
    for factor in (math.exp(-1e-3), math.exp(1e-3), 0.5, 2.0):
        assert at_best > _hand_lml(sum_loss, model, x, y, names, G, best * factor)
    grid = np.exp(np.linspace(math.log(best) - 3, math.log(best) + 3, 61))
    values = [_hand_lml(sum_loss, model, x, y, names, G, float(d)) for d in grid]
    assert abs(math.log(grid[int(np.argmax(values))]) - math.log(best)) <= 0.05 + 1e-12


def test_prior_precision_errors():
    model, loss, _, batches, _, _ = _problem("ce")
    with pytest.raises(ValueError, match="prior_precision"):
        LastLayerLaplace(model, loss, batches, prior_precision=0.0)
    lap = LastLayerLaplace(model, loss, batches)
    with pytest.raises(ValueError, match="bounds"):
        lap.optimize_prior_precision(bounds=(1.0, 0.5))
    with pytest.raises(ValueError, match="raise bounds"):
        lap.optimize_prior_precision(bounds=(1e-8, 1e-6))  # the maximum lies far above
    with pytest.raises(ValueError, match="prior_precision"):
        lap.log_marginal_likelihood(-1.0)


# ============================================================================================
# predictive
# ============================================================================================
@pytest.mark.parametrize("which", ["last", "diag"])
def test_glm_predictive_mean_is_map_and_covariance_is_j_sigma_jt(which):
    model, loss, sum_loss, batches, x, _ = _problem("ce")
    xt = make_classification_data(n=6, d=4, seed=7)[0]
    delta = 1.7
    if which == "last":
        lap, names = LastLayerLaplace(model, loss, batches, prior_precision=delta), LAST
        G = dense_ggn(model, sum_loss, batches, names=LAST, reduction="sum")
        Sigma = torch.linalg.inv(G + delta * torch.eye(G.shape[0], dtype=G.dtype))
        torch.testing.assert_close(lap.posterior_covariance(), Sigma, rtol=1e-10, atol=1e-12)
    else:
        lap, names = (
            DiagLaplace(model, loss, batches, prior_precision=delta),
            [n for n, _ in model.named_parameters()],
        )
        G = dense_ggn(model, sum_loss, batches, reduction="sum")
        Sigma = torch.diag(1.0 / (G.diagonal() + delta))
    mean, cov = lap.predictive_mean_and_covariance(xt)
    with torch.no_grad():
        torch.testing.assert_close(mean, model(xt), rtol=0, atol=0)  # the MAP logits
    J = _dense_jacobian(model, names, xt)
    torch.testing.assert_close(cov, J @ Sigma @ J.transpose(1, 2), rtol=1e-10, atol=1e-12)
    kappa = 1.0 / torch.sqrt(1.0 + math.pi / 8.0 * torch.diagonal(cov, dim1=1, dim2=2))
    with torch.no_grad():
        want = torch.softmax(model(xt) * kappa, dim=1)
    torch.testing.assert_close(lap.predictive(xt), want, rtol=1e-12, atol=1e-12)


def test_mc_predictive_converges_to_the_gaussian_integral_binary():
    model, loss, _, batches, _, _ = _problem("bce")
    lap = LastLayerLaplace(model, loss, batches, prior_precision=0.5)
    xt = make_classification_data(n=4, d=4, seed=3)[0]
    mean, cov = lap.predictive_mean_and_covariance(xt)
    # E[sigmoid(f)], f ~ N(m, v), by 80-point Gauss-Hermite quadrature
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    m, v = mean[:, 0].numpy(), cov[:, 0, 0].numpy()
    exact = (weights / weights.sum() * (1 / (1 + np.exp(-(m[:, None] + np.sqrt(v)[:, None] * nodes))))).sum(1)
    probs = lap.predictive(xt, link="mc", samples=100_000, seed=0)
    assert probs.shape == (4, 1)
    assert np.abs(probs[:, 0].numpy() - exact).max() < 3e-3
    probit = lap.predictive(xt)[:, 0].numpy()  # an approximation: close, not equal
    assert np.abs(probit - exact).max() < 0.02


def test_diag_laplace_samples_weights_with_its_posterior_std():
    model, loss, sum_loss, batches, x, _ = _problem("ce")
    lap = DiagLaplace(model, loss, batches, prior_precision=2.0, seed=4)
    var = 1.0 / (dense_ggn(model, sum_loss, batches, reduction="sum").diagonal() + 2.0)
    gen = torch.Generator().manual_seed(4)
    z = torch.cat(
        [torch.randn(p.shape, generator=gen, dtype=p.dtype).reshape(-1) for p in model.parameters()]
    )
    before = flatten_params(model)
    with lap.sample():
        torch.testing.assert_close(flatten_params(model), before + var.sqrt() * z, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(flatten_params(model), before, rtol=0, atol=0)
    probs = lap.bayesian_model_average(model, x, samples=3)
    torch.testing.assert_close(probs.sum(1), torch.ones(len(x), dtype=torch.float64))


def test_fitting_and_predicting_leave_the_model_bit_identical():
    model, loss, _, batches, x, y = _problem("ce")
    model.train()
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    snap = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    ids = [id(p) for p in model.parameters()]
    for lap in (LastLayerLaplace(model, loss, batches), DiagLaplace(model, loss, batches)):
        lap.optimize_prior_precision()
        lap.predictive(x[:3])
        lap.predictive(x[:3], link="mc", samples=10, seed=1)
    assert model.training and all(m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, snap[k])
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert [id(p) for p in model.parameters()] == ids


def test_input_errors_name_the_problem():
    model, _, _, batches, x, y = _problem("ce")
    with pytest.raises(ValueError, match="classification losses only"):
        LastLayerLaplace(model, nn.MSELoss(), batches)
    with pytest.raises(ValueError, match="label smoothing"):
        DiagLaplace(model, nn.CrossEntropyLoss(label_smoothing=0.1), batches)
    post = nn.Sequential(*model, nn.Tanh())  # something after the last Linear
    with pytest.raises(ValueError, match="not the output of the last layer"):
        LastLayerLaplace(post, nn.CrossEntropyLoss(), batches)
    with pytest.raises(ValueError, match="no nn.Linear"):
        LastLayerLaplace(nn.Sequential(nn.Tanh()), nn.CrossEntropyLoss(), batches)
    with pytest.raises(TypeError, match="nn.Linear"):
        LastLayerLaplace(model, nn.CrossEntropyLoss(), batches, last_layer="1")
    lap = LastLayerLaplace(model, nn.CrossEntropyLoss(), batches)
    with pytest.raises(ValueError, match="link"):
        lap.predictive(x, link="bridge")


def test_per_group_prior_evidence_matches_dense_and_layerwise_fit_is_stationary():
    """A prior precision per parameter tensor: the evidence equals the dense float64 formula with
    ``diag(delta)``; each fitted ``delta_g`` is a stationary point of the evidence in its own
    coordinate (central differences) and the fit is at least as good as the one-number fit."""
    model, loss, sum_loss, batches, x, y = _problem("ce")
    lap = DiagLaplace(model, loss, batches)
    assert lap.prior_groups == ["0.weight", "0.bias", "2.weight", "2.bias"]
    G = torch.diag(dense_ggn(model, sum_loss, batches, reduction="sum").diagonal())
    theta = flatten_params(model, None)
    sizes = [p.numel() for p in model.parameters()]

    def dense(d):
        D = torch.repeat_interleave(torch.as_tensor(d, dtype=torch.float64), torch.tensor(sizes))
        with torch.no_grad():
            nll = float(sum_loss(model(x), y))
        logdet = torch.linalg.slogdet(G + torch.diag(D))[1]
        return -nll - 0.5 * float(theta @ (D * theta)) + 0.5 * float(D.log().sum()) - 0.5 * float(logdet)

    d = [0.3, 2.0, 11.0, 0.9]
    assert lap.log_marginal_likelihood(d) == pytest.approx(dense(d), rel=1e-12, abs=1e-10)
    per_weight = torch.repeat_interleave(torch.tensor(d, dtype=torch.float64), torch.tensor(sizes))
    variance = DiagLaplace(model, loss, batches, prior_precision=d).posterior_variance()
    torch.testing.assert_close(variance, 1.0 / (G.diagonal() + per_weight), rtol=1e-13, atol=0.0)
    scalar = lap.log_marginal_likelihood(lap.optimize_prior_precision())
    best = lap.optimize_prior_precision(layerwise=True)
    for g in range(4):
        up, down = best.clone(), best.clone()
        up[g], down[g] = best[g] * math.exp(1e-4), best[g] * math.exp(-1e-4)
        assert abs(dense(up) - dense(down)) / 2e-4 < 1e-6
    assert lap.log_marginal_likelihood() == pytest.approx(dense(best), rel=1e-12)
    assert lap.log_marginal_likelihood() >= scalar


def test_per_group_prior_errors_name_the_groups():
    model, loss, _, batches, _, _ = _problem("ce")
    lap = DiagLaplace(model, loss, batches)
    for bad in ([1.0, 2.0], [1.0, 2.0, -1.0, 1.0], [[1.0] * 4], "big"):
        with pytest.raises(ValueError, match=r"4 numbers > 0, one per group of prior_groups \(0.weight"):
            lap.log_marginal_likelihood(bad)
    with pytest.raises(ValueError, match="4 numbers > 0"):
        DiagLaplace(model, loss, batches, prior_precision=[1.0, 1.0])
    last = LastLayerLaplace(model, loss, batches, prior_precision=[2.0])  # one group: the layer
    assert last.log_marginal_likelihood() == pytest.approx(last.log_marginal_likelihood(2.0), rel=1e-15)
    zero_bias = copy.deepcopy(model)
    with torch.no_grad():
        zero_bias[0].bias.zero_()
    lap0 = DiagLaplace(zero_bias, loss, batches)
    with pytest.raises(ValueError, match="group '0.bias'"):
        lap0.optimize_prior_precision(layerwise=True)  # ||theta_g|| = 0: no finite maximiser
