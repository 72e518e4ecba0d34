"""Cross-check of ``ls.kfac`` / ``ls.ekfac`` with curvlinops' ``KFACLinearOperator``,
``EKFACLinearOperator`` and ``KFACInverseLinearOperator`` (installed by ``benchmarks/install_peers.sh``)
to 1e-10 in float64, on the cases of curvlinops' own tests (``test/cases.py`` of
github.com/f-dangel/curvlinops, rewritten here): an MLP with cross-entropy, BCE-with-logits (one and
two outputs) and MSE, mean and sum, two uneven batches; the same with a sequence dimension
(cross-entropy on ``[B, C, T]`` outputs, BCE and MSE on ``[B, T, C]``) under "expand" and "reduce";
their CNN (two ``Conv2d`` + ``MaxPool2d``, a ``Linear`` head) under both (products on 40 random
vectors).  Types "type-2" and
"empirical" are compared exactly, with weight and bias joint and separate; "mc" draws its labels
from another generator than curvlinops, so both are compared with the type-2 matrix in expectation
(200 draws).  EKFAC is compared where curvlinops defines it (one loss term per example), the
inverses with exact, pi and factor damping on the MLP cases, the trace everywhere.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import landscape as ls

cl = pytest.importorskip("curvlinops")

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class _ClassesFirst(nn.Module):
    """``[B, T, C]`` -> ``[B, C, T]`` (cross-entropy's class dimension 1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


def _mlp(d_in: int, d_out: int, tail: tuple = ()) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, 5), nn.ReLU(), nn.Linear(5, d_out), *tail)


def _case(name: str):
    g = torch.Generator().manual_seed(0)

    def x(*shape):
        return torch.rand(*shape, generator=g, dtype=DT)

    def cls(shape, c):
        return torch.randint(0, c, shape, generator=g)

    def binary(shape):
        return torch.randint(0, 2, shape, generator=g).to(DT)

    def reg(shape):
        return torch.randn(shape, generator=g, dtype=DT)

    kind, red = name.rsplit("-", 1)
    torch.manual_seed(0)
    if kind == "ce":
        model, data = _mlp(10, 3), [(x(3, 10), cls((3,), 3)), (x(4, 10), cls((4,), 3))]
        loss = nn.CrossEntropyLoss(reduction=red)
    elif kind == "bce1":
        model, data = _mlp(10, 1), [(x(3, 10), binary((3, 1))), (x(4, 10), binary((4, 1)))]
        loss = nn.BCEWithLogitsLoss(reduction=red)
    elif kind == "bce2":
        model, data = _mlp(10, 2), [(x(3, 10), binary((3, 2))), (x(4, 10), binary((4, 2)))]
        loss = nn.BCEWithLogitsLoss(reduction=red)
    elif kind == "mse":
        model, data = _mlp(8, 3), [(x(2, 8), reg((2, 3))), (x(6, 8), reg((6, 3)))]
        loss = nn.MSELoss(reduction=red)
    elif kind == "ce_seq":
        model = _mlp(10, 3, (_ClassesFirst(),))
        data = [(x(3, 5, 10), cls((3, 5), 3)), (x(4, 5, 10), cls((4, 5), 3))]
        loss = nn.CrossEntropyLoss(reduction=red)
    elif kind == "bce_seq":
        model, data = _mlp(10, 2), [(x(3, 5, 10), binary((3, 5, 2))), (x(4, 5, 10), binary((4, 5, 2)))]
        loss = nn.BCEWithLogitsLoss(reduction=red)
    elif kind == "mse_seq":
        model, data = _mlp(8, 3), [(x(2, 5, 8), reg((2, 5, 3))), (x(6, 5, 8), reg((6, 5, 3)))]
        loss = nn.MSELoss(reduction=red)
    else:  # cnn
        model = nn.Sequential(
            nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
        )  # fmt: skip
        data = [(x(5, 1, 28, 28), cls((5,), 10)), (x(5, 1, 28, 28), cls((5,), 10))]
        loss = nn.CrossEntropyLoss(reduction=red)
    return model.to(DT), loss, data


FLAT = [f"{k}-{r}" for k in ("ce", "bce1", "bce2", "mse") for r in ("mean", "sum")]
SHARED = [f"{k}-{r}" for k in ("ce_seq", "bce_seq", "mse_seq") for r in ("mean", "sum")] + ["cnn-mean"]


def _theirs(cls, model, loss, data, **kw):
    return cls(model, loss, list(model.parameters()), data, check_deterministic=False, **kw)


def _dense(op, p: int) -> torch.Tensor:
    return op @ torch.eye(p, dtype=DT)


def _pair(name, fisher_type, approx, separate, ekfac=False):
    model, loss, data = _case(name)
    obj = ls.Objective(model, loss, data)
    kw = dict(fisher_type=fisher_type, kfac_approx=approx)
    ours = (ls.ekfac if ekfac else ls.kfac)(obj, separate_bias=separate, **kw)
    cls = cl.EKFACLinearOperator if ekfac else cl.KFACLinearOperator
    theirs = _theirs(cls, model, loss, data, separate_weight_and_bias=separate, **kw)
    return ours, theirs, obj.num_params


@pytest.mark.parametrize("separate", [False, True], ids=["joint", "separate"])
@pytest.mark.parametrize("fisher_type", ["type-2", "empirical"])
@pytest.mark.parametrize("name", FLAT)
def test_kfac_and_ekfac_equal_curvlinops_on_flat_outputs(name, fisher_type, separate):
    for ekfac in (False, True):
        ours, theirs, p = _pair(name, fisher_type, "expand", separate, ekfac)
        T = _dense(theirs, p)
        assert _rel(ours.to_dense(), T) < 1e-10
        assert _rel(ours @ torch.eye(p, dtype=DT), T) < 1e-10
        assert abs(float(ours.trace()) - float(theirs.trace)) <= 1e-10 * abs(float(theirs.trace))


def _close_on(ours, theirs, p: int, columns: int | None) -> float:
    """The relative difference of the products on the identity, or on ``columns`` random vectors
    (the CNN has 5,142 parameters: curvlinops' dense matrix would take 5,142 products)."""
    if columns is None:
        return _rel(ours.to_dense(), _dense(theirs, p))
    V = torch.randn(p, columns, generator=torch.Generator().manual_seed(0), dtype=DT)
    return _rel(ours @ V, theirs @ V)


@pytest.mark.parametrize("approx", ["expand", "reduce"])
@pytest.mark.parametrize("fisher_type", ["type-2", "empirical"])
@pytest.mark.parametrize("name", SHARED)
def test_kfac_equals_curvlinops_with_weight_sharing(name, fisher_type, approx):
    cnn = name.startswith("cnn")
    for separate in (False, True):
        ours, theirs, p = _pair(name, fisher_type, approx, separate)
        assert _close_on(ours, theirs, p, 40 if cnn else None) < 1e-10
    if cnn and approx == "expand":
        # EKFAC of the CNN (one loss term per example); not under "reduce": with 10 examples its
        # averaged-patch factors are rank-deficient, the eigenbasis of their null space is any basis
        # (eigh's choice differs with rounding), and the per-example gradients, built from all
        # patches, do not vanish there, so the refitted diagonal depends on that arbitrary choice
        ours, theirs, p = _pair(name, fisher_type, approx, False, ekfac=True)
        assert _close_on(ours, theirs, p, 40) < 1e-10


# EKFAC's inverse is exact damping only (in both libraries): no heuristic for it
@pytest.mark.parametrize(
    "heuristic, ekfac", [("exact", False), ("pi", False), ("factor", False), ("exact", True)]
)
@pytest.mark.parametrize("name", ["ce-mean", "bce2-sum", "mse-mean"])
def test_inverse_equals_curvlinops(name, heuristic, ekfac):
    ours, theirs, p = _pair(name, "type-2", "expand", False, ekfac)
    lam = 1e-2
    inv = cl.KFACInverseLinearOperator(
        theirs, damping=lam, use_exact_damping=heuristic == "exact", use_heuristic_damping=heuristic == "pi"
    )
    assert _rel(ours.inverse(lam, heuristic=heuristic).to_dense(), _dense(inv, p)) < 1e-10


@pytest.mark.slow  # ~15 s: curvlinops back-propagates the 200 draws one at a time
def test_mc_of_both_libraries_is_the_type2_matrix_in_expectation():
    model, loss, data = _case("ce-mean")
    obj = ls.Objective(model, loss, data)
    p = obj.num_params
    t2 = ls.kfac(obj).to_dense()
    # 200 draws: curvlinops 3.0.1 back-propagates one draw at a time (2,000 took a minute)
    ours = ls.kfac(obj, fisher_type="mc", samples=200, seed=1).to_dense()
    kw = dict(fisher_type="mc", mc_samples=200, separate_weight_and_bias=False)
    theirs = _dense(_theirs(cl.KFACLinearOperator, model, loss, data, **kw), p)
    assert _rel(ours, t2) < 0.05 and _rel(theirs, t2) < 0.05, (_rel(ours, t2), _rel(theirs, t2))


def test_benchmark_quick_run_computes_the_same_matrix_as_curvlinops(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "benchmarks/kfac_vs_curvlinops.py", "--quick", "--repeat", "1", "--threads", "1"]
    subprocess.run([*cmd, "--out", str(tmp_path), "--fisher-types", "type-2"], cwd=root, check=True)
    rows = json.loads((tmp_path / "kfac_cpu_quick.json").read_text())["rows"]
    ours = [r for r in rows if r["library"] == "landscape"]
    assert {r["model"] for r in ours} == {"resnet20", "transformer"}
    assert all(r["max_rel_diff"] < 1e-5 for r in ours)  # float32: the same KFAC matrix as curvlinops'
    assert all(r["factors_ratio"] > 0 for r in ours)
