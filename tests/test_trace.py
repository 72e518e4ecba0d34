"""Trace / diagonal estimators against exact traces of dense matrices with known spectra."""

import math

import numpy as np
import pytest
import torch

import landscape as ls
from tests import references as ref

_matrix = ref.matrix_with_spectrum


def _power_law(p: int) -> torch.Tensor:
    return _matrix(torch.arange(1, p + 1, dtype=torch.float64) ** -2.0)


def _flat(p: int) -> torch.Tensor:
    return _matrix(torch.rand(p, generator=torch.Generator().manual_seed(1), dtype=torch.float64))


def test_power_law_target_auto_picks_xtrace():
    A = _power_law(1000)
    exact = float(torch.trace(A))
    errs = []
    for seed in range(4):
        r = ls.trace(A, seed=seed, max_matvecs=100)
        assert r.method == "xtrace" and r.matvecs <= 100
        errs.append(abs(r.value - exact) / exact)
        lo, hi = r.ci(0.95)
        assert lo <= exact <= hi
    assert float(np.median(errs)) <= 1e-3


def test_flat_spectrum_auto_is_hutchinson_at_equal_budget():
    A = _flat(400)
    exact = float(torch.trace(A))
    e_auto, e_h = [], []
    for seed in range(10):
        a = ls.trace(A, seed=seed, max_matvecs=60, rtol=1e-5)
        h = ls.trace(A, method="hutchinson", seed=seed, max_matvecs=60, rtol=1e-5)
        assert a.method == "hutchinson" and a.matvecs == h.matvecs == 60
        e_auto.append(abs(a.value - exact))
        e_h.append(abs(h.value - exact))
    assert np.median(e_auto) <= 1.1 * np.median(e_h)


def _coverage(A, method, repeats, max_matvecs):
    exact = float(torch.trace(A))
    hits = 0
    for seed in range(repeats):
        r = ls.trace(A, method=method, seed=seed, max_matvecs=max_matvecs, rtol=1e-6)
        lo, hi = r.ci(0.95)
        hits += lo <= exact <= hi
    return hits / repeats


@pytest.mark.parametrize(
    "method, spectrum, repeats",
    [("hutchinson", "flat", 50), ("hutchpp", "power", 50), ("auto", "power", 30)],
)
def test_confidence_intervals_cover(method, spectrum, repeats):
    A = _flat(200) if spectrum == "flat" else _power_law(300)
    assert _coverage(A, method, repeats, 40) >= 0.9


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 200 dense 1000 x 1000 estimates: ~3 min idle, far longer on a loaded machine
@pytest.mark.parametrize("method", ["hutchinson", "hutchpp", "xtrace", "auto"])
@pytest.mark.parametrize("spectrum", ["flat", "power"])
def test_confidence_intervals_cover_200_repeats(method, spectrum):
    A = _flat(1000) if spectrum == "flat" else _power_law(1000)
    assert _coverage(A, method, 200, 100) >= 0.9


def test_stops_on_the_error_bar_not_on_the_mean():
    A = _flat(300)
    exact = float(torch.trace(A))
    r = ls.trace(A, method="hutchinson", rtol=2e-2, max_matvecs=1000, seed=3)
    assert r.converged and r.matvecs < 1000
    # the stopping rule: t-quantile * stderr within rtol * |value|, and not at the previous block
    from scipy import stats

    x = np.asarray(r.samples)
    n = len(x)
    half = stats.t.ppf(0.975, n - 1) * x.std(ddof=1) / math.sqrt(n)
    assert half <= 2e-2 * abs(x.mean())
    prev = x[: n - 10]
    assert stats.t.ppf(0.975, len(prev) - 1) * prev.std(ddof=1) / math.sqrt(len(prev)) > 2e-2 * abs(
        prev.mean()
    )
    assert abs(r.value - x.mean()) < 1e-12 and abs(r.stderr - x.std(ddof=1) / math.sqrt(n)) < 1e-12
    assert abs(r.value - exact) <= 4 * r.stderr


def test_hutchpp_and_xtrace_budget_and_unbiased_pieces():
    A = _power_law(300)
    exact = float(torch.trace(A))
    pp = ls.trace(A, method="hutchpp", max_matvecs=60, rtol=1e-9, seed=0)
    assert pp.matvecs == 60 and pp.config["sketch"] == 20
    assert abs(pp.value - exact) <= 4 * pp.stderr
    assert abs(pp.value - (pp.exact_part + np.mean(pp.samples))) < 1e-12
    xt = ls.trace(A, method="xtrace", max_matvecs=60, rtol=1e-9, seed=0)
    assert xt.matvecs <= 60 and abs(xt.value - exact) <= 4 * xt.stderr
    assert abs(xt.value - np.mean(xt.samples)) < 1e-12


def test_xtrace_is_exact_when_the_sketch_spans_the_range():
    # rank-6 matrix: with >= 7 probes range(A Omega) = range(A), so every leave-one-out estimate is exact
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(100, 6, generator=g, dtype=torch.float64))[0]
    A = (U * torch.tensor([5.0, 4, 3, 2, 1, 0.5], dtype=torch.float64)) @ U.T
    A = 0.5 * (A + A.T)
    r = ls.trace(A, method="xtrace", max_matvecs=32, rtol=1e-9, seed=1)
    assert abs(r.value - 15.5) < 1e-9 and r.stderr < 1e-9


def test_real_hessian_exact_and_per_layer():
    model = ref.make_mlp((5, 8, 3), seed=2)
    x, y = ref.make_classification_data(40, d=5, seed=3)
    loss = torch.nn.functional.cross_entropy
    obj = ls.Objective(model, loss, (x, y))
    H = ref.dense_hessian(model, loss, [(x, y)])
    r = ls.trace(obj, method="exact")
    assert abs(r.value - float(torch.trace(H))) < 1e-10 and r.matvecs == obj.num_params
    est = ls.trace(ls.hessian(obj), method="hutchinson", max_matvecs=200, rtol=1e-9, seed=0)
    assert abs(est.value - float(torch.trace(H))) <= 4 * est.stderr
    per = ls.trace(obj, per_layer=True, method="exact")
    off = 0
    for name, shape in zip(obj.param_names, obj.param_shapes):
        n = int(torch.Size(shape).numel())
        assert abs(per[name].value - float(torch.trace(H[off : off + n, off : off + n]))) < 1e-10
        off += n


def test_per_layer_with_sizes_on_a_dense_operator():
    A = _flat(120)
    sizes = {"a": 50, "b": 40, "c": 30}
    per = ls.trace(A, per_layer=sizes, method="hutchinson", max_matvecs=80, rtol=1e-9, seed=0)
    off = 0
    for name, n in sizes.items():
        exact = float(torch.trace(A[off : off + n, off : off + n]))
        assert abs(per[name].value - exact) <= 4 * per[name].stderr
        off += n
    with pytest.raises(ValueError, match="add up"):
        ls.trace(A, per_layer={"a": 10})


def test_diagonal_estimates_with_stderr():
    A = _matrix(torch.linspace(0.5, 2.0, 80, dtype=torch.float64))
    d = torch.diagonal(A)
    ex = ls.diagonal(A, method="exact")
    assert torch.allclose(ex.values, d, atol=1e-14) and ex.matvecs == 80
    est = ls.diagonal(A, samples=400, seed=0)
    z = (est.values - d) / est.stderr
    assert est.matvecs == 400 and float((z.abs() <= 1.96).double().mean()) >= 0.85
    # per-entry variance of one sample is sum_{i != j} A_ji^2 (Bekas et al. 2007)
    var = (A * A).sum(1) - d * d
    assert torch.allclose(est.stderr**2 * 400, var, rtol=0.35)


def test_bad_inputs():
    A = _flat(20)
    with pytest.raises(ValueError, match="method"):
        ls.trace(A, method="magic")
    with pytest.raises(ValueError, match="level"):
        ls.trace(A, level=1.5)
    with pytest.raises(ValueError, match="samples"):
        ls.diagonal(A, samples=1)


# ----------------------------------------------------------------------------- rank-deficient XTrace
def _xtrace_brute(A, Om, tol=1e-9):
    """XTrace by its definition (Epperly et al. 2024, Alg. 2): an SVD basis of Y_(-i) per probe."""

    def loo(cols):
        Y = A @ Om[:, cols]
        out = []
        for i in range(len(cols)):
            Yi = Y[:, [k for k in range(len(cols)) if k != i]]
            U, S, _ = torch.linalg.svd(Yi, full_matrices=False)
            Q = U[:, S > tol * max(float(S[0]) if S.numel() else 0.0, 1e-300)]
            w = Om[:, cols[i]]
            r = w - Q @ (Q.T @ w)
            out.append(float(torch.trace(Q.T @ A @ Q) + r @ A @ r))
        return torch.tensor(out, dtype=torch.float64)

    m = Om.shape[1]
    tri = loo(list(range(m)))
    jack = torch.stack([loo([k for k in range(m) if k != j]).mean() for j in range(m)])
    se = math.sqrt(float((m - 1) / m * ((jack - jack.mean()) ** 2).sum()))
    return tri, se


def _rank3(p=50):
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(p, 3, generator=g, dtype=torch.float64))[0]
    return (U * torch.tensor([3.0, 2.0, -1.0], dtype=torch.float64)) @ U.T


@pytest.mark.parametrize(
    "A",
    [torch.diag(torch.tensor([3.0, 2.0, -1.0] + [0.0] * 47, dtype=torch.float64)), _rank3()],
    ids=["diag-exact-zeros", "rotated"],
)
def test_xtrace_exact_on_rank_deficient_operator_with_more_probes_than_rank(A):
    # rank 3, 20 probes: Y = A Omega is rank-deficient (R = Q^T Y singular; inverting it crashed);
    # range(Y) = range(A), so every leave-one-out estimate is tr(A) exactly
    exact = float(torch.trace(A))
    r = ls.trace(A, method="xtrace", pilot=20, max_matvecs=40, rtol=1e-9, seed=1)
    assert abs(r.value - exact) < 1e-10 and r.stderr < 1e-10 and r.converged
    assert max(abs(s - exact) for s in r.samples) < 1e-10
    assert r.matvecs == 20 + 3  # the basis grows by the rank only: no matvec on rounding noise
    a = ls.trace(A, method="auto", max_matvecs=100, rtol=1e-9, seed=1)
    assert a.method == "xtrace" and abs(a.value - exact) < 1e-10


def test_xtrace_on_a_low_rank_model_hessian():
    # linear regression on 3 examples: the Hessian 2/n X^T X (bias included) has rank 3 of 11
    g = torch.Generator().manual_seed(4)
    model = torch.nn.Linear(10, 1).double()
    x = torch.randn(3, 10, generator=g, dtype=torch.float64)
    y = torch.randn(3, 1, generator=g, dtype=torch.float64)
    loss = torch.nn.functional.mse_loss
    H = ref.dense_hessian(model, loss, [(x, y)])
    assert int(torch.linalg.matrix_rank(H)) == 3
    r = ls.trace(ls.Objective(model, loss, (x, y)), method="xtrace", pilot=10, max_matvecs=40, seed=0)
    assert abs(r.value - float(torch.trace(H))) < 1e-10 and r.matvecs == 10 + 3


@pytest.mark.parametrize(
    "nonzero, m, seed", [(3, 4, 0), (3, 4, 10), (3, 5, 3), (3, 6, 1), (4, 5, 1), (4, 6, 28)]
)
def test_xtrace_leave_one_out_and_jackknife_match_the_definition(nonzero, m, seed):
    # Rademacher probes on diag(3, 2, -1, [0.5,] 0, ...): these seeds give rank-deficient sketches in
    # which removing some probes lowers the rank of Y_(-i) and removing others does not
    from landscape.curvature.linop import as_linop
    from landscape.curvature.xtrace import XTraceState

    A = torch.diag(
        torch.tensor([3.0, 2.0, -1.0, 0.5][:nonzero] + [0.0] * (20 - nonzero), dtype=torch.float64)
    )
    Om = torch.randint(0, 2, (20, m), generator=torch.Generator().manual_seed(seed)).double() * 2 - 1
    Y = A @ Om
    ranks = {int(torch.linalg.matrix_rank(Y[:, [k for k in range(m) if k != i]])) for i in range(m)}
    assert len(ranks) == 2 and int(torch.linalg.matrix_rank(Y)) < m
    xt = XTraceState(as_linop(A), None)
    xt.add(Om=Om, Y=Y)
    value, se, tri = xt.estimate()
    tri_ref, se_ref = _xtrace_brute(A, Om)
    assert torch.allclose(tri, tri_ref, atol=1e-10) and abs(se - se_ref) < 1e-10
    assert abs(value - float(tri_ref.mean())) < 1e-10
    # a full-rank sketch takes the square-R path: the same definition holds
    B = _rank3(20) + torch.diag(torch.linspace(0.1, 1.0, 20, dtype=torch.float64))
    xt = XTraceState(as_linop(B), None)
    xt.add(Om=Om, Y=B @ Om)
    value, se, tri = xt.estimate()
    tri_ref, se_ref = _xtrace_brute(B, Om)
    assert torch.allclose(tri, tri_ref, atol=1e-10) and abs(se - se_ref) < 1e-9
