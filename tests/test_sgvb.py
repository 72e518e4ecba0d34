"""SGVB / SGVB-LRT layers, KL, ELBO steps and F-SGVB (+ Geometry) against closed forms (float64)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Normal
from torch.distributions import kl_divergence as torch_kl

from optimizers.bayes import (
    BayesConv2d,
    BayesLinear,
    FlatSGVB,
    convert_to_bayesian,
    elbo_loss,
    kl_divergence,
    sgvb_predict,
)
from optimizers.bayes.sgvb import use_mean
from tests.references import make_classification_data, make_cnn_bn

DT = torch.float64


def _set_posterior(layer, seed: int, std_scale: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mu, rho in layer.mean_std_pairs():
            mu.copy_(torch.randn(mu.shape, generator=g, dtype=DT))
            sig = std_scale * (0.5 + torch.rand(rho.shape, generator=g, dtype=DT))
            rho.copy_(torch.log(torch.expm1(sig)))  # softplus^-1


def _sig(rho: torch.Tensor) -> torch.Tensor:
    return torch.log1p(torch.exp(rho.detach()))


# --------------------------------------------------------------------------------------------
# moments: SGVB-LRT pre-activations have SGVB's marginal mean and variance
# --------------------------------------------------------------------------------------------
def _hand_op(kind, x, w, b):
    """``x w^T + b`` or the 3x3, padding-1 convolution written with unfold; ``w`` may carry a
    leading sample dimension ``[S, ...]`` (then the output is ``[S, n, ...]``)."""
    if kind == "linear":
        return torch.einsum("nk,...ok->...no", x, w) + b[..., None, :]
    n, _, h, wd = x.shape
    cols = F.unfold(x, kernel_size=3, padding=1)  # [n, C*9, h*w]
    out = torch.einsum("nkl,...ok->...nol", cols, w.flatten(-3)) + b[..., None, :, None]
    return out.reshape(*out.shape[:-1], h, wd)


def _hand_moments(kind, layer, x):
    """Pre-activation mean ``op(x, mu) + mu_b`` and variance ``op(x^2, sigma^2) + sigma_b^2``."""
    mu_w, mu_b = layer.weight_mu.detach(), layer.bias_mu.detach()
    var_w, var_b = _sig(layer.weight_rho) ** 2, _sig(layer.bias_rho) ** 2
    return _hand_op(kind, x, mu_w, mu_b), _hand_op(kind, x * x, var_w, var_b)


def _layer(kind, local_reparam, seed):
    if kind == "linear":
        layer = BayesLinear(5, 3, local_reparam=local_reparam, seed=seed, dtype=DT)
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(9), dtype=DT)
    else:
        layer = BayesConv2d(2, 3, 3, padding=1, local_reparam=local_reparam, seed=seed, dtype=DT)
        x = torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(9), dtype=DT)
    _set_posterior(layer, seed=1)
    return layer, x


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_lrt_preactivations_have_sgvb_moments(kind):
    lrt, x = _layer(kind, True, seed=3)
    sgvb, _ = _layer(kind, False, seed=4)
    mean, var = _hand_moments(kind, lrt, x)
    torch.testing.assert_close(_hand_moments(kind, sgvb, x), (mean, var), rtol=0, atol=0)
    mu_w, mu_b = sgvb.weight_mu.detach(), sgvb.bias_mu.detach()
    s_w, s_b = _sig(sgvb.weight_rho), _sig(sgvb.bias_rho)
    # each layer's sample, exactly, with its noise replayed from a copy of its generator:
    # LRT: mean + sqrt(var) * eps;  SGVB: op(x, mu + sigma * eps_w) + mu_b + sigma_b * eps_b
    g_lrt, g_sgvb = torch.Generator().manual_seed(3), torch.Generator().manual_seed(4)
    for _ in range(2):
        with torch.no_grad():
            out_lrt, out_sgvb = lrt(x), sgvb(x)
        eps = torch.randn(out_lrt.shape, generator=g_lrt, dtype=DT)
        torch.testing.assert_close(out_lrt, mean + var.sqrt() * eps, rtol=1e-12, atol=1e-12)
        e_w = torch.randn(mu_w.shape, generator=g_sgvb, dtype=DT)
        e_b = torch.randn(mu_b.shape, generator=g_sgvb, dtype=DT)
        torch.testing.assert_close(out_sgvb, _hand_op(kind, x, mu_w + s_w * e_w, mu_b + s_b * e_b))
    # Monte Carlo over S samples of SGVB weights: the marginal moments are LRT's
    S = 20000
    g = torch.Generator().manual_seed(17)
    e_w = torch.randn(S, *mu_w.shape, generator=g, dtype=DT)
    e_b = torch.randn(S, *mu_b.shape, generator=g, dtype=DT)
    samples = _hand_op(kind, x, mu_w + s_w * e_w, mu_b + s_b * e_b)
    assert ((samples.mean(0) - mean).abs() <= 5 * (var / S).sqrt()).all()
    rel = (samples.var(0) / var - 1).abs()
    assert (rel <= 5 * math.sqrt(2 / (S - 1))).all(), float(rel.max())
    # and a few hundred passes of the layers themselves agree too (looser, sampling error; the
    # convolution passes fewer: tiny float64 convolutions are slow on a busy multi-threaded CPU)
    S2 = 300 if kind == "linear" else 40
    with torch.no_grad():
        for layer in (lrt, sgvb):
            s2 = torch.stack([layer(x) for _ in range(S2)])
            assert ((s2.mean(0) - mean).abs() <= 5 * (var / S2).sqrt()).all()
            assert ((s2.var(0) / var - 1).abs() <= 5 * math.sqrt(2 / (S2 - 1))).all()


# --------------------------------------------------------------------------------------------
# KL, conversion
# --------------------------------------------------------------------------------------------
def test_kl_equals_closed_form_gaussian_kl():
    model = convert_to_bayesian(make_cnn_bn(), prior_std=0.7, init_std=0.05, seed=0)
    for layer in (m for m in model.modules() if isinstance(m, (BayesLinear, BayesConv2d))):
        _set_posterior(layer, seed=2, std_scale=0.2)
    want = 0.0
    for layer in (m for m in model.modules() if isinstance(m, (BayesLinear, BayesConv2d))):
        for mu, rho in layer.mean_std_pairs():
            want += float(
                torch_kl(
                    Normal(mu.detach(), _sig(rho)),
                    Normal(torch.zeros((), dtype=DT), torch.tensor(0.7, dtype=DT)),
                ).sum()
            )
    assert float(kl_divergence(model).detach()) == pytest.approx(want, rel=1e-12)
    assert len([m for m in model.modules() if isinstance(m, (BayesLinear, BayesConv2d))]) == 3


def test_convert_keeps_the_original_and_the_mean_network_equals_it():
    net = make_cnn_bn()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    bnet = convert_to_bayesian(net, init_std=1e-3, local_reparam=True, seed=0)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k])
    assert isinstance(bnet[0], BayesConv2d) and isinstance(bnet[1], nn.BatchNorm2d)
    assert isinstance(bnet[6], BayesLinear) and isinstance(net[0], nn.Conv2d)
    assert float(_sig(bnet[0].weight_rho).max()) == pytest.approx(1e-3, rel=1e-9)
    x, _ = make_classification_data(n=5, image=True, seed=3)
    net.eval(), bnet.eval()
    with torch.no_grad(), use_mean(bnet):
        torch.testing.assert_close(bnet(x), net(x), rtol=1e-12, atol=1e-14)
    assert bnet[0].noise_mode == "sample"


def test_bad_input_errors():
    with pytest.raises(ValueError, match="no nn.Linear or nn.Conv2d"):
        convert_to_bayesian(nn.Sequential(nn.Tanh()))
    with pytest.raises(ValueError, match="convert_to_bayesian"):
        kl_divergence(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="no Bayesian layer"):
        FlatSGVB(nn.Linear(2, 2), num_data=10, lr=0.1)
    with pytest.raises(ValueError, match="num_data"):
        elbo_loss(nn.Linear(2, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="padding_mode"):
        BayesConv2d(1, 1, 3, _template=nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(ValueError, match="prior_std"):
        BayesLinear(2, 2, prior_std=0.0)


# --------------------------------------------------------------------------------------------
# one SGVB step and one F-SGVB step against closed-form gradients
# --------------------------------------------------------------------------------------------
def _problem(local_reparam, seed=5):
    layer = BayesLinear(3, 4, local_reparam=local_reparam, prior_std=0.8, seed=seed, dtype=DT)
    _set_posterior(layer, seed=6, std_scale=0.2)
    model = nn.Sequential(layer)
    x, y = make_classification_data(n=7, d=3, n_classes=4, seed=7)
    return model, layer, x, y


def _hand_nll_grads(p, x, y, eps, lrt):
    """Closed-form gradients of the mean cross-entropy in (mu_w, rho_w, mu_b, rho_b)."""
    mu_w, rho_w, mu_b, rho_b = p
    s_w, s_b = torch.log1p(torch.exp(rho_w)), torch.log1p(torch.exp(rho_b))
    if lrt:
        delta = (x * x) @ (s_w**2).T + s_b**2
        z = x @ mu_w.T + mu_b + delta.sqrt() * eps[0]
    else:
        z = x @ (mu_w + s_w * eps[0]).T + mu_b + s_b * eps[1]
    prob = torch.softmax(z, 1)
    loss = float((torch.logsumexp(z, 1) - z[torch.arange(len(y)), y]).mean())
    prob[torch.arange(len(y)), y] -= 1
    G = prob / len(y)
    g_mu_w, g_mu_b = G.T @ x, G.sum(0)
    if lrt:
        A = G * eps[0] / (2 * delta.sqrt())  # dL/d(delta)
        g_s_w, g_s_b = (A.T @ (x * x)) * 2 * s_w, A.sum(0) * 2 * s_b
    else:
        g_s_w, g_s_b = g_mu_w * eps[0], g_mu_b * eps[1]
    return [g_mu_w, g_s_w * torch.sigmoid(rho_w), g_mu_b, g_s_b * torch.sigmoid(rho_b)], loss


def _hand_kl_grads(p, s0, n):
    mu_w, rho_w, mu_b, rho_b = p
    out = []
    for mu, rho in ((mu_w, rho_w), (mu_b, rho_b)):
        s = torch.log1p(torch.exp(rho))
        out += [mu / (s0**2 * n), (s / s0**2 - 1 / s) * torch.sigmoid(rho) / n]
    return [out[0], out[1], out[2], out[3]]


def _params(layer):
    return [t.detach().clone() for t in (layer.weight_mu, layer.weight_rho, layer.bias_mu, layer.bias_rho)]


def _eps(seed, lrt, n):
    g = torch.Generator().manual_seed(seed)
    if lrt:
        return [torch.randn(n, 4, generator=g, dtype=DT)]
    return [torch.randn(4, 3, generator=g, dtype=DT), torch.randn(4, generator=g, dtype=DT)]


@pytest.mark.parametrize("lrt", [False, True])
def test_first_sgvb_step_equals_hand_step(lrt):
    model, layer, x, y = _problem(lrt)
    p0 = _params(layer)
    N, lr = 50, 0.3
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def closure():
        opt.zero_grad()
        loss = elbo_loss(model, model(x), y, N)
        loss.backward()
        return loss

    loss = opt.step(closure).detach()
    g_nll, nll = _hand_nll_grads(p0, x, y, _eps(5, lrt, len(x)), lrt)
    g_kl = _hand_kl_grads(p0, 0.8, N)
    kl = sum(
        float(
            torch_kl(
                Normal(mu, _sig(r)), Normal(torch.zeros((), dtype=DT), torch.tensor(0.8, dtype=DT))
            ).sum()
        )
        for mu, r in ((p0[0], p0[1]), (p0[2], p0[3]))
    )
    assert float(loss) == pytest.approx(nll + kl / N, rel=1e-12)
    for t, old, a, b in zip(_params(layer), p0, g_nll, g_kl):
        torch.testing.assert_close(t, old - lr * (a + b), rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize(
    "lrt,geometry,perturb_std", [(False, False, False), (False, True, False), (True, False, False),
                                 (True, True, False), (False, False, True)]
)  # fmt: skip
def test_first_f_sgvb_step_equals_hand_sam_step_on_the_elbo(lrt, geometry, perturb_std):
    model, layer, x, y = _problem(lrt)
    p0 = _params(layer)
    N, lr, rho = 40, 0.2, 0.07
    opt = FlatSGVB(model, torch.optim.SGD, rho, num_data=N, geometry=geometry, perturb_std=perturb_std, lr=lr)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)  # the data term only: FlatSGVB adds the KL
        loss.backward()
        return loss

    loss = opt.step(closure)
    eps = _eps(5, lrt, len(x))  # one draw, used by both passes
    g, nll = _hand_nll_grads(p0, x, y, eps, lrt)
    # ascent on the means (and on rho with perturb_std), T = |mu| / sigma with geometry
    T = [p0[0].abs() / _sig(p0[1]), None, p0[2].abs() / _sig(p0[3]), None] if geometry else [1, None, 1, None]
    if perturb_std:
        T = [1, 1, 1, 1]
    tg = [None if t is None else t * gi for t, gi in zip(T, g)]
    norm = torch.sqrt(sum(v.square().sum() for v in tg if v is not None))
    p_pert = [p if v is None else p + rho * v / (norm + 1e-12) for p, v in zip(p0, tg)]
    g_pert, nll_pert = _hand_nll_grads(p_pert, x, y, eps, lrt)
    g_kl = _hand_kl_grads(p0, 0.8, N)  # the KL is outside the max: evaluated at (mu, sigma)
    for t, old, a, b in zip(_params(layer), p0, g_pert, g_kl):
        torch.testing.assert_close(t, old - lr * (a + b), rtol=1e-10, atol=1e-12)
    assert float(loss) == pytest.approx(nll, rel=1e-12)
    assert float(opt.last["loss_perturbed"]) == pytest.approx(nll_pert, rel=1e-12)
    assert float(opt.last["eps_norm"]) == pytest.approx(rho, rel=1e-9)
    assert float(opt.last["kl"]) == pytest.approx(
        float(kl_divergence(nn.Sequential(_rebuild(p0))).detach()), rel=1e-12
    )


def _rebuild(p):
    layer = BayesLinear(3, 4, prior_std=0.8, dtype=DT, seed=0)
    with torch.no_grad():
        for t, v in zip((layer.weight_mu, layer.weight_rho, layer.bias_mu, layer.bias_rho), p):
            t.copy_(v)
    return layer


def test_f_sgvb_refuses_a_closure_that_changes_the_batch():
    model, _, x, y = _problem(True)
    opt = FlatSGVB(model, num_data=10, lr=0.1)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        xb = x if len(calls) == 1 else x[:3]
        loss = F.cross_entropy(model(xb), y[: len(xb)])
        loss.backward()
        return loss

    before = _params(model[0])
    with pytest.raises(RuntimeError, match="same batch"):
        opt.step(closure)
    for t, old in zip(_params(model[0]), before):
        assert torch.equal(t, old)  # restored, no step taken
    assert model[0].noise_mode == "sample" and model[0]._log == []


# --------------------------------------------------------------------------------------------
# prediction
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lrt", [False, True])
def test_sgvb_predict_is_the_average_over_seeded_samples(lrt):
    model, layer, x, _ = _problem(lrt)
    model.train()
    own = layer.generator.get_state()
    got = sgvb_predict(model, x, samples=5, seed=21, include_mean=True)
    assert torch.equal(layer.generator.get_state(), own) and model.training
    p = _params(layer)
    s_w, s_b = _sig(p[1]), _sig(p[3])
    g = torch.Generator().manual_seed(21)
    want = torch.softmax(x @ p[0].T + p[2], 1)  # the mean member
    for _ in range(5):
        if lrt:
            e = torch.randn(len(x), 4, generator=g, dtype=DT)
            z = x @ p[0].T + p[2] + ((x * x) @ (s_w**2).T + s_b**2).sqrt() * e
        else:
            ew = torch.randn(4, 3, generator=g, dtype=DT)
            eb = torch.randn(4, generator=g, dtype=DT)
            z = x @ (p[0] + s_w * ew).T + p[2] + s_b * eb
        want = want + torch.softmax(z, 1)
    torch.testing.assert_close(got, want / 6, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="samples"):
        sgvb_predict(model, x, samples=0, seed=0)
