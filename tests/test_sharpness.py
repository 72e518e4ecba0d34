"""Sharpness measures against closed forms (quadratics), dense searches (logistic regression) and
dense float64 matrices from tests/references.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from torch import nn

import landscape as ls
from landscape.objective import Objective
from landscape.sharpness import MEASURES, SharpnessResult, sharpness, sharpness_report
from tests.references import (
    dense_empirical_fisher,
    dense_ggn,
    dense_hessian,
    make_classification_data,
    make_mlp,
    split_batches,
)

F64 = torch.float64


# --------------------------------------------------------------------------------------------
# problems
# --------------------------------------------------------------------------------------------
class Quadratic(nn.Module):
    """``L(w) = 1/2 w^T A w + b^T w`` (the "outputs" are the loss repeated over the batch)."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("A", A.clone())
        self.register_buffer("b", b.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (0.5 * self.w @ self.A @ self.w + self.b @ self.w).expand(x.shape[0])


class DiagQuadratic(nn.Module):
    """``L(w) = 1/2 sum_i d_i w_i^2 + b^T w`` (cheap for large p)."""

    def __init__(self, d: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("d", d.clone())
        self.register_buffer("b", b.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (0.5 * (self.d * self.w**2).sum() + self.b @ self.w).expand(x.shape[0])


def mean_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.mean()


def quad(A, b, w) -> Objective:
    data = (torch.zeros(3, 1, dtype=F64), torch.zeros(3, dtype=F64))
    return Objective(Quadratic(A, b, w), mean_loss, data)


def qvalue(A, b, w) -> float:
    return float(0.5 * w @ A @ w + b @ w)


def spd(p: int, seed: int, cond: float = 10.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=F64))
    return q @ torch.diag(torch.logspace(0, math.log10(cond), p, dtype=F64)) @ q.T


def rand(p: int, seed: int) -> torch.Tensor:
    return torch.randn(p, generator=torch.Generator().manual_seed(seed), dtype=F64)


def trust_region_max(M: torch.Tensor, g: torch.Tensor, rho: float) -> float:
    """``max_{||u|| <= rho} g^T u + 1/2 u^T M u`` for symmetric ``M`` (easy case): the maximiser is
    ``u = (lam I - M)^{-1} g`` with ``lam > lambda_max(M)`` and ``||u|| = rho`` (secular equation)."""
    evals, evecs = torch.linalg.eigh(M)
    gh = (evecs.T @ g).numpy()
    ev = evals.numpy()

    def norm_minus_rho(lam):
        return np.linalg.norm(gh / (lam - ev)) - rho

    lo = ev.max() + 1e-12
    hi = ev.max() + np.linalg.norm(gh) / rho + 1.0
    lam = brentq(norm_minus_rho, lo + 1e-14, hi, xtol=1e-15, rtol=1e-15)
    u = evecs.numpy() @ (gh / (lam - ev))
    return float(g.numpy() @ u + 0.5 * u @ M.numpy() @ u)


def logistic_problem(n: int = 30, d: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    y = (
        x @ torch.tensor([1.5, -1.0][:d] + [0.5] * (d - 2), dtype=F64)
        + 0.5 * torch.randn(n, generator=g, dtype=F64)
        > 0
    )
    model = nn.Linear(d, 1, bias=False).to(F64)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.8, -0.3] + [0.1] * (d - 2)], dtype=F64))
    y = y.to(F64)

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model

        def forward(self, x):
            return self.lin(x).squeeze(-1)

    net = Flat()
    obj = Objective(net, nn.BCEWithLogitsLoss(), [(x[:17], y[:17]), (x[17:], y[17:])])

    def loss_at(W: torch.Tensor) -> torch.Tensor:  # W [..., d] -> loss [...]
        z = W @ x.T
        return nn.functional.binary_cross_entropy_with_logits(z, y.expand_as(z), reduction="none").mean(-1)

    return obj, net, loss_at


def mlp_problem(activation: str = "tanh", n: int = 24, seed: int = 0):
    model = make_mlp((4, 6, 3), activation, seed=seed)
    x, y = make_classification_data(n, 4, 3, seed=seed)
    batches = split_batches(x, y, [10, n - 10])
    return model, batches, Objective(model, nn.CrossEntropyLoss(), batches)


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


def _ref_loss(model, batches):
    from tests.references import total_loss_fn

    return total_loss_fn(model, nn.CrossEntropyLoss(), batches)


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
    x, y = torch.cat([b[0] for b in obj._data]), torch.cat([b[1] for b in obj._data])
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


# --------------------------------------------------------------------------------------------
# curvature measures vs dense matrices
# --------------------------------------------------------------------------------------------
def test_lambda_max_and_smallest_match_dense_hessian():
    model, batches, obj = mlp_problem()
    ev = torch.linalg.eigvalsh(dense_hessian(model, nn.CrossEntropyLoss(), batches))
    r = sharpness(obj, "lambda_max", tol=1e-8)
    assert r.value == pytest.approx(float(ev[-1]), rel=1e-6)
    assert r.extra["smallest"] == pytest.approx(float(ev[0]), rel=1e-5, abs=1e-8)
    assert r.evaluations["hvp"] > 0


def test_traces_match_dense_ggn_and_fishers():
    model, batches, obj = mlp_problem()
    ggn = float(torch.trace(dense_ggn(model, nn.CrossEntropyLoss(), batches)))
    ef = float(torch.trace(dense_empirical_fisher(model, nn.CrossEntropyLoss(), batches)))
    r = sharpness(obj, "ggn_trace", method="exact")
    assert r.value == pytest.approx(ggn, rel=1e-10)
    r = sharpness(obj, "ggn_trace", rtol=1e-2)
    assert abs(r.value - ggn) < 5 * r.stderr
    r = sharpness(obj, "fisher_trace")
    assert r.value == pytest.approx(ef, rel=1e-10) and r.stderr is None
    # Monte-Carlo Fisher: for cross-entropy E[F_mc] = GGN
    r = sharpness(obj, "fisher_trace", kind="mc", samples=30, seed=3)
    assert abs(r.value - ggn) < 4 * r.stderr


def test_tracer_trace_ratio():
    model, batches, obj = mlp_problem()
    loss, theta0 = _ref_loss(model, batches)
    g = torch.func.grad(loss)(theta0)
    f_bar = torch.rand(obj.num_params, generator=torch.Generator().manual_seed(0), dtype=F64) + 0.1
    r = sharpness(obj, "tracer", f_bar=f_bar, delta=1e-3)
    assert r.value == pytest.approx(float((g**2 / (f_bar + 1e-3)).sum()), rel=1e-10)
    # default f_bar: mean over mini-batches of 8 of the squared mini-batch gradient
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    sq = []
    for s in range(0, len(y), 8):
        lb, _ = __import__("tests.references", fromlist=["x"]).total_loss_fn(
            model, nn.CrossEntropyLoss(), [(x[s : s + 8], y[s : s + 8])]
        )
        sq.append(torch.func.grad(lb)(theta0) ** 2)
    fb = torch.stack(sq).mean(0)
    r = sharpness(obj, "tracer", batch_size=8, delta=1e-8)
    assert r.value == pytest.approx(float((g**2 / (fb + 1e-8)).sum()), rel=1e-8)


# --------------------------------------------------------------------------------------------
# Keskar, Jiang et al., directions, robustness curve
# --------------------------------------------------------------------------------------------
def test_keskar_against_box_vertex_enumeration():
    # convex losses: the maximum over the box is at a vertex
    p, eps = 4, 1e-2
    A, b, w = spd(p, 15), rand(p, 16), rand(p, 17)
    obj = quad(A, b, w)
    box = eps * (w.abs() + 1)
    L0 = qvalue(A, b, w)
    best = max(
        qvalue(A, b, w + box * torch.tensor(s, dtype=F64)) for s in itertools.product([-1, 1], repeat=p)
    )
    r = sharpness(obj, "keskar", epsilon=eps)
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)
    # logistic regression
    obj, net, loss_at = logistic_problem(d=3)
    w0 = net.lin.weight.detach().reshape(-1)
    box = 5e-2 * (w0.abs() + 1)
    L0 = float(loss_at(w0))
    verts = torch.tensor(list(itertools.product([-1, 1], repeat=3)), dtype=F64)
    best = float(loss_at(w0 + box * verts).max())
    r = sharpness(obj, "keskar", epsilon=5e-2)
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)


def test_keskar_random_subspace():
    p, k, eps = 6, 2, 1e-2
    A, b, w = spd(p, 18), rand(p, 19), rand(p, 20)
    obj = quad(A, b, w)
    r = sharpness(obj, "keskar", epsilon=eps, subspace=k, seed=4)
    M = torch.randn(p, k, generator=torch.Generator().manual_seed(4), dtype=F64)
    box = eps * ((torch.linalg.pinv(M) @ w).abs() + 1)
    L0 = qvalue(A, b, w)
    best = max(
        qvalue(A, b, w + M @ (box * torch.tensor(s, dtype=F64))) for s in itertools.product([-1, 1], repeat=k)
    )
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)


def test_pacbayes_sigma_is_a_standard_deviation():
    """Isotropic quadratic at its minimum: E[L(w+u)] - L(w) = sigma^2 Tr(A) / 2, so sigma* =
    sqrt(2 target / Tr A) = 0.0158 (passing a variance would give sigma*^2 = 2.5e-4 instead)."""
    p, a, eps = 800, 1.0, 1e-3
    w = rand(p, 21)
    data = (torch.zeros(1, 1, dtype=F64), torch.zeros(1, dtype=F64))
    obj = Objective(DiagQuadratic(torch.full((p,), a, dtype=F64), -a * w, w), mean_loss, data)
    r = sharpness(obj, "pacbayes_flatness", samples=20, steps=10, epsilon=eps, criterion="loss")
    sigma = math.sqrt(2 * 0.1 / (a * p))
    assert r.extra["sigma"] == pytest.approx(sigma, rel=0.03)
    assert r.value == pytest.approx(1 / sigma**2, rel=0.06)
    # magnitude aware: E = 1/2 sum_i a (sigma'^2 w_i^2 + eps^2)
    sigma_mag = math.sqrt((0.2 / a - p * eps**2) / float((w**2).sum()))
    assert r.extra["sigma_magnitude"] == pytest.approx(sigma_mag, rel=0.03)
    assert r.extra["inv_sigma_magnitude_sq"] == pytest.approx(1 / r.extra["sigma_magnitude"] ** 2)


def test_sharpness_flatness_closed_form():
    """Diagonal A, g != 0: the box maximum is at u = alpha sign(g): alpha ||g||_1 + alpha^2 Tr(A)/2."""
    p = 5
    d = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=F64)
    A, w, b = torch.diag(d), rand(p, 22), rand(p, 23)
    obj = quad(A, b, w)
    g1 = float((A @ w + b).abs().sum())
    tr = float(d.sum())
    alpha = (-g1 + math.sqrt(g1**2 + 2 * tr * 0.1)) / tr
    r = sharpness(obj, "sharpness_flatness", criterion="loss", epsilon=0.0, steps=20)
    assert r.extra["alpha"] == pytest.approx(alpha, rel=1e-4)
    assert r.value == pytest.approx(1 / alpha**2, rel=1e-3)
    # magnitude-aware box |u_i| <= alpha |w_i|: alpha sum |g_i w_i| + alpha^2 sum d_i w_i^2 / 2
    gw = float(((A @ w + b) * w).abs().sum())
    dw = float((d * w**2).sum())
    alpha_mag = (-gw + math.sqrt(gw**2 + 2 * dw * 0.1)) / dw
    assert r.extra["alpha_magnitude"] == pytest.approx(alpha_mag, rel=1e-4)


def test_directional_closed_form_and_filter_normalisation():
    p = 4
    A, b, w = spd(p, 24), rand(p, 25), rand(p, 26)
    obj = quad(A, b, w)
    ds = [rand(p, 30 + i) for i in range(3)]
    r = sharpness(obj, "directional", directions=ds, radius=0.2)
    g = A @ w + b
    rises = [float(0.2 * g @ d + 0.5 * 0.04 * d @ A @ d) for d in ds]
    assert r.value == pytest.approx(float(np.mean(rises)), rel=1e-12)
    assert r.extra["max"] == pytest.approx(max(rises), rel=1e-12)
    assert r.stderr == pytest.approx(float(np.std(rises, ddof=1) / math.sqrt(3)), rel=1e-10)
    # filter normalisation: every filter of d has the norm of the weights' filter, biases zero
    from landscape.sharpness.average_case import filter_normalized_direction

    model, batches, obj = mlp_problem()
    d = obj.unflatten(filter_normalized_direction(obj, obj.flat_params(), torch.Generator().manual_seed(0)))
    for name, t in model.named_parameters():
        if t.dim() == 2:
            assert torch.allclose(d[name].norm(dim=1), t.detach().norm(dim=1), rtol=1e-12)
        else:
            assert torch.count_nonzero(d[name]) == 0
    r = sharpness(obj, "directional", directions=5, radius=0.1)
    assert len(r.extra["rises"]) == 5 and r.extra["max"] >= r.value


def test_perturbation_robustness_curve():
    p = 4
    A, b, w = spd(p, 27), rand(p, 28), rand(p, 29)
    obj = quad(A, b, w)
    g = A @ w + b
    gh = g / g.norm()
    alphas = [0.1, 0.5, 1.0]
    r = sharpness(obj, "perturbation_robustness", alphas=alphas, noise_samples=3)
    expected = [float(a * g.norm() + 0.5 * a**2 * gh @ A @ gh) for a in alphas]
    assert np.allclose(np.array(r.extra["adversarial_loss"]) - r.extra["loss"], expected, rtol=1e-10)
    assert r.value == pytest.approx(float(np.mean(expected)), rel=1e-10)
    assert len(r.extra["noise_loss"]) == 3
    # accuracy curve on a classifier
    obj, net, loss_at = logistic_problem()
    r = sharpness(obj, "perturbation_robustness", alphas=[0.0, 2.0])
    x = torch.cat([bb[0] for bb in obj._data])
    y = torch.cat([bb[1] for bb in obj._data])
    w0 = net.lin.weight.detach().reshape(-1)
    gr = torch.func.grad(lambda W: loss_at(W))(w0)
    w2 = w0 + 2.0 * gr / gr.norm()
    acc = float((((x @ w2) > 0).to(F64) == y).to(F64).mean())
    assert r.extra["adversarial_accuracy"][1] == pytest.approx(acc)
    assert r.extra["adversarial_accuracy"][0] == pytest.approx(r.extra["accuracy"])


# --------------------------------------------------------------------------------------------
# API: results, report, errors, model safety
# --------------------------------------------------------------------------------------------
def test_every_measure_runs_and_records_config(tmp_path):
    model, batches, obj = mlp_problem("relu", n=16)
    fast = {
        "pacbayes_flatness": {"steps": 3, "samples": 2, "criterion": "loss"},
        "sharpness_flatness": {"steps": 3, "iterations": 2, "criterion": "loss"},
        "average_case": {"samples": 4},
        "fisher_trace": {"kind": "mc", "samples": 2},
        "hessian_trace": {"max_matvecs": 20},
        "ggn_trace": {"max_matvecs": 20},
        "directional": {"directions": 3},
        "perturbation_robustness": {"alphas": [0.5], "noise_samples": 2},
        "worst_case": {"iterations": 3},
        "fisher_worst_case": {"iterations": 3},
    }
    report = sharpness_report(obj, [(m, fast.get(m, {})) for m in MEASURES])
    assert [r.measure for r in report.rows] == list(MEASURES)
    for r in report.rows:
        assert isinstance(r, SharpnessResult) and math.isfinite(r.value) and r.seconds >= 0
        assert r.config["objective"]["num_params"] == obj.num_params and "bn_policy" in r.config
        assert sum(r.evaluations.values()) > 0
    text = str(report)
    assert all(m in text for m in MEASURES)
    report.to_json(tmp_path / "r.json")
    csv_text = report.to_csv(tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text() == csv_text and csv_text.count("\n") == len(MEASURES) + 1
    loaded = ls.load_result(tmp_path / "r.json")
    assert loaded.rows[5].measure == "worst_case" and loaded.rows[5].value == report.rows[5].value
    assert report["worst_case"] is report.rows[5]


def test_bad_input_raises_clear_errors():
    model, batches, obj = mlp_problem()
    with pytest.raises(ValueError, match="unknown measure"):
        sharpness(obj, "worst")
    with pytest.raises(TypeError, match="unknown option"):
        sharpness(obj, "worst_case", radius=0.1)
    with pytest.raises(ValueError, match="p must be 2 or inf"):
        sharpness(obj, "worst_case", p=1)
    with pytest.raises(ValueError, match="rho"):
        sharpness(obj, "average_case", rho=-1.0)
    with pytest.raises(TypeError, match="Objective"):
        sharpness(model, "worst_case")
    with pytest.raises(ValueError, match="deterministic"):
        sharpness(obj, "gradient_norm").ci()
    with pytest.raises(ValueError, match="even"):
        sharpness(obj, "pacbayes_flatness", samples=3)


def _snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [m.training for m in model.modules()],
    )


def _assert_same(model, snap):
    state, grads, modes = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for p, g in zip(model.parameters(), grads):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)
    assert [m.training for m in model.modules()] == modes


def test_model_bit_identical_after_calls_and_after_raising():
    from tests.references import make_cnn_bn

    model = make_cnn_bn()
    x, y = make_classification_data(12, image=True)
    model.train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    snap = _snapshot(model)
    obj = Objective(model, nn.CrossEntropyLoss(), [(x[:6], y[:6]), (x[6:], y[6:])], mode="train")
    for name, opts in [
        ("worst_case", {"iterations": 3, "adaptive": True, "eta": 0.01}),
        ("average_case", {"samples": 3}),
        ("keskar", {"iterations": 2}),
        ("fisher_worst_case", {"solver": "one_step"}),
        ("tracer", {"batch_size": 4}),
    ]:
        sharpness(obj, name, **opts)
        _assert_same(model, snap)

    calls = {"n": 0}

    def flaky(out, y):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("boom")
        return nn.functional.cross_entropy(out, y)

    bad = Objective(model, flaky, [(x, y)], mode="train")
    with pytest.raises(RuntimeError, match="boom"):
        sharpness(bad, "worst_case", iterations=10)
    _assert_same(model, snap)


def test_float32_objective_and_devices(devices):
    model, batches, _ = mlp_problem()
    ref = sharpness(
        Objective(model, nn.CrossEntropyLoss(), batches), "worst_case", rho=0.05, solver="one_step"
    )
    for device in devices:
        obj = Objective(model, nn.CrossEntropyLoss(), batches, dtype=torch.float32, device=device)
        r = sharpness(obj, "worst_case", rho=0.05, solver="one_step")
        assert r.value == pytest.approx(ref.value, rel=1e-4)
        assert r.config["objective"]["dtype"] == "float32"
        avg = sharpness(obj, "average_case", rho=1e-2, samples=4, seed=0)
        avg64 = sharpness(
            Objective(model, nn.CrossEntropyLoss(), batches), "average_case", rho=1e-2, samples=4, seed=0
        )
        assert avg.value == pytest.approx(avg64.value, rel=1e-2, abs=1e-6)
