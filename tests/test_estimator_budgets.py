"""Every stochastic curvature estimator refuses, before any product, a budget it cannot use, and at
its smallest accepted budget returns a finite estimate with a finite error bar (issue 36, item 4).

References, none of them from ``landscape``: the trace of ``Q diag(eigs) Q^T`` is ``sum(eigs)``
(closed form, checked against ``torch.trace``); eigenvalues from ``torch.linalg.eigvalsh`` of the
explicit float64 matrix; a quadrature trace from the probe itself (``p v^T A v``).  At the
smallest budgets a single estimate is rough (2 to 6 products), so the estimates are checked over
400 seeds: unbiased (mean error within 4 standard errors of zero) and, for Hutchinson and Hutch++,
with an error bar that is their actual spread (``sqrt(mean stderr^2) / rms error`` in [0.75, 1.33];
measured 1.11 and 0.95); XTrace's jackknife is conservative at 3 probes (1.9), so only bounded.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import landscape as ls
from landscape.sharpness import sharpness
from tests import references as ref
from tests.sharpness_problems import mlp_problem

P = 12
EIGS = 10.0 * 2.0 ** -torch.arange(P, dtype=torch.float64)  # decaying: sketches help
EXACT = float(EIGS.sum())
SEEDS = 400


@pytest.fixture(scope="module")
def A() -> torch.Tensor:
    M = ref.matrix_with_spectrum(EIGS, seed=0)
    assert float(torch.trace(M)) == pytest.approx(EXACT, rel=1e-12)
    return M


class Counting:
    """A dense symmetric matrix as an operator that counts its products (none may run on refusal)."""

    def __init__(self, M: torch.Tensor):
        self.M, self.shape, self.dtype, self.device = M, tuple(M.shape), M.dtype, M.device
        self.calls = 0

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        self.calls += V.shape[1]
        return self.M @ V


# ------------------------------------------------------------------------------------------- trace
MIN_TRACE = [("hutchinson", {}, 2), ("auto", {}, 2), ("hutchpp", {}, 4), ("xtrace", {}, 6)]
MIN_TRACE += [("hutchpp", {"sketch": 3}, 8)]


@pytest.mark.parametrize("method, kw, smallest", MIN_TRACE)
def test_trace_below_the_smallest_budget_is_refused_before_any_product(A, method, kw, smallest):
    op = Counting(A)
    who = method if "sketch" not in kw else f"{method} with sketch={kw['sketch']}"
    msg = f"{who} needs max_matvecs >= {smallest} (got {smallest - 1}): "
    with pytest.raises(ValueError, match=re.escape(msg)):
        ls.trace(op, method=method, max_matvecs=smallest - 1, **kw)
    assert op.calls == 0
    if "sketch" in kw:  # the fix names the largest sketch the budget affords
        with pytest.raises(ValueError, match=re.escape(f"or sketch <= {(smallest - 3) // 2}")):
            ls.trace(op, method=method, max_matvecs=smallest - 1, **kw)


@pytest.mark.parametrize("method, kw, smallest", MIN_TRACE)
def test_trace_at_the_smallest_budget_is_finite_unbiased_and_has_an_error_bar(A, method, kw, smallest):
    vals, ses = np.empty(SEEDS), np.empty(SEEDS)
    for seed in range(SEEDS):
        r = ls.trace(A, method=method, max_matvecs=smallest, rtol=0.0, seed=seed, **kw)
        assert r.matvecs <= smallest and r.dof >= 1 and len(r.samples) >= 2
        assert r.method == ("hutchinson" if method == "auto" else method)
        vals[seed], ses[seed] = r.value, r.stderr
    assert np.isfinite(vals).all() and np.isfinite(ses).all() and (ses > 0).all()
    err = vals - EXACT
    assert abs(err.mean()) <= 4 * err.std(ddof=1) / math.sqrt(SEEDS)
    ratio = math.sqrt(np.mean(ses**2)) / math.sqrt(np.mean(err**2))
    if method == "xtrace":
        assert 0.75 <= ratio <= 3.0, ratio
    else:
        assert 0.75 <= ratio <= 1.33, ratio


def test_hutchpp_sketch_spanning_the_space_is_the_exact_trace(A):
    # default sketch max_matvecs // 3 = 12 = p: the exact trace with p products instead of 2p + 2
    r = ls.trace(A, method="hutchpp", max_matvecs=3 * P, rtol=0.0)
    assert r.method == "exact" and r.matvecs == P and r.stderr == 0.0 and r.converged
    assert r.value == pytest.approx(EXACT, rel=1e-12) and "spans the whole space" in r.config["exact_because"]
    r = ls.trace(A, method="hutchpp", sketch=P + 5, max_matvecs=2 * (P + 5) + 2, rtol=0.0)
    assert r.method == "exact" and r.value == pytest.approx(EXACT, rel=1e-12)
    # one column short of the space: still Hutch++, with its error bar
    r = ls.trace(A, method="hutchpp", sketch=P - 1, max_matvecs=2 * (P - 1) + 2, rtol=0.0)
    assert r.method == "hutchpp" and r.config["sketch"] == P - 1 and math.isfinite(r.stderr)
    assert abs(r.value - EXACT) <= 1e-2 * EXACT  # the remainder is one tiny direction


def test_xtrace_with_a_budget_of_3p_is_exact(A):
    r = ls.trace(A, method="xtrace", max_matvecs=3 * P, rtol=0.0, seed=1)
    assert abs(r.value - EXACT) <= 1e-10 * EXACT and r.stderr <= 1e-10 * EXACT


def test_auto_stays_within_its_budget_on_a_small_operator(A):
    op = Counting(A)
    r = ls.trace(op, max_matvecs=5, rtol=0.0)  # p = 12 <= 2 * pilot, but the exact trace costs 12
    assert r.method == "hutchinson" and r.matvecs == op.calls == 5 and math.isfinite(r.stderr)
    r = ls.trace(A, max_matvecs=P, rtol=0.0)
    assert r.method == "exact" and r.value == pytest.approx(EXACT, rel=1e-12)


def test_diagonal_smallest_samples(A):
    op = Counting(A)
    with pytest.raises(ValueError, match=re.escape("diagonal needs samples >= 2 (got 1)")):
        ls.diagonal(op, samples=1)
    assert op.calls == 0
    r = ls.diagonal(A, samples=2, seed=0)
    assert bool(torch.isfinite(r.values).all()) and bool(torch.isfinite(r.stderr).all())
    # the same two probes by hand: (z1 * A z1 + z2 * A z2) / 2
    g = torch.Generator().manual_seed(0)
    Z = 2.0 * torch.randint(0, 2, (2, P), generator=g, dtype=torch.int8).T.double() - 1.0
    assert torch.allclose(r.values, (Z * (A @ Z)).mean(1), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------- eigen
def _spiked() -> torch.Tensor:
    # p = 60 (no dense shortcut): one eigenvalue 100 above a flat bulk in [1, 2]
    eigs = torch.cat([torch.tensor([100.0]), torch.linspace(2.0, 1.0, 59)]).double()
    return ref.matrix_with_spectrum(eigs, seed=2)


def test_eigenvalues_smallest_budget():
    B = _spiked()
    exact = torch.linalg.eigvalsh(B).flip(0)
    op = Counting(B)
    msg = "eigenvalues with k=3, block_size=1 needs max_matvecs >= 4 (got 3): "
    with pytest.raises(ValueError, match=re.escape(msg)):
        ls.eigenvalues(op, k=3, max_matvecs=3)
    assert op.calls == 0
    with pytest.raises(ValueError, match=re.escape("block_size=2 needs max_matvecs >= 5 (got 4)")):
        ls.eigenvalues(op, k=3, block_size=2, max_matvecs=4)
    r = ls.eigenvalues(B, k=3, max_matvecs=4, seed=0)
    assert r.method == "lanczos" and r.matvecs <= 4 and bool(torch.isfinite(r.values).all())
    # Ritz values of a subspace lie below the eigenvalues of the same rank (Courant-Fischer) and
    # the isolated top one is found by a 4-step Lanczos
    assert bool((r.values <= exact[:3] + 1e-10).all()) and bool((r.values >= exact[-1] - 1e-10).all())
    assert float(r.values[0]) == pytest.approx(100.0, rel=1e-4)
    with pytest.raises(ValueError, match=re.escape(f"k = {P + 1} exceeds the operator dimension p = {P}")):
        ls.eigenvalues(ref.matrix_with_spectrum(EIGS, seed=0), k=P + 1)


def test_power_iteration_smallest_budget():
    B = _spiked()
    op = Counting(B)
    msg = "power_iteration with k=2 needs max_matvecs >= 2 (got 1): "
    with pytest.raises(ValueError, match=re.escape(msg)):
        ls.power_iteration(op, k=2, max_matvecs=1)
    assert op.calls == 0
    r = ls.power_iteration(B, k=2, max_matvecs=2, seed=0)
    lo, hi = float(torch.linalg.eigvalsh(B)[0]), float(torch.linalg.eigvalsh(B)[-1])
    assert r.matvecs == 2 and bool(torch.isfinite(r.values).all())
    assert all(lo - 1e-10 <= float(v) <= hi + 1e-10 for v in r.values)  # Rayleigh quotients


# ------------------------------------------------------------------------------------- density
def test_spectral_density_smallest_budget(A):
    op = Counting(A)
    with pytest.raises(ValueError, match=re.escape("spectral_density needs lanczos_steps >= 2 (got 1): ")):
        ls.spectral_density(op, runs=4, lanczos_steps=1)
    with pytest.raises(ValueError, match=re.escape("spectral_density needs runs >= 1 (got 0): ")):
        ls.spectral_density(op, runs=0)
    assert op.calls == 0
    v = torch.randn(P, 1, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    r = ls.spectral_density(A, lanczos_steps=2, probes=v)
    u = v[:, 0] / v.norm()
    assert r.trace == pytest.approx(P * float(u @ A @ u), rel=1e-12)  # the run's quadrature
    assert math.isnan(r.trace_stderr) and "one run" in r.trace_stderr_reason
    assert bool(torch.isfinite(r.density).all()) and r.matvecs == 2
    r = ls.spectral_density(A, runs=2, lanczos_steps=2, seed=0)
    assert math.isfinite(r.trace_stderr) and r.trace_stderr_reason == ""


# ----------------------------------------------------------------------------------- sharpness
def test_sharpness_traces_pass_the_estimator_rule_through():
    model, batches, obj = mlp_problem()
    with pytest.raises(ValueError, match=re.escape("hutchpp needs max_matvecs >= 4 (got 3)")):
        sharpness(obj, "hessian_trace", max_matvecs=3)
    with pytest.raises(ValueError, match=re.escape("xtrace needs max_matvecs >= 6 (got 5)")):
        sharpness(obj, "ggn_trace", method="xtrace", max_matvecs=5)
    r = sharpness(obj, "hessian_trace", max_matvecs=4, seed=0)
    assert r.extra["method_used"] == "hutchpp" and r.stderr is not None and math.isfinite(r.stderr)
    assert math.isfinite(r.value) and r.evaluations["hvp"] == 4
    # a budget whose Hutch++ sketch spans the p parameters: the exact trace, deterministic
    H = ref.dense_hessian(model, torch.nn.CrossEntropyLoss(), batches)
    r = sharpness(obj, "hessian_trace", max_matvecs=3 * obj.num_params)
    assert r.extra["method_used"] == "exact" and r.stderr is None
    assert r.value == pytest.approx(float(torch.trace(H)), rel=1e-9)


def test_a_spectral_density_grid_is_a_count_or_the_values():
    """``grid=2.0`` (a float, as a config gives it) was taken as the grid itself: one point at 2."""
    A = ref.matrix_with_spectrum(EIGS, seed=0)
    for bad in (2.0, np.float64(500.0), torch.tensor(50)):
        with pytest.raises(TypeError, match="grid must be an integer, got"):
            ls.spectral_density(A, runs=2, lanczos_steps=4, grid=bad)
    assert len(ls.spectral_density(A, runs=2, lanczos_steps=4, grid=np.int64(7)).grid) == 7
    values = [0.0, 1.0, 2.0]
    assert ls.spectral_density(A, runs=2, lanczos_steps=4, grid=values).grid.tolist() == values
