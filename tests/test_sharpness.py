"""Sharpness measures against closed forms (quadratics), dense searches (logistic regression) and
dense float64 matrices from tests/references.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from landscape.objective import Objective
from landscape.sharpness import sharpness
from tests.references import (
    dense_hessian,
)
from tests.sharpness_problems import (
    F64,
    _ref_loss,
    logistic_problem,
    mlp_problem,
    quad,
    qvalue,
    rand,
    spd,
    trust_region_max,
)


# --------------------------------------------------------------------------------------------
# worst case
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [None, "adaptive"])
def test_worst_case_l2_equals_trust_region_solution(scale):
    p, rho = 5, 0.3
    A, b, w = spd(p, 0), rand(p, 1), rand(p, 2)
    obj = quad(A, b, w)
    c = w.abs() if scale == "adaptive" else torch.ones(p, dtype=F64)
    ref = trust_region_max(c[:, None] * A * c[None, :], c * (A @ w + b), rho)
    r_pgd = sharpness(obj, "worst_case", rho=rho, scale=scale, solver="pgd", iterations=300, step=0.01)
    r_apgd = sharpness(obj, "worst_case", rho=rho, scale=scale, solver="apgd", iterations=100)
    r_one = sharpness(obj, "worst_case", rho=rho, scale=scale, solver="one_step")
    assert r_pgd.value == pytest.approx(ref, rel=1e-5)
    assert r_apgd.value == pytest.approx(ref, rel=1e-6)
    assert r_one.value <= ref + 1e-12
    assert r_apgd.stderr is None and r_apgd.evaluations["gradient"] == 101


def test_worst_case_linf_equals_vertex_enumeration():
    p, rho = 4, 0.2
    A, b, w = spd(p, 3), rand(p, 4), rand(p, 5)
    obj = quad(A, b, w)
    base = qvalue(A, b, w)
    ref = (
        max(qvalue(A, b, w + rho * torch.tensor(s, dtype=F64)) for s in itertools.product([-1, 1], repeat=p))
        - base
    )
    r = sharpness(obj, "worst_case", rho=rho, p="inf", solver="apgd", iterations=50, restarts=3)
    assert r.value == pytest.approx(ref, rel=1e-10)
    # one step on the box: delta = rho sign(g)
    g = A @ w + b
    one = sharpness(obj, "worst_case", rho=rho, p=math.inf, solver="one_step")
    assert one.value == pytest.approx(qvalue(A, b, w + rho * g.sign()) - base, rel=1e-12)


def test_one_step_closed_form_adaptive():
    """ASAM one step: delta = rho c^2 g / ||c g|| (Kwon et al. 2021, eq. 9)."""
    p, rho, eta = 4, 0.1, 0.01
    A, b, w = spd(p, 6), rand(p, 7), rand(p, 8)
    obj = quad(A, b, w)
    g = A @ w + b
    c = w.abs() + eta
    delta = rho * c**2 * g / (c * g).norm()
    r = sharpness(obj, "worst_case", rho=rho, adaptive=True, eta=eta, solver="one_step")
    assert r.value == pytest.approx(qvalue(A, b, w + delta) - qvalue(A, b, w), rel=1e-12)
    assert r.extra["delta_norm"] == pytest.approx(float(delta.norm()), rel=1e-12)
    assert r.evaluations == {"loss": 1, "gradient": 1, "hvp": 0}


def test_worst_case_logistic_regression_against_dense_search():
    obj, net, loss_at = logistic_problem()
    w0 = net.lin.weight.detach().reshape(-1)
    rho = 0.5
    theta = torch.linspace(0, 2 * math.pi, 200001, dtype=F64)
    circle = torch.stack([torch.cos(theta), torch.sin(theta)], dim=1)
    ref = float(loss_at(w0 + rho * circle).max() - loss_at(w0))
    r = sharpness(obj, "worst_case", rho=rho, solver="apgd", iterations=40)
    assert r.value == pytest.approx(ref, rel=1e-7)
    # the box: convex loss -> maximum at a vertex
    ref_inf = max(
        float(loss_at(w0 + rho * torch.tensor(s, dtype=F64))) for s in itertools.product([-1, 1], repeat=2)
    )
    r_inf = sharpness(obj, "worst_case", rho=rho, p="inf", solver="pgd", iterations=10)
    assert r_inf.value == pytest.approx(ref_inf - float(loss_at(w0)), rel=1e-10)


def test_small_rho_one_step_is_rho_times_gradient_norm_and_sam_penalty():
    model, batches, obj = mlp_problem()
    rho = 1e-5
    r = sharpness(obj, "worst_case", rho=rho, solver="one_step")
    gn = sharpness(obj, "gradient_norm", rho=rho)
    loss, theta0 = _ref_loss(model, batches)
    g = torch.func.grad(loss)(theta0)
    assert gn.value == pytest.approx(float(g.norm()), rel=1e-10)
    assert gn.extra["sam_penalty"] == pytest.approx(rho * float(g.norm()), rel=1e-10)
    assert r.value == pytest.approx(rho * float(g.norm()), rel=1e-3)
    # adaptive: rho ||c g||
    ra = sharpness(obj, "worst_case", rho=rho, adaptive=True, eta=0.01, solver="one_step")
    ga = sharpness(obj, "gradient_norm", rho=rho, adaptive=True, eta=0.01)
    cg = (theta0.abs() + 0.01) * g
    assert ga.extra["sam_penalty"] == pytest.approx(rho * float(cg.norm()), rel=1e-10)
    assert ra.value == pytest.approx(rho * float(cg.norm()), rel=1e-3)


def test_apgd_at_least_one_step_and_worst_at_least_average():
    model, batches, obj = mlp_problem("relu")
    p = obj.num_params
    for rho in (0.05, 0.5):
        one = sharpness(obj, "worst_case", rho=rho, solver="one_step").value
        apgd = sharpness(obj, "worst_case", rho=rho, solver="apgd").value
        avg = sharpness(obj, "average_case", rho=rho / math.sqrt(p), samples=20)
        assert apgd >= one - 1e-12
        assert apgd >= avg.value + 2 * avg.stderr
    # on the box the average of uniform noise is below the maximum over the same box
    box = sharpness(obj, "worst_case", rho=0.05, p="inf").value
    avg_box = sharpness(obj, "average_case", rho=0.05, noise="uniform", samples=20)
    assert box >= avg_box.value + 2 * avg_box.stderr


def test_fisher_worst_case_one_step_is_fsam_eq10():
    p, gamma, eta = 4, 0.1, 1.0
    A, b, w = spd(p, 9), rand(p, 10), rand(p, 11)
    obj = quad(A, b, w)
    g = A @ w + b
    finv = 1.0 / (1.0 + eta * g**2)
    delta = gamma * finv * g / torch.sqrt(g @ (finv * g))
    assert float(delta @ ((1 + eta * g**2) * delta)) == pytest.approx(gamma**2)
    r = sharpness(obj, "fisher_worst_case", gamma=gamma, eta=eta, solver="one_step")
    assert r.value == pytest.approx(qvalue(A, b, w + delta) - qvalue(A, b, w), rel=1e-12)
    # the full maximisation: trust region in u with c = (1 + eta g^2)^{-1/2}
    c = finv.sqrt()
    ref = trust_region_max(c[:, None] * A * c[None, :], c * g, gamma)
    r2 = sharpness(obj, "fisher_worst_case", gamma=gamma, eta=eta, iterations=100)
    assert r2.value == pytest.approx(ref, rel=1e-6)
    assert r2.config["gamma"] == gamma and "rho" not in r2.config


def test_m_sharpness_is_weighted_mean_of_per_batch_worst_cases():
    obj, net, loss_at = logistic_problem()
    x, y = torch.cat([b[0] for b in obj.data]), torch.cat([b[1] for b in obj.data])
    rho, m = 0.3, 8
    r = sharpness(obj, "worst_case", rho=rho, solver="one_step", m=m)
    w0 = net.lin.weight.detach().reshape(-1)
    total, n = 0.0, len(y)
    for s in range(0, n, m):
        xb, yb = x[s : s + m], y[s : s + m]

        def lb(W, xb=xb, yb=yb):
            return nn.functional.binary_cross_entropy_with_logits(W @ xb.T, yb)

        g = torch.func.grad(lb)(w0)
        total += len(yb) / n * float(lb(w0 + rho * g / g.norm()) - lb(w0))
    assert r.extra["num_sub_batches"] == math.ceil(n / m)
    assert r.value == pytest.approx(total, rel=1e-12)


def test_logit_normalization_uses_normalised_logits():
    model, batches, obj = mlp_problem()

    def normalised_ce(out, y):
        return nn.functional.cross_entropy(out / out.norm(dim=-1, keepdim=True), y)

    ref_obj = Objective(model, normalised_ce, batches)
    r = sharpness(obj, "worst_case", rho=0.1, solver="one_step", logit_normalization=True)
    ref = sharpness(ref_obj, "worst_case", rho=0.1, solver="one_step")
    assert r.value == pytest.approx(ref.value, rel=1e-12)
    assert r.value != pytest.approx(sharpness(obj, "worst_case", rho=0.1, solver="one_step").value, rel=1e-3)


# --------------------------------------------------------------------------------------------
# average case and error bars
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("noise,factor", [("gaussian", 1.0), ("uniform", 1.0 / 3.0)])
def test_average_case_closed_form_on_quadratic(noise, factor):
    p, rho = 6, 0.1
    A, b, w = spd(p, 12, cond=3.0), rand(p, 13), rand(p, 14)
    obj = quad(A, b, w)
    c = w.abs()
    exact = 0.5 * rho**2 * factor * float(torch.sum(c**2 * torch.diagonal(A)))
    r = sharpness(obj, "average_case", rho=rho, adaptive=True, noise=noise, samples=200, seed=1)
    assert abs(r.value - exact) < 4 * r.stderr
    assert r.stderr < 0.1 * exact
    lo, hi = r.ci(0.999)
    assert lo < exact < hi


def test_average_case_default_samples_give_10_percent_error_bar():
    p = 4
    obj = quad(torch.eye(p, dtype=F64), rand(p, 0), rand(p, 1))
    r = sharpness(obj, "average_case", rho=0.1)
    assert r.config["samples"] == 100 and r.evaluations["loss"] == 201
    assert r.stderr < 0.1 * r.value
    assert abs(r.value - 0.5 * 0.01 * p) < 4 * r.stderr


def test_stderr_is_a_standard_deviation():
    """The reported stderr matches the spread of repeated seeded runs and scales like 1/sqrt(n); a
    variance (stderr**2, here ~1e-8 vs ~1e-4) fails both checks."""
    p = 3
    A = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=F64))
    obj = quad(A, rand(p, 2), rand(p, 3))
    runs = [sharpness(obj, "average_case", rho=0.05, samples=16, seed=s) for s in range(60)]
    spread = float(np.std([r.value for r in runs], ddof=1))
    mean_stderr = float(np.mean([r.stderr for r in runs]))
    assert 0.7 < spread / mean_stderr < 1.4
    big = sharpness(obj, "average_case", rho=0.05, samples=16 * 16, seed=0)
    assert 0.18 < big.stderr / mean_stderr < 0.35  # 1/sqrt(16) = 0.25


def test_average_case_matches_half_rho_squared_trace_estimator():
    model, batches, obj = mlp_problem()
    rho = 1e-3
    H = dense_hessian(model, nn.CrossEntropyLoss(), batches)
    tr = sharpness(obj, "hessian_trace", method="hutchinson", rtol=1e-3, max_matvecs=100)
    assert tr.value == pytest.approx(float(torch.trace(H)), abs=5 * tr.stderr + 1e-9)
    avg = sharpness(obj, "average_case", rho=rho, samples=100)
    predicted = 0.5 * rho**2 * tr.value
    assert (
        abs(avg.value - predicted) < 4 * math.hypot(avg.stderr, 0.5 * rho**2 * tr.stderr) + 1e-3 * predicted
    )
    assert tr.extra["trace_per_param"] == pytest.approx(tr.value / obj.num_params)
