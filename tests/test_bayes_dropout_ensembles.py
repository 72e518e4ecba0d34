"""MC-Dropout / F-MC-Dropout and Deep / F-Deep ensembles against hand-computed references (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from optimizers import SAM
from optimizers.bayes import (
    DeepEnsemble,
    f_mc_dropout,
    mc_dropout_closure,
    mc_dropout_predict,
    sam_factory,
    train_ensemble,
)
from tests.references import make_classification_data

DT = torch.float64
P_DROP = 0.3


def _dropout_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Dropout(P_DROP), nn.Linear(6, 3)
    ).to(DT)
    with torch.no_grad():  # running statistics far from a batch's, so train-mode BN would differ
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 2.0)
    return net


def _hand_mc_dropout(net: nn.Sequential, x: torch.Tensor, samples: int, seed: int) -> torch.Tensor:
    """Independent forward: BN with running statistics, masks drawn as Bernoulli(1 - p) in order."""
    lin1, bn, _, _, lin2 = net
    w1, b1, w2, b2 = (t.detach() for t in (lin1.weight, lin1.bias, lin2.weight, lin2.bias))
    pre = x @ w1.T + b1
    pre = (pre - bn.running_mean) / torch.sqrt(
        bn.running_var + bn.eps
    ) * bn.weight.detach() + bn.bias.detach()
    h = torch.tanh(pre)
    torch.manual_seed(seed)
    total = torch.zeros(len(x), 3, dtype=DT)
    for _ in range(samples):
        mask = torch.empty_like(h).bernoulli_(1 - P_DROP)
        logits = (h * mask / (1 - P_DROP)) @ w2.T + b2
        total += torch.softmax(logits, dim=1)
    return total / samples


def _snapshot(model: nn.Module):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        {m: m.training for m in model.modules()},
    )


def test_mc_dropout_prediction_equals_hand_masks_and_leaves_everything_as_it_was():
    net = _dropout_net()
    x, _ = make_classification_data(n=7, d=4, seed=1)
    net.train()
    net[4].eval()  # a mixed mode that must come back exactly
    state, flags = _snapshot(net)
    rng = torch.get_rng_state()
    got = mc_dropout_predict(net, x, samples=9, seed=123)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is forked, not consumed
    want = _hand_mc_dropout(net, x, 9, 123)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert {m: m.training for m in net.modules()} == flags
    for k, v in net.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert all(p.grad is None for p in net.parameters())
    # the same seed gives the same masks; another seed other masks; averaging changes the output
    torch.testing.assert_close(mc_dropout_predict(net, x, samples=9, seed=123), got, rtol=0, atol=0)
    assert not torch.allclose(mc_dropout_predict(net, x, samples=9, seed=124), got)
    net.eval()
    with torch.no_grad():
        deterministic = torch.softmax(net(x), 1)
    assert not torch.allclose(got, deterministic, atol=1e-3)


def test_mc_dropout_generator_draws_the_seed_and_modes_survive_an_error():
    net = _dropout_net()
    x, _ = make_classification_data(n=5, d=4, seed=2)
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(7)).item())
    got = mc_dropout_predict(net, x, samples=4, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(got, _hand_mc_dropout(net, x, 4, seed), rtol=1e-12, atol=1e-14)
    net.train()
    with pytest.raises(RuntimeError):
        mc_dropout_predict(net, torch.zeros(3, 5, dtype=DT), samples=2, seed=0)  # wrong width
    assert all(m.training for m in net.modules())


def test_mc_dropout_bad_input_errors():
    with pytest.raises(ValueError, match="no dropout module"):
        mc_dropout_predict(nn.Linear(2, 2), torch.zeros(1, 2), seed=0)
    with pytest.raises(ValueError, match="samples"):
        mc_dropout_predict(_dropout_net(), torch.zeros(1, 4, dtype=DT), samples=0, seed=0)
    with pytest.raises(TypeError, match="generator"):
        mc_dropout_predict(_dropout_net(), torch.zeros(1, 4, dtype=DT), generator=3)


def _flat_loss_fixed_mask(theta, x, y, mask):
    w1, b1 = theta[:15].reshape(5, 3), theta[15:20]
    w2, b2 = theta[20:35].reshape(3, 5), theta[35:38]
    h = torch.tanh(x @ w1.T + b1) * mask / (1 - 0.4)
    z = h @ w2.T + b2
    return (torch.logsumexp(z, 1) - z[torch.arange(len(y)), y]).mean()


def test_f_mc_dropout_step_with_shared_masks_equals_hand_sam_step():
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Dropout(0.4), nn.Linear(5, 3)).to(DT)
    x, y = make_classification_data(n=8, d=3, seed=4)
    theta = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    opt = f_mc_dropout(net.parameters(), torch.optim.SGD, rho=0.2, lr=0.5)
    assert isinstance(opt, SAM)
    closure = mc_dropout_closure(opt, net, nn.functional.cross_entropy, x, y, seed=11)
    loss = opt.step(closure)
    # hand: the step's seed is the first draw of the closure's generator; one mask for both passes
    step_seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(11)).item())
    torch.manual_seed(step_seed)
    mask = torch.empty(8, 5, dtype=DT).bernoulli_(0.6)
    t0 = theta.clone().requires_grad_(True)
    l0 = _flat_loss_fixed_mask(t0, x, y, mask)
    (g,) = torch.autograd.grad(l0, t0)
    t1 = (theta + 0.2 * g / (g.norm() + 1e-12)).requires_grad_(True)
    (g1,) = torch.autograd.grad(_flat_loss_fixed_mask(t1, x, y, mask), t1)
    want = theta - 0.5 * g1
    got = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, l0.detach(), rtol=1e-12, atol=1e-14)


# --------------------------------------------------------------------------------------------
# deep ensembles
# --------------------------------------------------------------------------------------------
def _linear() -> nn.Module:
    return nn.Linear(3, 4).to(DT)


def test_ensemble_members_differ_and_are_reproducible_from_the_seed():
    rng = torch.get_rng_state()
    ens = DeepEnsemble(_linear, num_members=3, seed=40)
    assert torch.equal(torch.get_rng_state(), rng)
    assert ens.member_seeds == [40, 41, 42]
    again = DeepEnsemble(_linear, num_members=3, seed=40)
    for a, b in zip(ens.members, again.members):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    for k, member in enumerate(ens.members):
        torch.manual_seed(40 + k)
        ref = _linear()
        assert torch.equal(member.weight, ref.weight) and torch.equal(member.bias, ref.bias)
    w = [m.weight for m in ens.members]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])


def test_ensemble_prediction_is_the_mean_of_member_softmaxes():
    ens = DeepEnsemble(_linear, num_members=4, seed=0)
    x, _ = make_classification_data(n=6, d=3, seed=5)
    want = sum(torch.softmax(x @ m.weight.detach().T + m.bias.detach(), 1) for m in ens.members) / 4
    torch.testing.assert_close(ens.predict(x), want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ens.bayesian_model_average(x), want, rtol=1e-12, atol=1e-14)
    assert ens(x).shape == (4, 6, 4)
    assert all(m.training for m in ens.modules())


def _ce_grad(w, b, x, y):
    """Closed-form gradient of the mean cross-entropy of ``x w^T + b``."""
    p = torch.softmax(x @ w.T + b, 1)
    p[torch.arange(len(y)), y] -= 1
    g = p / len(y)
    return g.T @ x, g.sum(0)


@pytest.mark.parametrize("method", ["sgd", "sam"])
def test_train_ensemble_one_step_per_member_equals_hand_step(method):
    ens = DeepEnsemble(_linear, num_members=3, seed=7)
    x, y = make_classification_data(n=10, d=3, n_classes=4, seed=8)
    before = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in ens.members]
    lr, rho = 0.5, 0.1
    if method == "sgd":
        factory = lambda params: torch.optim.SGD(params, lr=lr)
    else:
        factory = sam_factory(torch.optim.SGD, rho=rho, lr=lr)
    hist = train_ensemble(ens, (x, y), factory, epochs=1)
    assert hist["seeds"] == [0, 1, 2] and len(hist["loss"]) == 3
    for k, (member, (w, b)) in enumerate(zip(ens.members, before)):
        gw, gb = _ce_grad(w, b, x, y)
        if method == "sam":
            scale = rho / (torch.sqrt(gw.square().sum() + gb.square().sum()) + 1e-12)
            gw, gb = _ce_grad(w + scale * gw, b + scale * gb, x, y)
            assert isinstance(hist["optimizers"][k], SAM) and hist["optimizers"][k].model is member
        torch.testing.assert_close(member.weight.detach(), w - lr * gw, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(member.bias.detach(), b - lr * gb, rtol=1e-12, atol=1e-14)
        ce = torch.nn.functional.cross_entropy(x @ w.T + b, y)
        assert hist["loss"][k] == [pytest.approx(float(ce), rel=1e-12)]  # one step


def test_train_ensemble_bad_input_errors():
    ens = DeepEnsemble(_linear, num_members=2, seed=0)
    data = make_classification_data(n=4, d=3, n_classes=4, seed=0)
    with pytest.raises(TypeError, match="each member needs its own"):
        train_ensemble(ens, data, torch.optim.SGD(ens.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="one torch.optim.Optimizer per member"):
        train_ensemble(ens, data, [torch.optim.SGD(ens.members[0].parameters(), lr=0.1)])
    with pytest.raises(TypeError, match="DeepEnsemble"):
        train_ensemble(_linear(), data, lambda p: torch.optim.SGD(p, lr=0.1))
    with pytest.raises(ValueError, match="num_members"):
        DeepEnsemble(_linear, num_members=0)
    shared = _linear()
    with pytest.raises(ValueError, match="same module twice"):
        DeepEnsemble(lambda: shared, num_members=2)
