"""SAM family (SAM, ASAM, FisherSAM, RandomSAM, MixSAM, VariationalSAM) against hand-computed steps.

Every reference below is written out with plain tensor operations on a flat float64 parameter
vector: the loss is a hand-written function of that vector (no ``nn.Module``), its gradient comes
from ``torch.autograd.grad`` on that function, the perturbation is the formula from
``docs/methods/optimizers.md`` and the base optimizer update (SGD with momentum + weight decay, Adam) is
written out by hand.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from optimizers import ASAM, SAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM, bn_update_disabled
from optimizers.perturbation import global_norm, make_closure
from tests.references import UnusedParamNet, make_classification_data, make_cnn_bn, make_mlp

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)
GUARD = 1e-12


# --------------------------------------------------------------------------------------------
# tiny problems: a module, and the same loss as a hand-written function of a flat vector
# --------------------------------------------------------------------------------------------
def _logreg_problem(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 1).to(DT)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(18, 4, generator=g, dtype=DT)
    y = (torch.rand(18, generator=g) < 0.5).to(DT)

    def module_loss(out, t):
        return F.binary_cross_entropy_with_logits(out.squeeze(-1), t)

    def flat_loss(theta, xb, yb):
        w, b = theta[:4], theta[4]
        z = xb @ w + b
        return (torch.log1p(torch.exp(-z.abs())) + z.clamp(min=0) - yb * z).mean()

    return model, x, y, module_loss, flat_loss


def _mlp_problem(seed: int = 0):
    model = make_mlp((4, 6, 3), seed=seed)
    x, y = make_classification_data(n=18, d=4, n_classes=3, seed=seed + 1)

    def flat_loss(theta, xb, yb):
        w1 = theta[:24].reshape(6, 4)
        b1 = theta[24:30]
        w2 = theta[30:48].reshape(3, 6)
        b2 = theta[48:51]
        out = torch.tanh(xb @ w1.T + b1) @ w2.T + b2
        return (torch.logsumexp(out, dim=1) - out[torch.arange(len(yb)), yb]).mean()

    return model, x, y, F.cross_entropy, flat_loss


PROBLEMS = {"logreg": _logreg_problem, "mlp": _mlp_problem}


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _weight_mask(model: nn.Module) -> torch.Tensor:
    """1 for entries of weight tensors (dim > 1), 0 for 1-D tensors (ASAM's default scaling rule)."""
    return torch.cat([torch.full((p.numel(),), float(p.dim() > 1), dtype=DT) for p in model.parameters()])


def _grad(flat_loss, theta, xb, yb):
    t = theta.detach().clone().requires_grad_(True)
    loss = flat_loss(t, xb, yb)
    (g,) = torch.autograd.grad(loss, t)
    return loss.detach(), g


def _batches(x, y, steps):
    # a different batch each step (cyclic thirds of the data)
    n = len(y) // 3
    return [(x[(i % 3) * n : (i % 3 + 1) * n], y[(i % 3) * n : (i % 3 + 1) * n]) for i in range(steps)]


class _HandSGD:
    """torch.optim.SGD(lr, momentum, weight_decay) with dampening 0, written out."""

    def __init__(self, lr, momentum=0.0, weight_decay=0.0):
        self.lr, self.mom, self.wd, self.buf = lr, momentum, weight_decay, None

    def __call__(self, theta, d):
        d = d + self.wd * theta
        if self.mom:
            self.buf = d.clone() if self.buf is None else self.mom * self.buf + d
            d = self.buf
        return theta - self.lr * d


class _HandAdam:
    """torch.optim.Adam(lr, betas, eps, weight_decay) (L2 form), written out."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = self.v = None
        self.t = 0

    def __call__(self, theta, d):
        d = d + self.wd * theta
        self.t += 1
        self.m = (1 - self.b1) * d if self.m is None else self.b1 * self.m + (1 - self.b1) * d
        self.v = (1 - self.b2) * d * d if self.v is None else self.b2 * self.v + (1 - self.b2) * d * d
        mhat = self.m / (1 - self.b1**self.t)
        vhat = self.v / (1 - self.b2**self.t)
        return theta - self.lr * mhat / (vhat.sqrt() + self.eps)


def _hand_base(base: str):
    if base == "sgd":
        return torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2), _HandSGD(0.1, 0.9, 1e-2)
    return torch.optim.Adam, dict(lr=0.01, weight_decay=1e-2), _HandAdam(0.01, weight_decay=1e-2)


def _randn_like_params(gen, model):
    return torch.cat([torch.randn(p.shape, generator=gen, dtype=DT).reshape(-1) for p in model.parameters()])


# --------------------------------------------------------------------------------------------
# hand references of each method: return eps from (theta, g) (and per-method state)
# --------------------------------------------------------------------------------------------
def _ref_trajectory(method, model, flat_loss, batches, hand_step, hp, chunks=1):
    """Run ``len(batches)`` hand-computed steps from the model's current parameters."""
    theta = _flat(model)
    p = theta.numel()
    mask = _weight_mask(model)
    gen = torch.Generator().manual_seed(hp.get("seed", 0))
    sigma = torch.full_like(theta, hp.get("rho", 0.05) / math.sqrt(p))
    records = []
    for xb, yb in batches:
        descent = torch.zeros_like(theta)
        sig_data = torch.zeros_like(theta)
        xs, ys = torch.tensor_split(xb, chunks), torch.tensor_split(yb, chunks)
        rec = {}
        for xc, yc in zip(xs, ys):
            if method == "random_sam":
                z = _randn_like_params(gen, model)
                eps = hp["rho"] / math.sqrt(p) * z
                loss_eps, g_eps = _grad(flat_loss, theta + eps, xc, yc)
                descent += g_eps + 2 * hp.get("alpha", 0.0) * theta
                rec = {"eps": eps, "loss": loss_eps}
                continue
            loss, g = _grad(flat_loss, theta, xc, yc)
            if method == "sam":
                eps = hp["rho"] * g / (g.norm() + GUARD)
            elif method == "asam":
                t = (
                    (theta.abs() + hp["eta"]) * mask + (1 - mask)
                    if not hp.get("scale_all")
                    else theta.abs() + hp["eta"]
                )
                eps = hp["rho"] * t * t * g / ((t * g).norm() + GUARD)
            elif method == "fisher_sam":
                f = 1 + hp["eta"] * g * g if "fisher" not in hp else hp["fisher"](theta)
                eps = hp["rho"] * (g / f) / (torch.sqrt((g * g / f).sum()) + GUARD)
                rec["fisher_quadratic"] = (g * g / f).sum()
            elif method == "mix_sam":
                z = _randn_like_params(gen, model)
                u = math.sqrt(p) * g / (g.norm() + GUARD) + hp["kappa"] * z
                eps = hp["rho"] * u / (u.norm() + GUARD)
            elif method == "vsam":
                quad = (g * sigma**2 * g).sum()
                eps = math.sqrt(p) * sigma**2 * g / (quad.sqrt() + GUARD)
                sig_data += math.sqrt(p) * sigma * g * g / (quad.sqrt() + GUARD)
                rec["sigma_before"] = sigma.clone()
            else:  # pragma: no cover
                raise AssertionError(method)
            loss_eps, g_eps = _grad(flat_loss, theta + eps, xc, yc)
            descent += g_eps
            rec.update(eps=eps, g=g, loss=loss, loss_eps=loss_eps)
        descent /= chunks
        if method == "vsam":
            prior_prec = hp["kl_weight"] / (hp["num_data"] * hp["prior_std"] ** 2)
            descent = descent + prior_prec * theta
            grad_sigma = sig_data / chunks + prior_prec * sigma - hp["kl_weight"] / (hp["num_data"] * sigma)
            sigma = (sigma - hp["sigma_lr"] * grad_sigma).abs()
            rec["sigma"] = sigma.clone()
        theta = hand_step(theta, descent)
        records.append(rec)
    return theta, records


def _make_opt(method, model, base_cls, base_kw, hp, m=1):
    kw = {k: v for k, v in hp.items() if k not in ("fisher", "fisher_param")}
    if method == "sam":
        return SAM(model.parameters(), base_cls, rho=kw["rho"], m=m, **base_kw)
    if method == "asam":
        return ASAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "fisher_sam":
        fisher = hp.get("fisher")
        if fisher is not None:
            # the same analytic diagonal, as a param -> tensor callable
            def fisher_fn(p):
                return hp["fisher_param"](p)

            return FisherSAM(model.parameters(), base_cls, fisher=fisher_fn, m=m, **kw, **base_kw)
        return FisherSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "random_sam":
        return RandomSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "mix_sam":
        return MixSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "vsam":
        return VariationalSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    raise AssertionError(method)


HP = {
    "sam": {"rho": 0.05},
    "asam": {"rho": 0.5, "eta": 0.01},
    "fisher_sam": {"rho": 0.1, "eta": 1.0},
    "random_sam": {"rho": 0.05, "alpha": 0.01, "seed": 3},
    "mix_sam": {"rho": 0.05, "kappa": 1.0, "seed": 4},
    "vsam": {"rho": 0.05, "num_data": 18, "prior_std": 1.0, "sigma_lr": 0.01, "kl_weight": 1.0},
}


def _module_closure(opt, model, loss_fn, xb, yb):
    def closure(chunk=None):
        opt.zero_grad()
        if chunk is None:
            xc, yc = xb, yb
        else:
            xc, yc = torch.tensor_split(xb, opt.m)[chunk], torch.tensor_split(yb, opt.m)[chunk]
        loss = loss_fn(model(xc), yc)
        loss.backward()
        return loss

    return closure


def _run_opt(opt, model, loss_fn, batches):
    losses = []
    for xb, yb in batches:
        losses.append(opt.step(_module_closure(opt, model, loss_fn, xb, yb)))
    return losses


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
def _recording_closure(opt, model, loss_fn, x, y, log):
    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        log.append((_flat(model), torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
        return loss

    return closure


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
