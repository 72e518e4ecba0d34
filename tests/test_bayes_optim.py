"""MFVI, BayesianSAM and the diagonal-Gaussian posterior utilities against hand-computed steps (float64).

Every reference step is written here with plain tensor operations on the flat parameter vector;
gradients of the loss come from ``tests/references.total_loss_fn`` (``torch.func``), which shares
no code with the optimizers.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad

from optimizers import MFVI, BayesianSAM, bayesian_model_average
from optimizers.perturbation import make_closure
from tests.references import flatten_params, make_classification_data, make_mlp, total_loss_fn

MODELS = {"logreg": (4, 3), "mlp": (4, 6, 3)}


def _setup(kind: str, n: int = 24, seed: int = 0):
    model = make_mlp(MODELS[kind], seed=seed)
    x, y = make_classification_data(n=n, d=4, n_classes=3, seed=seed + 1)
    return model, x, y


def _closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


def _noise(model, gen_seed: int) -> torch.Tensor:
    """The flat z that the optimizers draw: per parameter, in order, with a generator of that seed."""
    g = torch.Generator().manual_seed(gen_seed)
    return torch.cat(
        [torch.randn(p.shape, generator=g, dtype=p.dtype).reshape(-1) for p in model.parameters()]
    )


# ============================================================================================
# MFVI
# ============================================================================================
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("param", ["softplus", "exp"])
def test_mfvi_matches_hand_computed_sgd_steps(kind, steps, param):
    model, x, y = _setup(kind)
    L, mu = total_loss_fn(model, F.cross_entropy, [(x, y)])
    N, s0, init_std, lr, mom, wd = 50, 0.7, 0.05, 0.1, 0.9, 1e-2
    opt = MFVI(
        model.parameters(),
        lr=lr,
        num_data=N,
        prior_std=s0,
        init_std=init_std,
        base_optimizer=torch.optim.SGD,
        parameterization=param,
        seed=123,
        momentum=mom,
        weight_decay=wd,
    )
    closure = _closure(opt, model, x, y)
    # hand computation
    gen = torch.Generator().manual_seed(123)
    r = torch.full_like(mu, math.log(math.expm1(init_std)) if param == "softplus" else math.log(init_std))
    buf_mu = buf_r = None
    for _ in range(steps):
        z = torch.cat(
            [torch.randn(p.shape, generator=gen, dtype=p.dtype).reshape(-1) for p in model.parameters()]
        )
        sig = torch.log1p(torch.exp(r)) if param == "softplus" else torch.exp(r)
        dsig = 1 / (1 + torch.exp(-r)) if param == "softplus" else torch.exp(r)
        g = grad(L)(mu + sig * z)
        gmu = g + mu / (N * s0**2)
        gsig = g * z + (sig / s0**2 - 1 / sig) / N
        gr = gsig * dsig
        d_mu, d_r = gmu + wd * mu, gr + wd * r  # SGD: weight decay, then momentum
        buf_mu = d_mu if buf_mu is None else mom * buf_mu + d_mu
        buf_r = d_r if buf_r is None else mom * buf_r + d_r
        mu, r = mu - lr * buf_mu, r - lr * buf_r
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), mu, rtol=1e-12, atol=1e-12)
    std = torch.cat([opt.posterior_std()[p].reshape(-1) for p in model.parameters()])
    sig = torch.log1p(torch.exp(r)) if param == "softplus" else torch.exp(r)
    torch.testing.assert_close(std, sig, rtol=1e-12, atol=1e-12)
    # logged KL equals the closed form
    kl = (math.log(s0) - torch.log(sig) + (sig**2 + mu**2) / (2 * s0**2) - 0.5).sum()
    assert opt.last["kl"] == pytest.approx(float(kl), rel=1e-10)
    assert opt.last["kl_per_datum"] == pytest.approx(float(kl) / N, rel=1e-10)


def test_mfvi_gradients_and_kl_weight_zero_is_variational_optimisation():
    model, x, y = _setup("mlp")
    L, mu = total_loss_fn(model, F.cross_entropy, [(x, y)])
    opt = MFVI(model.parameters(), lr=0.0, num_data=10, init_std=0.1, kl_weight=0.0, seed=7)
    opt.step(_closure(opt, model, x, y))
    z = _noise(model, 7)
    sig = 0.1
    g = grad(L)(mu + sig * z)
    # with kl_weight=0 the gradients are the pure reparameterisation gradients (VO / ES)
    got_mu = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    got_r = torch.cat([opt._raw[p].grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(got_mu, g, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(got_r, g * z * (1 - math.exp(-sig)), rtol=1e-10, atol=1e-14)  # sigmoid(r)
    torch.testing.assert_close(flatten_params(model), mu)  # lr = 0: the mean is restored exactly
    assert torch.equal(flatten_params(model), mu)


def test_mfvi_validation_errors():
    model, x, y = _setup("logreg")
    with pytest.raises(ValueError, match="num_data"):
        MFVI(model.parameters(), lr=0.1, num_data=0)
    with pytest.raises(ValueError, match="lr"):
        MFVI(model.parameters(), lr=-1.0, num_data=10)
    with pytest.raises(ValueError, match="prior_std"):
        MFVI(model.parameters(), lr=0.1, num_data=10, prior_std=0.0)
    opt = MFVI(model.parameters(), lr=0.1, num_data=10, seed=0)
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    w0 = flatten_params(model)

    def bad():
        F.cross_entropy(model(x), y).backward()

    with pytest.raises(ValueError, match="return loss"):
        opt.step(bad)
    assert torch.equal(flatten_params(model), w0)  # restored although it raised


# ============================================================================================
# bSAM
# ============================================================================================
def _bsam_hand(Ls, w, gm, s, *, N, lr, rho, b1, b2, prior, gamma, order, noise=None):
    delta = prior / N
    ges, hs = [], []
    for k, Lk in enumerate(Ls):
        e = 0.0 if noise is None else noise[k] / torch.sqrt(N * s)
        g = grad(Lk)(w + e)
        eps = rho * g / s
        ges.append(grad(Lk)(w + eps))
        hs.append(torch.sqrt(s) * g.abs())
    ge, h = sum(ges) / len(Ls), sum(hs) / len(Ls)
    gm = b1 * gm + (1 - b1) * (ge + delta * w)
    s_new = b2 * s + (1 - b2) * (h + delta + gamma)
    w = w - lr * gm / (s_new if order == "paper" else s)
    return w, gm, s_new


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("order", ["paper", "official"])
def test_bsam_without_noise_matches_hand_computed_steps(kind, steps, order):
    model, x, y = _setup(kind)
    L, w = total_loss_fn(model, F.cross_entropy, [(x, y)])
    hp = dict(N=40, lr=0.05, rho=0.2, b1=0.8, b2=0.9, prior=2.0, gamma=0.1)
    opt = BayesianSAM(
        model.parameters(),
        lr=hp["lr"],
        num_data=hp["N"],
        rho=hp["rho"],
        betas=(hp["b1"], hp["b2"]),
        prior_precision=hp["prior"],
        damping=hp["gamma"],
        s_init=1.5,
        noise=False,
        s_update_order=order,
    )
    gm, s = torch.zeros_like(w), torch.full_like(w, 1.5)
    closure = _closure(opt, model, x, y)
    for _ in range(steps):
        w, gm, s = _bsam_hand([L], w, gm, s, order=order, **hp)
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), w, rtol=1e-12, atol=1e-12)
    s_opt = torch.cat([opt.precision()[p].reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(s_opt, s, rtol=1e-12, atol=1e-12)
    assert opt.last["s_min"] == pytest.approx(float(s.min()))
    assert opt.last["s_max"] == pytest.approx(float(s.max()))
    std = torch.cat([opt.posterior_std()[p].reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(std, 1 / torch.sqrt(hp["N"] * s))


def test_bsam_orders_differ_and_noise_step_matches_hand_computation():
    model, x, y = _setup("mlp")
    L, w = total_loss_fn(model, F.cross_entropy, [(x, y)])
    hp = dict(N=30, lr=0.05, rho=0.1, b1=0.9, b2=0.99, prior=1.0, gamma=0.1)
    opt = BayesianSAM(
        model.parameters(), lr=0.05, num_data=30, rho=0.1, betas=(0.9, 0.99), prior_precision=1.0, seed=11
    )
    gm, s = torch.zeros_like(w), torch.ones_like(w)
    gen = torch.Generator().manual_seed(11)
    closure = _closure(opt, model, x, y)
    for _ in range(3):
        z = torch.cat(
            [torch.randn(p.shape, generator=gen, dtype=p.dtype).reshape(-1) for p in model.parameters()]
        )
        w, gm, s = _bsam_hand([L], w, gm, s, order="paper", noise=[z], **hp)
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), w, rtol=1e-12, atol=1e-12)
    # the two orders give different (not identical) weights after one step
    w_p = _bsam_hand([L], w, gm, s, order="paper", **hp)[0]
    w_o = _bsam_hand([L], w, gm, s, order="official", **hp)[0]
    assert (w_p - w_o).abs().max() > 1e-6


def test_bsam_m_sharpness_matches_hand_computation():
    model, x, y = _setup("mlp", n=24)
    chunks = list(zip(torch.tensor_split(x, 3), torch.tensor_split(y, 3)))
    Ls = [total_loss_fn(model, F.cross_entropy, [c])[0] for c in chunks]
    w = flatten_params(model)
    hp = dict(N=24, lr=0.1, rho=0.05, b1=0.9, b2=0.999, prior=1.0, gamma=0.1)
    opt = BayesianSAM(
        model.parameters(), lr=0.1, num_data=24, rho=0.05, prior_precision=1.0, noise=False, m=3
    )
    closure = make_closure(opt, model, F.cross_entropy, x, y)
    gm, s = torch.zeros_like(w), torch.ones_like(w)
    for _ in range(2):
        w, gm, s = _bsam_hand(Ls, w, gm, s, order="paper", **hp)
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), w, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="chunk"):
        opt.step(_closure(opt, model, x, y))  # m=3 needs closure(chunk)


def test_bsam_noise_has_standard_deviation_sqrt_inverse_N_s():
    torch.manual_seed(0)
    model = torch.nn.Linear(40, 25).double()  # 1025 parameters
    x = torch.randn(64, 40, dtype=torch.float64)
    y = torch.randint(0, 25, (64,))
    N = 100
    opt = BayesianSAM(model.parameters(), lr=0.02, num_data=N, rho=0.05, betas=(0.9, 0.5), s_init=2.0, seed=5)
    captured: list[torch.Tensor] = []

    def closure():
        opt.zero_grad()
        captured.append(flatten_params(model))
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    # step 1: s = s_init everywhere, so e ~ N(0, 1/(N s_init)) i.i.d.
    w0 = flatten_params(model)
    opt.step(closure)
    e = captured[0] - w0
    n = e.numel()
    sd = float(e.std())
    target = math.sqrt(1 / (N * 2.0))
    assert abs(sd - target) < 4 * target / math.sqrt(2 * n)
    assert abs(float(e.mean())) < 4 * target / math.sqrt(n)
    # later steps: s is no longer uniform; the standardised noise e * sqrt(N s) is N(0, 1)
    zs = []
    for _ in range(4):
        captured.clear()
        s = torch.cat([opt.precision()[p].reshape(-1) for p in model.parameters()])
        w = flatten_params(model)
        opt.step(closure)
        zs.append((captured[0] - w) * torch.sqrt(N * s))
    assert float(s.max() / s.min()) > 1.05  # s really varies across coordinates
    z = torch.cat(zs)
    assert abs(float(z.std()) - 1.0) < 4 / math.sqrt(2 * z.numel())
    assert abs(float(z.mean())) < 4 / math.sqrt(z.numel())


def test_bsam_validation_errors():
    model, x, y = _setup("logreg")
    P = lambda: model.parameters()  # noqa: E731
    for kw, word in [
        (dict(num_data=0), "num_data"),
        (dict(num_data=-3), "num_data"),
        (dict(rho=-0.1), "rho"),
        (dict(lr=-0.1), "lr"),
        (dict(damping=-1.0), "damping"),
        (dict(prior_precision=-1.0), "prior_precision"),
        (dict(s_update_order="x"), "s_update_order"),
        (dict(m=0), "m"),
    ]:
        args = dict(lr=0.1, num_data=10)
        args.update(kw)
        with pytest.raises(ValueError, match=word):
            BayesianSAM(P(), **args)
    opt = BayesianSAM(P(), lr=0.1, num_data=10, seed=0)
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    w0 = flatten_params(model)
    with pytest.raises(ValueError, match="return loss"):
        opt.step(lambda: None)
    assert torch.equal(flatten_params(model), w0)


def test_bsam_batchnorm_stats_updated_by_first_pass_only():
    from tests.references import make_cnn_bn

    model = make_cnn_bn()
    x, y = make_classification_data(n=8, image=True, seed=3)
    ref = make_cnn_bn()
    ref.train()
    ref(x)  # one plain forward pass at w (noise=False)
    opt = BayesianSAM(model.parameters(), lr=0.1, num_data=8, noise=False, model=model)
    opt.step(_closure(opt, model, x, y))
    bn, bn_ref = model[1], ref[1]
    assert torch.equal(bn.running_mean, bn_ref.running_mean)
    assert torch.equal(bn.running_var, bn_ref.running_var)
    assert int(bn.num_batches_tracked) == 1


# ============================================================================================
# posterior sampling and Bayesian model average
# ============================================================================================
def test_sample_context_restores_bit_exactly_even_on_error():
    model, x, y = _setup("mlp")
    opt = BayesianSAM(model.parameters(), lr=0.1, num_data=10, seed=3)
    before = [p.detach().clone() for p in model.parameters()]
    with opt.sample() as noise:
        moved = flatten_params(model)
        expected = torch.cat([(b + noise[p]).reshape(-1) for b, p in zip(before, model.parameters())])
        assert torch.equal(moved, expected)
        assert float((moved - torch.cat([b.reshape(-1) for b in before])).abs().max()) > 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(RuntimeError, match="boom"):
        with opt.sample():
            raise RuntimeError("boom")
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the sampled noise has the posterior standard deviation sqrt(1/(N s)) = sqrt(1/10)
    zs = []
    for _ in range(20):
        with opt.sample() as noise:
            zs.append(torch.cat([v.reshape(-1) for v in noise.values()]))
    z = torch.cat(zs) / math.sqrt(1 / 10)
    assert abs(float(z.std()) - 1) < 4 / math.sqrt(2 * z.numel())


@pytest.mark.parametrize("include_mean", [False, True])
def test_bayesian_model_average_softmax_matches_hand_average(include_mean):
    model, x, y = _setup("mlp")
    L, w = total_loss_fn(model, F.cross_entropy, [(x, y)])
    opt = MFVI(model.parameters(), lr=0.1, num_data=10, init_std=0.3, seed=0)
    model.train()
    probs = bayesian_model_average(opt, model, x, samples=5, generator=torch.Generator().manual_seed(9),
                                   include_mean=include_mean)  # fmt: skip
    assert model.training  # mode restored
    gen = torch.Generator().manual_seed(9)
    std = 0.3
    members = [torch.softmax(model(x), -1).detach()] if include_mean else []
    shapes = [p.shape for p in model.parameters()]
    for _ in range(5):
        z = torch.cat([torch.randn(s, generator=gen, dtype=torch.float64).reshape(-1) for s in shapes])
        theta = w + std * z
        with torch.no_grad():
            W1, b1, W2, b2 = torch.split(theta, [24, 6, 18, 3])
            h = torch.tanh(x @ W1.reshape(6, 4).T + b1)
            members.append(torch.softmax(h @ W2.reshape(3, 6).T + b2, -1))
    torch.testing.assert_close(probs, torch.stack(members).mean(0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(x), dtype=torch.float64))
    assert torch.equal(flatten_params(model), w)


def test_bayesian_model_average_sigmoid_for_one_logit():
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 1).double()
    x = torch.randn(7, 3, dtype=torch.float64)
    opt = BayesianSAM(model.parameters(), lr=0.1, num_data=4, s_init=1.0, seed=0)
    probs = opt.bayesian_model_average(model, x, samples=3, generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(2)
    W, b = model.weight.detach(), model.bias.detach()
    acc = 0
    for _ in range(3):
        dW = torch.randn(W.shape, generator=gen, dtype=W.dtype) * 0.5
        db = torch.randn(b.shape, generator=gen, dtype=b.dtype) * 0.5
        acc = acc + torch.sigmoid(x @ (W + dW).T + b + db)
    torch.testing.assert_close(probs, acc / 3, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="samples"):
        opt.bayesian_model_average(model, x, samples=0)


@pytest.mark.parametrize("which", ["mfvi", "bsam"])
def test_state_dict_roundtrip_continues_identically(which):
    import copy

    def build(model):
        if which == "mfvi":
            return MFVI(model.parameters(), lr=0.05, num_data=30, init_std=0.05, seed=4)
        return BayesianSAM(model.parameters(), lr=0.05, num_data=30, seed=4)

    model, x, y = _setup("mlp")
    opt = build(model)
    opt.step(_closure(opt, model, x, y))
    model2 = copy.deepcopy(model)
    opt2 = build(model2)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares state tensors otherwise
    for _ in range(2):
        opt.step(_closure(opt, model, x, y))
        opt2.step(_closure(opt2, model2, x, y))
    assert torch.equal(flatten_params(model), flatten_params(model2))
    s1 = torch.cat([v.reshape(-1) for v in opt.posterior_std().values()])
    s2 = torch.cat([v.reshape(-1) for v in opt2.posterior_std().values()])
    assert torch.equal(s1, s2)
