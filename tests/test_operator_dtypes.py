"""Curvature operators never mix dtypes silently (issue 28): a vector or block of another dtype than
the operator's is refused with both dtypes and the fix named, in both directions; the same dtype
gives that dtype; ``to_scipy()`` casts explicitly (float64 numpy in and out) and the spectral
routines, which cast to the operator's dtype themselves, keep working on a float32 operator."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg
import torch
from torch import nn

import landscape as ls
from landscape.objective import Objective
from tests import references as ref

OPERATORS = {
    "hessian": lambda o: ls.hessian(o),
    "ggn": lambda o: ls.ggn(o),
    "empirical_fisher": lambda o: ls.empirical_fisher(o),
    "fisher": lambda o: ls.fisher(o, samples=1, seed=0),
}


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _objective(dtype: torch.dtype) -> Objective:
    x, y = ref.make_classification_data(12)
    return Objective(ref.make_mlp((4, 5, 3)), nn.CrossEntropyLoss(), (x, y), dtype=dtype)


@pytest.mark.parametrize("kind", sorted(OPERATORS))
@pytest.mark.parametrize(
    ("op_dtype", "vec_dtype"), [(torch.float32, torch.float64), (torch.float64, torch.float32)]
)
def test_mixed_dtypes_are_refused_in_both_directions(kind, op_dtype, vec_dtype):
    op = OPERATORS[kind](_objective(op_dtype))
    p = op.shape[0]
    v = torch.linspace(-1.0, 1.0, p, dtype=vec_dtype)
    want = f"operator is {op_dtype} but the vector multiplied by it is {vec_dtype}"
    for call in (lambda: op @ v, lambda: op.matvec(v)):
        with pytest.raises(TypeError, match=want) as err:
            call()
        assert "v.to(op.dtype)" in str(err.value) and f"dtype={vec_dtype}" in str(err.value)
    with pytest.raises(
        TypeError, match=f"operator is {op_dtype} but the block multiplied by it is {vec_dtype}"
    ):
        op.matmat(v.reshape(-1, 1).repeat(1, 2))
    with pytest.raises(TypeError, match="block multiplied by it is torch.int64"):
        op @ torch.ones(p, 2, dtype=torch.int64)
    assert op.matvecs == 0  # nothing was computed
    # the same dtype works and keeps it; the explicit cast the message names works too
    same = op @ v.to(op.dtype)
    assert same.dtype == op_dtype and same.shape == (p,)
    assert torch.equal(op.matmat(v.to(op.dtype).reshape(-1, 1)).reshape(-1), same)


def test_float32_operator_agrees_with_float64_after_an_explicit_cast():
    op32, op64 = ls.hessian(_objective(torch.float32)), ls.hessian(_objective(torch.float64))
    v = torch.linspace(-1.0, 1.0, op64.shape[0], dtype=torch.float64)
    a, b = op32 @ v.float(), op64 @ v
    assert a.dtype == torch.float32 and b.dtype == torch.float64
    assert float((a.double() - b).abs().max()) <= 1e-5 * float(b.abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_to_scipy_casts_explicitly_and_estimators_still_work(dtype):
    op = ls.hessian(_objective(dtype))
    p = op.shape[0]
    dense = ref.dense_hessian(
        ref.make_mlp((4, 5, 3)), nn.CrossEntropyLoss(), [ref.make_classification_data(12)]
    )
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    lin = op.to_scipy()
    x = np.linspace(-1.0, 1.0, p)
    y = lin.matvec(x)
    assert y.dtype == np.float64 and y.shape == (p,)
    assert np.abs(y - dense.numpy() @ x).max() <= tol * np.abs(dense.numpy() @ x).max()
    Y = lin.matmat(np.stack([x, -x], axis=1))
    assert Y.dtype == np.float64 and np.abs(Y[:, 0] + Y[:, 1]).max() <= tol * np.abs(Y).max()
    top = scipy.sparse.linalg.eigsh(lin, k=1, which="LA", return_eigenvectors=False)[0]
    lam = float(torch.linalg.eigvalsh(dense)[-1])
    assert abs(top - lam) <= 10 * tol * abs(lam)
    # the spectral routines cast to the operator's dtype themselves (landscape.curvature.linop)
    res = ls.eigenvalues(op, k=1, tol=1e-6 if dtype == torch.float32 else 1e-10)
    assert abs(float(res.values[0]) - lam) <= 10 * tol * abs(lam)
    assert ls.trace(op, method="exact").value == pytest.approx(float(dense.trace()), rel=10 * tol)


def test_preconditioned_sharpness_of_a_float32_model_casts_to_the_operator_dtype():
    """The curvature monitor's ``D H D`` (float64 probes) on a float32 Hessian: the probe is cast to
    the operator's dtype (which refuses other dtypes), the result equals the float64 reference."""
    from landscape.curvature.stability import Preconditioned
    from tests.references import dense_hessian, make_classification_data, make_mlp

    model = make_mlp((4, 5, 3), "tanh", seed=0, dtype=torch.float32)
    x, y = make_classification_data(n=12, d=4, n_classes=3, seed=1, dtype=torch.float32)
    H32 = ls.hessian(ls.Objective(model, torch.nn.CrossEntropyLoss(), [(x, y)]))
    d = torch.linspace(0.5, 2.0, H32.shape[0], dtype=torch.float64)
    P = Preconditioned(H32, d)
    V = torch.randn(H32.shape[0], 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    got = P.matmat(V)
    H = dense_hessian(model.double(), torch.nn.CrossEntropyLoss(), [(x.double(), y)])
    D = torch.diag(d.rsqrt())
    torch.testing.assert_close(got, D @ H @ D @ V, rtol=1e-4, atol=1e-5)
