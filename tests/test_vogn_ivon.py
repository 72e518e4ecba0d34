"""VOGN (Osawa et al. 2019, Alg. 1) and IVON (Shen et al. 2024, Alg. 1) against hand-written float64
steps, and IVON against the authors' ``ivon-opt`` package when it is installed."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import vector_to_parameters

from optimizers.bayes.ivon import IVON
from optimizers.bayes.vogn import VOGN
from tests.references import flatten_params, make_classification_data, make_mlp, total_loss_fn


def _problem(kind: str, n: int = 12):
    """``logreg``: binary logistic regression (one logit); ``mlp``: a 4-5-3 tanh net, 3 classes."""
    if kind == "logreg":
        model = make_mlp((4, 1), seed=0)
        x, y = make_classification_data(n=n, d=4, n_classes=2, seed=1)
        return model, x, y.to(torch.float64), lambda out, t: F.binary_cross_entropy_with_logits(out[:, 0], t)
    model = make_mlp((4, 5, 3), seed=0)
    x, y = make_classification_data(n=n, d=4, n_classes=3, seed=1)
    return model, x, y, F.cross_entropy


def _noise(model, gen: torch.Generator) -> torch.Tensor:
    """One flat z as the optimizers draw it: per parameter, in order, from ``gen``."""
    return torch.cat(
        [torch.randn(p.shape, generator=gen, dtype=p.dtype).reshape(-1) for p in model.parameters()]
    )


def _per_example_grads(model, loss_fn, x, y, theta: torch.Tensor) -> torch.Tensor:
    """``[B, P]``: a Python loop of ``autograd.grad`` over single examples, at weights ``theta``."""
    m = copy.deepcopy(model)
    vector_to_parameters(theta, m.parameters())
    rows = []
    for i in range(len(y)):
        loss = loss_fn(m(x[i : i + 1]), y[i : i + 1])
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(m.parameters()))]))
    return torch.stack(rows)


# ============================================================================================
# VOGN
# ============================================================================================
def _vogn_hand(model, loss_fn, x, y, mu, mom, s, zs, hp):
    """Osawa et al. 2019, Alg. 1 (official-code form), written out in float64."""
    delta = hp["tau"] * hp["prior"] / hp["N"]
    sigma = torch.sqrt(hp["tau"] / (hp["N"] * (s + delta + hp["gamma"])))
    gs, hs = [], []
    for z in zs:
        G = _per_example_grads(model, loss_fn, x, y, mu + sigma * z)
        gs.append(G.mean(0))
        hs.append(G.square().mean(0))
    g, h = torch.stack(gs).mean(0), torch.stack(hs).mean(0)
    mom = hp["b1"] * mom + g + delta * mu
    s = (1 - hp["b2"]) * s + hp["b2"] * h
    mu = mu - hp["lr"] * mom / (s + delta + hp["gamma"])
    return mu, mom, s, g


def _vogn_closure(model, loss_fn, x, y):
    def closure():
        out = model(x)
        if out.shape[1] == 1:
            return F.binary_cross_entropy_with_logits(out[:, 0], y, reduction="none")
        return loss_fn(out, y, reduction="none")

    return closure


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("samples", [1, 2])
def test_vogn_first_two_steps_match_hand_computed_alg1(kind, samples):
    model, x, y, loss_fn = _problem(kind)
    hp = dict(N=40, lr=0.2, b1=0.8, b2=0.7, prior=3.0, gamma=0.05, tau=0.5)
    opt = VOGN(
        model.parameters(),
        lr=hp["lr"],
        num_data=hp["N"],
        betas=(hp["b1"], hp["b2"]),
        prior_precision=hp["prior"],
        damping=hp["gamma"],
        tempering=hp["tau"],
        s_init=0.4,
        mc_samples=samples,
        seed=5,
    )
    mu = flatten_params(model)
    mom, s = torch.zeros_like(mu), torch.full_like(mu, 0.4)
    gen = torch.Generator().manual_seed(5)
    closure = _vogn_closure(model, loss_fn, x, y)
    for _ in range(2):
        zs = [_noise(model, gen) for _ in range(samples)]
        mu, mom, s, g = _vogn_hand(model, loss_fn, x, y, mu, mom, s, zs, hp)
        opt.step(closure)
        torch.testing.assert_close(flatten_params(model), mu, rtol=1e-12, atol=1e-12)
    params = list(model.parameters())
    torch.testing.assert_close(torch.cat([opt.precision()[p].reshape(-1) for p in params]), s)
    torch.testing.assert_close(torch.cat([opt.state[p]["momentum"].reshape(-1) for p in params]), mom)
    torch.testing.assert_close(torch.cat([p.grad.reshape(-1) for p in params]), g)
    delta = hp["tau"] * hp["prior"] / hp["N"]
    std = torch.cat([opt.posterior_std()[p].reshape(-1) for p in params])
    torch.testing.assert_close(std, torch.sqrt(hp["tau"] / (hp["N"] * (s + delta + hp["gamma"]))))
    assert opt.last["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-12)


def test_vogn_chunked_and_per_example_loop_agree_with_batched_jacobian():
    runs = []
    for chunk, batched in [(None, True), (5, True), (None, False)]:
        model, x, y, loss_fn = _problem("mlp", n=12)
        opt = VOGN(model.parameters(), lr=0.1, num_data=30, chunk_size=chunk, seed=2)
        if not batched:
            opt._grad_state["batched"] = False  # the fallback for ops without a batching rule
        closure = _vogn_closure(model, loss_fn, x, y)
        for _ in range(2):
            opt.step(closure)
        runs.append(flatten_params(model))
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(runs[2], runs[0], rtol=1e-13, atol=1e-13)


def test_vogn_closure_contract_errors():
    model, x, y, loss_fn = _problem("mlp")
    opt = VOGN(model.parameters(), lr=0.1, num_data=12, seed=0)
    before = flatten_params(model)
    with pytest.raises(ValueError, match="per-example losses"):
        opt.step(lambda: F.cross_entropy(model(x), y))  # a scalar, not [B]
    with pytest.raises(ValueError, match="not attached to the autograd graph"):
        opt.step(lambda: F.cross_entropy(model(x), y, reduction="none").detach())
    with pytest.raises(ValueError, match="per-example losses"):
        opt.step()
    torch.testing.assert_close(flatten_params(model), before, rtol=0, atol=0)  # restored after errors


def test_vogn_argument_errors():
    params = make_mlp((4, 3)).parameters
    with pytest.raises(ValueError, match="num_data"):
        VOGN(params(), lr=0.1, num_data=0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        VOGN(params(), lr=0.1, num_data=10, betas=(0.9, 0.0))
    with pytest.raises(ValueError, match="mc_samples"):
        VOGN(params(), lr=0.1, num_data=10, mc_samples=0)
    with pytest.raises(ValueError, match="tempering"):
        VOGN(params(), lr=0.1, num_data=10, tempering=0.0)
    with pytest.raises(ValueError, match="initial posterior variance is infinite"):
        VOGN(params(), lr=0.1, num_data=10, s_init=0.0, damping=0.0, prior_precision=0.0)


# ============================================================================================
# IVON
# ============================================================================================
def _ivon_hand(L, m, g, h, zs, t, hp):
    """Shen et al. 2024, Alg. 1, written out in float64 (``L``: mean mini-batch loss of flat weights)."""
    sigma = 1.0 / torch.sqrt(hp["ess"] * (h + hp["wd"]))
    ghats, hhats = [], []
    for z in zs:
        theta = m + sigma * z
        gh = torch.func.grad(L)(theta)
        ghats.append(gh)
        hhats.append(gh * (theta - m) / sigma**2)
    ghat, hhat = torch.stack(ghats).mean(0), torch.stack(hhats).mean(0)
    b1, b2, wd = hp["b1"], hp["b2"], hp["wd"]
    g = b1 * g + (1 - b1) * ghat
    h = b2 * h + (1 - b2) * hhat + 0.5 * (1 - b2) ** 2 * (h - hhat) ** 2 / (h + wd)
    gbar = g / (1 - b1**t) if hp["debias"] else g
    alpha = hp["lr"] * (hp["h0"] + wd) if hp["rescale"] else hp["lr"]
    step = ((gbar + wd * m) / (h + wd)).clamp(-hp["clip"], hp["clip"])
    return m - alpha * step, g, h


@pytest.mark.parametrize(
    "samples, debias, rescale, clip",
    [(1, True, True, math.inf), (2, False, False, 0.05), (1, True, False, 0.5)],
)
def test_ivon_three_steps_match_hand_written_alg1(samples, debias, rescale, clip):
    model, x, y, loss_fn = _problem("mlp")
    L, m = total_loss_fn(model, F.cross_entropy, [(x, y)])
    hp = dict(lr=0.1, ess=30.0, h0=0.3, wd=0.02, b1=0.9, b2=0.95, debias=debias, rescale=rescale, clip=clip)
    opt = IVON(
        model.parameters(),
        lr=hp["lr"],
        ess=hp["ess"],
        hess_init=hp["h0"],
        betas=(hp["b1"], hp["b2"]),
        weight_decay=hp["wd"],
        mc_samples=samples,
        clip_radius=clip,
        debias=debias,
        rescale_lr=rescale,
        seed=9,
    )
    g, h = torch.zeros_like(m), torch.full_like(m, hp["h0"])
    gen = torch.Generator().manual_seed(9)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for t in range(1, 4):
        zs = [_noise(model, gen) for _ in range(samples)]
        m, g, h = _ivon_hand(L, m, g, h, zs, t, hp)
        opt.step(closure)
        torch.testing.assert_close(flatten_params(model), m, rtol=1e-12, atol=1e-12)
    params = list(model.parameters())
    torch.testing.assert_close(torch.cat([opt.hessian()[p].reshape(-1) for p in params]), h)
    std = torch.cat([opt.posterior_std()[p].reshape(-1) for p in params])
    torch.testing.assert_close(std, 1.0 / torch.sqrt(hp["ess"] * (h + hp["wd"])))
    assert bool((h + hp["wd"] > 0).all())


@pytest.mark.parametrize("samples", [1, 2])
def test_ivon_three_steps_match_the_ivon_opt_package(samples, monkeypatch):
    ivon = pytest.importorskip("ivon")
    model, x, y, _ = _problem("mlp")
    theirs_model = copy.deepcopy(model)
    # hess_init exactly representable in float32: ivon-opt adds it as a float32 0-d tensor
    hp = dict(lr=0.05, ess=20.0, hess_init=0.25, weight_decay=1e-2, mc_samples=samples)
    ours = IVON(model.parameters(), betas=(0.9, 0.99), seed=3, **hp)
    theirs = ivon.IVON(theirs_model.parameters(), beta1=0.9, beta2=0.99, **hp)
    real_randn, gen = torch.randn, torch.Generator().manual_seed(3)

    def same_noise(*_args, **_kwargs):
        """ivon-opt draws one flat vector per group with torch.randn: hand it our z, in our order."""
        zs = [real_randn(p.shape, generator=gen, dtype=p.dtype) for p in theirs_model.parameters()]
        return torch.cat([z.reshape(-1) for z in zs])

    def our_closure():
        ours.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    def their_closure():
        with theirs.sampled_params(train=True):
            theirs.zero_grad()
            loss = F.cross_entropy(theirs_model(x), y)
            loss.backward()
        return loss

    for _ in range(3):
        ours.step(our_closure)
        with monkeypatch.context() as mp:
            mp.setattr(torch, "randn", same_noise)
            theirs.step(their_closure)
        torch.testing.assert_close(
            flatten_params(model), flatten_params(theirs_model), rtol=1e-12, atol=1e-12
        )


def test_ivon_errors_and_state_dict_roundtrip():
    model, x, y, _ = _problem("mlp")
    with pytest.raises(ValueError, match="ess"):
        IVON(model.parameters(), lr=0.1, ess=0.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        IVON(model.parameters(), lr=0.1, ess=10.0, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="hess_init"):
        IVON(model.parameters(), lr=0.1, ess=10.0, hess_init=0.0)
    opt = IVON(model.parameters(), lr=0.1, ess=10.0, seed=4)
    with pytest.raises(ValueError, match="needs a closure"):
        opt.step()

    def closure(o, mdl):
        def c():
            o.zero_grad()
            loss = F.cross_entropy(mdl(x), y)
            loss.backward()
            return loss

        return c

    opt.step(closure(opt, model))
    twin = copy.deepcopy(model)
    opt2 = IVON(twin.parameters(), lr=0.1, ess=10.0, seed=123)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for _ in range(2):
        opt.step(closure(opt, model))
        opt2.step(closure(opt2, twin))
    torch.testing.assert_close(flatten_params(twin), flatten_params(model), rtol=0, atol=0)
    vogn = VOGN(twin.parameters(), lr=0.1, num_data=10)
    with pytest.raises(ValueError, match=r"saved by (a )?IVON"):
        vogn.load_state_dict(opt.state_dict())


# ============================================================================================
# the step summary ``last`` (one helper for IVON, VOGN and bSAM)
# ============================================================================================
def _flat(d: dict, model) -> torch.Tensor:
    return torch.cat([d[p].reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("name", ["ivon", "vogn", "bsam"])
def test_step_summary_matches_the_optimizer_state(name):
    from optimizers.bayes.bsam import BayesianSAM

    model, x, y, _ = _problem("mlp")
    seen: list[float] = []

    def closure():  # IVON / bSAM: a mean loss with backward; VOGN: per-example losses
        model.zero_grad()
        if name == "vogn":
            losses = F.cross_entropy(model(x), y, reduction="none")
            seen.append(float(losses.detach().mean()))
            return losses
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        seen.append(float(loss))
        return loss

    if name == "ivon":
        opt = IVON(model.parameters(), lr=0.05, ess=30.0, weight_decay=0.1, mc_samples=2, seed=3)
    elif name == "vogn":
        opt = VOGN(
            model.parameters(), lr=0.05, num_data=30, prior_precision=2.0, damping=0.01, tempering=0.5,
            mc_samples=2, seed=3,
        )  # fmt: skip
    else:
        opt = BayesianSAM(model.parameters(), lr=0.05, num_data=30, rho=0.1, seed=3)
    for _ in range(2):
        seen.clear()
        loss = opt.step(closure)
    last = opt.last
    if name == "ivon":
        h = _flat(opt.hessian(), model)
        std = 1 / torch.sqrt(30.0 * (h + 0.1))  # Shen et al. 2024: sigma^2 = 1 / (lambda (h + delta))
        keys = ["loss", "grad_norm", "noise_norm", "hess_min", "hess_mean", "hess_max"]
        mean_loss = sum(seen) / 2
    elif name == "vogn":
        h = _flat(opt.precision(), model)
        std = torch.sqrt(0.5 / (30 * (h + 0.5 * 2.0 / 30 + 0.01)))  # tau / (N (s + tau prior / N + gamma))
        keys = ["loss", "grad_norm", "noise_norm", "s_min", "s_mean", "s_max"]
        mean_loss = sum(seen) / 2
    else:
        h = _flat(opt.precision(), model)
        std = 1 / torch.sqrt(30 * h)
        keys = ["loss", "loss_perturbed", "grad_norm", "eps_norm", "noise_norm", "s_min", "s_mean", "s_max"]
        mean_loss, pert = seen[0], seen[1]  # pass 1 at w + e, pass 2 at w + eps
        assert last["loss_perturbed"] == pytest.approx(pert, rel=1e-14)
    assert list(last) == keys + ["posterior_std_mean"]
    assert last["loss"] == pytest.approx(mean_loss, rel=1e-14) and float(loss) == last["loss"]
    stat = keys[-3].split("_")[0]
    assert last[f"{stat}_min"] == float(h.min()) and last[f"{stat}_max"] == float(h.max())
    assert last[f"{stat}_mean"] == pytest.approx(float(h.mean()), rel=1e-14)
    assert last["posterior_std_mean"] == pytest.approx(float(std.mean()), rel=1e-12)
    if name != "bsam":  # p.grad holds the averaged gradient of the step
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert last["grad_norm"] == pytest.approx(float(g.norm()), rel=1e-12)
