"""Accuracy per matvec of ``eigenvalues`` (restart size, ``true_residuals``) and calibration of the
Hutch++ standard error (issue 23, item 4).

References, none of them from ``landscape``:

* exact eigenvalues: ``torch.linalg.eigvalsh`` of the explicit float64 matrices;
* hessian-eigenthings 0.x (``hessian_eigenthings/lanczos.py``) calls SciPy's ARPACK as
  ``eigsh(op, k, which="LM", maxiter=max_steps, tol=tol, ncv=min(2k, n - 1))``.  We mirror ``k``,
  ``which`` (``"LA"`` on the indefinite MLP Hessian, where "top" means algebraically largest) and
  ``ncv = min(2k, n - 1)``, and pass the *same* start vector as ours as ``v0`` (hessian-eigenthings
  draws its own).  ``maxiter``/``tol`` are replaced by the matvec budget: ARPACK runs with
  ``tol=0`` and is stopped before its ``budget + 1``-th product, and its current Ritz values (the
  ``ritz`` array of ``workl``) are read -- i.e. its best estimate from at most ``budget`` products;
  :func:`test_arpack_reference_reads_arpacks_ritz_values` checks this read-out against public
  ``eigsh`` on convergence;
* hessian-eigenthings 1.0.0a5 (the version ``benchmarks/install_peers.sh`` pins) runs an
  unrestarted Lanczos of ``max_iter`` steps with full reorthogonalisation
  (``algorithms/lanczos.py``): :func:`_plain_lanczos` below, in numpy.

Error of a top-``k`` estimate: ``max_i |theta_i - lambda_i| / |lambda_1|`` over the ``k`` largest,
both sorted descending.  Slack of "ours <= reference": a factor ``1 + 1e-6`` plus ``1e-12`` (rounding
of float64 Ritz values relative to ``|lambda_1|``).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

import landscape as ls
from landscape.curvature import eigen
from tests import references as ref

SLACK, FLOOR = 1e-6, 1e-12


@functools.cache
def _model(name: str) -> tuple[torch.Tensor, str]:
    """(matrix, ARPACK ``which``): a tanh MLP's cross-entropy Hessian (p = 430, indefinite) or a
    decaying spectrum ``exp(-i / 100)`` (n = 300, PSD)."""
    if name == "mlp":
        model = ref.make_mlp((10, 20, 10), seed=0)
        x, y = ref.make_classification_data(100, d=10, n_classes=10, seed=1)
        return ref.dense_hessian(model, torch.nn.functional.cross_entropy, [(x, y)]), "LA"
    eigs = torch.exp(-torch.arange(300, dtype=torch.float64) / 100)
    return ref.matrix_with_spectrum(eigs, seed=0), "LM"


def _ours_which(which: str) -> str:
    return {"LA": "largest", "LM": "largest_magnitude"}[which]


def _v0(p: int, seed: int) -> torch.Tensor:
    return torch.randn(p, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _err(vals, exact: np.ndarray, k: int) -> float:
    top = np.sort(np.asarray(vals, dtype=np.float64))[::-1][:k]
    return float(np.max(np.abs(top - exact[:k])) / abs(exact[0]))


def _plain_lanczos(A: np.ndarray, v: np.ndarray, steps: int) -> np.ndarray:
    """Unrestarted Lanczos, full reorthogonalisation (twice), Ritz values descending."""
    p = A.shape[0]
    V = np.zeros((p, steps + 1))
    alpha, beta = np.zeros(steps), np.zeros(steps)
    V[:, 0] = v / np.linalg.norm(v)
    for j in range(steps):
        w = A @ V[:, j]
        alpha[j] = V[:, j] @ w
        for _ in range(2):
            w = w - V[:, : j + 1] @ (V[:, : j + 1].T @ w)
        beta[j] = np.linalg.norm(w)
        V[:, j + 1] = w / beta[j]
    T = np.diag(alpha) + np.diag(beta[:-1], 1) + np.diag(beta[:-1], -1)
    return np.linalg.eigvalsh(T)[::-1]


class _Stop(Exception):
    pass


def _arpack_at_budget(A: np.ndarray, k: int, v0: np.ndarray, budget: int, which: str, ncv: int):
    """ARPACK's top-``k`` Ritz values after at most ``budget`` products (see the module docstring)."""
    arpack = pytest.importorskip("scipy.sparse.linalg._eigen.arpack.arpack")
    state = {"count": 0, "ritz": None}

    def matvec(x):
        ptr = int(P.ipntr[5])  # 0-based offset of the ncv Ritz values in workl (0 before the first)
        state["ritz"] = P.workl[ptr : ptr + P.ncv].copy() if ptr > 0 else None
        if state["count"] == budget:
            raise _Stop
        state["count"] += 1
        return A @ x

    P = arpack._SymmetricArpackParams(
        A.shape[0], k, "d", matvec, mode=1, which=which, ncv=ncv, v0=v0, maxiter=10**6, tol=0
    )
    try:
        while not P.converged:
            P.iterate()
        return np.sort(P.extract(False))[::-1], state["count"]
    except _Stop:
        r = state["ritz"]
        if r is None:  # not even one Lanczos factorisation of ncv vectors: no estimate
            return np.zeros(k), budget
        key = -np.abs(r) if which == "LM" else -r
        return np.sort(r[np.argsort(key)[:k]])[::-1], budget


def test_arpack_reference_reads_arpacks_ritz_values():
    from scipy.sparse.linalg import eigsh

    A, which = _model("decay")
    An, v0 = A.numpy(), _v0(300, 0).numpy()
    for k in (1, 5):
        ncv = min(2 * k, 299)
        public = np.sort(eigsh(An, k=k, which=which, ncv=ncv, v0=v0, tol=0, maxiter=10**6)[0])[::-1]
        ours_read, used = _arpack_at_budget(An, k, v0, 10**6, which, ncv)
        assert np.allclose(ours_read, public, rtol=1e-12, atol=0)
        # one product short of convergence, the Ritz values read are ARPACK's (nearly converged) ones
        near, _ = _arpack_at_budget(An, k, v0, used - 1, which, ncv)
        assert np.allclose(near, public, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["mlp", "decay"])
@pytest.mark.parametrize("budget", [30, 60])
@pytest.mark.parametrize("k", [1, 5])
def test_budget_lanczos_beats_arpack_and_equals_unrestarted_lanczos(name, budget, k):
    A, which = _model(name)
    An, p = A.numpy(), A.shape[0]
    exact = np.linalg.eigvalsh(An)[::-1]
    for seed in range(5):
        v0 = _v0(p, seed)
        r = ls.eigenvalues(A, k=k, which=_ours_which(which), tol=1e-15, max_matvecs=budget, v0=v0)
        assert r.matvecs <= budget and r.config["ncv"] == budget and r.config["ncv_rule"] == "budget"
        assert r.restarts == 0
        ours = _err(r.values.numpy(), exact, k)
        arp, used = _arpack_at_budget(An, k, v0.numpy(), budget, which, min(2 * k, p - 1))
        assert used <= budget
        assert ours <= _err(arp, exact, k) * (1 + SLACK) + FLOOR
        # no restart within the budget: the Ritz values of the budget-step Krylov space
        plain = _plain_lanczos(An, v0.numpy(), budget)[:k]
        assert np.max(np.abs(np.sort(r.values.numpy())[::-1] - plain)) <= 1e-10 * abs(exact[0])


def test_restarting_at_the_old_ncv_loses_accuracy():
    # the fixed ncv = 20 of earlier versions restarts twice within 60 products: ~4x the error
    A, which = _model("decay")
    exact = np.linalg.eigvalsh(A.numpy())[::-1]
    new, old = [], []
    for seed in range(5):
        kw = dict(k=5, which=_ours_which(which), tol=1e-15, max_matvecs=60, v0=_v0(300, seed))
        new.append(_err(ls.eigenvalues(A, **kw).values.numpy(), exact, 5))
        r20 = ls.eigenvalues(A, ncv=20, **kw)
        assert r20.restarts >= 2 and r20.config["ncv_rule"] == "given"
        old.append(_err(r20.values.numpy(), exact, 5))
    assert np.mean(old) > 2.0 * np.mean(new)


def test_ncv_caps_memory_and_dimension(monkeypatch):
    A, _ = _model("decay")
    exact = torch.linalg.eigvalsh(A).flip(0)[:3]
    # a 64 KiB cap on the basis (8 p (ncv + b) bytes, p = 300): 26 vectors fit -> floor 20 wins
    monkeypatch.setattr(eigen, "NCV_MAX_BYTES", 2**16)
    r = ls.eigenvalues(A, k=3, tol=1e-10, max_matvecs=300)
    assert r.config["ncv"] == 26 and r.restarts >= 1 and r.all_converged
    monkeypatch.setattr(eigen, "NCV_MAX_BYTES", 2**10)
    r = ls.eigenvalues(A, k=3, tol=1e-10, max_matvecs=300)
    assert r.config["ncv"] == 20 and r.all_converged  # never below max(2k + 10, 20)
    assert torch.allclose(r.values, exact, rtol=1e-9, atol=0)
    monkeypatch.undo()
    # p = 60 < budget: ncv = p - 2, still Lanczos (no p-product dense solve), exact after p - 2 steps
    B = ref.matrix_with_spectrum(torch.linspace(1.0, 3.0, 60, dtype=torch.float64), seed=5)
    r = ls.eigenvalues(B, k=2, tol=1e-10, max_matvecs=300)
    assert r.method == "lanczos" and r.config["ncv"] == 58 and r.all_converged
    assert torch.allclose(r.values, torch.linalg.eigvalsh(B).flip(0)[:2], rtol=1e-10, atol=0)


@pytest.mark.parametrize("name", ["mlp", "decay"])
def test_true_residuals_cost_nothing_at_small_budgets(name):
    A, which = _model(name)
    An, p = A.numpy(), A.shape[0]
    exact = np.linalg.eigvalsh(An)[::-1]
    for seed in range(5):
        kw = dict(k=5, which=_ours_which(which), tol=1e-15, v0=_v0(p, seed))
        # 10 < 3k: no product held back (holding 5 back would be a 5-step Lanczos: top-5 error 0.9-1.4)
        held = ls.eigenvalues(A, max_matvecs=10, true_residuals=True, **kw)
        free = ls.eigenvalues(A, max_matvecs=10, **kw)
        assert held.config["true_residuals_reserved"] is False and held.config["residuals"] == "recurrence"
        assert torch.equal(held.values, free.values) and held.matvecs == 10
        assert _err(held.values.numpy(), exact, 1) <= _err(free.values.numpy(), exact, 1)
        five = _plain_lanczos(An, _v0(p, seed).numpy(), 5)
        assert _err(five, exact, 1) > 1.5 * _err(held.values.numpy(), exact, 1)
        assert _err(five, exact, 5) > 1.5 * _err(held.values.numpy(), exact, 5)
        # 15 = 3k: k products are held back and the residuals are true ones, of a 10-step Lanczos
        r = ls.eigenvalues(A, max_matvecs=15, true_residuals=True, **kw)
        assert r.config["true_residuals_reserved"] is True and r.config["residuals"] == "true"
        assert r.matvecs == 15
        plain10 = _plain_lanczos(An, _v0(p, seed).numpy(), 10)[:5]
        assert np.max(np.abs(np.sort(r.values.numpy())[::-1] - plain10)) <= 1e-10 * abs(exact[0])
        res = torch.linalg.vector_norm(A @ r.vectors - r.vectors * r.values, dim=0)
        assert torch.allclose(res, r.residuals, rtol=1e-8, atol=1e-14)


def _flat() -> torch.Tensor:
    eigs = 1.0 + torch.rand(200, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    return ref.matrix_with_spectrum(eigs, seed=3)  # eigenvalues uniform in [1, 2]


def _decaying() -> torch.Tensor:
    return ref.matrix_with_spectrum(torch.arange(1, 301, dtype=torch.float64) ** -2.0, seed=4)


@pytest.mark.parametrize("spectrum", ["flat", "decaying"])
@pytest.mark.parametrize("budget", [30, 60])
def test_hutchpp_stderr_is_calibrated(spectrum, budget):
    """``sqrt(mean se^2) / sqrt(mean error^2)`` over 50 seeds within [0.8, 1.5] (measured: flat
    0.96 / 1.12, decaying 1.23 / 0.93 at 30 / 60 products; the former bound ``2 ||B||_F^2`` gave
    about 3x on the flat spectrum)."""
    A = _flat() if spectrum == "flat" else _decaying()
    exact = float(torch.trace(A))
    se, err = [], []
    for seed in range(50):
        r = ls.trace(A, method="hutchpp", rtol=1e-12, max_matvecs=budget, seed=seed)
        x = np.asarray(r.samples)
        assert r.matvecs == budget and r.dof == x.size - 1
        # the reported error bar is the remainder samples' sample standard deviation over sqrt(n)
        assert math.isclose(r.stderr, x.std(ddof=1) / math.sqrt(x.size), rel_tol=1e-12)
        se.append(r.stderr)
        err.append(r.value - exact)
    ratio = math.sqrt(np.mean(np.square(se))) / math.sqrt(np.mean(np.square(err)))
    assert 0.8 <= ratio <= 1.5, ratio
