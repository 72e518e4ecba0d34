"""Hutch++'s reported standard error (``landscape.trace(method="hutchpp")``) is the actual spread of
its estimates: over 1000 seeds on dense float64 matrices whose trace is known in closed form,

* the 95 % interval ``value +- t_{0.975, dof} * stderr`` (Student-t quantile from SciPy, not from
  ``landscape``) covers the true trace in 92.5-97.5 % of the runs (binomial sd at 1000 runs: 0.7 %;
  measured 94.7-94.8 %);
* ``sqrt(mean stderr^2) / sqrt(mean (value - trace)^2)`` lies in [0.85, 1.15] (measured 0.97-1.02).
  The root mean square, not the mean, of the stderr: ``E[stderr^2]`` is the variance of the estimate
  (given the sketch the remainder forms are i.i.d., and the sketch adds no variance, see
  ``landscape/curvature/trace.py``), while the mean stderr is biased low by Jensen's inequality.

A stderr reported twice (or half) too large gives a coverage of 99.8-100 % (67-70 %) and a ratio of
1.9-2.1 (0.48-0.51): both bands exclude it, which the test checks on the same runs.  The estimates are
unbiased too: the mean error within 4 standard errors of zero."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import landscape as ls

P = 200  # matrix size
BUDGET = 60  # sketch of 20 (40 products), then 20 remainder samples: dof 19
RUNS = 1000


def _matrix_with_spectrum(eigs: torch.Tensor, seed: int) -> torch.Tensor:
    """``Q diag(eigs) Q^T`` with ``Q`` a random orthogonal matrix (QR of a Gaussian), float64."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(eigs), len(eigs), generator=g, dtype=torch.float64))
    return (Q * eigs) @ Q.T


def _spectrum(name: str) -> tuple[torch.Tensor, float]:
    """Eigenvalues and their sum in closed form."""
    i = torch.arange(P, dtype=torch.float64)
    if name == "flat":  # 1 + i/P, i = 0..P-1: uniform in [1, 2), the case Hutch++ helps least
        return 1.0 + i / P, P + (P - 1) / 2
    r = 0.97  # geometric decay: the low-rank sketch takes most of the trace
    return r**i, (1 - r**P) / (1 - r)


@pytest.mark.parametrize("spectrum", ["flat", "geometric"])
def test_hutchpp_stderr_is_the_spread_of_its_estimates(spectrum, one_thread):
    eigs, exact = _spectrum(spectrum)
    A = _matrix_with_spectrum(eigs, seed=0)
    assert float(torch.trace(A)) == pytest.approx(exact, rel=1e-12)  # the matrix has that trace
    se, err = np.empty(RUNS), np.empty(RUNS)
    for seed in range(RUNS):
        r = ls.trace(A, method="hutchpp", rtol=0.0, max_matvecs=BUDGET, seed=seed)
        assert r.method == "hutchpp" and r.matvecs == BUDGET and r.dof == 19 and len(r.samples) == 20
        se[seed], err[seed] = r.stderr, r.value - exact
    q = stats.t.ppf(0.975, 19)

    def coverage(factor: float) -> float:
        return float(np.mean(np.abs(err) <= q * factor * se))

    def ratio(factor: float) -> float:
        return factor * math.sqrt(np.mean(se**2)) / math.sqrt(np.mean(err**2))

    assert 0.925 <= coverage(1.0) <= 0.975, coverage(1.0)
    assert 0.85 <= ratio(1.0) <= 1.15, ratio(1.0)
    assert abs(err.mean()) <= 4 * err.std(ddof=1) / math.sqrt(RUNS)
    # the test can fail: a stderr twice or half the right one is outside both bands
    for factor in (2.0, 0.5):
        assert not 0.925 <= coverage(factor) <= 0.975, (factor, coverage(factor))
        assert not 0.85 <= ratio(factor) <= 1.15, (factor, ratio(factor))
