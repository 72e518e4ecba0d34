"""SAM family machinery: bit-exact restore, BatchNorm statistics, unused parameters, schedulers,
state_dict, m-sharpness, VSAM sampling, argument errors and CUDA."""

from __future__ import annotations

import contextlib
import copy
import io
import math

import pytest
import torch
from torch.nn import functional as F

from optimizers import ASAM, SAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM, bn_update_disabled
from optimizers.perturbation import global_norm, make_closure
from tests.references import UnusedParamNet, make_classification_data, make_cnn_bn
from tests.sam_hand_steps import (
    DT,
    GUARD,
    HP,
    TOL,
    _batches,
    _flat,
    _grad,
    _hand_base,
    _HandSGD,
    _logreg_problem,
    _make_opt,
    _mlp_problem,
    _module_closure,
    _recording_closure,
    _ref_trajectory,
    _run_opt,
)


# --------------------------------------------------------------------------------------------
# restore, BatchNorm, unused parameters, schedulers, state_dict, m-sharpness
# --------------------------------------------------------------------------------------------
class _Recorder(torch.optim.Optimizer):
    """A base 'optimizer' that only records the parameters and gradients it is called with."""

    def __init__(self, params, **kw):
        super().__init__(params, {"lr": 0.0})
        self.seen = []

    def step(self, closure=None):
        self.seen.append(
            [(p.detach().clone(), p.grad.detach().clone()) for g in self.param_groups for p in g["params"]]
        )


@pytest.mark.parametrize("cls", [SAM, ASAM, FisherSAM, MixSAM, RandomSAM])
def test_weights_restored_bit_exactly_before_base_step(cls):
    model, x, y, module_loss, _ = _mlp_problem(seed=4)
    before = [p.detach().clone() for p in model.parameters()]
    opt = cls(model.parameters(), _Recorder, rho=0.5)
    opt.step(_module_closure(opt, model, module_loss, x, y))
    seen = opt.base_optimizer.seen[0]
    for b, (w, _) in zip(before, seen):
        assert torch.equal(b, w)
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.detach())


def test_restored_when_the_closure_raises():
    model = make_cnn_bn(seed=0)
    x, y = make_classification_data(n=12, image=True, seed=0)
    before = copy.deepcopy(model.state_dict())
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.5, lr=0.1, model=model)
    calls = []

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return loss

    with pytest.raises(RuntimeError, match="boom"):
        opt.step(closure)
    # the first pass updated BN stats (as a plain forward would); weights and the rest are back
    plain = make_cnn_bn(seed=0)
    plain.train()
    with torch.no_grad():
        plain(x)
    for k, v in model.state_dict().items():
        ref = plain.state_dict()[k] if "running" in k or "num_batches" in k else before[k]
        assert torch.equal(v, ref), k


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_stats_equal_one_plain_forward(momentum):
    x, y = make_classification_data(n=12, image=True, seed=2)
    model = make_cnn_bn(seed=1)
    model[1].momentum = momentum
    plain = copy.deepcopy(model)
    plain.train()
    with torch.no_grad():
        plain(x)
    bn_ref = {k: v for k, v in plain.state_dict().items() if "running" in k or "num_batches" in k}
    assert not torch.equal(bn_ref["1.running_mean"], model.state_dict()["1.running_mean"])

    m1, m2, m3 = (copy.deepcopy(model) for _ in range(3))
    o1 = SAM(m1.parameters(), torch.optim.SGD, rho=0.5, lr=0.1, model=m1)
    o1.step(_module_closure(o1, m1, F.cross_entropy, x, y))

    o2 = SAM(m2.parameters(), torch.optim.SGD, rho=0.5, lr=0.1)  # user handles BN in the closure

    def closure2():
        o2.zero_grad()
        with bn_update_disabled(m2) if o2.perturbed else contextlib.nullcontext():
            loss = F.cross_entropy(m2(x), y)
            loss.backward()  # inside: autograd saved the BN buffers, restore only after backward
        return loss

    o2.step(closure2)
    o3 = SAM(m3.parameters(), torch.optim.SGD, rho=0.5, lr=0.1)  # no BN handling: stats differ
    o3.step(_module_closure(o3, m3, F.cross_entropy, x, y))
    for k, v in bn_ref.items():
        assert torch.equal(m1.state_dict()[k], v), k
        assert torch.equal(m2.state_dict()[k], v), k
    assert not torch.equal(m3.state_dict()["1.running_mean"], bn_ref["1.running_mean"])
    assert (
        int(m1.state_dict()["1.num_batches_tracked"]) == int(model.state_dict()["1.num_batches_tracked"]) + 1
    )
    # same weights with either BN mechanism
    torch.testing.assert_close(_flat(m1), _flat(m2), rtol=0, atol=0)


def test_model_without_batchnorm_is_unaffected_by_model_argument():
    model, x, y, module_loss, _ = _mlp_problem(seed=6)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    oa = SAM(a.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, model=a)
    ob = SAM(b.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    for xb, yb in _batches(x, y, 2):
        oa.step(_module_closure(oa, a, module_loss, xb, yb))
        ob.step(_module_closure(ob, b, module_loss, xb, yb))
    assert torch.equal(_flat(a), _flat(b))


def test_parameters_without_grad_are_skipped():
    model = UnusedParamNet(seed=0)
    x, y = make_classification_data(n=10, seed=3)
    unused0 = model.unused.detach().clone()
    used = [p for n, p in model.named_parameters() if n != "unused"]
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, weight_decay=0.1)
    log = []

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        log.append(torch.cat([p.detach().reshape(-1) for p in used]))
        return loss

    w_used0 = torch.cat([p.detach().reshape(-1) for p in used])
    opt.step(closure)
    torch.testing.assert_close((log[1] - log[0]).norm(), torch.tensor(0.05, dtype=DT), **TOL)
    assert torch.equal(model.unused.detach(), unused0)
    assert not torch.equal(torch.cat([p.detach().reshape(-1) for p in used]), w_used0)


def test_lr_scheduler_changes_the_lr_used():
    model, x, y, module_loss, flat_loss = _logreg_problem(seed=7)
    batches = _batches(x, y, 3)
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert opt.param_groups is opt.base_optimizer.param_groups
    theta = _flat(model)
    hand = _HandSGD(0.2, 0.9)
    for i, (xb, yb) in enumerate(batches):
        hand.lr = 0.2 * 0.5**i
        _, g = _grad(flat_loss, theta, xb, yb)
        _, ge = _grad(flat_loss, theta + 0.05 * g / (g.norm() + GUARD), xb, yb)
        theta = hand(theta, ge)
        opt.step(_module_closure(opt, model, module_loss, xb, yb))
        sched.step()
    torch.testing.assert_close(_flat(model), theta, **TOL)
    assert opt.base_optimizer.param_groups[0]["lr"] == pytest.approx(0.2 * 0.5**3)


@pytest.mark.parametrize("cls", [SAM, ASAM, FisherSAM, RandomSAM, MixSAM, VariationalSAM])
def test_state_dict_round_trip_reproduces_next_step(cls):
    model, x, y, module_loss, _ = _mlp_problem(seed=8)
    batches = _batches(x, y, 4)
    extra = {"num_data": 18} if cls is VariationalSAM else {}
    seed = {"seed": 5} if cls in (RandomSAM, MixSAM, VariationalSAM) else {}
    opt = cls(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=1e-3, **extra, **seed)
    _run_opt(opt, model, module_loss, batches[:2])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    clone = copy.deepcopy(model)
    seed2 = {"seed": 99} if seed else {}
    opt2 = cls(clone.parameters(), torch.optim.SGD, lr=0.5, momentum=0.1, **extra, **seed2)
    buf.seek(0)
    opt2.load_state_dict(torch.load(buf, weights_only=False))
    assert opt2.param_groups is opt2.base_optimizer.param_groups
    assert opt2.param_groups[0]["lr"] == 0.1
    _run_opt(opt, model, module_loss, batches[2:])
    _run_opt(opt2, clone, module_loss, batches[2:])
    assert torch.equal(_flat(model), _flat(clone))


@pytest.mark.parametrize("method", ["sam", "fisher_sam", "vsam", "random_sam"])
def test_m_sharpness_equals_mean_of_chunk_gradients(method):
    model, x, y, module_loss, flat_loss = _mlp_problem(seed=9)
    batches = _batches(x, y, 2)  # 6 examples per batch -> 3 chunks of 2
    base_cls, base_kw, hand = _hand_base("sgd")
    hp = HP[method]
    theta_ref, recs = _ref_trajectory(method, model, flat_loss, batches, hand, hp, chunks=3)
    opt = _make_opt(method, model, base_cls, base_kw, hp, m=3)
    _run_opt(opt, model, module_loss, batches)
    torch.testing.assert_close(_flat(model), theta_ref, **TOL)
    assert len(opt.last["per_chunk"]) == 3
    if method == "sam":
        for rec in opt.last["per_chunk"]:
            torch.testing.assert_close(rec["eps_norm"], torch.tensor(0.05, dtype=DT), **TOL)


def test_m_sharpness_with_make_closure_and_chunk_contract_errors():
    model, x, y, module_loss, flat_loss = _mlp_problem(seed=10)
    xb, yb = x[:6], y[:6]
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, m=2)
    theta = _flat(model)
    descent = torch.zeros_like(theta)
    for xc, yc in zip(torch.tensor_split(xb, 2), torch.tensor_split(yb, 2)):
        _, g = _grad(flat_loss, theta, xc, yc)
        descent += _grad(flat_loss, theta + 0.05 * g / (g.norm() + GUARD), xc, yc)[1] / 2
    opt.step(make_closure(opt, model, module_loss, xb, yb))
    torch.testing.assert_close(_flat(model), theta - 0.1 * descent, **TOL)

    def plain_closure():
        return module_loss(model(xb), yb)

    with pytest.raises(TypeError, match="chunk"):
        opt.step(plain_closure)


# --------------------------------------------------------------------------------------------
# VSAM posterior, errors
# --------------------------------------------------------------------------------------------
def test_vsam_posterior_sample_and_bma():
    model, x, y, module_loss, _ = _mlp_problem(seed=11)
    opt = VariationalSAM(model.parameters(), torch.optim.SGD, rho=0.05, num_data=1000, lr=0.1, seed=0)
    _run_opt(opt, model, module_loss, _batches(x, y, 2))
    std = torch.cat([s.reshape(-1) for s in opt.posterior_std().values()])
    w = _flat(model)
    draws = []
    for _ in range(400):
        with opt.sample():
            draws.append(_flat(model) - w)
        assert torch.equal(_flat(model), w)
    z = torch.stack(draws) / std  # standardised draws
    assert abs(float(z.mean())) < 4 / math.sqrt(z.numel())
    assert abs(float(z.var()) - 1.0) < 0.05
    probs = opt.bayesian_model_average(model, x, samples=4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(x), dtype=DT), **TOL)


def test_errors():
    model, x, y, module_loss, _ = _mlp_problem()
    params = list(model.parameters())
    with pytest.raises(ValueError, match="rho"):
        SAM(params, torch.optim.SGD, rho=-0.1, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        SAM(params, torch.optim.SGD, lr=-1.0)
    with pytest.raises(ValueError, match="eta"):
        FisherSAM(params, torch.optim.SGD, eta=-1.0, lr=0.1)
    with pytest.raises(ValueError, match="num_data"):
        VariationalSAM(params, torch.optim.SGD, num_data=0, lr=0.1)
    with pytest.raises(ValueError, match="m "):
        SAM(params, torch.optim.SGD, lr=0.1, m=0)
    with pytest.raises(TypeError, match="class"):
        SAM(params, torch.optim.SGD(params, lr=0.1))
    opt = SAM(params, torch.optim.SGD, lr=0.1)
    with pytest.raises(TypeError, match="closure must return the loss"):
        opt.step()
    w0 = _flat(model)

    def no_return():
        opt.zero_grad()
        module_loss(model(x), y).backward()

    with pytest.raises(ValueError, match="closure must return the loss"):
        opt.step(no_return)
    assert torch.equal(_flat(model), w0)
    bad = FisherSAM(params, torch.optim.SGD, lr=0.1, fisher=lambda p: torch.ones(3, dtype=DT))
    with pytest.raises(ValueError, match="shape"):
        bad.step(_module_closure(bad, model, module_loss, x, y))
    bad = FisherSAM(params, torch.optim.SGD, lr=0.1, fisher=lambda p: torch.zeros_like(p))
    with pytest.raises(ValueError, match="positive"):
        bad.step(_module_closure(bad, model, module_loss, x, y))
    assert torch.equal(_flat(model), w0)


def test_global_norm_helper():
    a = torch.tensor([3.0, 0.0], dtype=DT)
    b = torch.tensor([[4.0]], dtype=DT)
    assert float(global_norm([a, b])) == 5.0
    assert float(global_norm([])) == 0.0


def test_param_groups_per_group_rho_and_add_param_group():
    model, x, y, module_loss, flat_loss = _mlp_problem(seed=12)
    params = list(model.parameters())
    opt = SAM(
        [{"params": params[:2], "rho": 0.2}, {"params": params[2:3]}], torch.optim.SGD, rho=0.05, lr=0.1
    )
    opt.add_param_group({"params": params[3:], "lr": 0.01})
    assert opt.param_groups is opt.base_optimizer.param_groups and len(opt.param_groups) == 3
    assert opt.param_groups[2]["rho"] == 0.05 and opt.param_groups[1]["lr"] == 0.1
    theta = _flat(model)
    sizes = [p.numel() for p in params]
    rho = torch.cat([torch.full((n,), r, dtype=DT) for n, r in zip(sizes, [0.2, 0.2, 0.05, 0.05])])
    lr = torch.cat([torch.full((n,), r, dtype=DT) for n, r in zip(sizes, [0.1, 0.1, 0.1, 0.01])])
    _, g = _grad(flat_loss, theta, x, y)
    _, ge = _grad(flat_loss, theta + rho * g / (g.norm() + GUARD), x, y)
    opt.step(_module_closure(opt, model, module_loss, x, y))
    torch.testing.assert_close(_flat(model), theta - lr * ge, **TOL)


def test_fisher_sam_grad_scale_undoes_loss_scaling():
    model, x, y, module_loss, _ = _mlp_problem(seed=13)
    eps = []
    for scale in (1.0, 64.0):
        m = copy.deepcopy(model)
        opt = FisherSAM(m.parameters(), torch.optim.SGD, rho=0.1, eta=5.0, grad_scale=scale, lr=0.0)
        log: list = []
        opt.step(_recording_closure(opt, m, lambda o, t, s=scale: s * module_loss(o, t), x, y, log))
        eps.append(log[1][0] - log[0][0])
        g = log[0][1] / scale
        torch.testing.assert_close(opt.last["fisher_quadratic"], (g * g / (1 + 5.0 * g * g)).sum(), **TOL)
    torch.testing.assert_close(eps[1], eps[0], rtol=1e-9, atol=1e-13)
    # without undoing the scale the Fisher (and eps) would differ
    m = copy.deepcopy(model)
    opt = FisherSAM(m.parameters(), torch.optim.SGD, rho=0.1, eta=5.0, lr=0.0)
    log = []
    opt.step(_recording_closure(opt, m, lambda o, t: 64.0 * module_loss(o, t), x, y, log))
    assert not torch.allclose(log[1][0] - log[0][0], eps[0], rtol=1e-3, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("cls", [SAM, ASAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM])
def test_cuda_matches_cpu(cls):
    model, x, y, module_loss, _ = _mlp_problem(seed=14)
    kw = {"num_data": 18} if cls is VariationalSAM else {}
    results = []
    for device in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(device)
        opt = cls(m.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9, **kw)
        if cls in (MixSAM, RandomSAM):  # a generator on the parameters' device
            opt.generator = torch.Generator(device=device).manual_seed(0)
        for xb, yb in _batches(x.to(device), y.to(device), 3):
            opt.step(_module_closure(opt, m, module_loss, xb, yb))
        results.append((_flat(m).cpu(), float(opt.last["eps_norm"])))
    if cls is MixSAM:  # CPU and CUDA generators give different noise: check the constraint only
        assert results[1][1] == pytest.approx(0.05, rel=1e-9)
    elif cls is RandomSAM:  # ||eps|| = rho ||z|| / sqrt(p), ||z||^2 ~ chi^2_51
        assert 0.02 < results[1][1] < 0.08
    else:
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-9, atol=1e-11)
