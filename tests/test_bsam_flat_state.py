"""bSAM's state in flat buffers (``optimizers.bayes.bsam_split.FlatState``) against the per-tensor
update it replaced, written out below parameter by parameter (float64, <= 1e-12): param groups with
their own hyper-parameters, a frozen parameter, a parameter that never gets a gradient, parameters
that get one in only one of the two passes, m-sharpness, both ``s`` update orders, mixed dtypes;
``state_dict`` round trips (bit for bit), state dicts in the per-tensor layout, in-place edits of
the state between steps and a param group added after a step."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from optimizers import BayesianSAM

N = 40
GROUP_A = dict(lr=0.05, rho=0.2, betas=(0.8, 0.9), prior_precision=2.0, damping=0.1)
GROUP_B = dict(lr=0.02, rho=0.05, betas=(0.9, 0.99), prior_precision=0.5, damping=0.3)


class Net(nn.Module):
    """Linear-tanh-linear plus: ``frozen`` (no grad), ``unused`` (never in the graph), ``first``
    (only in the first pass of a sub-batch, at ``w + e``) and ``second`` (only at ``w + eps``)."""

    def __init__(self, dtype_b: torch.dtype = torch.float64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = nn.Linear(5, 7).double()
        self.b = nn.Linear(7, 3).to(dtype_b)
        with torch.no_grad():
            for p in (*self.a.parameters(), *self.b.parameters()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
        self.frozen = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64), requires_grad=False)
        self.unused = nn.Parameter(torch.randn(4, generator=g, dtype=torch.float64))
        self.first = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))
        self.second = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.b(torch.tanh(self.a(x)).to(self.b.weight.dtype)).double() + self.frozen
        out = out + self.first if self.calls % 2 == 0 else out * (1 + 0.1 * self.second)
        self.calls += 1
        return out


def _groups(net: Net) -> list[dict]:
    return [
        {"params": [net.a.weight, net.a.bias, net.first, net.unused], **GROUP_A},
        {"params": [net.b.weight, net.frozen, net.b.bias, net.second], **GROUP_B},
    ]


def _data(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + t)
    return torch.randn(12, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (12,), generator=g)


def _closure(net: Net, x: torch.Tensor, y: torch.Tensor, m: int):
    xs, ys = torch.tensor_split(x, m), torch.tensor_split(y, m)

    def closure(chunk=None):
        xb, yb = (x, y) if chunk is None else (xs[chunk], ys[chunk])
        loss = nn.functional.cross_entropy(net(xb), yb)
        loss.backward()
        return loss

    return closure


# ---- the per-tensor reference ----------------------------------------------------------------------
class Reference:
    """Alg. 1 of Moellenhoff & Khan (2023) parameter by parameter, as the optimizer ran it before its
    state was flattened: noise drawn with ``torch.randn(p.shape, generator)`` per parameter in group
    order, a parameter without any gradient in a step left alone, ``p.grad`` the descent gradient."""

    def __init__(self, groups, *, m=1, noise=True, order="paper", s_init=1.0, seed=3):
        self.groups, self.m, self.noise, self.order, self.s_init = groups, m, noise, order, s_init
        self.gen = torch.Generator().manual_seed(seed)
        self.state: dict = {}
        self.last: dict = {}

    def _grads(self, params, closure, k):
        for p in params:
            p.grad = None
        with torch.enable_grad():
            loss = closure() if k is None else closure(k)
        return float(loss), [p.grad for p in params]

    @torch.no_grad()
    def step(self, closure) -> None:
        pairs = [(g, p) for g in self.groups for p in g["params"] if p.requires_grad]
        params = [p for _, p in pairs]
        for p in params:
            self.state.setdefault(
                p, {"s": torch.full_like(p, self.s_init), "exp_avg": torch.zeros_like(p), "step": 0}
            )
        s = [self.state[p]["s"] for p in params]
        w0 = [p.clone() for p in params]
        ge_sum, h_sum = [None] * len(params), [None] * len(params)
        losses, losses_eps, gnorm, eps_sq, noise_sq = [], [], 0.0, 0.0, 0.0
        chunks = [None] if self.m == 1 else list(range(self.m))
        for k in chunks:
            if self.noise:
                for p, w, si in zip(params, w0, s):
                    e = torch.randn(p.shape, generator=self.gen, dtype=p.dtype) / torch.sqrt(N * si)
                    noise_sq += float(e.square().sum())
                    p.copy_(w + e)
            loss, g1 = self._grads(params, closure, k)
            losses.append(loss)
            gnorm += sum(float(g.square().sum()) for g in g1 if g is not None) ** 0.5
            for (grp, p), w, si, g in zip(pairs, w0, s, g1):
                eps = 0.0 if g is None else grp["rho"] * g / si
                eps_sq += 0.0 if g is None else float(eps.square().sum())
                p.copy_(w + eps)
            loss, g2 = self._grads(params, closure, k)
            losses_eps.append(loss)
            for i, (p, w, si) in enumerate(zip(params, w0, s)):
                p.copy_(w)
                if g2[i] is not None:
                    ge_sum[i] = g2[i] if ge_sum[i] is None else ge_sum[i] + g2[i]
                if g1[i] is not None:
                    h = torch.sqrt(si) * g1[i].abs()
                    h_sum[i] = h if h_sum[i] is None else h_sum[i] + h
        for i, (grp, p) in enumerate(pairs):
            if ge_sum[i] is None and h_sum[i] is None:
                continue
            ge = (torch.zeros_like(p) if ge_sum[i] is None else ge_sum[i]) / self.m
            h = (torch.zeros_like(p) if h_sum[i] is None else h_sum[i]) / self.m
            st, (b1, b2), delta = self.state[p], grp["betas"], grp["prior_precision"] / N
            st["exp_avg"] = b1 * st["exp_avg"] + (1 - b1) * (ge + delta * p)
            s_old = st["s"]
            st["s"] = b2 * s_old + (1 - b2) * (h + delta + grp["damping"])
            p.sub_(grp["lr"] * st["exp_avg"] / (st["s"] if self.order == "paper" else s_old))
            st["step"] += 1
            p.grad = ge
        all_s = torch.cat([self.state[p]["s"].reshape(-1).double() for p in params])
        m = len(chunks)
        self.last = dict(
            loss=sum(losses) / m, loss_perturbed=sum(losses_eps) / m, grad_norm=gnorm / m,
            eps_norm=(eps_sq / m) ** 0.5, noise_norm=(noise_sq / m) ** 0.5,
            s_min=float(all_s.min()), s_mean=float(all_s.mean()), s_max=float(all_s.max()),
            posterior_std_mean=float((1 / torch.sqrt(N * all_s)).mean()),
        )  # fmt: skip


def _pair(m=1, noise=True, order="paper", dtype_b=torch.float64):
    net, twin = Net(dtype_b), Net(dtype_b)
    opt = BayesianSAM(_groups(net), lr=0.1, num_data=N, m=m, noise=noise, s_update_order=order, seed=3)
    return net, opt, twin, Reference(_groups(twin), m=m, noise=noise, order=order)


def _assert_matches(net, opt, twin, ref, tol=1e-12):
    for (name, p), q in zip(net.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=tol, msg=name)
        if p.requires_grad:
            st, rs = opt.state[p], ref.state[q]
            torch.testing.assert_close(st["s"], rs["s"], rtol=0, atol=tol, msg=name)
            torch.testing.assert_close(st["exp_avg"], rs["exp_avg"], rtol=0, atol=tol, msg=name)
            assert st["step"] == rs["step"], name
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=tol, msg=name)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("noise", [True, False])
@pytest.mark.parametrize("order", ["paper", "official"])
def test_flat_update_equals_the_per_tensor_update(m, noise, order):
    net, opt, twin, ref = _pair(m, noise, order)
    for t in range(3):
        x, y = _data(t)
        opt.step(_closure(net, x, y, m))
        ref.step(_closure(twin, x, y, m))
    _assert_matches(net, opt, twin, ref)
    assert opt.state[net.unused]["step"] == 0 and net.unused.grad is None  # never had a gradient
    assert torch.equal(opt.state[net.unused]["s"], torch.ones(4, dtype=torch.float64))
    assert opt.state[net.first]["step"] == 3 and opt.state[net.second]["step"] == 3
    assert net.frozen not in opt.state
    for key, value in ref.last.items():
        assert float(opt.last[key]) == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_split_step_equals_the_per_tensor_update():
    net, opt, twin, ref = _pair()
    loss_fn = nn.CrossEntropyLoss()
    for t in range(3):
        x, y = _data(t)
        opt.zero_grad()
        opt.noise_step()
        loss_fn(net(x), y).backward()
        opt.first_step(zero_grad=True)
        loss_fn(net(x), y).backward()
        opt.second_step()
        ref.step(_closure(twin, x, y, 1))
    _assert_matches(net, opt, twin, ref)


def test_mixed_dtypes_in_one_group_keep_their_own_buffers():
    net, opt, twin, ref = _pair(dtype_b=torch.float32)
    for t in range(3):
        x, y = _data(t)
        opt.step(_closure(net, x, y, 1))
        ref.step(_closure(twin, x, y, 1))
    tol = dict(rtol=1e-5, atol=1e-6)  # float32 rounding (the float64 tensors see float32 activations)
    for p, q in zip(net.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, **tol)
        if p.requires_grad:
            assert opt.state[p]["s"].dtype == p.dtype
            torch.testing.assert_close(opt.state[p]["s"], ref.state[q]["s"], **tol)
            torch.testing.assert_close(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"], **tol)
    # one buffer per (group, dtype): the float64 / float32 parameters of group 1 do not share one
    storage = lambda p: opt.state[p]["s"].untyped_storage().data_ptr()  # noqa: E731
    assert storage(net.a.weight) == storage(net.a.bias) == storage(net.first)
    assert storage(net.b.weight) == storage(net.b.bias) != storage(net.second)
    assert storage(net.a.weight) != storage(net.b.weight)


def _stepped(t0: int, t1: int, opt, net) -> None:
    for t in range(t0, t1):
        opt.step(_closure(net, *_data(t), opt.m))


def test_state_dict_round_trip_through_a_file_continues_bit_for_bit():
    net, opt, _, _ = _pair()
    _stepped(0, 2, opt, net)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "net": net.state_dict(), "calls": net.calls}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    net2 = Net()
    net2.load_state_dict(saved["net"])
    net2.calls = saved["calls"]
    opt2 = BayesianSAM(_groups(net2), lr=0.1, num_data=N, seed=99)
    opt2.load_state_dict(saved["opt"])
    for p in net2.parameters():
        if p.requires_grad:
            assert opt2.state[p]["s"].shape == p.shape and opt2.state[p]["exp_avg"].shape == p.shape
    _stepped(2, 5, opt, net)
    _stepped(2, 5, opt2, net2)
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)
        for key, value in opt.state.get(p, {}).items():
            other = opt2.state[q][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
    for key, value in opt.last.items():
        assert torch.equal(value, opt2.last[key]), key


def test_loaded_state_is_not_shared_with_the_source_optimizer():
    net, opt, _, _ = _pair()
    _stepped(0, 1, opt, net)
    net2 = copy.deepcopy(net)
    opt2 = BayesianSAM(_groups(net2), lr=0.1, num_data=N, seed=3)
    opt2.load_state_dict(opt.state_dict())  # no copy: torch hands over the very tensors
    before = {p: (st["s"].clone(), st["exp_avg"].clone()) for p, st in opt.state.items()}
    _stepped(1, 3, opt2, net2)
    for p, (s, g) in before.items():
        assert torch.equal(opt.state[p]["s"], s) and torch.equal(opt.state[p]["exp_avg"], g)
    _stepped(1, 3, opt, net)  # and the source continues as the loaded copy did
    for p, q in zip(net.parameters(), net2.parameters()):
        assert torch.equal(p, q)


def test_loading_into_an_optimizer_that_has_stepped_replaces_its_state():
    """Rewind: the state dict of step 1 loaded after step 3 continues as from step 1."""
    net, opt, _, _ = _pair()
    _stepped(0, 1, opt, net)
    sd, weights, calls = copy.deepcopy(opt.state_dict()), copy.deepcopy(net.state_dict()), net.calls
    twin = copy.deepcopy(net)
    opt_twin = BayesianSAM(_groups(twin), lr=0.1, num_data=N, seed=0)
    opt_twin.load_state_dict(copy.deepcopy(sd))
    _stepped(1, 3, opt, net)
    net.load_state_dict(weights)
    net.calls = calls
    opt.load_state_dict(sd)
    for p in net.parameters():
        if p.requires_grad:  # state[p] holds the loaded values (and the optimizer uses them)
            assert torch.equal(opt.state[p]["s"], sd["state"][_index(opt, p)]["s"])
    _stepped(1, 3, opt, net)
    _stepped(1, 3, opt_twin, twin)
    for p, q in zip(net.parameters(), twin.parameters()):
        assert torch.equal(p, q)
        if p.requires_grad:
            assert torch.equal(opt.state[p]["s"], opt_twin.state[q]["s"])
            assert torch.equal(opt.state[p]["exp_avg"], opt_twin.state[q]["exp_avg"])
            assert opt.state[p]["step"] == opt_twin.state[q]["step"] == 3 - (p is net.unused) * 3


def _index(opt, p) -> int:
    return next(i for i, q in enumerate(q for g in opt.param_groups for q in g["params"]) if q is p)


def test_state_dict_with_separate_per_parameter_tensors_loads():
    """The layout the per-tensor optimizer saved: one tensor per parameter and key."""
    net, opt, twin, ref = _pair()
    _stepped(0, 2, ref, twin)
    with torch.no_grad():
        for p, q in zip(net.parameters(), twin.parameters()):
            p.copy_(q)
    net.calls = twin.calls
    sd = opt.state_dict()
    sd["state"] = {
        _index(opt, p): {"s": st["s"].clone(), "exp_avg": st["exp_avg"].clone(), "step": st["step"]}
        for p, st in zip(net.parameters(), (ref.state.get(q) for q in twin.parameters()))
        if st is not None
    }
    sd["generator"] = ref.gen.get_state()
    opt.load_state_dict(sd)
    x, y = _data(2)
    opt.step(_closure(net, x, y, 1))
    ref.step(_closure(twin, x, y, 1))
    _assert_matches(net, opt, twin, ref)
    bad = copy.deepcopy(sd)
    bad["state"][0]["s"] = torch.ones(3, dtype=torch.float64)
    opt.load_state_dict(bad)
    with pytest.raises(ValueError, match=r"shape \(7, 5\) has shape \(3,\)"):
        opt.step(_closure(net, x, y, 1))


def test_edits_of_the_state_between_steps_are_used():
    """The noise scale ``1 / sqrt(N s)`` is kept between steps and ``state[p]`` holds views into flat
    buffers: an edit in place, or a new tensor in ``state[p]``, must reach the next step."""
    net, opt, twin, ref = _pair()
    _stepped(0, 1, opt, net)
    _stepped(0, 1, ref, twin)
    with torch.no_grad():
        opt.state[net.a.weight]["s"].mul_(3.0)
        ref.state[twin.a.weight]["s"].mul_(3.0)
        opt.state[net.b.bias]["exp_avg"].fill_(0.25)
        ref.state[twin.b.bias]["exp_avg"].fill_(0.25)
        opt.state[net.b.weight]["s"] = opt.state[net.b.weight]["s"] + 0.5  # a new tensor
        ref.state[twin.b.weight]["s"] = ref.state[twin.b.weight]["s"] + 0.5
    _stepped(1, 3, opt, net)
    _stepped(1, 3, ref, twin)
    _assert_matches(net, opt, twin, ref)
    assert float(opt.last["posterior_std_mean"]) == pytest.approx(ref.last["posterior_std_mean"], rel=1e-12)


def test_param_group_added_after_a_step():
    net, opt, twin, ref = _pair()
    extra = nn.Parameter(torch.linspace(-1.0, 1.0, 3, dtype=torch.float64))
    extra_ref = nn.Parameter(extra.detach().clone())
    _stepped(0, 1, opt, net)
    _stepped(0, 1, ref, twin)
    hyper = dict(lr=0.03, rho=0.1, betas=(0.7, 0.95), prior_precision=1.0, damping=0.2)
    opt.add_param_group({"params": [extra], **hyper})
    ref.groups.append({"params": [extra_ref], **hyper})
    for t in (1, 2):
        x, y = _data(t)
        for o, model, e in ((opt, net, extra), (ref, twin, extra_ref)):

            def closure(model=model, e=e, x=x, y=y):
                loss = nn.functional.cross_entropy(model(x), y) + 0.5 * (e**2).sum()
                loss.backward()
                return loss

            o.step(closure)
    _assert_matches(net, opt, twin, ref)
    torch.testing.assert_close(extra, extra_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(opt.state[extra]["s"], ref.state[extra_ref]["s"], rtol=0, atol=1e-12)
    assert opt.state[extra]["step"] == 2


def test_precision_and_posterior_std_before_the_first_step():
    net = Net()
    opt = BayesianSAM(_groups(net), lr=0.1, num_data=N, s_init=2.5, seed=0)
    prec, std = opt.precision(), opt.posterior_std()
    managed = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    assert len(prec) == len(managed) and all(a is b for a, b in zip(prec, managed))
    for p, s in prec.items():
        assert torch.equal(s, torch.full_like(p, 2.5))
        torch.testing.assert_close(std[p], torch.full_like(p, (N * 2.5) ** -0.5), rtol=1e-15, atol=0)
    s.fill_(7.0)  # a copy: the optimizer's state is untouched
    assert torch.equal(opt.precision()[p], torch.full_like(p, 2.5))


def test_hyper_parameters_are_read_from_the_current_param_groups():
    """A learning-rate schedule edits ``group["lr"]``; a group dict may also be replaced."""
    net, opt, twin, ref = _pair()
    _stepped(0, 1, opt, net)
    _stepped(0, 1, ref, twin)
    opt.param_groups[0]["lr"] = ref.groups[0]["lr"] = 0.2
    opt.param_groups[1] = {**opt.param_groups[1], "rho": 0.3, "damping": 0.05}
    ref.groups[1] = {**ref.groups[1], "rho": 0.3, "damping": 0.05}
    _stepped(1, 3, opt, net)
    _stepped(1, 3, ref, twin)
    _assert_matches(net, opt, twin, ref)
