"""G-TRACER (SGDTracer, AdamTracer) against hand-computed steps with a dense float64 Hessian.

The reference direction ``g + 2 rho H (g / (f_bar + delta))`` uses ``tests.references.dense_hessian``
evaluated at the hand-computed weights; SGD and Adam are written out by hand.
"""

from __future__ import annotations

import copy
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

pytestmark = pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")


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
