"""VOGN's official defaults (``team-approx-bayes/dl-with-bayes``,
``distributed/classification/configs/cifar10/resnet18_vogn_bs256_8gpu.json``: ``"num_mc_samples": 5``,
``"non_reg_for_bn": true``) against hand-written float64 steps: BatchNorm weights and biases get no
prior term and no noise (torchsso ``SecondOrderOptimizer``: ``l2_reg = 0`` for ``nn.BatchNorm1d/2d/3d``;
``VIOptimizer``: ``std_scale = 0`` for such a group), and ``mc_samples=k`` averages ``k`` draws."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimizers.bayes.vogn import VOGN

OFFICIAL_MC_SAMPLES = 5  # "num_mc_samples" of the CIFAR-10 / CIFAR-100 ResNet-18 VOGN configs
HP = dict(N=50, lr=0.3, b1=0.8, b2=0.6, prior=4.0, gamma=0.02, tau=0.7, s0=0.5)
DT = torch.float64


def _bn_model(seed: int = 0) -> nn.Sequential:
    """3-4-2 net with an eval-mode BatchNorm1d (non-trivial running statistics and affine parameters)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)).to(DT)
    bn = model[1]
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=DT))
        bn.running_var.copy_(torch.tensor([0.5, 1.5, 2.0, 0.8], dtype=DT))
        bn.weight.copy_(torch.tensor([1.2, 0.7, -0.4, 0.9], dtype=DT))
        bn.bias.copy_(torch.tensor([0.05, -0.1, 0.2, 0.3], dtype=DT))
    return model.eval()  # per-example gradients need examples that do not interact


def _data(n: int = 6):
    g = torch.Generator().manual_seed(3)
    return torch.randn(n, 3, generator=g, dtype=DT), torch.randint(0, 2, (n,), generator=g)


def _forward(theta, x, bn):
    """The model written out: Linear, BatchNorm (eval: running statistics), tanh, Linear."""
    w1, b1, gam, beta, w2, b2 = theta
    h = (x @ w1.T + b1 - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) * gam + beta
    return torch.tanh(h) @ w2.T + b2


def _hand_step(mu, mom, s, zs, x, y, bn, exempt):
    """One VOGN step (Osawa et al. 2019, Alg. 1, torchsso form) with the non_reg_for_bn exemption:
    an exempt tensor has delta~ = 0 (momentum and step) and sigma = 0."""
    N, tau = HP["N"], HP["tau"]
    delta = [0.0 if ex else tau * HP["prior"] / N for ex in exempt]
    sig = [
        torch.zeros_like(m) if ex else torch.sqrt(tau / (N * (si + d + HP["gamma"])))
        for m, si, d, ex in zip(mu, s, delta, exempt)
    ]
    g_k, h_k, thetas = [], [], []
    for z in zs:
        theta = [(m + sg * zz).requires_grad_(True) for m, sg, zz in zip(mu, sig, z)]
        thetas.append([t.detach() for t in theta])
        rows = []
        for i in range(len(y)):
            loss = F.cross_entropy(_forward(theta, x[i : i + 1], bn), y[i : i + 1])
            rows.append(torch.autograd.grad(loss, theta))
        g_k.append([torch.stack([r[j] for r in rows]).mean(0) for j in range(len(mu))])
        h_k.append([torch.stack([r[j].square() for r in rows]).mean(0) for j in range(len(mu))])
    K = len(zs)
    g = [sum(gk[j] for gk in g_k) / K for j in range(len(mu))]
    h = [sum(hk[j] for hk in h_k) / K for j in range(len(mu))]
    mom = [HP["b1"] * mo + gj + d * m for mo, gj, d, m in zip(mom, g, delta, mu)]
    s = [(1 - HP["b2"]) * si + HP["b2"] * hj for si, hj in zip(s, h)]
    mu = [m - HP["lr"] * mo / (si + d + HP["gamma"]) for m, mo, si, d in zip(mu, mom, s, delta)]
    return mu, mom, s, g, thetas


def _vogn(params, **kw) -> VOGN:
    return VOGN(
        params,
        lr=HP["lr"],
        num_data=HP["N"],
        betas=(HP["b1"], HP["b2"]),
        prior_precision=HP["prior"],
        damping=HP["gamma"],
        tempering=HP["tau"],
        s_init=HP["s0"],
        seed=11,
        **kw,
    )


def _recording_closure(model, x, y, seen):
    def closure():
        seen.append([p.detach().clone() for p in model.parameters()])
        return F.cross_entropy(model(x), y, reduction="none")

    return closure


def _run_against_hand(opt, model, exempt, samples, steps=2):
    x, y = _data()
    mu = [p.detach().clone() for p in model.parameters()]
    mom = [torch.zeros_like(m) for m in mu]
    s = [torch.full_like(m, HP["s0"]) for m in mu]
    gen = torch.Generator().manual_seed(11)
    seen: list = []
    closure = _recording_closure(model, x, y, seen)
    for step in range(steps):
        # z for every tensor, in parameter order, sample by sample (also the exempt ones: drawn, unused)
        zs = [[torch.randn(m.shape, generator=gen, dtype=DT) for m in mu] for _ in range(samples)]
        mu_before = mu
        mu, mom, s, g, thetas = _hand_step(mu, mom, s, zs, x, y, model[1], exempt)
        n_seen = len(seen)
        opt.step(closure)
        assert len(seen) - n_seen == samples  # one closure call per draw
        for k in range(samples):  # the closure ran at the hand-drawn weights
            for a, b in zip(seen[n_seen + k], thetas[k]):
                torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)
        for p, m in zip(model.parameters(), mu):
            torch.testing.assert_close(p.detach(), m, rtol=1e-12, atol=1e-12)
        for p, mo, si, gj in zip(model.parameters(), mom, s, g):
            torch.testing.assert_close(opt.state[p]["momentum"], mo, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(opt.state[p]["s"], si, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(p.grad, gj, rtol=1e-12, atol=1e-12)
        if step == 0:
            first = (mu_before, mom, g, seen[n_seen:])
    return first


# ============================================================================================
# non_reg_for_bn
# ============================================================================================
def test_bn_parameters_get_no_prior_and_no_noise_as_hand_computed():
    model = _bn_model()
    opt = _vogn(model.parameters(), model=model, mc_samples=2)  # non_reg_for_bn=True by default
    exempt = [False, False, True, True, False, False]  # Linear w, b; BN weight, bias; Linear w, b
    mu0, mom1, g1, seen = _run_against_hand(opt, model, exempt, samples=2)
    delta = HP["tau"] * HP["prior"] / HP["N"]
    for j, ex in enumerate(exempt):
        for theta in seen:  # no noise on BN, noise on the rest
            assert torch.equal(theta[j], mu0[j]) is ex
        # step 1 from zero momentum: m = g (+ delta~ mu for the regularised tensors only)
        torch.testing.assert_close(mom1[j], g1[j] + (0.0 if ex else delta) * mu0[j], rtol=0, atol=0)
        assert (mu0[j] != 0).all()  # the prior term is visible
    std = opt.posterior_std()
    for p, ex in zip(model.parameters(), exempt):
        assert bool((std[p] == 0).all()) is ex and bool((std[p] > 0).all()) is not ex


def test_non_reg_for_bn_false_regularises_and_perturbs_bn_like_the_rest():
    model = _bn_model()
    opt = _vogn(model.parameters(), model=model, mc_samples=2, non_reg_for_bn=False)
    _run_against_hand(opt, model, [False] * 6, samples=2)


def test_param_group_marked_non_reg_equals_the_model_argument():
    runs = []
    for how in ("model", "groups"):
        model = _bn_model()
        if how == "model":
            # the same per-example method as without the model, so the runs agree bit for bit
            opt = _vogn(model.parameters(), model=model, mc_samples=2, per_example="batched_backward")
        else:  # same parameter order: Linear, BN (marked), Linear
            groups = [
                {"params": list(m.parameters()), "non_reg": isinstance(m, nn.BatchNorm1d)} for m in model
            ]
            opt = _vogn([g for g in groups if g["params"]], mc_samples=2)
        closure = _recording_closure(model, *_data(), [])
        for _ in range(2):
            opt.step(closure)
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_only_batchnorm_is_exempt_not_group_or_layer_norm():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.GroupNorm(2, 4), nn.LayerNorm(4), nn.Linear(4, 2)).to(DT)
    opt = _vogn(model.parameters(), model=model, mc_samples=1)
    x, y = _data()
    opt.step(lambda: F.cross_entropy(model(x), y, reduction="none"))  # no BatchNorm op: no error
    assert all(bool((sd > 0).all()) for sd in opt.posterior_std().values())


def test_runner_builds_vogn_with_the_model_so_bn_is_exempt():
    from experiments.methods import build_optimizer

    model = _bn_model()
    method = dict(name="m", optimizer="vogn", hyperparameters={"lr": 0.01}, bayesian=None, swag=None)
    method.update(mc_dropout=None, ensemble=None)
    opt, used = build_optimizer(
        method, model, train_cfg={"lr": 0.1, "optimizer_defaults": {}}, num_data=50, seed=0, steps_per_epoch=1
    )
    assert isinstance(opt, VOGN) and opt.mc_samples == OFFICIAL_MC_SAMPLES and "model" not in used
    std = opt.posterior_std()
    assert [bool((std[p] == 0).all()) for p in model.parameters()] == [False, False, True, True, False, False]


# ============================================================================================
# mc_samples
# ============================================================================================
def test_defaults_are_the_official_values():
    sig = inspect.signature(VOGN).parameters
    assert sig["mc_samples"].default == OFFICIAL_MC_SAMPLES
    assert sig["non_reg_for_bn"].default is True
    # the other official CIFAR-10 ResNet-18 values: ema_decay 0.999, momentum 0.9, prior variance
    # 0.02, damping 1e-3
    assert sig["betas"].default == (0.9, 0.999)
    assert sig["prior_precision"].default == pytest.approx(1 / 0.02)
    assert sig["damping"].default == 1e-3
    opt = VOGN(_bn_model().parameters(), lr=0.1, num_data=10)
    assert opt.mc_samples == opt.config["mc_samples"] == OFFICIAL_MC_SAMPLES
    assert opt.config["non_reg_for_bn"] is True


@pytest.mark.parametrize("k", [1, 3, None])  # None: the default, 5 draws
def test_mc_samples_k_averages_k_draws_of_the_generator(k):
    model = _bn_model()
    opt = _vogn(model.parameters(), model=model, **({} if k is None else {"mc_samples": k}))
    _run_against_hand(opt, model, [False, False, True, True, False, False], samples=k or 5, steps=1)
    assert opt.last["noise_norm"] > 0 and math.isfinite(opt.last["loss"])


# ============================================================================================
# errors
# ============================================================================================
def test_bn_without_model_is_an_error_naming_the_fixes():
    model = _bn_model()
    x, y = _data()
    before = [p.detach().clone() for p in model.parameters()]
    opt = _vogn(model.parameters())
    with pytest.raises(ValueError, match=r"2 optimized parameter\(s\).*BatchNorm.*model=net.*non_reg=True"):
        opt.step(lambda: F.cross_entropy(model(x), y, reduction="none"))
    for p, b in zip(model.parameters(), before):  # restored, not stepped
        assert torch.equal(p, b)
    with pytest.raises(ValueError, match="non_reg_for_bn=False"):  # checked again, not only once
        opt.step(lambda: F.cross_entropy(model(x), y, reduction="none"))
    opt = _vogn(model.parameters(), non_reg_for_bn=False, mc_samples=1)  # the explicit opt-out steps
    opt.step(lambda: F.cross_entropy(model(x), y, reduction="none"))


def test_argument_errors():
    model = _bn_model()
    with pytest.raises(ValueError, match="model must be the torch.nn.Module"):
        VOGN(model.parameters(), lr=0.1, num_data=10, model=list(model.parameters()))
    with pytest.raises(ValueError, match="2 of the optimized parameters are not parameters of model="):
        VOGN(model.parameters(), lr=0.1, num_data=10, model=model[:2])
    with pytest.raises(ValueError, match="non_reg_for_bn must be True or False"):
        VOGN(model.parameters(), lr=0.1, num_data=10, non_reg_for_bn="yes")
    with pytest.raises(ValueError, match=r"non_reg \(param group 0\) must be True"):
        VOGN([{"params": model.parameters(), "non_reg": 1}], lr=0.1, num_data=10)
    with pytest.raises(ValueError, match="mc_samples"):
        VOGN(model.parameters(), lr=0.1, num_data=10, mc_samples=0)


def test_state_dict_round_trip_and_an_old_one_without_non_reg():
    model = _bn_model()
    x, y = _data()
    opt = _vogn(model.parameters(), model=model, mc_samples=1)
    opt.step(lambda: F.cross_entropy(model(x), y, reduction="none"))
    sd = opt.state_dict()
    assert [g["non_reg"] for g in sd["param_groups"]] == [False]
    for g in sd["param_groups"]:
        del g["non_reg"]  # saved before the key existed
    other = _vogn(model.parameters(), model=model, mc_samples=1)
    other.load_state_dict(sd)
    other.step(lambda: F.cross_entropy(model(x), y, reduction="none"))
    std = other.posterior_std()
    assert (std[model[1].weight] == 0).all() and (std[model[0].weight] > 0).all()
