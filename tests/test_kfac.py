"""KFAC / EKFAC (``landscape.curvature.kfac``) and their algebra against dense float64 references.

* Exact cases (Eschenhagen et al. 2023, Sec. 3): one ``Linear`` layer with MSE, and deep linear
  networks with MSE on inputs with a weight-sharing dimension -- "expand" exact when every position
  is a loss term, "reduce" exact when the positions are averaged before the loss, for ``Linear`` and
  ``Conv2d`` -- equal the diagonal blocks of the dense GGN of ``tests/references.py``
  (``torch.func`` Jacobians and output Hessians, no library code).  The other setting is asserted to
  differ, and the factors have different sizes, so a swap of ``A`` and ``G`` fails these tests.
* EKFAC's diagonal equals the diagonal of the dense GGN block in KFAC's eigenbasis (George et al.
  2018, eq. 10: the refit is the best diagonal in that basis), with the basis from the factors.
* The algebra (inverse, log-determinant, trace, eigenvalues) against ``torch.linalg`` on the dense
  matrix; the factor-wise damping against the damped factors inverted by hand.
* The Monte-Carlo type: equal to the empirical type on the labels it drew (same generator), and
  within 6 % of the type-2 matrix with 2,000 draws.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature.likelihoods import sample_targets
from tests import references as ref

DT = torch.float64


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _seeded(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    model = model.to(DT)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * 0.6)
    return model


def _block_mask(model: nn.Module) -> torch.Tensor:
    """``[p, p]`` True on the diagonal blocks of the layers (weight and bias together)."""
    sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()]
    sizes = [s for s in sizes if s]
    mask = torch.zeros(sum(sizes), sum(sizes), dtype=torch.bool)
    off = 0
    for s in sizes:
        mask[off : off + s, off : off + s] = True
        off += s
    return mask


class _Positions(nn.Module):
    """A stack of layers applied per position of ``[B, T, d]``; ``"expand"``: every position is a
    loss term (output ``[B, T, C]``), ``"reduce"``: positions averaged before the loss (``[B, C]``)."""

    def __init__(self, *layers: nn.Module, setting: str) -> None:
        super().__init__()
        self.net = nn.Sequential(*layers)
        self.setting = setting

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        return out if self.setting == "expand" else out.mean(1)


class _ConvPositions(nn.Module):
    """A ``Conv2d`` and a ``Linear`` head, linear throughout: ``"expand"``: the head on every output
    position (``[B, H W, C]``), ``"reduce"``: on the spatial average (``[B, C]``)."""

    def __init__(self, setting: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, stride=2)
        self.head = nn.Linear(3, 2)
        self.setting = setting

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(2).transpose(1, 2)  # [B, HW, c]
        return self.head(h if self.setting == "expand" else h.mean(1))


def _data(x_shape, y_shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(x_shape, generator=g, dtype=DT)
    y = torch.randn(y_shape, generator=g, dtype=DT)
    return [(x[:3], y[:3]), (x[3:], y[3:])]


# ------------------------------------------------------------------------------------ exact cases
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_single_linear_layer_with_mse_equals_the_ggn(reduction):
    # f = W x + b, H_out = (2/C) I (mean) is the same for every example, so G = (2/C) I and
    # A kron G = (1/N) sum_n [x;1][x;1]^T kron (2/C) I: the GGN exactly, weight-bias block included
    model = _seeded(nn.Linear(4, 3))
    loss = nn.MSELoss(reduction=reduction)
    data = _data((7, 4), (7, 3))
    K = ls.kfac(ls.Objective(model, loss, data)).to_dense()
    G = ref.dense_ggn(model, loss, data, reduction=reduction)
    assert _rel(K, G) < 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("setting", ["expand", "reduce"])
def test_deep_linear_network_with_weight_sharing_is_exact_in_its_setting(setting, reduction):
    model = _seeded(_Positions(nn.Linear(3, 5), nn.Linear(5, 4), nn.Linear(4, 2), setting=setting), seed=2)
    loss = nn.MSELoss(reduction=reduction)
    data = _data((7, 4, 3), (7, 4, 2) if setting == "expand" else (7, 2))
    obj = ls.Objective(model, loss, data)
    G = ref.dense_ggn(model, loss, data, reduction=reduction)
    mask = _block_mask(model)
    blocks = torch.where(mask, G, torch.zeros_like(G))
    same = ls.kfac(obj, kfac_approx=setting).to_dense()
    other = ls.kfac(obj, kfac_approx="reduce" if setting == "expand" else "expand").to_dense()
    assert _rel(same, blocks) < 1e-12
    assert _rel(other, blocks) > 1e-2  # the approximation of the other setting is not exact here
    assert bool((same[~mask] == 0).all())


@pytest.mark.parametrize("setting", ["expand", "reduce"])
def test_conv2d_with_linear_head_is_exact_in_its_setting(setting):
    model = _seeded(_ConvPositions(setting), seed=3)
    loss = nn.MSELoss()
    data = _data((5, 2, 5, 5), (5, 9, 2) if setting == "expand" else (5, 2))
    obj = ls.Objective(model, loss, data)
    G = ref.dense_ggn(model, loss, data)
    mask = _block_mask(model)
    K = ls.kfac(obj, kfac_approx=setting).to_dense()
    assert _rel(K, torch.where(mask, G, torch.zeros_like(G))) < 1e-12
    other = ls.kfac(obj, kfac_approx="reduce" if setting == "expand" else "expand").to_dense()
    assert _rel(other, torch.where(mask, G, torch.zeros_like(G))) > 1e-2


# ------------------------------------------------------------------------------------ EKFAC
def _mlp_ce(reduction="mean"):
    model = _seeded(nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)), seed=4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(9, 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (9,), generator=g)
    return model, nn.CrossEntropyLoss(reduction=reduction), [(x[:4], y[:4]), (x[4:], y[4:])]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ekfac_diagonal_is_the_ggn_diagonal_in_the_kfac_eigenbasis(reduction):
    model, loss, data = _mlp_ce(reduction)
    obj = ls.Objective(model, loss, data)
    K, E = ls.kfac(obj), ls.ekfac(obj)
    G = ref.dense_ggn(model, loss, data, reduction=reduction)
    for b, (name, f) in zip(E.blocks(), K.factors().items()):
        assert b.name == name
        Q = torch.kron(torch.linalg.eigh(f["G"])[1], torch.linalg.eigh(f["A"])[1])
        Gb = G[b.index[:, None], b.index[None, :]]
        # the eigenvectors' signs do not matter: diag(Q^T M Q) is sign-invariant
        assert _rel(b.diag.reshape(-1), torch.diagonal(Q.T @ Gb @ Q)) < 1e-10
    # the EKFAC matrix differs from KFAC's (the refit changed the eigenvalues)
    assert _rel(E.to_dense(), K.to_dense()) > 1e-3


# ------------------------------------------------------------------------------------ algebra
@pytest.mark.parametrize("which", ["kfac", "ekfac"])
@pytest.mark.parametrize("separate_bias", [False, True])
def test_algebra_equals_the_dense_matrix(which, separate_bias):
    model, loss, data = _mlp_ce()
    op = getattr(ls, which)(ls.Objective(model, loss, data), separate_bias=separate_bias)
    D = op.to_dense()
    p = D.shape[0]
    assert torch.allclose(D, op @ torch.eye(p, dtype=DT), rtol=0, atol=1e-14)  # products = assembly
    ev = torch.linalg.eigvalsh(D).flip(0)
    assert torch.allclose(op.eigenvalues(), ev, rtol=0, atol=1e-12)
    assert torch.allclose(op.eigenvalues(k=3), ev[:3], rtol=0, atol=1e-12)
    assert math.isclose(float(op.trace()), float(D.trace()), rel_tol=1e-12)
    lam = 1e-2
    I = torch.eye(p, dtype=DT)
    assert math.isclose(float(op.logdet(lam)), float(torch.linalg.slogdet(D + lam * I)[1]), rel_tol=1e-10)
    inv = op.inverse(lam)
    assert _rel(inv.to_dense(), torch.linalg.inv(D + lam * I)) < 1e-10
    assert _rel((inv @ (D + lam * I)), I) < 1e-10
    for b in op.blocks():
        block = D[b.index[:, None], b.index[None, :]]
        want = torch.linalg.eigvalsh(block).flip(0)
        assert torch.allclose(op.layer_eigenvalues()[b.name], want, rtol=0, atol=1e-12)
    assert inv.config()["heuristic"] == "exact" and inv.config()["of"] == which


@pytest.mark.parametrize("heuristic", ["pi", "factor"])
def test_factorwise_damping_inverts_the_damped_factors(heuristic):
    model, loss, data = _mlp_ce()
    op = ls.kfac(ls.Objective(model, loss, data))
    lam = 0.05
    inv = op.inverse(lam, heuristic=heuristic).to_dense()
    for b, f in zip(op.blocks(), op.factors().values()):
        A, G = f["A"], f["G"]
        if heuristic == "pi":  # Martens & Grosse 2015, Sec. 6.3
            pi = math.sqrt((float(A.trace()) / A.shape[0]) / (float(G.trace()) / G.shape[0]))
            la, lg = pi * math.sqrt(lam), math.sqrt(lam) / pi
        else:
            la = lg = lam
        want = torch.kron(
            torch.linalg.inv(G + lg * torch.eye(G.shape[0], dtype=DT)),
            torch.linalg.inv(A + la * torch.eye(A.shape[0], dtype=DT)),
        )
        assert _rel(inv[b.index[:, None], b.index[None, :]], want) < 1e-10


def test_logdet_and_inverse_refuse_a_singular_matrix_without_damping():
    model, loss, data = _mlp_ce()
    op = ls.kfac(ls.Objective(model, loss, data))  # rank(A) <= 9 examples, G of a softmax is singular
    with pytest.raises(ValueError, match="damping > 0"):
        op.logdet()
    with pytest.raises(ValueError, match="damping > 0"):
        op.inverse(0.0)
    with pytest.raises(ValueError, match="heuristic must be one of"):
        op.inverse(1e-3, heuristic="tikhonov")
    with pytest.raises(ValueError, match="exact damping only"):
        ls.ekfac(op.objective).inverse(1e-3, heuristic="pi")


# ------------------------------------------------------------------------------------ MC and empirical
def test_mc_equals_empirical_on_the_drawn_labels_and_the_ggn_in_expectation():
    model, loss, data = _mlp_ce()
    obj = ls.Objective(model, loss, data)
    mc = ls.kfac(obj, fisher_type="mc", seed=7).to_dense()
    gen = torch.Generator().manual_seed(7)  # the operator's generator: CPU, seed + 1_000_003 * rank
    drawn = []
    for x, _ in data:
        t = sample_targets(model(x).detach(), "categorical", 1, gen)[0]
        drawn.append((x, t))
    emp = ls.kfac(ls.Objective(model, loss, drawn), fisher_type="empirical").to_dense()
    assert _rel(mc, emp) < 1e-12
    many = ls.kfac(obj, fisher_type="mc", samples=2000, seed=1).to_dense()
    t2 = ls.kfac(obj).to_dense()
    assert _rel(many, t2) < 0.06


def test_empirical_kfac_of_one_example_per_batch_is_the_empirical_fisher_block():
    # one example, no weight sharing: A = a a^T, G = g g^T, so G kron A = vec(g a^T) vec(g a^T)^T,
    # the empirical Fisher of that example (per-example gradients by torch.func, tests/references.py)
    model, loss, data = _mlp_ce()
    one = [(data[0][0][:1], data[0][1][:1])]
    K = ls.kfac(ls.Objective(model, loss, one), fisher_type="empirical").to_dense()
    F = ref.dense_empirical_fisher(model, loss, one)
    mask = _block_mask(model)
    assert _rel(K, torch.where(mask, F, torch.zeros_like(F))) < 1e-12


# ------------------------------------------------------------------------------------ refusals, config
def test_layers_without_kronecker_form_are_refused_by_name():
    model = nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Linear(5, 3)).to(DT).eval()
    _, loss, data = _mlp_ce()
    obj = ls.Objective(model, loss, data)
    with pytest.raises(ValueError, match=r"parameter '1.weight' of layer '1' \(BatchNorm1d\).*subset"):
        ls.kfac(obj)
    sub = obj.subset(lambda n: not n.startswith("1."))
    op = ls.kfac(sub)
    assert op.config()["layers"] == ["0", "2"] and op.shape == (25 + 18, 25 + 18)


def test_bad_arguments_are_refused_with_the_fix():
    model, loss, data = _mlp_ce()
    obj = ls.Objective(model, loss, data)
    with pytest.raises(ValueError, match="fisher_type must be one of"):
        ls.kfac(obj, fisher_type="type-1")
    with pytest.raises(ValueError, match="kfac_approx must be one of"):
        ls.kfac(obj, kfac_approx="mean")
    with pytest.raises(ValueError, match="samples=3 is for fisher_type='mc'"):
        ls.kfac(obj, samples=3)
    with pytest.raises(ValueError, match="supports nn.CrossEntropyLoss"):
        ls.kfac(ls.Objective(model, nn.HuberLoss(), [(data[0][0], torch.randn(4, 3, dtype=DT))]))
    seq = _seeded(nn.Linear(3, 4))
    sobj = ls.Objective(
        seq, nn.CrossEntropyLoss(), [(torch.randn(2, 5, 3, dtype=DT), torch.randint(0, 5, (2, 4)))]
    )
    with pytest.raises(ValueError, match="EKFAC needs one loss term per example"):
        ls.ekfac(sobj)


def test_config_records_the_choices():
    model, loss, data = _mlp_ce()
    cfg = ls.kfac(ls.Objective(model, loss, data), fisher_type="mc", samples=2, seed=3).config()
    assert cfg["operator"] == "kfac"
    assert (cfg["fisher_type"], cfg["kfac_approx"], cfg["samples"], cfg["seed"]) == ("mc", "expand", 2, 3)
    assert (
        cfg["likelihood"] == "categorical" and cfg["layers"] == ["0", "2"] and cfg["terms_per_example"] == 1
    )
