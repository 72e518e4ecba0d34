"""Trajectory runner, smoothing and the papers' toy claims, asserted numerically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import toy_problems as tp
from toy_problems import figures
from toy_problems.figures import fisher_sam, vsam

optimizers = pytest.importorskip("optimizers")


# ------------------------------------------------------------------------------------------------
# run_trajectory
# ------------------------------------------------------------------------------------------------
def test_trajectory_sgd_matches_hand_computed_steps():
    prob = tp.get("ill_conditioned_quadratic", condition_number=10.0)
    tr = tp.run_trajectory(prob, lambda p: torch.optim.SGD(p, lr=0.05), (1.0, 1.0), 5)
    # x_{k+1} = (1 - lr * lambda) x_k per axis
    k = np.arange(6)
    np.testing.assert_allclose(tr.path.numpy(), np.stack([0.95**k, 0.5**k], -1), rtol=1e-12)
    np.testing.assert_allclose(tr.losses.numpy(), 0.5 * (0.95 ** (2 * k) + 10 * 0.5 ** (2 * k)), rtol=1e-12)
    assert tr.perturbations.shape == (5, 2) and float(tr.perturbations.abs().max()) == 0.0
    assert not tr.diverged and tr.steps == 5


def test_trajectory_records_the_sam_probe():
    prob = tp.get("rosenbrock")
    rho, lr = 0.1, 1e-3
    tr = tp.run_trajectory(prob, lambda p: optimizers.SAM(p, torch.optim.SGD, rho=rho, lr=lr), (-1.0, 2.0), 3)
    # by hand: eps = rho g/||g||, w <- w - lr grad L(w + eps)
    w = torch.tensor([-1.0, 2.0], dtype=torch.float64)
    for t in range(3):
        g = tp.gradient(prob, w)
        eps = rho * g / (g.norm() + 1e-12)
        np.testing.assert_allclose(tr.perturbations[t].numpy(), eps.numpy(), rtol=1e-10)
        w = w - lr * tp.gradient(prob, w + eps)
        np.testing.assert_allclose(tr.path[t + 1].numpy(), w.numpy(), rtol=1e-10)
    assert tr.evaluations[0].shape == (2, 2)


def test_trajectory_divergence_is_a_flag_not_an_exception():
    prob = tp.get("ill_conditioned_quadratic", condition_number=100.0)
    tr = tp.run_trajectory(prob, lambda p: torch.optim.SGD(p, lr=1.0), (1.0, 1.0), 500)
    assert tr.diverged and "non-finite" in tr.message and tr.steps < 500
    assert tr.path.shape == (tr.steps + 1, 2) and bool(torch.isfinite(tr.path).all())
    # leaving sigma > 0 on the Gaussian mixture also stops with a message
    gm = tp.get("gaussian_mixture")
    tr = tp.run_trajectory(gm, lambda p: torch.optim.SGD(p, lr=1e4), (-30.0, 3.0), 50)
    assert tr.diverged and "sigma > 0" in tr.message
    with pytest.raises(ValueError, match="sigma > 0"):
        tp.run_trajectory(gm, lambda p: torch.optim.SGD(p, lr=1.0), (0.0, -1.0), 5)
    with pytest.raises(ValueError, match="steps"):
        tp.run_trajectory(gm, lambda p: torch.optim.SGD(p, lr=1.0), (0.0, 1.0), -1)


# ------------------------------------------------------------------------------------------------
# smoothing operators
# ------------------------------------------------------------------------------------------------
def test_smoothing_operators_on_a_quadratic_closed_forms():
    prob = tp.get("ill_conditioned_quadratic", condition_number=4.0)
    th = torch.tensor([[0.3, -0.2], [1.0, 0.5]], dtype=torch.float64)
    rho = 0.7
    L = prob.loss(th)
    # E L(theta + eps), eps ~ N(0, rho^2/2 I): L + tr(A) rho^2 / 4
    np.testing.assert_allclose(
        tp.gaussian_smoothed(prob, th, rho, n_quad=8).numpy(), (L + 5 * rho**2 / 4).numpy()
    )
    # max over the ball of a convex quadratic is on the boundary; check against a fine brute force
    a = np.linspace(0, 2 * np.pi, 20001)
    for t in th.numpy():
        pts = t + rho * np.stack([np.cos(a), np.sin(a)], -1)
        brute = (0.5 * (pts[:, 0] ** 2 + 4 * pts[:, 1] ** 2)).max()
        ours = float(tp.worst_case_ball(prob, torch.tensor(t), rho, n_radii=4, n_angles=2048))
        assert ours == pytest.approx(brute, rel=1e-5)
    g = th * torch.tensor([1.0, 4.0], dtype=torch.float64)
    probe = th + rho * g / g.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(
        tp.sam_first_order(prob, th, rho).numpy(), prob.loss(probe).numpy(), rtol=1e-10
    )


def test_gauss_hermite_smoothing_matches_monte_carlo_on_the_mixture():
    prob = tp.get("gaussian_mixture")
    th = torch.tensor([[-10.0, 25.0], [15.0, 35.0]], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    eps = torch.randn(400_000, 2, generator=gen, dtype=torch.float64) * (8.0 / math.sqrt(2))
    mc = torch.stack([prob.loss(t + eps, check=False).mean() for t in th])
    np.testing.assert_allclose(tp.gaussian_smoothed(prob, th, 8.0, n_quad=48).numpy(), mc.numpy(), rtol=3e-3)


# ------------------------------------------------------------------------------------------------
# Fisher SAM Fig. 2 / 3 and VSAM Fig. 1 claims
# ------------------------------------------------------------------------------------------------
def _run(kind: str, start, steps: int | None = None, gamma: float | None = None):
    """(basin, end point, Hessian eigenvalues at the end) of one Fig. 2/3 method; the reduced step
    count by default (``test_fsam_reduced_steps_decide_the_basin`` checks 1500 steps agree)."""
    prob = tp.get("gaussian_mixture")
    sam, fsam, asam = fisher_sam._factories(prob, gamma=gamma)
    factory = {"SAM": sam, "FSAM": fsam, "ASAM": asam}[kind][1]
    steps = figures.FSAM_SETTINGS["steps_reduced"] if steps is None else steps
    tr = tp.run_trajectory(prob, factory, start, steps)
    assert not tr.diverged, tr.message
    end = tr.path[-1]
    # the dense 2x2 Hessian of eq. 15 by double autograd (independent of the optimizers)
    h = torch.autograd.functional.hessian(lambda t: prob.loss(t), end.clone())
    return fisher_sam._basin_of(prob, end), end, torch.linalg.eigvalsh(h)


def test_fsam_fig2_claim_sam_sharp_fsam_flat():
    start = figures.FSAM_SETTINGS["fig2_start"]
    basin, end, eig = _run("SAM", start)
    assert basin == "sharp" and float(eig.min()) > 1e-4  # a minimum, not the ridge
    assert float(end[0]) < -10
    basin, end, eig = _run("FSAM", start)
    assert basin == "flat" and float(eig.min()) > 1e-4
    flat = tp.get("gaussian_mixture").minima[0]
    assert flat.label == "flat" and float((end - torch.tensor(flat.theta)).norm()) < 5


def test_fsam_fig3_claim_asam_sharp_fsam_flat_from_mu_near_zero():
    start = figures.FSAM_SETTINGS["fig3_start"]
    assert abs(start[0]) < 1
    basin, end, eig = _run("ASAM", start)
    assert basin == "sharp" and float(eig.min()) > 1e-4 and float(end[0]) < -10
    basin, end, eig = _run("FSAM", start)
    assert basin == "flat" and float(eig.min()) > 1e-4 and float(end[0]) > 15


def test_fsam_small_gamma_case_stalls_on_the_ridge():
    s = figures.FSAM_SETTINGS
    basin, end, eig = _run("FSAM", s["small_gamma_start"], gamma=s["small_gamma"])
    # between the basins (mu near 0) at a saddle of the loss: one negative Hessian eigenvalue
    assert abs(float(end[0])) < 3 and float(eig.min()) < 0 < float(eig.max())
    basin, end, eig = _run("SAM", s["small_gamma_start"], gamma=s["small_gamma"])
    assert basin == "sharp" and float(eig.min()) > 0


@pytest.mark.slow
def test_fsam_reduced_steps_decide_the_basin():
    s = figures.FSAM_SETTINGS
    for kind, start in (("SAM", s["fig2_start"]), ("FSAM", s["fig2_start"]), ("ASAM", s["fig3_start"])):
        short, _, _ = _run(kind, start)
        full, _, eig = _run(kind, start, steps=s["steps"])
        assert short == full and float(eig.min()) > 1e-4, kind


def test_vsam_panels_drawn_where_defined():
    # the VSAM Fig. 1 claims (basins of gradient flow, minima) are in test_vsam_basins.py
    P = figures.vsam_panels(24)
    band = P["ys"][:, None] > figures.VSAM_RHO
    for k in "BC":
        assert np.isfinite(P[k][np.broadcast_to(band, P[k].shape)]).all()
        assert np.isnan(P[k][np.broadcast_to(~band, P[k].shape)]).all()
    assert np.isfinite(P["A"]).all() and np.isfinite(P["D"]).all()


# ------------------------------------------------------------------------------------------------
# bSAM Fig. 3 / 5 claims (logistic regression)
# ------------------------------------------------------------------------------------------------
def test_bsam_logistic_claims():
    R = figures.logistic_results(30)
    post = R["post"]
    d = R["distances"]
    # bSAM's predictive is closer to the exact one than SAM's point prediction (TV and KL on the grid)
    assert d["bSAM"]["tv_mean"] < d["SAM"]["tv_mean"]
    assert d["bSAM"]["kl_mean"] < d["SAM"]["kl_mean"]
    # Laplace at the SAM solution is wider than the exact posterior (Fig. 5, green dashed ellipse)
    lap = R["gauss"]["SAM+Laplace"]
    assert float(torch.det(lap.cov)) > float(torch.det(post.cov))
    assert float(torch.linalg.eigvalsh(lap.cov - post.cov).max()) > 0
    # SAM's point sits farther from the origin than the MAP (the extra margin that makes it overconfident)
    assert float(R["w_sam"].norm()) > float(post.map.norm())
    # Laplace covariance is the inverse closed-form Hessian at that point
    X, y = R["prob"].data
    s = torch.sigmoid(X @ R["w_sam"])
    H = (X.T * (s * (1 - s))) @ X + torch.eye(2, dtype=torch.float64) / 100
    np.testing.assert_allclose(lap.cov.numpy(), torch.linalg.inv(H).numpy(), rtol=1e-10)


# ------------------------------------------------------------------------------------------------
# the figures command
# ------------------------------------------------------------------------------------------------
def test_figures_command_quick_subset(tmp_path):
    from toy_problems.__main__ import main

    assert (
        main(
            [
                "figures",
                "--out",
                str(tmp_path),
                "--only",
                "fsam_fig1",
                "--only",
                "vsam_fig1",
                "--resolution",
                "24",
            ]
        )
        == 0
    )
    for name in ("fsam_fig1", "vsam_fig1"):
        png = tmp_path / f"{name}.png"
        assert png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    f1 = json.loads((tmp_path / "fsam_fig1.json").read_text())
    assert f1["minima"]["sharp"]["loss"] == pytest.approx(0.27523, abs=1e-4)
    assert f1["minima"]["flat"]["hessian_trace"] == pytest.approx(0.0010074, abs=1e-6)
    assert f1["paper"]["sharp"]["loss"] == 0.49
    v = json.loads((tmp_path / "vsam_fig1.json").read_text())
    assert v["rho"] == 8.0 and "Gauss-Hermite" in v["smoothing"]
    assert v["n_starts"] == list(vsam.VSAM_STARTS_REDUCED)  # reduced mode: fewer starts
    # the worst case (C) shrinks the sharp basin of gradient flow against the loss on the same band
    assert v["panels"]["C"]["sharp"]["share"] < v["panels"]["A"]["on_band_sigma_gt_rho"]["sharp"]["share"]
    with pytest.raises(SystemExit):
        main(["figures", "--out", str(tmp_path), "--only", "nope"])


def test_fsam_end_distance_is_euclidean_to_its_basins_minimum():
    """The committed figures' ``distance_to_basin_minimum`` (docs/reproductions.md and
    docs/figures/README.md quote it) against a hand computation: the Euclidean distance from each
    run's end point to the minimum, in docs/figures/fsam_fig1.json, of the basin it flows to."""
    fig = Path(__file__).resolve().parents[1] / "docs" / "figures"
    minima = json.loads((fig / "fsam_fig1.json").read_text())["minima"]
    for name in ("fsam_fig2", "fsam_fig3", "fsam_fig2_small_gamma"):
        for run in json.loads((fig / f"{name}.json").read_text())["runs"].values():
            want = math.dist(run["end"], minima[run["basin"]]["theta"])
            assert run["distance_to_basin_minimum"] == pytest.approx(want, rel=1e-9)
    flat_end = json.loads((fig / "fsam_fig3.json").read_text())["runs"]["FSAM"]["end"]
    assert math.hypot(flat_end[0] - 19.810064, flat_end[1] - 29.936621) == pytest.approx(1.933, abs=1e-3)


@pytest.mark.slow
def test_figures_command_all_reduced(tmp_path):
    from toy_problems.__main__ import main

    assert main(["figures", "--out", str(tmp_path), "--resolution", "30"]) == 0
    for name in figures.FIGURES:
        assert (tmp_path / f"{name}.png").stat().st_size > 5000
        assert json.loads((tmp_path / f"{name}.json").read_text())["figure"] == name
    f2 = json.loads((tmp_path / "fsam_fig2.json").read_text())
    assert f2["runs"]["SAM"]["basin"] == "sharp" and f2["runs"]["FSAM"]["basin"] == "flat"
    for run in f2["runs"].values():
        assert min(run["end_hessian_eigenvalues"]) > 0
        theta = next(m.theta for m in tp.GaussianMixture().minima if m.label == run["basin"])
        assert run["distance_to_basin_minimum"] == pytest.approx(math.dist(run["end"], theta), rel=1e-9)
    f3 = json.loads((tmp_path / "fsam_fig3.json").read_text())
    assert f3["runs"]["ASAM"]["basin"] == "sharp" and f3["runs"]["FSAM"]["basin"] == "flat"
    assert f"rho = {figures.FSAM_SETTINGS['asam_rho']:g}" in f3["runs"]["ASAM"]["settings"]
    small = json.loads((tmp_path / "fsam_fig2_small_gamma.json").read_text())
    assert min(small["runs"]["FSAM"]["end_hessian_eigenvalues"]) < 0
    b3 = json.loads((tmp_path / "bsam_fig3.json").read_text())
    d = b3["predictive_distance_to_exact"]
    assert d["bSAM"]["tv_mean"] < d["SAM"]["tv_mean"]
    assert b3["posteriors"]["SAM+Laplace"]["det_cov_ratio_to_exact"] > 1
    b6 = json.loads((tmp_path / "bsam_fig6.json").read_text())
    m = b6["methods"]
    assert m["bSAM"]["mean_predictive_entropy"] > m["SAM"]["mean_predictive_entropy"]
    assert m["SAM+Laplace"]["mean_predictive_entropy"] > m["SAM"]["mean_predictive_entropy"]
