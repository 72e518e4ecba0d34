"""Basins of attraction of gradient flow (toy_problems._flow_basins) and the VSAM Fig. 1 statistic
built on them: a closed-form check, independence of the drawing grid, convergence in the number of
starts, and the minima marked on the panels."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import toy_problems._flow_basins as fb
from toy_problems.figures import vsam
from toy_problems.gaussian_mixture import GaussianMixture
from toy_problems.smoothing import gaussian_smoothed_even, worst_case_ball, worst_case_circle

A_TILT = 0.5
BOX = ((-2.0, 2.0), (-1.0, 1.0))


def _saddle_x() -> float:
    """``g(x) = (x^2 - 1)^2 + a x``: the middle root of ``g'(x) = 4x^3 - 4x + a`` (its local max)."""
    roots = np.sort(np.roots([4.0, 0.0, -4.0, A_TILT]).real)
    return float(roots[1])


def _double_well(kinked: bool) -> fb.Objective:
    """``f(x, y) = g(x) + y^2/2`` (smooth) or ``g(x) + |y|`` (a kink along ``y = 0``). Both separate,
    so the flow's x-motion follows ``g`` alone and the basins split exactly at ``x = x_s``."""

    def value(t):
        x, y = t[..., 0], t[..., 1]
        return (x * x - 1) ** 2 + A_TILT * x + (y.abs() if kinked else 0.5 * y * y)

    def grad(t):
        x, y = t[..., 0], t[..., 1]
        return torch.stack([4 * x**3 - 4 * x + A_TILT, torch.sign(y) if kinked else y], -1)

    return fb.Objective(value, grad if kinked else None, smooth=not kinked)


@pytest.mark.parametrize("kinked", [False, True])
def test_double_well_share_matches_the_closed_form(kinked):
    obj = _double_well(kinked)
    xs = _saddle_x()
    minima, rejected = fb.find_minima(obj, fb.grid_starts(BOX, 6, 3))
    assert len(minima) == 2 and not rejected
    left = min(range(2), key=lambda k: minima[k]["theta"][0])
    roots = np.sort(np.roots([4.0, 0.0, -4.0, A_TILT]).real)
    assert minima[left]["theta"][0] == pytest.approx(roots[0], abs=1e-4)
    assert abs(minima[left]["theta"][1]) < 1e-4
    if not kinked:
        assert min(minima[left]["hessian_eigenvalues"]) > 0
    S = fb.basin_shares(obj, minima, fb.uniform_starts(BOX, 2000, 0), step=0.05, n_steps=400)
    assert S["unresolved"] == 0
    exact = (xs - BOX[0][0]) / (BOX[0][1] - BOX[0][0])  # x_s = -0.126...: share 0.468...
    lo, hi = S["shares"][left]["wilson95"]
    assert lo <= exact <= hi, (exact, S["shares"][left])
    assert S["shares"][left]["se"] == pytest.approx(math.sqrt(exact * (1 - exact) / 2000), rel=0.05)


def test_wilson_interval_and_agreement():
    lo, hi = fb.wilson_interval(40, 100)
    assert lo == pytest.approx(0.3094, abs=1e-4) and hi == pytest.approx(0.4980, abs=1e-4)
    assert fb.wilson_interval(0, 50)[0] == 0.0
    a = {"share": 0.40, "se": 0.015}
    assert fb.agree(a, {"share": 0.43, "se": 0.008}) and not fb.agree(a, {"share": 0.45, "se": 0.008})


def test_accurate_panel_objectives():
    prob = GaussianMixture()
    pts = torch.tensor([[-15.0, 8.5], [-14.0, 16.0], [20.0, 30.0], [0.0, 22.0]], dtype=torch.float64)
    # B: the split rule agrees with itself at twice the nodes; C: never below a dense search
    fine = gaussian_smoothed_even(prob, pts, 8.0, n_quad=16, n_far=64, n_near=24)
    assert float((gaussian_smoothed_even(prob, pts, 8.0) - fine).abs().max()) < 1e-6
    dense = worst_case_ball(prob, pts, 8.0, n_radii=8, n_angles=4096)
    d = worst_case_circle(prob, pts, 8.0)[0] - dense
    assert float(d.min()) >= -1e-12 and float(d.max()) < 1e-4


# ------------------------------------------------------------------------------------------------
# the VSAM Fig. 1 statistic
# ------------------------------------------------------------------------------------------------
SMALL = (40, 80)


@pytest.fixture(scope="module")
def two_figures(tmp_path_factory):
    """The figure at two drawing resolutions with the same (small) numbers of starts."""
    out = {}
    for res in (24, 40):
        d = tmp_path_factory.mktemp(f"vsam{res}")
        out[res] = vsam.vsam_fig1(d, res, n_starts=SMALL)
    return out


def test_statistic_does_not_depend_on_the_drawing_grid(two_figures):
    a, b = two_figures[24], two_figures[40]
    assert a["resolution"] == 24 and b["resolution"] == 40
    for k in "ABC":
        assert a["panels"][k]["sharp"] == b["panels"][k]["sharp"], k
        assert a["panels"][k]["minima"] == b["panels"][k]["minima"], k
        assert [r["n_starts"] for r in a["panels"][k]["runs"]] == list(SMALL)
        assert "gradient flow" in a["panels"][k]["method"]
    assert a["panels"]["A"]["on_band_sigma_gt_rho"] == b["panels"]["A"]["on_band_sigma_gt_rho"]


def test_statistic_agrees_at_two_numbers_of_starts(two_figures):
    for k in "ABC":
        p = two_figures[24]["panels"][k]
        r1, r2 = p["runs"]
        assert p["agree"] and fb.agree(r1["sharp"], r2["sharp"]), k
        assert r1["unresolved"] == r2["unresolved"] == 0
        lo, hi = r2["sharp"]["wilson95"]
        assert lo <= r2["sharp"]["share"] <= hi


def test_panel_b_minima_are_true_minima(two_figures):
    minima = two_figures[24]["panels"]["B"]["minima"]
    assert sorted(m["label"] for m in minima) == ["flat", "sharp"]  # one minimum per basin
    obj = vsam.vsam_objectives()["B"]
    for m in minima:
        th = torch.tensor([m["theta"]], dtype=torch.float64)
        assert float(obj.gradient(th).norm()) < 1e-8
        # Hessian by central differences of the autograd gradient at a step (1e-2) other than the
        # code's (1e-3): positive definite
        eig = torch.linalg.eigvalsh(obj.hessian(th, delta=1e-2)[0])
        assert float(eig.min()) > 1e-5
        assert eig.numpy() == pytest.approx(m["hessian_eigenvalues"], rel=1e-4)
    for m, n in itertools.combinations(minima, 2):
        assert math.dist(m["theta"], n["theta"]) > 1.0


def test_vsam_fig1_claims_by_gradient_flow(two_figures):
    P = two_figures[24]["panels"]
    # A: the sharp minimum is the deeper one; B removes most of its depth advantage; in C (the worst
    # case) the sharp minimum becomes the higher one
    assert P["A"]["sharp_minus_flat"] < -0.05
    assert P["A"]["sharp_minus_flat"] + 0.05 < P["B"]["sharp_minus_flat"] < 0.01
    assert P["C"]["sharp_minus_flat"] > 0
    for k in "ABC":
        assert not P[k]["same_basin"] and len(P[k]["minima"]) == 2
    assert [m["label"] for m in P["C"]["minima"]].count("sharp") == 1
    assert P["D"]["minima"] == [] and P["D"]["descent_end_points"]
    assert vsam.panel_region("B") == ((-40.0, 40.0), (8.0, 50.0))


def test_reproductions_page_quotes_the_committed_figure_numbers():
    root = Path(__file__).resolve().parents[1]
    v = json.loads((root / "docs" / "figures" / "vsam_fig1.json").read_text())
    assert v["resolution"] == 200 and v["n_starts"] == list(vsam.VSAM_STARTS)  # the CLI's defaults
    page = (root / "docs" / "reproductions.md").read_text()
    bullet = page[page.index("- VSAM Fig. 1:") :]
    text = " ".join(bullet[: bullet.index("\n- ")].split())
    P = v["panels"]
    for s in (P["A"]["sharp"], P["A"]["on_band_sigma_gt_rho"]["sharp"], P["B"]["sharp"], P["C"]["sharp"]):
        assert vsam._pct(s) in text, vsam._pct(s)
    for k in "ABC":
        assert P[k]["agree"] and f"{P[k]['sharp_minus_flat']:+.3f}".replace("-", "−") in text
