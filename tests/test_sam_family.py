"""SAM family (SAM, ASAM, FisherSAM, RandomSAM, MixSAM, VariationalSAM) against hand-computed steps.

Every reference below is written out with plain tensor operations on a flat float64 parameter
vector: the loss is a hand-written function of that vector (no ``nn.Module``), its gradient comes
from ``torch.autograd.grad`` on that function, the perturbation is the formula from
``docs/methods/optimizers.md`` and the base optimizer update (SGD with momentum + weight decay, Adam) is
written out by hand.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch.nn import functional as F

from optimizers import SAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM
from tests.references import make_classification_data, make_mlp
from tests.sam_hand_steps import (
    DT,
    HP,
    PROBLEMS,
    TOL,
    _batches,
    _flat,
    _hand_base,
    _make_opt,
    _mlp_problem,
    _recording_closure,
    _ref_trajectory,
    _run_opt,
)


# --------------------------------------------------------------------------------------------
# update rules == hand-computed steps
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", list(HP))
@pytest.mark.parametrize("problem", list(PROBLEMS))
@pytest.mark.parametrize("steps", [1, 3])
def test_update_equals_hand_computed_step_sgd(method, problem, steps):
    model, x, y, module_loss, flat_loss = PROBLEMS[problem]()
    base_cls, base_kw, hand = _hand_base("sgd")
    hp = HP[method]
    batches = _batches(x, y, steps)
    theta_ref, recs = _ref_trajectory(method, model, flat_loss, batches, hand, hp)
    opt = _make_opt(method, model, base_cls, base_kw, hp)
    losses = _run_opt(opt, model, module_loss, batches)
    torch.testing.assert_close(_flat(model), theta_ref, **TOL)
    # the returned loss is the loss at w (RandomSAM: at w + eps, its only evaluation)
    torch.testing.assert_close(losses[-1].to(DT), recs[-1]["loss"], **TOL)
    if "loss_eps" in recs[-1]:
        torch.testing.assert_close(opt.last["loss_perturbed"].to(DT), recs[-1]["loss_eps"], **TOL)
    torch.testing.assert_close(opt.last["eps_norm"], recs[-1]["eps"].norm(), **TOL)
    if method == "vsam":
        std = torch.cat([s.reshape(-1) for s in opt.posterior_std().values()])
        torch.testing.assert_close(std, recs[-1]["sigma"], **TOL)


@pytest.mark.parametrize("method", ["sam", "fisher_sam", "vsam"])
def test_update_equals_hand_computed_step_adam(method):
    model, x, y, module_loss, flat_loss = _mlp_problem(seed=2)
    base_cls, base_kw, hand = _hand_base("adam")
    batches = _batches(x, y, 3)
    theta_ref, _ = _ref_trajectory(method, model, flat_loss, batches, hand, HP[method])
    opt = _make_opt(method, model, base_cls, base_kw, HP[method])
    _run_opt(opt, model, module_loss, batches)
    torch.testing.assert_close(_flat(model), theta_ref, **TOL)


def test_asam_scale_all_and_fisher_sam_custom_fisher():
    model, x, y, module_loss, flat_loss = _mlp_problem(seed=5)
    batches = _batches(x, y, 2)
    base_cls, base_kw, hand = _hand_base("sgd")
    hp = {"rho": 0.3, "eta": 0.05, "scale_all": True}
    ref, _ = _ref_trajectory("asam", model, flat_loss, batches, hand, hp)
    m2 = copy.deepcopy(model)
    _run_opt(_make_opt("asam", m2, base_cls, base_kw, hp), m2, module_loss, batches)
    torch.testing.assert_close(_flat(m2), ref, **TOL)

    # FisherSAM with an analytic diagonal Fisher used as is: F(theta) = 2 + theta^2
    _, _, hand = _hand_base("sgd")
    hp = {
        "rho": 0.1,
        "eta": 1.0,
        "fisher": lambda th: 2 + th * th,
        "fisher_param": lambda p: 2 + p.detach() ** 2,
    }
    ref, _ = _ref_trajectory("fisher_sam", model, flat_loss, batches, hand, hp)
    m3 = copy.deepcopy(model)
    _run_opt(_make_opt("fisher_sam", m3, base_cls, base_kw, hp), m3, module_loss, batches)
    torch.testing.assert_close(_flat(m3), ref, **TOL)


# --------------------------------------------------------------------------------------------
# constraints, read off the parameters the closure actually sees (independent of opt.last)
# --------------------------------------------------------------------------------------------


def test_constraints_on_the_probed_points():
    model, x, y, module_loss, _ = _mlp_problem(seed=1)
    p = sum(q.numel() for q in model.parameters())
    cases = [
        (SAM(model.parameters(), torch.optim.SGD, rho=0.07, lr=0.0), "sam"),
        (FisherSAM(model.parameters(), torch.optim.SGD, rho=0.2, eta=3.0, lr=0.0), "fisher"),
        (MixSAM(model.parameters(), torch.optim.SGD, rho=0.09, kappa=2.0, seed=1, lr=0.0), "mix"),
        (VariationalSAM(model.parameters(), torch.optim.SGD, rho=0.05, num_data=18, lr=0.0), "vsam"),
    ]
    for opt, kind in cases:
        log: list = []
        sigma = None
        if kind == "vsam":
            sigma = torch.cat([s.reshape(-1) for s in opt.posterior_std().values()])
        opt.step(_recording_closure(opt, model, module_loss, x, y, log))
        (w0, g), (w1, _) = log
        eps = w1 - w0
        if kind == "sam":
            torch.testing.assert_close(eps.norm(), torch.tensor(0.07, dtype=DT), **TOL)
            torch.testing.assert_close(eps / eps.norm(), g / g.norm(), **TOL)
        elif kind == "fisher":
            q = (eps * (1 + 3.0 * g * g) * eps).sum()
            torch.testing.assert_close(q, torch.tensor(0.2**2, dtype=DT), **TOL)
            torch.testing.assert_close(opt.last["fisher_quadratic"], (g * g / (1 + 3.0 * g * g)).sum(), **TOL)
            # not the Euclidean rescaling pitfall: ||eps|| != gamma here
            assert abs(float(eps.norm()) - 0.2) > 1e-3
        elif kind == "mix":
            torch.testing.assert_close(eps.norm(), torch.tensor(0.09, dtype=DT), **TOL)
            cos = float((eps @ g) / (eps.norm() * g.norm()))
            assert 0.05 < cos < 0.999  # between the SAM direction and a random one
        else:
            # w1 - w0 loses ~1e-10 relative accuracy to cancellation, and the 1e-12 guard on
            # sqrt(g^T Sigma g) ~ 5e-3 is another ~1e-10
            maha = (eps * eps / sigma**2).sum()
            torch.testing.assert_close(maha, torch.tensor(float(p), dtype=DT), rtol=1e-8, atol=0)
            torch.testing.assert_close(sigma, torch.full_like(sigma, 0.05 / math.sqrt(p)), **TOL)
        # lr = 0: the weights are back at w, bit for bit
        assert torch.equal(_flat(model), w0)


def test_fisher_sam_eta0_equals_sam_and_mixsam_kappa0_equals_sam():
    model, x, y, module_loss, _ = _mlp_problem(seed=3)
    batches = _batches(x, y, 3)
    ms = [copy.deepcopy(model) for _ in range(3)]
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)
    opts = [
        SAM(ms[0].parameters(), torch.optim.SGD, rho=0.1, **kw),
        FisherSAM(ms[1].parameters(), torch.optim.SGD, rho=0.1, eta=0.0, **kw),
        MixSAM(ms[2].parameters(), torch.optim.SGD, rho=0.1, kappa=0.0, seed=0, **kw),
    ]
    for o, mm in zip(opts, ms):
        _run_opt(o, mm, module_loss, batches)
    torch.testing.assert_close(_flat(ms[1]), _flat(ms[0]), **TOL)
    torch.testing.assert_close(_flat(ms[2]), _flat(ms[0]), **TOL)
    assert not torch.allclose(_flat(ms[0]), _flat(model))


def test_random_sam_noise_is_standard_normal_times_rho_over_sqrt_p():
    model = make_mlp((10, 20, 5), seed=0)
    x, y = make_classification_data(n=8, d=10, n_classes=5, seed=0)
    p = sum(q.numel() for q in model.parameters())
    opt = RandomSAM(model.parameters(), torch.optim.SGD, rho=0.3, seed=11, lr=0.0)
    w0 = _flat(model)
    zs = []
    for _ in range(20):
        log: list = []
        opt.step(_recording_closure(opt, model, F.cross_entropy, x, y, log))
        zs.append((log[0][0] - w0) * math.sqrt(p) / 0.3)
    z = torch.cat(zs)  # 20 * 345 = 6900 draws
    n = z.numel()
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.std()) - 1.0) < 4 * math.sqrt(0.5 / n)
    assert torch.equal(_flat(model), w0)  # lr = 0
