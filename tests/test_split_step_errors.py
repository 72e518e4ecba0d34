"""The split-step protocol (optimizers/step_protocol.py) for SAM, ASAM, Fisher-SAM, RandomSAM and
bSAM: every call out of turn is refused with a message that names the call, the state and the fix,
and changes nothing (weights, BatchNorm statistics, optimizer state, generator, the open step); a
refused ``second_step`` without a backward pass leaves the step open and finishing it gives the
closure step bit for bit; a NaN / inf gradient, in either pass and in either API, raises
:class:`NonFiniteGradient` naming the pass, with the weights and state bit-identical to before the
step; and the runner records such a step as a diverged run. A sparse gradient is named before
anything changes, and a copy of the optimizer is whole between steps and refused within one."""

from __future__ import annotations

import copy
import io
import json
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

import experiments.train as train_mod
from experiments.config import resolve_config
from experiments.parallel import DistContext
from experiments.runner import plan_runs, run_one
from optimizers import ASAM, SAM, BayesianSAM, FisherSAM, LossScaler, RandomSAM, make_closure
from optimizers.step_protocol import IDLE, NOISE, OPEN, NonFiniteGradient, StepOrderError

SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
METHODS = {
    "sam": lambda ps, model, m=1: SAM(ps, torch.optim.SGD, rho=0.05, model=model, m=m, **SGD),
    "asam": lambda ps, model, m=1: ASAM(ps, torch.optim.SGD, rho=0.5, model=model, m=m, **SGD),
    "fisher_sam": lambda ps, model, m=1: FisherSAM(ps, torch.optim.SGD, rho=0.1, model=model, m=m, **SGD),
    "random_sam": lambda ps, model, m=1: RandomSAM(
        ps, torch.optim.SGD, rho=0.05, seed=3, model=model, m=m, **SGD
    ),
    "bsam": lambda ps, model, m=1: BayesianSAM(ps, lr=0.05, num_data=64, rho=0.05, seed=3, model=model, m=m),
}
MAIN = ["sam", "asam", "fisher_sam", "bsam"]
LOSS = nn.CrossEntropyLoss()


def _model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(100, 3)
    )
    return net.double()


def _batch(t: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + t)
    return torch.randn((16, 2, 5, 5), generator=g, dtype=torch.float64), torch.randint(
        0, 3, (16,), generator=g
    )


def _setup(method: str, warm: bool = True):
    """Model, optimizer, batch; ``warm``: one closure step first, so momentum / precision exist."""
    model = _model()
    opt = METHODS[method](model.parameters(), model)
    x, y = _batch()
    if warm:
        opt.step(_closure(opt, model, x, y))
    return model, opt, x, y


def _closure(opt, model, x, y, poison: dict | None = None):
    """The usual closure; ``poison = {call: value}`` writes ``value`` into one gradient entry of
    the ``call``-th call (0: the pass at w, 1: at w + eps)."""
    calls = [0]

    def closure():
        opt.zero_grad()
        loss = LOSS(model(x), y)
        loss.backward()
        if poison and calls[0] in poison:
            with torch.no_grad():
                model[4].weight.grad[1, 7] = poison[calls[0]]
        calls[0] += 1
        return loss

    return closure


def _backward(model, x, y) -> None:
    LOSS(model(x), y).backward()


def _two_pass(opt) -> bool:
    return getattr(opt, "passes", 2) == 2


def _begin(opt, model, x, y, *, zero_grad: bool = True) -> None:
    """A split step up to the open state (backward at w + eps not yet run)."""
    opt.zero_grad()
    if isinstance(opt, BayesianSAM):
        opt.noise_step()
    if _two_pass(opt):
        _backward(model, x, y)
    opt.first_step(zero_grad=zero_grad)


def _tensors(obj) -> list:
    """Every tensor and number inside ``obj`` (dicts, lists), in a fixed order, cloned."""
    if isinstance(obj, torch.Tensor):
        return [obj.detach().clone()]
    if isinstance(obj, dict):
        return [v for k in sorted(obj, key=str) for v in _tensors(obj[k])]
    if isinstance(obj, (list, tuple)):
        return [v for o in obj for v in _tensors(o)]
    return [obj] if isinstance(obj, (int, float, str, bool)) or obj is None else []


def _snapshot(opt, model) -> dict:
    """Weights, buffers, gradients, optimizer state (the wrapper's and the base optimizer's),
    generator and the open step: what a refused call must leave as it was."""
    opts = [opt] + ([opt.base_optimizer] if hasattr(opt, "base_optimizer") else [])
    state = [[_tensors(o.state.get(p, {})) for p in model.parameters()] for o in opts]
    gen = getattr(opt, "generator", None)
    return dict(
        weights=_tensors(list(model.parameters())),
        buffers=_tensors(list(model.buffers())),
        grads=[None if p.grad is None else p.grad.clone() for p in model.parameters()],
        state=state,
        groups=_tensors([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
        generator=None if gen is None else gen.get_state(),
        step_state=opt.step_state,
        split=opt._split,
    )


def _without_rng(sd: dict) -> list:
    """A state dict's tensors and numbers without the generator's state (a failed step has drawn
    its noise, as a step skipped by LossScaler has)."""
    sd = dict(sd, generator=None, extra={k: v for k, v in sd.get("extra", {}).items() if k != "rng_state"})
    return _tensors(sd)


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if key == "split":
            assert x is y, "the open step was replaced"
            continue
        assert _equal(x, y), key


def _equal(x, y) -> bool:
    if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
        return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_equal(u, v) for u, v in zip(x, y))
    return x == y


def _refused(opt, model, call, match: list[str], exc=StepOrderError):
    before = _snapshot(opt, model)
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for part in match:
        assert part in msg, (part, msg)
    _assert_same(before, _snapshot(opt, model))
    return msg


# ---- calls out of turn --------------------------------------------------------------------------
@pytest.mark.parametrize("method", MAIN + ["random_sam"])
def test_out_of_turn_calls_are_refused_and_change_nothing(method):
    model, opt, x, y = _setup(method)
    name = type(opt).__name__
    bsam = isinstance(opt, BayesianSAM)
    begin = "noise_step()" if bsam else "first_step()"
    # idle: nothing to finish or undo
    assert opt.step_state == IDLE
    for call in ("second_step", "cancel_step"):
        _refused(
            opt, model, getattr(opt, call), [f"{name}.{call}() refused", "no step is open", f"with {begin}"]
        )
    # open: the step must be finished or undone first
    _begin(opt, model, x, y)
    assert opt.step_state == OPEN and opt.perturbed
    fix = ["a step is open: first_step() moved the weights to w + eps", "second_step()", "cancel_step()"]
    sd = copy.deepcopy(METHODS[method](_model().parameters(), None).state_dict())
    calls = {
        "first_step()": opt.first_step,
        "step(closure)": lambda: opt.step(_closure(opt, model, x, y)),
        "state_dict()": opt.state_dict,
        "load_state_dict()": lambda: opt.load_state_dict(sd),
        "add_param_group()": lambda: opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]}),
    }
    if bsam:
        calls["noise_step()"] = opt.noise_step
    for call, fn in calls.items():
        _refused(opt, model, fn, [f"{name}.{call} refused", *fix, "nothing was changed"])
    # no backward pass at w + eps yet: refused, the step stays open
    for fn in (opt.second_step, opt.step):
        _refused(
            opt,
            model,
            fn,
            [
                f"{name}.second_step() refused",
                "gradient at w + eps",
                "written since first_step()",
                "stays open",
            ],
        )
    opt.zero_grad()  # zero_grad between the halves is fine
    _backward(model, x, y)
    opt.second_step(zero_grad=True)
    assert opt.step_state == IDLE and not opt.perturbed
    opt.state_dict()  # allowed again


def test_bsam_noise_state_refusals_and_cancel_after_a_refused_closure_step():
    """The user study's case: noise_step(), then step(closure) (refused now: it used to update
    from w + e and leave cancel_step() restoring the noise sample), then cancel_step() restores w."""
    model, opt, x, y = _setup("bsam")
    w = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    opt.noise_step()
    assert opt.step_state == NOISE
    fix = ["a step is open: noise_step() moved the weights to w + e", "call first_step()", "cancel_step()"]
    for call, fn in {
        "step(closure)": lambda: opt.step(_closure(opt, model, x, y)),
        "step()": opt.step,
        "second_step()": opt.second_step,
        "noise_step()": opt.noise_step,
        "state_dict()": opt.state_dict,
    }.items():
        _refused(opt, model, fn, [f"BayesianSAM.{call} refused", *fix])
    # first_step without the backward pass at w + e (stale gradients of the warm-up step, or none)
    _refused(opt, model, opt.first_step, ["gradient at w + e", "written since noise_step()", "stays open"])
    opt.cancel_step()
    assert opt.step_state == IDLE
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w))


@pytest.mark.parametrize("method", MAIN + ["random_sam"])
@pytest.mark.parametrize("how", ["forgot_backward", "stale_gradient", "zero_grad"])
def test_second_step_without_a_new_gradient_is_refused_then_finishes_as_the_closure_step(method, how):
    """Refused with the step open (weights at w + eps); the backward pass and a second call finish
    it with the update of step(closure), bit for bit."""
    model, opt, x, y = _setup(method)
    twin = copy.deepcopy(model)
    opt_twin = METHODS[method](twin.parameters(), twin)
    opt_twin.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch.optim's load aliases tensors
    _begin(opt, model, x, y, zero_grad=how != "stale_gradient")
    if how == "zero_grad":
        _backward(model, x, y)
        opt.zero_grad()  # the gradient at w + eps thrown away before second_step
    perturbed = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(StepOrderError, match="run loss.backward\\(\\) at w \\+ eps and call second_step"):
        opt.second_step()
    assert opt.step_state == OPEN and all(torch.equal(p, q) for p, q in zip(model.parameters(), perturbed))
    opt.zero_grad()
    _backward(model, x, y)
    opt.second_step()
    opt_twin.step(_closure(opt_twin, twin, x, y))
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.equal(p, q)
    for p, q in zip(model.parameters(), twin.parameters()):
        for key, v in opt_twin.state[q].items():
            assert _equal(opt.state[p][key], v)


def test_capability_refusals_are_unchanged():
    model, opt, x, y = _setup("sam")
    m2 = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, m=2)
    _backward(model, x, y)
    _refused(m2, model, m2.first_step, ["m=2", "step(closure)"], exc=ValueError)
    no_noise = BayesianSAM(model.parameters(), lr=0.05, num_data=64, noise=False)
    _refused(no_noise, model, no_noise.noise_step, ["noise=False", "first_step()"], exc=RuntimeError)


# ---- non-finite gradients -----------------------------------------------------------------------
def _where(opt, first_pass: bool) -> str:
    if first_pass:
        return "at w + e" if isinstance(opt, BayesianSAM) else "at w"
    return "at w + eps"


@pytest.mark.parametrize("method", MAIN + ["random_sam"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("first_pass", [True, False])
def test_nonfinite_gradient_in_a_closure_step_raises_and_leaves_everything(method, value, first_pass):
    model, opt, x, y = _setup(method)
    if first_pass and not _two_pass(opt):
        pytest.skip("one pass only")
    before = _snapshot(opt, model)
    sd = _without_rng(opt.state_dict())
    with pytest.raises(NonFiniteGradient) as info:
        opt.step(_closure(opt, model, x, y, poison={0 if first_pass or not _two_pass(opt) else 1: value}))
    msg = str(info.value)
    assert isinstance(info.value, FloatingPointError)
    assert f"{type(opt).__name__}: non-finite gradient (NaN or inf) {_where(opt, first_pass)};" in msg
    assert "Lower the learning rate" in msg and "LossScaler" in msg and "check the data" in msg
    assert info.value.loss is not None and math.isfinite(info.value.loss)
    after = _snapshot(opt, model)
    assert opt.step_state == IDLE and not opt.perturbed
    for key in ("weights", "state", "groups"):  # bit-identical to before the step
        assert _equal(before[key], after[key]), key
    assert _equal(sd, _without_rng(opt.state_dict()))
    opt.step(_closure(opt, model, x, y))  # the next step runs as usual
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("method", MAIN)
@pytest.mark.parametrize("first_pass", [True, False])
def test_nonfinite_gradient_in_a_split_step_raises_at_second_step_with_w_restored(method, first_pass):
    model, opt, x, y = _setup(method)
    before = _snapshot(opt, model)
    opt.zero_grad()
    if isinstance(opt, BayesianSAM):
        opt.noise_step()
    _backward(model, x, y)
    if first_pass:
        model[4].weight.grad[0, 0] = math.nan
    opt.first_step(zero_grad=True)
    _backward(model, x, y)
    if not first_pass:
        model[4].weight.grad[0, 0] = -math.inf
    with pytest.raises(NonFiniteGradient, match=re.escape(f"(NaN or inf) {_where(opt, first_pass)};")):
        opt.second_step()
    after = _snapshot(opt, model)
    assert opt.step_state == IDLE  # closed, as cancel_step()
    for key in ("weights", "state", "groups"):
        assert _equal(before[key], after[key]), key


def test_the_gradient_check_tells_finite_from_nonfinite_in_every_precision():
    """check_finite on hand-made gradients: a float16 gradient whose norm exceeds float16's range
    (65504) is finite and passes; one NaN or inf entry, in either pass, is refused with its pass."""
    from optimizers.step_protocol import check_finite

    opt = SAM(nn.Linear(2, 1).parameters(), torch.optim.SGD, lr=0.1)
    where = ("at w", "at w + eps")
    big = [torch.full((100_000,), 300.0, dtype=torch.float16), torch.ones(3, dtype=torch.float16)]
    assert float(torch.stack([g.float().norm() for g in big]).max()) > 65504
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        grads = [g.to(dtype) for g in big]
        check_finite(opt, [torch.tensor(1.0)], grads, where)  # finite: no error
        for bad in (math.nan, math.inf, -math.inf):
            poisoned = [grads[0], grads[1].clone()]
            poisoned[1][1] = bad
            with pytest.raises(NonFiniteGradient, match="at w \\+ eps") as info:
                check_finite(opt, [torch.tensor(1.0)], poisoned, where, torch.tensor(2.5))
            assert info.value.where == "at w + eps" and info.value.loss == 2.5
            with pytest.raises(NonFiniteGradient, match="at w;") as info:
                check_finite(opt, [torch.tensor([1.0, bad])], grads, where)
            assert info.value.where == "at w" and info.value.loss is None
    check_finite(opt, [], [], where)  # nothing to check


def test_nan_loss_from_nan_data_is_reported_with_its_loss():
    model, opt, x, y = _setup("sam")
    w = [p.detach().clone() for p in model.parameters()]
    x = x.clone()
    x[3, 0, 2, 2] = math.nan
    with pytest.raises(NonFiniteGradient, match="at w;") as info:
        opt.step(_closure(opt, model, x, y))
    assert math.isnan(info.value.loss)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w))


@pytest.mark.parametrize("method", ["sam", "bsam"])
def test_nonfinite_gradient_with_m_sharpness_vectorised(method):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    opt = METHODS[method](model.parameters(), None, m=2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)
    opt.step(make_closure(opt, model, LOSS, x, y))
    w = [p.detach().clone() for p in model.parameters()]
    state = _without_rng(opt.state_dict())
    x = x.clone()
    x[12, 1] = math.inf  # in the second sub-batch only
    with pytest.raises(NonFiniteGradient):
        opt.step(make_closure(opt, model, LOSS, x, y))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w))
    assert _equal(state, _without_rng(opt.state_dict()))


@pytest.mark.parametrize("method", MAIN)
@pytest.mark.parametrize("call", [0, 1])
def test_a_closure_raising_midway_restores_the_weights(method, call):
    model, opt, x, y = _setup(method)
    before = _snapshot(opt, model)
    calls = [0]
    inner = _closure(opt, model, x, y)

    def closure():
        if calls[0] == call:
            raise KeyError("data loader failed")
        calls[0] += 1
        return inner()

    with pytest.raises(KeyError):
        opt.step(closure)
    after = _snapshot(opt, model)
    assert opt.step_state == IDLE
    for key in ("weights", "state", "groups"):
        assert _equal(before[key], after[key]), key


def test_loss_scaler_overflow_still_skips_the_step():
    """SkipStep from inside the closure is not a NonFiniteGradient: LossScaler.step skips the step."""
    model, opt, x, y = _setup("sam")
    w = [p.detach().clone() for p in model.parameters()]
    scaler = LossScaler(init_scale=2.0**120)  # times 1e300: beyond float64, the gradients are inf
    assert scaler.step(opt, lambda: LOSS(model(x), y) * 1e300) is None and scaler.skipped == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), w)) and opt.step_state == IDLE


# ---- the runner --------------------------------------------------------------------------------
def _runner_cfg(tmp_path, optimizer: str):
    raw = {
        "name": "nonfinite",
        "seeds": [0],
        "device": "cpu",
        "threads": 1,
        "progress": False,
        "precision": "float64",
        "out_dir": str(tmp_path / "runs"),
        "data": {"name": "digits", "limit_train": 256},
        "model": {"name": "mlp", "kwargs": {"sizes": [64, 8, 10], "activation": "tanh"}},
        "train": {"epochs": 1, "batch_size": 64, "lr": 0.05},
        "methods": [{"name": optimizer, "optimizer": optimizer}],
        "evaluation": {"sharpness": [], "every": 0, "metrics": ["accuracy"]},
    }
    (run,) = plan_runs(resolve_config(raw))
    return run


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("optimizer", ["sam", "bsam"])
@pytest.mark.parametrize("poison", ["gradient", "data"])
def test_runner_records_a_nonfinite_gradient_as_diverged(tmp_path, monkeypatch, optimizer, poison):
    """At step 3: a NaN in one gradient entry (finite loss) is ``non-finite gradient``; a NaN in the
    data (NaN loss and gradient) is ``non-finite loss``, as a loss check records it."""
    original = train_mod.Trainer._batch

    def batch(self, idx):
        x, y = original(self, idx)
        if self.counters["step"] == 2:
            if poison == "data":
                x = x.clone()
                x[0, 5] = math.nan
            else:
                last = list(self.model.parameters())[-1]  # the output layer's bias: NaN from now on
                last.register_hook(lambda g: g.index_fill(0, torch.tensor([0]), math.nan))
        return x, y

    monkeypatch.setattr(train_mod.Trainer, "_batch", batch)
    run = _runner_cfg(tmp_path, optimizer)
    out = run_one(run, device=torch.device("cpu"), ctx=DistContext())
    res = json.loads((run.run_dir / "results.json").read_text())
    div = res["divergence"]
    assert out["status"] == res["status"] == "diverged"
    assert div["step"] == 3 and div["epoch"] == 1
    if poison == "data":
        assert div["reason"] == "non-finite loss" and math.isnan(div["loss"])
    else:
        assert div["reason"] == "non-finite gradient" and "non-finite gradient (NaN or inf)" in div["detail"]


# ---- fresh cases: a closure without backward, gradients zeroed in place mid-step ----------------
@pytest.mark.parametrize("name", ["sam", "bsam"])
def test_a_closure_without_backward_is_refused_with_the_weights_untouched(name):
    model, opt, x, y = _setup(name)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"closure computed no gradient .* call loss.backward\(\)"):
        opt.step(lambda: LOSS(model(x), y))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert opt.step_state == IDLE


def test_gradients_zeroed_in_place_after_first_step_are_not_a_new_gradient():
    model, opt, x, y = _setup("sam")
    LOSS(model(x), y).backward()
    opt.first_step()  # gradients at w kept
    opt.zero_grad(set_to_none=False)  # zeroed in place: a version bump, not a backward pass
    with pytest.raises(StepOrderError, match="no parameter has a gradient written since first_step"):
        opt.second_step()
    assert opt.step_state == OPEN
    LOSS(model(x), y).backward()
    opt.second_step()
    assert opt.step_state == IDLE


def test_loss_scaler_step_names_a_wrong_argument():
    model, opt, x, y = _setup("sam")
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        LossScaler().step(None, lambda: LOSS(model(x), y))
    with pytest.raises(TypeError, match="forward must be a function"):
        LossScaler().step(opt, 3)


# ---- fresh cases (probe 2): sparse gradients, copies of the optimizer, numpy m ------------------
def _sparse_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Flatten(), nn.Linear(8, 3)).double()


@pytest.mark.parametrize("name", ["sam", "bsam"])
@pytest.mark.parametrize("how", ["closure", "split"])
def test_a_sparse_gradient_is_named_before_anything_changes(name, how):
    model = _sparse_model()
    opt = METHODS[name](model.parameters(), model)
    x, y = torch.randint(0, 10, (6, 2)), torch.randint(0, 3, (6,))
    if name == "bsam":
        opt.precision()  # bSAM's state (s = s_init, momentum 0) is created on first use
    before = _snapshot(opt, model)
    with pytest.raises(TypeError) as info:
        if how == "closure":
            opt.step(_closure(opt, model, x, y))
        else:
            if name == "bsam":
                opt.noise_step()
            _backward(model, x, y)
            opt.first_step()
    msg = str(info.value)
    assert "parameter of shape (10, 4) is sparse" in msg and "sparse=False" in msg and "to_dense()" in msg
    if how == "split" and name == "bsam":
        opt.cancel_step()  # noise_step() had moved the weights; the refused first_step() did not
    after = _snapshot(opt, model)
    assert opt.step_state == IDLE
    for key in ("weights", "state", "groups"):
        assert _equal(before[key], after[key]), key


@pytest.mark.parametrize("method", MAIN + ["random_sam"])
@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_copy_of_the_optimizer_is_whole_and_refused_mid_step(method, how):
    """A copy taken between steps continues bit for bit as the original (it used to lose its base
    optimizer and m); one taken while a step is open is refused (the weights are at w + eps)."""
    model, opt, x, y = _setup(method)
    if how == "deepcopy":
        model2, opt2 = copy.deepcopy((model, opt))
    else:
        buf = io.BytesIO()
        torch.save((model, opt), buf)
        buf.seek(0)
        model2, opt2 = torch.load(buf, weights_only=False)
    for _ in range(2):
        opt.step(_closure(opt, model, x, y))
        opt2.step(_closure(opt2, model2, x, y))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), model2.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(model.buffers(), model2.buffers()))
    _begin(opt, model, x, y)
    _refused(
        opt,
        model,
        lambda: copy.deepcopy(opt),
        ["copy (copy.deepcopy, pickle, torch.save) refused", "a step is open"],
    )


def test_numpy_integers_are_integers_for_m():
    model = _model()
    assert SAM(model.parameters(), torch.optim.SGD, lr=0.1, m=np.int64(2)).m == 2
    assert BayesianSAM(model.parameters(), lr=0.1, num_data=8, m=np.int64(2)).m == 2
    with pytest.raises(
        ValueError, match=r"m \(number of sub-batches for m-sharpness\) must be an integer, got float"
    ):
        SAM(model.parameters(), torch.optim.SGD, lr=0.1, m=2.0)
