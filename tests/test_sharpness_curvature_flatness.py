"""Curvature-based measures, Keskar, Jiang et al.'s flatness, directional sharpness, the robustness
curve, every measure's config, errors and the caller's model after every call."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

import landscape as ls
from landscape.objective import Objective
from landscape.sharpness import MEASURES, SharpnessResult, sharpness, sharpness_report
from tests.references import (
    dense_empirical_fisher,
    dense_ggn,
    dense_hessian,
    make_classification_data,
)
from tests.sharpness_problems import (
    F64,
    DiagQuadratic,
    _ref_loss,
    logistic_problem,
    mean_loss,
    mlp_problem,
    quad,
    qvalue,
    rand,
    spd,
)


# --------------------------------------------------------------------------------------------
# curvature measures vs dense matrices
# --------------------------------------------------------------------------------------------
def test_lambda_max_and_smallest_match_dense_hessian():
    model, batches, obj = mlp_problem()
    ev = torch.linalg.eigvalsh(dense_hessian(model, nn.CrossEntropyLoss(), batches))
    r = sharpness(obj, "lambda_max", tol=1e-8)
    assert r.value == pytest.approx(float(ev[-1]), rel=1e-6)
    assert r.extra["smallest"] == pytest.approx(float(ev[0]), rel=1e-5, abs=1e-8)
    assert r.evaluations["hvp"] > 0


def test_traces_match_dense_ggn_and_fishers():
    model, batches, obj = mlp_problem()
    ggn = float(torch.trace(dense_ggn(model, nn.CrossEntropyLoss(), batches)))
    ef = float(torch.trace(dense_empirical_fisher(model, nn.CrossEntropyLoss(), batches)))
    r = sharpness(obj, "ggn_trace", method="exact")
    assert r.value == pytest.approx(ggn, rel=1e-10)
    r = sharpness(obj, "ggn_trace", rtol=1e-2)
    assert abs(r.value - ggn) < 5 * r.stderr
    r = sharpness(obj, "fisher_trace")
    assert r.value == pytest.approx(ef, rel=1e-10) and r.stderr is None
    # Monte-Carlo Fisher: for cross-entropy E[F_mc] = GGN
    r = sharpness(obj, "fisher_trace", kind="mc", samples=30, seed=3)
    assert abs(r.value - ggn) < 4 * r.stderr


def test_tracer_trace_ratio():
    model, batches, obj = mlp_problem()
    loss, theta0 = _ref_loss(model, batches)
    g = torch.func.grad(loss)(theta0)
    f_bar = torch.rand(obj.num_params, generator=torch.Generator().manual_seed(0), dtype=F64) + 0.1
    r = sharpness(obj, "tracer", f_bar=f_bar, delta=1e-3)
    assert r.value == pytest.approx(float((g**2 / (f_bar + 1e-3)).sum()), rel=1e-10)
    # default f_bar: mean over mini-batches of 8 of the squared mini-batch gradient
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    sq = []
    for s in range(0, len(y), 8):
        lb, _ = __import__("tests.references", fromlist=["x"]).total_loss_fn(
            model, nn.CrossEntropyLoss(), [(x[s : s + 8], y[s : s + 8])]
        )
        sq.append(torch.func.grad(lb)(theta0) ** 2)
    fb = torch.stack(sq).mean(0)
    r = sharpness(obj, "tracer", batch_size=8, delta=1e-8)
    assert r.value == pytest.approx(float((g**2 / (fb + 1e-8)).sum()), rel=1e-8)


# --------------------------------------------------------------------------------------------
# Keskar, Jiang et al., directions, robustness curve
# --------------------------------------------------------------------------------------------
def test_keskar_against_box_vertex_enumeration():
    # convex losses: the maximum over the box is at a vertex
    p, eps = 4, 1e-2
    A, b, w = spd(p, 15), rand(p, 16), rand(p, 17)
    obj = quad(A, b, w)
    box = eps * (w.abs() + 1)
    L0 = qvalue(A, b, w)
    best = max(
        qvalue(A, b, w + box * torch.tensor(s, dtype=F64)) for s in itertools.product([-1, 1], repeat=p)
    )
    r = sharpness(obj, "keskar", epsilon=eps)
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)
    # logistic regression
    obj, net, loss_at = logistic_problem(d=3)
    w0 = net.lin.weight.detach().reshape(-1)
    box = 5e-2 * (w0.abs() + 1)
    L0 = float(loss_at(w0))
    verts = torch.tensor(list(itertools.product([-1, 1], repeat=3)), dtype=F64)
    best = float(loss_at(w0 + box * verts).max())
    r = sharpness(obj, "keskar", epsilon=5e-2)
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)


def test_keskar_random_subspace():
    p, k, eps = 6, 2, 1e-2
    A, b, w = spd(p, 18), rand(p, 19), rand(p, 20)
    obj = quad(A, b, w)
    r = sharpness(obj, "keskar", epsilon=eps, subspace=k, seed=4)
    M = torch.randn(p, k, generator=torch.Generator().manual_seed(4), dtype=F64)
    box = eps * ((torch.linalg.pinv(M) @ w).abs() + 1)
    L0 = qvalue(A, b, w)
    best = max(
        qvalue(A, b, w + M @ (box * torch.tensor(s, dtype=F64))) for s in itertools.product([-1, 1], repeat=k)
    )
    assert r.value == pytest.approx(100 * (best - L0) / (1 + L0), rel=1e-9)


def test_pacbayes_sigma_is_a_standard_deviation():
    """Isotropic quadratic at its minimum: E[L(w+u)] - L(w) = sigma^2 Tr(A) / 2, so sigma* =
    sqrt(2 target / Tr A) = 0.0158 (passing a variance would give sigma*^2 = 2.5e-4 instead)."""
    p, a, eps = 800, 1.0, 1e-3
    w = rand(p, 21)
    data = (torch.zeros(1, 1, dtype=F64), torch.zeros(1, dtype=F64))
    obj = Objective(DiagQuadratic(torch.full((p,), a, dtype=F64), -a * w, w), mean_loss, data)
    r = sharpness(obj, "pacbayes_flatness", samples=20, steps=10, epsilon=eps, criterion="loss")
    sigma = math.sqrt(2 * 0.1 / (a * p))
    assert r.extra["sigma"] == pytest.approx(sigma, rel=0.03)
    assert r.value == pytest.approx(1 / sigma**2, rel=0.06)
    # magnitude aware: E = 1/2 sum_i a (sigma'^2 w_i^2 + eps^2)
    sigma_mag = math.sqrt((0.2 / a - p * eps**2) / float((w**2).sum()))
    assert r.extra["sigma_magnitude"] == pytest.approx(sigma_mag, rel=0.03)
    assert r.extra["inv_sigma_magnitude_sq"] == pytest.approx(1 / r.extra["sigma_magnitude"] ** 2)


def test_sharpness_flatness_closed_form():
    """Diagonal A, g != 0: the box maximum is at u = alpha sign(g): alpha ||g||_1 + alpha^2 Tr(A)/2."""
    p = 5
    d = torch.tensor([1.0, 2.0, 0.5, 3.0, 1.5], dtype=F64)
    A, w, b = torch.diag(d), rand(p, 22), rand(p, 23)
    obj = quad(A, b, w)
    g1 = float((A @ w + b).abs().sum())
    tr = float(d.sum())
    alpha = (-g1 + math.sqrt(g1**2 + 2 * tr * 0.1)) / tr
    r = sharpness(obj, "sharpness_flatness", criterion="loss", epsilon=0.0, steps=20)
    assert r.extra["alpha"] == pytest.approx(alpha, rel=1e-4)
    assert r.value == pytest.approx(1 / alpha**2, rel=1e-3)
    # magnitude-aware box |u_i| <= alpha |w_i|: alpha sum |g_i w_i| + alpha^2 sum d_i w_i^2 / 2
    gw = float(((A @ w + b) * w).abs().sum())
    dw = float((d * w**2).sum())
    alpha_mag = (-gw + math.sqrt(gw**2 + 2 * dw * 0.1)) / dw
    assert r.extra["alpha_magnitude"] == pytest.approx(alpha_mag, rel=1e-4)


def test_directional_closed_form_and_filter_normalisation():
    p = 4
    A, b, w = spd(p, 24), rand(p, 25), rand(p, 26)
    obj = quad(A, b, w)
    ds = [rand(p, 30 + i) for i in range(3)]
    r = sharpness(obj, "directional", directions=ds, radius=0.2)
    g = A @ w + b
    rises = [float(0.2 * g @ d + 0.5 * 0.04 * d @ A @ d) for d in ds]
    assert r.value == pytest.approx(float(np.mean(rises)), rel=1e-12)
    assert r.extra["max"] == pytest.approx(max(rises), rel=1e-12)
    assert r.stderr == pytest.approx(float(np.std(rises, ddof=1) / math.sqrt(3)), rel=1e-10)
    # filter normalisation: every filter of d has the norm of the weights' filter, biases zero
    from landscape.sharpness.average_case import filter_normalized_direction

    model, batches, obj = mlp_problem()
    d = obj.unflatten(filter_normalized_direction(obj, obj.flat_params(), torch.Generator().manual_seed(0)))
    for name, t in model.named_parameters():
        if t.dim() == 2:
            assert torch.allclose(d[name].norm(dim=1), t.detach().norm(dim=1), rtol=1e-12)
        else:
            assert torch.count_nonzero(d[name]) == 0
    r = sharpness(obj, "directional", directions=5, radius=0.1)
    assert len(r.extra["rises"]) == 5 and r.extra["max"] >= r.value


def test_perturbation_robustness_curve():
    p = 4
    A, b, w = spd(p, 27), rand(p, 28), rand(p, 29)
    obj = quad(A, b, w)
    g = A @ w + b
    gh = g / g.norm()
    alphas = [0.1, 0.5, 1.0]
    r = sharpness(obj, "perturbation_robustness", alphas=alphas, noise_samples=3)
    expected = [float(a * g.norm() + 0.5 * a**2 * gh @ A @ gh) for a in alphas]
    assert np.allclose(np.array(r.extra["adversarial_loss"]) - r.extra["loss"], expected, rtol=1e-10)
    assert r.value == pytest.approx(float(np.mean(expected)), rel=1e-10)
    assert len(r.extra["noise_loss"]) == 3
    # accuracy curve on a classifier
    obj, net, loss_at = logistic_problem()
    r = sharpness(obj, "perturbation_robustness", alphas=[0.0, 2.0])
    x = torch.cat([bb[0] for bb in obj.data])
    y = torch.cat([bb[1] for bb in obj.data])
    w0 = net.lin.weight.detach().reshape(-1)
    gr = torch.func.grad(lambda W: loss_at(W))(w0)
    w2 = w0 + 2.0 * gr / gr.norm()
    acc = float((((x @ w2) > 0).to(F64) == y).to(F64).mean())
    assert r.extra["adversarial_accuracy"][1] == pytest.approx(acc)
    assert r.extra["adversarial_accuracy"][0] == pytest.approx(r.extra["accuracy"])


# --------------------------------------------------------------------------------------------
# API: results, report, errors, model safety
# --------------------------------------------------------------------------------------------
def test_every_measure_runs_and_records_config(tmp_path):
    model, batches, obj = mlp_problem("relu", n=16)
    fast = {
        "pacbayes_flatness": {"steps": 3, "samples": 2, "criterion": "loss"},
        "sharpness_flatness": {"steps": 3, "iterations": 2, "criterion": "loss"},
        "average_case": {"samples": 4},
        "fisher_trace": {"kind": "mc", "samples": 2},
        "hessian_trace": {"max_matvecs": 20},
        "ggn_trace": {"max_matvecs": 20},
        "directional": {"directions": 3},
        "perturbation_robustness": {"alphas": [0.5], "noise_samples": 2},
        "worst_case": {"iterations": 3},
        "fisher_worst_case": {"iterations": 3},
    }
    report = sharpness_report(obj, [(m, fast.get(m, {})) for m in MEASURES])
    assert [r.measure for r in report.rows] == list(MEASURES)
    for r in report.rows:
        assert isinstance(r, SharpnessResult) and math.isfinite(r.value) and r.seconds >= 0
        assert r.config["objective"]["num_params"] == obj.num_params and "bn_policy" in r.config
        assert sum(r.evaluations.values()) > 0
    text = str(report)
    assert all(m in text for m in MEASURES)
    report.to_json(tmp_path / "r.json")
    csv_text = report.to_csv(tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text() == csv_text and csv_text.count("\n") == len(MEASURES) + 1
    loaded = ls.load_result(tmp_path / "r.json")
    assert loaded.rows[5].measure == "worst_case" and loaded.rows[5].value == report.rows[5].value
    assert report["worst_case"] is report.rows[5]


def test_bad_input_raises_clear_errors():
    model, batches, obj = mlp_problem()
    with pytest.raises(ValueError, match="unknown measure"):
        sharpness(obj, "worst")
    with pytest.raises(TypeError, match="unknown option"):
        sharpness(obj, "worst_case", radius=0.1)
    with pytest.raises(ValueError, match="p must be 2 or inf"):
        sharpness(obj, "worst_case", p=1)
    with pytest.raises(ValueError, match="rho"):
        sharpness(obj, "average_case", rho=-1.0)
    with pytest.raises(TypeError, match="Objective"):
        sharpness(model, "worst_case")
    with pytest.raises(ValueError, match="deterministic"):
        sharpness(obj, "gradient_norm").ci()
    with pytest.raises(ValueError, match="even"):
        sharpness(obj, "pacbayes_flatness", samples=3)


def _snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [m.training for m in model.modules()],
    )


def _assert_same(model, snap):
    state, grads, modes = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for p, g in zip(model.parameters(), grads):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)
    assert [m.training for m in model.modules()] == modes


def test_model_bit_identical_after_calls_and_after_raising():
    from tests.references import make_cnn_bn

    model = make_cnn_bn()
    x, y = make_classification_data(12, image=True)
    model.train()
    model[0].weight.grad = torch.ones_like(model[0].weight)
    snap = _snapshot(model)
    obj = Objective(model, nn.CrossEntropyLoss(), [(x[:6], y[:6]), (x[6:], y[6:])], mode="train")
    for name, opts in [
        ("worst_case", {"iterations": 3, "adaptive": True, "eta": 0.01}),
        ("average_case", {"samples": 3}),
        ("keskar", {"iterations": 2}),
        ("fisher_worst_case", {"solver": "one_step"}),
        ("tracer", {"batch_size": 4}),
    ]:
        sharpness(obj, name, **opts)
        _assert_same(model, snap)

    calls = {"n": 0}

    def flaky(out, y):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("boom")
        return nn.functional.cross_entropy(out, y)

    bad = Objective(model, flaky, [(x, y)], mode="train")
    with pytest.raises(RuntimeError, match="boom"):
        sharpness(bad, "worst_case", iterations=10)
    _assert_same(model, snap)


def test_float32_objective_and_devices(devices):
    model, batches, _ = mlp_problem()
    ref = sharpness(
        Objective(model, nn.CrossEntropyLoss(), batches), "worst_case", rho=0.05, solver="one_step"
    )
    for device in devices:
        obj = Objective(model, nn.CrossEntropyLoss(), batches, dtype=torch.float32, device=device)
        r = sharpness(obj, "worst_case", rho=0.05, solver="one_step")
        assert r.value == pytest.approx(ref.value, rel=1e-4)
        assert r.config["objective"]["dtype"] == "float32"
        avg = sharpness(obj, "average_case", rho=1e-2, samples=4, seed=0)
        avg64 = sharpness(
            Objective(model, nn.CrossEntropyLoss(), batches), "average_case", rho=1e-2, samples=4, seed=0
        )
        assert avg.value == pytest.approx(avg64.value, rel=1e-2, abs=1e-6)
