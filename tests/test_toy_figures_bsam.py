"""bSAM Figs. 1, 2, 5, 7 (toy_problems.relaxed_bayes, figures.bsam_relaxation, figures.bsam) against
closed forms, scipy quadrature and convex duality."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import integrate

from toy_problems.logistic import LogisticRegression
from toy_problems.relaxed_bayes import (
    BumpLoss1D,
    gaussian_expectation_1d,
    max_loss_1d,
    relaxed_bayes_fixed_point,
    relaxed_expected_loss,
)

TH = np.linspace(-8, 8, 801)


def test_quadratic_expected_max_and_relaxed_loss_match_closed_forms():
    a, b = 1.5, -0.7
    loss = lambda t: 0.5 * a * t * t + b * t  # noqa: E731
    m, s, rho = np.array([-1.3, 0.2, 2.0]), 0.6, 0.4
    np.testing.assert_allclose(gaussian_expectation_1d(loss, m, s), loss(m) + a * s * s / 2, rtol=1e-12)
    # convex: the ball's maximum is at the end farther from the vertex -b/a
    np.testing.assert_allclose(
        max_loss_1d(loss, m, rho), np.maximum(loss(m - rho), loss(m + rho)), rtol=1e-14
    )
    # f(mu) is linear in mu for a quadratic loss, so f** = f: -f** = loss(m) + a s^2 / 2
    for mi in m:
        r = relaxed_expected_loss(TH, loss(TH), mi, s * s)
        assert r.value == pytest.approx(loss(mi) + a * s * s / 2, abs=1e-7)
        # gradient of -f** = E[loss] = a mu2 / 2 + b mu1: (b, a / 2)
        assert r.grad_mean[0] == pytest.approx(b, abs=1e-6) and r.grad_second[0, 0] == pytest.approx(
            a / 2, abs=1e-6
        )


def test_bump_loss_expectation_matches_scipy_quad():
    L = BumpLoss1D(depths=(2.0, 0.8, 1.8))
    for m, s in [(-2.4, 0.1), (0.3, 0.5), (1.7, 1.2)]:
        dens = lambda t, m=m, s=s: (
            L(t) * math.exp(-((t - m) ** 2) / (2 * s * s)) / math.sqrt(2 * math.pi * s * s)
        )  # noqa: E731
        ref = integrate.quad(dens, m - 12 * s, m + 12 * s, points=[-2.5, 0.0, 2.5], limit=200, epsabs=1e-13)[
            0
        ]
        assert float(L.expected(m, s)) == pytest.approx(ref, abs=1e-8)


def test_biconjugate_of_nonconvex_loss_is_a_convex_lower_bound_touching_at_sigma_zero():
    L = BumpLoss1D(depths=(2.0, 0.8, 1.8))
    lv = L(TH)
    rng = np.random.default_rng(0)
    for _ in range(6):
        m, s = rng.uniform(-3, 3), rng.uniform(0.05, 1.5)
        r = relaxed_expected_loss(TH, lv, m, s * s)
        # f** <= f  <=>  -f** >= E[loss]
        assert r.value >= float(L.expected(m, s)) - 1e-9
        # weak duality with eq. 9 at any (m', tau = 1 / (2 sigma'^2)):
        # -f** <= tau E_q[(theta - m')^2] + max_theta (loss(theta) - tau (theta - m')^2)
        for mp, tau in rng.uniform([-3, 0.1], [3, 5], size=(5, 2)):
            bound = tau * ((m - mp) ** 2 + s * s) + np.max(lv - tau * (TH - mp) ** 2)
            assert r.value <= bound + 1e-9
        # the distribution the LP returns is feasible and attains the value
        w = r.weights
        assert w.sum() == pytest.approx(1, abs=1e-9) and w @ TH == pytest.approx(m, abs=1e-9)
        assert w @ TH**2 <= m * m + s * s + 1e-9 and w @ lv == pytest.approx(r.value, abs=1e-8)
    # sigma -> 0 at grid points: -f** = loss(m) (the shape is kept at the boundary of M)
    for m in TH[[300, 400, 520]]:
        assert relaxed_expected_loss(TH, lv, m, 0.0).value == pytest.approx(float(L(m)), abs=1e-9)
    # convexity of f** in mu = (m, m^2 + s^2) along a segment
    mu_a, mu_b = np.array([-2.0, 4.0 + 0.3]), np.array([1.0, 1.0 + 1.2])
    fval = lambda mu: -relaxed_expected_loss(TH, lv, mu[0], mu[1] - mu[0] ** 2).value  # noqa: E731
    for t in (0.25, 0.5, 0.75):
        assert fval((1 - t) * mu_a + t * mu_b) <= (1 - t) * fval(mu_a) + t * fval(mu_b) + 1e-9


def test_relaxed_fixed_point_on_a_quadratic_loss_is_the_conjugate_posterior():
    H = np.array([[3.0, 0.8], [0.8, 1.5]])
    c = np.array([0.5, -0.3])
    g = np.arange(-2.5, 2.5 + 1e-9, 0.25)
    W = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    Lv = 0.5 * np.einsum("ki,ij,kj->k", W - c, H, W - c)
    prior_cov = 4.0 * np.eye(2)
    fit = relaxed_bayes_fixed_point(W, Lv, prior_cov, np.zeros(2), 0.5 * np.eye(2))
    S = np.linalg.inv(H + np.linalg.inv(prior_cov))
    np.testing.assert_allclose(fit.cov, S, atol=1e-7)
    np.testing.assert_allclose(fit.mean, S @ H @ c, atol=1e-7)
    with pytest.raises(ValueError, match="convex_loss=True"):
        relaxed_expected_loss(W, Lv, np.zeros(2), np.eye(2))


def test_exact_posterior_integrates_to_one_by_scipy():
    prob = LogisticRegression()
    post = prob.exact_posterior()
    d = post.density.double().numpy()
    xs = post.xs.double().numpy()
    assert integrate.simpson(integrate.simpson(d, x=xs, axis=1), x=xs) == pytest.approx(
        1.0, abs=5e-5
    )  # Simpson's end weights: the ring mass is 2.5e-5


@pytest.mark.slow
def test_exact_log_evidence_matches_scipy_dblquad():
    prob = LogisticRegression()
    post = prob.exact_posterior()
    # the log evidence against adaptive quadrature of the joint
    f = lambda w2, w1: math.exp(
        float(prob.log_joint(torch.tensor([w1, w2], dtype=torch.float64))) - post.log_evidence
    )  # noqa: E731
    assert integrate.dblquad(f, -4, 10, -3, 5, epsabs=1e-7)[0] == pytest.approx(
        1.0, abs=5e-4
    )  # measured 1.00015


def test_cli_writes_fig1_with_the_loss_and_the_relaxation_bound(tmp_path):
    from toy_problems.__main__ import main

    assert main(["figures", "--out", str(tmp_path), "--only", "bsam_fig1", "--resolution", "10"]) == 0
    assert (tmp_path / "bsam_fig1.png").stat().st_size > 10_000
    N = json.loads((tmp_path / "bsam_fig1.json").read_text())
    m = np.asarray(N["m"])
    p = N["settings"]["loss"]
    ref = p["slope"] * (np.sqrt(1 + m * m) - 1)
    for c, w, dep in zip(p["centers"], p["widths"], p["depths"]):
        ref = ref - dep * np.exp(-((m - c) ** 2) / (2 * w * w))
    np.testing.assert_allclose(N["loss"], ref, rtol=1e-12)
    for sl in N["slices"].values():
        assert np.all(np.asarray(sl["relaxed"]) >= np.asarray(sl["expected_loss"]) - 1e-9)
    assert N["argmin"]["loss"] == pytest.approx(-2.5, abs=0.01)  # the deepest, sharp minimum A
    assert N["slices"]["1.0"]["argmin_relaxed"] == pytest.approx(0.0, abs=0.1)  # wide minimum B


@pytest.mark.slow
def test_fig7_bounds_are_ordered_below_the_exact_log_evidence(tmp_path):
    from toy_problems.figures.bsam_relaxation import fig7_numbers

    N = fig7_numbers(40)
    logz = N["exact"]["log_evidence"]
    vi, rel = N["gaussian_vi"]["objectives"], N["relaxed"]["objectives"]
    # ELBO <= log Z; the relaxed bound is below the ELBO at the same Gaussian and at the optima
    assert -vi["bayes"] <= logz and -vi["relaxed"] <= -vi["bayes"] and -rel["relaxed"] <= -rel["bayes"]
    assert -rel["relaxed"] <= -vi["bayes"]
    assert np.all(np.diff(N["relaxed"]["history"]) <= 1e-9)
