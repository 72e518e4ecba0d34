"""The KFAC / EKFAC sharpness measures (``landscape.sharpness.kronecker_based``) against the dense float64
GGN of ``tests/references.py`` (``torch.func`` Jacobians and output Hessians, no library code).

* Where KFAC is exact (one ``Linear`` layer with MSE; a deep linear ``Conv2d`` network in its
  weight-sharing setting, Eschenhagen et al. 2023, Sec. 3) ``kfac_trace`` is ``Tr G`` and
  ``kfac_lambda_max`` the largest eigenvalue of ``G``'s diagonal blocks (of ``G`` itself for one layer).
* Where it is not (a tanh MLP with cross-entropy), ``kfac_trace`` is ``sum_l tr(A_l) tr(G_l)``
  with ``A_l`` from the layer inputs and ``tr(G_l)`` from the dense GGN of a last layer (whose input
  is fixed), computed by hand; ``ekfac_trace`` is ``Tr G`` (George et al. 2018: an orthonormal basis
  with the exact second moments on its diagonal) of the GGN and of the empirical Fisher.
* The runner and the study accept the measures by name (the study checks every registered measure).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import landscape as ls
from tests import references as ref

DT = torch.float64


def _ce_mlp(seed: int = 3):
    model = ref.make_mlp((4, 5, 3), "tanh", seed=seed)
    x, y = ref.make_classification_data(n=10, d=4, n_classes=3, seed=seed)
    return model, nn.CrossEntropyLoss(), [(x[:6], y[:6]), (x[6:], y[6:])]


def _block_eigs(G: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    eigs, off = [], 0
    for s in sizes:
        eigs.append(torch.linalg.eigvalsh(G[off : off + s, off : off + s]))
        off += s
    return torch.cat(eigs).sort(descending=True).values


def test_single_linear_layer_with_mse_gives_the_ggn_trace_and_lambda_max():
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(4, 3).to(DT)
    x = torch.randn(12, 4, generator=g, dtype=DT)
    y = torch.randn(12, 3, generator=g, dtype=DT)
    data, loss = [(x[:5], y[:5]), (x[5:], y[5:])], nn.MSELoss()
    G = ref.dense_ggn(model, loss, data)
    obj = ls.Objective(model, loss, data)
    rep = ls.sharpness_report(obj, ["kfac_trace", ("kfac_lambda_max", {"k": 3})])
    assert rep["kfac_trace"].value == pytest.approx(float(G.trace()), rel=1e-10)
    top = torch.linalg.eigvalsh(G).flip(0)[:3]
    assert rep["kfac_lambda_max"].extra["top"] == pytest.approx(top.tolist(), rel=1e-10)
    assert rep["kfac_lambda_max"].value == pytest.approx(float(top[0]), rel=1e-10)
    assert rep["kfac_trace"].stderr is None and rep["kfac_trace"].evaluations["gradient"] == 1


class _LinearConvNet(nn.Module):
    """A linear ``Conv2d`` and a ``Linear`` head on the spatially averaged features: KFAC-reduce is
    exact for it (Eschenhagen et al. 2023, Sec. 3.2)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, stride=2)
        self.head = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).flatten(2).mean(2))


def test_deep_linear_conv_network_with_reduce_gives_the_block_spectrum():
    g = torch.Generator().manual_seed(1)
    model = _LinearConvNet().to(DT)
    x = torch.randn(7, 2, 5, 5, generator=g, dtype=DT)
    y = torch.randn(7, 2, generator=g, dtype=DT)
    data, loss = [(x[:3], y[:3]), (x[3:], y[3:])], nn.MSELoss()
    G = ref.dense_ggn(model, loss, data)
    obj = ls.Objective(model, loss, data)
    tr = ls.sharpness(obj, "kfac_trace", kfac_approx="reduce")
    lam = ls.sharpness(obj, "kfac_lambda_max", kfac_approx="reduce", k=4)
    assert tr.value == pytest.approx(float(G.trace()), rel=1e-10)
    eigs = _block_eigs(G, [3 * 2 * 9 + 3, 3 * 2 + 2])
    assert lam.extra["top"] == pytest.approx(eigs[:4].tolist(), rel=1e-9)
    # the full matrix's top eigenvalue bounds the block-diagonal one from above (Cauchy interlacing)
    assert lam.value <= float(torch.linalg.eigvalsh(G)[-1]) * (1 + 1e-12)


def test_kfac_trace_of_a_cross_entropy_mlp_is_the_product_of_the_factor_traces():
    model, loss, data = _ce_mlp()
    obj = ls.Objective(model, loss, data)
    r = ls.sharpness(obj, "kfac_trace")
    x = torch.cat([b[0] for b in data])
    N = len(x)
    # layer inputs with the bias's column of ones: tr A = mean ||(a, 1)||^2
    h = torch.tanh(model[0](x)).detach()
    trA = [float(((x**2).sum(1) + 1).mean()), float(((h**2).sum(1) + 1).mean())]
    G = ref.dense_ggn(model, loss, data)
    # the last layer's output is the network output: its G factor is the mean output Hessian, whose
    # trace is sum_n sum_c p_c (1 - p_c) / N -- by hand from the softmax
    p = torch.softmax(model(x), 1).detach()
    trG_last = float((p * (1 - p)).sum() / N)
    last = r.extra["block_traces"]["2"]
    assert last == pytest.approx(trA[1] * trG_last, rel=1e-10)
    assert r.value == pytest.approx(sum(r.extra["block_traces"].values()), rel=1e-12)
    # KFAC's trace is not the exact one here, EKFAC's is
    exact = float(G.trace())
    assert abs(r.value - exact) / exact > 1e-3
    e = ls.sharpness(obj, "ekfac_trace")
    assert e.value == pytest.approx(exact, rel=1e-10)
    assert e.evaluations["gradient"] == 2


def test_ekfac_trace_is_the_exact_trace_of_the_empirical_fisher():
    model, loss, data = _ce_mlp(seed=4)
    F = ref.dense_empirical_fisher(model, loss, data)
    r = ls.sharpness(ls.Objective(model, loss, data), "ekfac_trace", fisher_type="empirical")
    assert r.value == pytest.approx(float(F.trace()), rel=1e-10)


def test_ekfac_lambda_max_is_the_largest_refitted_eigenvalue_and_below_the_ggn_bound():
    model, loss, data = _ce_mlp(seed=5)
    G = ref.dense_ggn(model, loss, data)
    r = ls.sharpness(ls.Objective(model, loss, data), "ekfac_lambda_max", k=2)
    assert r.value == pytest.approx(max(r.extra["block_lambda_max"].values()), rel=1e-12)
    # each refitted diagonal entry is a Rayleigh quotient of a diagonal block of G, so at most
    # lambda_max(G)
    assert 0 < r.value <= float(torch.linalg.eigvalsh(G)[-1]) * (1 + 1e-10)


def test_other_params_skip_measures_the_linear_and_conv_layers_only():
    model = ref.make_cnn_bn()
    x, y = ref.make_classification_data(n=8, image=True, seed=2)
    data, loss = [(x, y)], nn.CrossEntropyLoss()
    obj = ls.Objective(model, loss, data, mode="eval")
    with pytest.raises(ValueError, match=r"'1.weight'.*BatchNorm2d"):
        ls.sharpness(obj, "kfac_trace")
    keep = ["0.weight", "0.bias", "3.weight", "3.bias", "6.weight", "6.bias"]
    r = ls.sharpness(obj, "ekfac_trace", other_params="skip")
    model.eval()
    G = ref.dense_ggn(model, loss, data, names=keep)
    assert r.value == pytest.approx(float(G.trace()), rel=1e-10)
    assert r.extra["skipped_params"] == ["1.weight", "1.bias"]
    assert r.extra["num_params_factorised"] == G.shape[0]


def test_bad_options_are_refused_with_the_fix():
    model, loss, data = _ce_mlp()
    obj = ls.Objective(model, loss, data)
    with pytest.raises(ValueError, match="fisher_type"):
        ls.sharpness(obj, "kfac_trace", fisher_type="mc")
    with pytest.raises(ValueError, match="other_params"):
        ls.sharpness(obj, "kfac_trace", other_params="ignore")
    with pytest.raises(ValueError, match="k = 99 exceeds"):
        ls.sharpness(obj, "kfac_lambda_max", k=99)
    with pytest.raises(TypeError, match="unknown option"):
        ls.sharpness(obj, "kfac_trace", samples=3)


def test_the_runner_and_the_study_accept_the_kfac_measures():
    from experiments.evaluate import sharpness_measures
    from experiments.study.config import _check_measures

    cfg = {"evaluation": {"sharpness": ["kfac_trace", "kfac_lambda_max"], "sharpness_options": {}}}
    assert [s[1] for s in sharpness_measures(cfg)] == ["kfac_trace", "kfac_lambda_max"]
    # every registered measure is a valid study column (the study validates against ls.MEASURES)
    rows = _check_measures([{"measure": m} for m in ls.MEASURES])
    assert {"kfac_trace", "kfac_lambda_max", "ekfac_trace", "ekfac_lambda_max"} <= {
        r["measure"] for r in rows
    }
