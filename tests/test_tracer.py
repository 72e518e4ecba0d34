"""G-TRACER (SGDTracer, AdamTracer) against hand-computed steps with a dense float64 Hessian.

The reference direction ``g + 2 rho H (g / (f_bar + delta))`` uses ``tests.references.dense_hessian``
evaluated at the hand-computed weights; SGD and Adam are written out by hand.
"""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad
from torch.nn.utils import vector_to_parameters

from optimizers import AdamTracer, SGDTracer
from tests.references import (
    dense_hessian,
    flatten_params,
    make_classification_data,
    make_cnn_bn,
    make_mlp,
    total_loss_fn,
)

MODELS = {"logreg": (4, 3), "mlp": (4, 6, 3)}

pytestmark = [pytest.mark.filterwarnings("ignore:.*TRACER correction:RuntimeWarning")]


def _setup(kind: str):
    model = make_mlp(MODELS[kind], seed=0)
    x, y = make_classification_data(n=20, d=4, n_classes=3, seed=2)
    return model, x, y


def _closure(opt, model, x, y, create_graph: bool):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward(create_graph=create_graph)
        return loss

    return closure


def _hessian_at(model, theta, x, y):
    m = copy.deepcopy(model)
    vector_to_parameters(theta, m.parameters())
    return dense_hessian(m, F.cross_entropy, [(x, y)])


def _hand_directions(model, x, y, theta, fbar, rho, delta, beta):
    L, _ = total_loss_fn(model, F.cross_entropy, [(x, y)])
    g = grad(L)(theta)
    if fbar is None:
        fbar = g**2
    H = _hessian_at(model, theta, x, y)
    d = g + 2 * rho * H @ (g / (fbar + delta))
    fbar = (1 - beta) * fbar + beta * g**2
    return d, fbar, g


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("hvp", ["exact", "finite_difference"])
def test_sgd_tracer_matches_hand_computed_steps(kind, steps, hvp):
    model, x, y = _setup(kind)
    rho, delta, beta, lr, mom, wd = 0.05, 1e-3, 0.2, 0.1, 0.9, 1e-2
    opt = SGDTracer(model.parameters(), lr=lr, rho=rho, beta=beta, delta=delta, hvp=hvp, momentum=mom,
                    weight_decay=wd, fd_step=1e-6 if hvp == "finite_difference" else None)  # fmt: skip
    closure = _closure(opt, model, x, y, create_graph=hvp == "exact")
    theta, fbar, buf = flatten_params(model), None, None
    tol = 1e-12 if hvp == "exact" else 1e-6
    for _ in range(steps):
        d, fbar, g = _hand_directions(model, x, y, theta, fbar, rho, delta, beta)
        d = d + wd * theta
        buf = d if buf is None else mom * buf + d
        theta = theta - lr * buf
        opt.step(closure)
        torch.testing.assert_close(flatten_params(model), theta, rtol=tol, atol=tol)
    fb = torch.cat([opt.state[p]["f_bar"].reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(fb, fbar, rtol=1e-9 if hvp == "exact" else 1e-5, atol=1e-14)
    # the graph is freed: every .grad is a detached tensor (the direction handed to SGD)
    assert all(p.grad is not None and not p.grad.requires_grad for p in model.parameters())


@pytest.mark.parametrize("steps", [1, 3])
def test_adam_tracer_matches_hand_computed_steps(steps):
    model, x, y = _setup("mlp")
    rho, delta, beta, lr, b1, b2, eps = 0.02, 1e-3, 0.1, 1e-2, 0.9, 0.99, 1e-8
    opt = AdamTracer(model.parameters(), lr=lr, rho=rho, beta=beta, delta=delta, betas=(b1, b2), eps=eps)
    closure = _closure(opt, model, x, y, create_graph=True)
    theta, fbar = flatten_params(model), None
    m = v = torch.zeros_like(theta)
    for t in range(1, steps + 1):
        d, fbar, _ = _hand_directions(model, x, y, theta, fbar, rho, delta, beta)
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d**2
        theta = theta - lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), theta, rtol=1e-10, atol=1e-12)


def test_exact_and_finite_difference_agree_and_log_penalty():
    model, x, y = _setup("mlp")
    model2 = copy.deepcopy(model)
    kw = dict(lr=0.1, rho=0.05, beta=0.1, delta=1e-3, momentum=0.9)
    o1 = SGDTracer(model.parameters(), hvp="exact", **kw)
    o2 = SGDTracer(model2.parameters(), hvp="finite_difference", **kw)  # default fd_step
    c1, c2 = _closure(o1, model, x, y, True), _closure(o2, model2, x, y, False)
    for _ in range(3):
        theta = flatten_params(model)
        L, _ = total_loss_fn(model, F.cross_entropy, [(x, y)])
        g = grad(L)(theta)
        fb = (
            g**2
            if not o1.state
            else torch.cat([o1.state[p]["f_bar"].reshape(-1) for p in model.parameters()])
        )
        o1.step(c1)
        o2.step(c2)
        assert o1.last["penalty"] == pytest.approx(float(0.05 * (g**2 / (fb + 1e-3)).sum()), rel=1e-10)
        assert o2.last["fd_h"] > 0 and o1.last["fd_h"] is None
        assert o1.last["hv_norm"] == pytest.approx(o2.last["hv_norm"], rel=1e-5)
    torch.testing.assert_close(flatten_params(model), flatten_params(model2), rtol=1e-5, atol=1e-7)


def test_exact_mode_without_graph_raises_clear_error():
    model, x, y = _setup("logreg")
    opt = SGDTracer(model.parameters(), lr=0.1)
    before = flatten_params(model)
    with pytest.raises(RuntimeError, match=r"create_graph=True.*finite_difference"):
        opt.step(_closure(opt, model, x, y, create_graph=False))
    assert torch.equal(flatten_params(model), before)
    with pytest.raises(ValueError, match="closure"):
        opt.step(None)
    with pytest.raises(ValueError, match="return"):
        opt.step(lambda: None)


@pytest.mark.parametrize(
    "kw,word",
    [
        (dict(rho=-1.0), "rho"),
        (dict(lr=-0.1), "lr"),
        (dict(delta=0.0), "delta"),
        (dict(beta=0.0), "beta"),
        (dict(beta=1.5), "beta"),
        (dict(hvp="gauss"), "hvp"),
        (dict(fd_step=-1e-3), "fd_step"),
    ],
)
def test_tracer_validation(kw, word):
    model, _, _ = _setup("logreg")
    args = dict(lr=0.1)
    args.update(kw)
    with pytest.raises(ValueError, match=word):
        SGDTracer(model.parameters(), **args)


def test_finite_difference_pass_leaves_batchnorm_stats_alone():
    model = make_cnn_bn()
    x, y = make_classification_data(n=8, image=True, seed=3)
    ref = make_cnn_bn()
    ref.train()
    ref(x)
    opt = SGDTracer(model.parameters(), lr=0.1, hvp="finite_difference", model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.step(_closure(opt, model, x, y, False))
    assert torch.equal(model[1].running_mean, ref[1].running_mean)
    assert torch.equal(model[1].running_var, ref[1].running_var)


def test_state_dict_roundtrip_continues_identically():
    model, x, y = _setup("mlp")
    opt = SGDTracer(model.parameters(), lr=0.1, momentum=0.9, hvp="finite_difference", fd_step=1e-6)
    closure = _closure(opt, model, x, y, False)
    opt.step(closure)
    model2 = copy.deepcopy(model)
    opt2 = SGDTracer(model2.parameters(), lr=0.1, momentum=0.9, hvp="finite_difference", fd_step=1e-6)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares state tensors
    opt.step(closure)
    opt2.step(_closure(opt2, model2, x, y, False))
    assert torch.equal(flatten_params(model), flatten_params(model2))
    assert opt.last["step"] == opt2.last["step"] == 2  # the step counter is part of the state


# ------------------------------------------------------------------ bounded correction, divergence
def _hand_capped_direction(model, x, y, theta, fbar, rho, delta, cap):
    """``g + s * 2 rho H v`` with ``s = min(1, cap ||g|| / ||2 rho H v||)`` from the dense Hessian."""
    L, _ = total_loss_fn(model, F.cross_entropy, [(x, y)])
    g = grad(L)(theta)
    if fbar is None:
        fbar = g**2
    corr = 2 * rho * _hessian_at(model, theta, x, y) @ (g / (fbar + delta))
    ratio = float(corr.norm() / g.norm())
    s = 1.0 if cap is None or ratio <= cap else cap * float(g.norm()) / float(corr.norm())
    return g + s * corr, g, fbar, ratio, s


@pytest.mark.parametrize("cap", [1.0, 12.0])
def test_max_correction_ratio_matches_hand_computed_steps(cap):
    model, x, y = _setup("mlp")
    rho, delta, beta, lr, mom = 0.05, 1e-3, 0.2, 0.1, 0.9
    opt = SGDTracer(model.parameters(), lr=lr, rho=rho, beta=beta, delta=delta, momentum=mom,
                    max_correction_ratio=cap)  # fmt: skip
    closure = _closure(opt, model, x, y, create_graph=True)
    theta, fbar, buf, scales = flatten_params(model), None, None, []
    for _ in range(4):
        d, g, fbar, ratio, s = _hand_capped_direction(model, x, y, theta, fbar, rho, delta, cap)
        fbar = (1 - beta) * fbar + beta * g**2
        buf = d if buf is None else mom * buf + d
        theta = theta - lr * buf
        opt.step(closure)
        torch.testing.assert_close(flatten_params(model), theta, rtol=1e-12, atol=1e-12)
        assert opt.last["correction_ratio"] == pytest.approx(ratio, rel=1e-10)
        assert opt.last["correction_scale"] == pytest.approx(s, rel=1e-10)
        scales.append(s)
    # uncapped ratios here: 10.2, 8.2, 10.1, 16.0; cap 1 binds on every step, cap 12 on the last only
    assert all(s < 1 for s in scales) if cap == 1.0 else (scales[:3] == [1.0] * 3 and scales[3] < 1)


def test_non_binding_bound_is_bit_identical_to_the_paper_rule():
    model, x, y = _setup("mlp")
    model2 = copy.deepcopy(model)
    kw = dict(lr=0.1, rho=0.05, beta=0.2, delta=1e-3, momentum=0.9)
    o1 = SGDTracer(model.parameters(), **kw)
    o2 = SGDTracer(model2.parameters(), max_correction_ratio=1e6, **kw)
    for _ in range(3):
        o1.step(_closure(o1, model, x, y, True))
        o2.step(_closure(o2, model2, x, y, True))
    assert torch.equal(flatten_params(model), flatten_params(model2))
    assert o2.last["correction_scale"] == 1.0 and o1.config["max_correction_ratio"] is None


def _rare_feature_problem():
    """Logistic regression on 3 features; feature 2 is 0 except in one example, where it is 20 (as a
    standardised corner pixel of the digits, 0 in all but 1-3 of 1,438 images, reaches 26-38). Its
    weights start at 0, so that the rare example does not saturate the softmax."""
    gen = torch.Generator().manual_seed(5)
    n = 64
    x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
    x[:, 2] = 0.0
    x[7, 2] = 20.0
    y = torch.randint(0, 3, (n,), generator=gen)
    model = make_mlp((3, 3), seed=1)
    with torch.no_grad():
        model[0].weight[:, 2] = 0.0
    batches = [torch.arange(16, 32), torch.arange(32, 48), torch.arange(48, 64), torch.arange(0, 16)]
    return model, x, y, batches


def test_rare_feature_makes_the_correction_explode_and_the_bound_holds():
    """The miniature's divergence in small: the feature's weights have f_bar = 0 (<= delta) until the
    batch holding the rare example gives them a gradient, so v = g / (f_bar + delta) ~ 1e8 g there and
    ``2 rho H v`` (defaults rho 1e-6, delta 1e-8) exceeds ||g|| by orders of magnitude (checked
    against the dense Hessian)."""
    model, x, y, batches = _rare_feature_problem()
    capped = copy.deepcopy(model)
    opt = SGDTracer(model.parameters(), lr=0.05)
    opt_c = SGDTracer(capped.parameters(), lr=0.05, max_correction_ratio=1.0)
    theta, fbar = flatten_params(model), None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for idx in batches:
            xb, yb = x[idx], y[idx]
            _, g, fbar_used, ratio, _ = _hand_capped_direction(model, xb, yb, theta, fbar, 1e-6, 1e-8, None)
            opt.step(_closure(opt, model, xb, yb, True))
            opt_c.step(_closure(opt_c, capped, xb, yb, True))
            assert opt.last["correction_ratio"] == pytest.approx(ratio, rel=1e-8)
            fbar = (1 - 0.01) * fbar_used + 0.01 * g**2
            theta = flatten_params(model)
    # the last batch holds the rare example: the uncapped correction is > 100 ||g||
    assert opt.last["correction_ratio"] > 100 and opt.last["correction_scale"] == 1.0
    assert opt_c.last["correction_scale"] < 1 / 100
    tracer_warnings = [w for w in caught if "TRACER correction" in str(w.message)]
    assert len(tracer_warnings) == 1 and issubclass(tracer_warnings[0].category, RuntimeWarning)
    message = str(tracer_warnings[0].message)
    assert "step 4:" in message and "max_correction_ratio=1" in message
    assert f"is {opt.last['correction_ratio']:.3g} times" in message  # the ratio it reports
    assert "exceeds 10000" in message  # 1e3 < ratio < 1e4: the next warning needs another decade
    assert tracer_warnings[0].filename == __file__  # points at the caller of step()


def test_bounded_optimizer_does_not_warn():
    model, x, y, batches = _rare_feature_problem()
    opt = SGDTracer(model.parameters(), lr=0.05, max_correction_ratio=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for idx in batches:
            opt.step(_closure(opt, model, x[idx], y[idx], True))


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("what", ["loss", "gradient"])
def test_non_finite_step_raises_and_leaves_everything_unchanged(first, what):
    model, x, y = _setup("mlp")
    opt = SGDTracer(model.parameters(), lr=0.1, momentum=0.9, hvp="finite_difference", fd_step=1e-6)
    if not first:
        opt.step(_closure(opt, model, x, y, False))
    before = flatten_params(model)
    state = copy.deepcopy(opt.state_dict())
    x_bad = x.clone()
    if what == "gradient":
        x_bad[0, 0] = math.inf  # tanh saturates: finite loss, NaN gradient (inf * 0)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x_bad), y)
        loss.backward()
        return loss * math.nan if what == "loss" else loss

    fragment = (
        r"loss nan, 0 non-finite gradient" if what == "loss" else r"loss [0-9.]+, [1-9][0-9]* non-finite"
    )
    with pytest.raises(FloatingPointError, match=fragment + r".*left unchanged.*max_correction_ratio=1"):
        opt.step(closure)
    assert torch.equal(flatten_params(model), before)
    assert all(p.grad is not None and not p.grad.requires_grad for p in model.parameters())
    after = opt.state_dict()
    assert len(after["tracer"]["state"]) == len(state["tracer"]["state"])
    for k, v in state["tracer"]["state"].items():
        assert torch.equal(after["tracer"]["state"][k]["f_bar"], v["f_bar"])
    assert len(after["base"]["state"]) == len(state["base"]["state"])
    for k, v in state["base"]["state"].items():
        assert torch.equal(after["base"]["state"][k]["momentum_buffer"], v["momentum_buffer"])


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan])
def test_max_correction_ratio_validation(bad):
    model, _, _ = _setup("logreg")
    with pytest.raises(ValueError, match="max_correction_ratio"):
        SGDTracer(model.parameters(), lr=0.1, max_correction_ratio=bad)


def test_the_double_backward_closure_warns_nothing_and_leaves_no_graph_on_the_grads():
    """torch's create_graph reference-cycle warning stays inside the step, which breaks the cycle:
    every ``.grad`` it leaves is detached (the direction the base optimizer used)."""
    model, x, y = _setup("mlp")
    opt = SGDTracer(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            opt.step(_closure(opt, model, x, y, create_graph=True))
    assert all(
        p.grad is not None and p.grad.grad_fn is None and not p.grad.requires_grad for p in model.parameters()
    )
