"""Curvature operators vs independent dense float64 references (tests/references.py)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature import FisherOperator, GGNOperator, HessianOperator
from tests import references as ref


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _uneven(n):
    return [3, n - 3 - 5, 5]


# name -> (model, loss_fn, batches, names)
def _case(name: str):
    x, y = ref.make_classification_data(22)
    if name == "tanh_ce_mean_uneven":
        return ref.make_mlp((4, 6, 3)), nn.CrossEntropyLoss(), ref.split_batches(x, y, _uneven(22)), None
    if name == "tanh_ce_sum_uneven":
        m = ref.make_mlp((4, 6, 3), seed=1)
        return m, nn.CrossEntropyLoss(reduction="sum"), ref.split_batches(x, y, _uneven(22)), None
    if name == "relu_ce_mean_single":
        return ref.make_mlp((4, 7, 3), "relu"), nn.CrossEntropyLoss(), [(x, y)], None
    if name == "relu_ce_sum_ones":
        return (
            ref.make_mlp((4, 5, 3), "relu", seed=2),
            nn.CrossEntropyLoss(reduction="sum"),
            ref.split_batches(x[:6], y[:6], [1] * 6),
            None,
        )
    if name == "elu_deep_ce_mean":
        return (
            ref.make_mlp((4, 5, 4, 3), "elu"),
            nn.CrossEntropyLoss(),
            ref.split_batches(x, y, [1, 21]),
            None,
        )
    if name.startswith("cnn_bn"):
        xi, yi = ref.make_classification_data(13, image=True)
        model = ref.make_cnn_bn()
        model.eval()
        if name == "cnn_bn_ce_mean_uneven":
            return model, nn.CrossEntropyLoss(), ref.split_batches(xi, yi, [4, 9]), None
        if name == "cnn_bn_ce_sum":
            return model, nn.CrossEntropyLoss(reduction="sum"), [(xi, yi)], None
        if name == "cnn_bn_subset_bn":
            return model, nn.CrossEntropyLoss(), ref.split_batches(xi, yi, [6, 7]), ["1.weight", "1.bias"]
        if name == "cnn_bn_mse":
            return model, nn.MSELoss(), ref.split_batches(xi, _randn(13, 3), [5, 8]), None
    if name == "unused_ce_mean":
        return ref.UnusedParamNet(), nn.CrossEntropyLoss(), ref.split_batches(x, y, _uneven(22)), None
    if name == "unused_mse_sum":
        return (
            ref.UnusedParamNet(d_out=2),
            nn.MSELoss(reduction="sum"),
            ref.split_batches(x, _randn(22, 2), [10, 12]),
            None,
        )
    if name == "unused_in_subset":
        return ref.UnusedParamNet(), nn.CrossEntropyLoss(), [(x, y)], ["fc2.bias", "unused"]
    if name == "subset_first_weight":
        return (
            ref.make_mlp((4, 6, 3)),
            nn.CrossEntropyLoss(),
            ref.split_batches(x, y, _uneven(22)),
            ["0.weight"],
        )
    if name == "subset_last_layer_sum":
        return ref.make_mlp((4, 6, 3)), nn.CrossEntropyLoss(reduction="sum"), [(x, y)], ["2.weight", "2.bias"]
    if name.startswith("dict"):
        g = torch.Generator().manual_seed(5)
        inp = {
            "a": torch.randn(14, 3, generator=g, dtype=torch.float64),
            "b": torch.randn(14, 2, generator=g, dtype=torch.float64),
        }
        yy = torch.randint(0, 3, (14,), generator=g) if name == "dict_ce_mean" else _randn(14, 3, seed=6)
        batches = [({k: v[:5] for k, v in inp.items()}, yy[:5]), ({k: v[5:] for k, v in inp.items()}, yy[5:])]
        loss = nn.CrossEntropyLoss() if name == "dict_ce_mean" else nn.MSELoss()
        return ref.DictInputNet(), loss, batches, None
    if name == "mse_mean_uneven":
        return ref.make_mlp((4, 5, 2)), nn.MSELoss(), ref.split_batches(x, _randn(22, 2), _uneven(22)), None
    if name == "mse_sum":
        return (
            ref.make_mlp((4, 5, 2), "relu", seed=3),
            nn.MSELoss(reduction="sum"),
            ref.split_batches(x, _randn(22, 2, seed=1), [11, 11]),
            None,
        )
    if name == "bce_mean_one_logit":
        yb = (y == 1).double().reshape(-1, 1)
        return ref.make_mlp((4, 5, 1)), nn.BCEWithLogitsLoss(), ref.split_batches(x, yb, _uneven(22)), None
    if name == "bce_sum_multilabel":
        yb = (_randn(22, 3, seed=4) > 0).double()
        return (
            ref.make_mlp((4, 5, 3)),
            nn.BCEWithLogitsLoss(reduction="sum"),
            ref.split_batches(x, yb, [7, 15]),
            None,
        )
    raise KeyError(name)


CASES = [
    "tanh_ce_mean_uneven",
    "tanh_ce_sum_uneven",
    "relu_ce_mean_single",
    "relu_ce_sum_ones",
    "elu_deep_ce_mean",
    "cnn_bn_ce_mean_uneven",
    "cnn_bn_ce_sum",
    "cnn_bn_subset_bn",
    "cnn_bn_mse",
    "unused_ce_mean",
    "unused_mse_sum",
    "unused_in_subset",
    "subset_first_weight",
    "subset_last_layer_sum",
    "dict_ce_mean",
    "dict_mse_mean",
    "mse_mean_uneven",
    "mse_sum",
    "bce_mean_one_logit",
    "bce_sum_multilabel",
]


class _ConcatInputs(nn.Module):
    """DictInputNet fed with one ``[B, 5]`` tensor (same parameters, same order)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net({"a": z[:, :3], "b": z[:, 3:]})


@functools.cache
def _reference(name: str, kind: str) -> torch.Tensor:
    model, loss, batches, names = _case(name)
    fn = {"hessian": ref.dense_hessian, "ggn": ref.dense_ggn, "ef": ref.dense_empirical_fisher}[kind]
    if isinstance(batches[0][0], dict):  # the per-example reference takes tensor inputs: wrap the net
        model = _ConcatInputs(model)
        batches = [(torch.cat([x["a"], x["b"]], dim=1), y) for x, y in batches]
    return fn(model, loss, batches, names=names, reduction=loss.reduction)


def _state(model):
    return (
        [p.detach().clone() for p in model.parameters()],
        [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        [b.clone() for b in model.buffers()],
        [m.training for m in model.modules()],
    )


def _same(model, st) -> bool:
    p, g, b, f = st
    return (
        all(torch.equal(a.detach(), c) for a, c in zip(model.parameters(), p))
        and all(
            (a.grad is None and c is None) or torch.equal(a.grad, c) for a, c in zip(model.parameters(), g)
        )
        and all(torch.equal(a, c) for a, c in zip(model.buffers(), b))
        and [m.training for m in model.modules()] == f
    )


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("kind", ["hessian", "ggn", "ef"])
def test_operator_matches_dense_reference(name, kind):
    model, loss, batches, names = _case(name)
    model.train()  # the objective uses eval mode and must restore this
    for i, p in enumerate(model.parameters()):
        p.grad = None if i == 0 else torch.full_like(p, 0.5)
    st = _state(model)
    obj = ls.Objective(model, loss, batches, params=names)
    op = {"hessian": ls.hessian, "ggn": ls.ggn, "ef": ls.empirical_fisher}[kind](obj)
    want = _reference(name, kind)
    assert op.shape == tuple(want.shape)
    got = op.to_dense(chunk_size=128)
    assert _rel(got, want) <= 1e-10
    assert op.matvecs == want.shape[0]
    v = _randn(want.shape[0], seed=7)
    assert _rel(op @ v, want @ v) <= 1e-10
    assert _same(model, st)


@pytest.mark.parametrize("name", ["tanh_ce_mean_uneven", "cnn_bn_ce_sum", "dict_ce_mean", "unused_ce_mean"])
@pytest.mark.parametrize("engine", ["forward_over_reverse", "double_backward"])
def test_hessian_engines(name, engine):
    model, loss, batches, names = _case(name)
    obj = ls.Objective(model, loss, batches, params=names)
    op = ls.hessian(obj, engine=engine, chunk_size=5)
    assert op.engine_used == engine
    V = _randn(obj.num_params, 7, seed=2)
    want = _reference(name, "hessian") @ V
    assert _rel(op @ V, want) <= 1e-10
    assert _rel(op @ V, want) <= 1e-10  # second call (cached graph for single-batch objectives)


def test_finite_difference_engine_is_close():
    model, loss, batches, names = _case("tanh_ce_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    op = ls.hessian(obj, engine="finite_difference")
    V = _randn(obj.num_params, 3, seed=3)
    assert _rel(op @ V, _reference("tanh_ce_mean_uneven", "hessian") @ V) <= 1e-7


def test_auto_falls_back_once_and_records_it():
    model, loss, batches, _ = _case("mse_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    op = ls.hessian(obj)
    assert op.engine_used == "double_backward"  # CPU default: fastest engine there
    eng = ls.hessian(obj, engine="auto")
    eng.engine_used = "forward_over_reverse"  # what auto picks on accelerators
    V = _randn(obj.num_params, 4)
    want = _reference("mse_mean_uneven", "hessian") @ V
    assert _rel(eng.matmat(V), want) <= 1e-10
    assert eng.engine_used == "double_backward"
    assert "ZeroTensors" in eng.fallback_reason
    assert eng.config()["fallback_reason"] == eng.fallback_reason
    with pytest.raises(RuntimeError, match="engine='double_backward'"):
        ls.hessian(obj, engine="forward_over_reverse") @ V


def test_hvp_function_and_scipy():
    from scipy.sparse.linalg import eigsh

    model, loss, batches, _ = _case("tanh_ce_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    H = _reference("tanh_ce_mean_uneven", "hessian")
    v = _randn(obj.num_params, seed=9)
    assert _rel(ls.hvp(obj, v), H @ v) <= 1e-10
    assert _rel(ls.hvp(obj, v, engine="forward_over_reverse"), H @ v) <= 1e-10
    op = ls.hessian(obj)
    lo = op.to_scipy()
    x = np.random.default_rng(0).standard_normal(obj.num_params)
    assert np.allclose(lo @ x, (H @ torch.from_numpy(x)).numpy(), rtol=1e-10, atol=1e-14)
    vals = eigsh(lo, k=2, which="LA", tol=1e-10, return_eigenvectors=False)
    want = torch.linalg.eigvalsh(H)[-2:].numpy()
    assert np.allclose(np.sort(vals), want, rtol=1e-8)


@pytest.mark.parametrize("kind", ["hessian", "ggn", "ef"])
def test_batching_invariance(kind):
    model = ref.make_mlp((4, 6, 3))
    x, y = ref.make_classification_data(31)
    make = {"hessian": ls.hessian, "ggn": ls.ggn, "ef": ls.empirical_fisher}[kind]
    one = make(ls.Objective(model, nn.CrossEntropyLoss(), (x, y)))
    many = make(ls.Objective(model, nn.CrossEntropyLoss(), ref.split_batches(x, y, [1, 12, 3, 15])))
    V = _randn(one.shape[0], 5)
    a, b = one @ V, many @ V
    assert _rel(b, a) <= 1e-12


def test_operator_point_and_subset_and_config():
    model, loss, batches, _ = _case("tanh_ce_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    theta = obj.flat_params() + 0.05 * _randn(obj.num_params, seed=1)
    op = ls.hessian(obj, params=theta)
    shifted = ref.make_mlp((4, 6, 3))
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(theta, shifted.parameters())
    want = ref.dense_hessian(shifted, loss, batches)
    assert _rel(op.to_dense(), want) <= 1e-10
    assert torch.equal(obj.flat_params(), ref.flatten_params(model))  # model not moved
    cfg = op.config()
    assert cfg["operator"] == "hessian" and cfg["engine_used"] == "double_backward"
    assert cfg["objective"]["num_params"] == obj.num_params
    assert isinstance(op, ls.CurvatureOperator)


def test_fisher_equals_empirical_fisher_on_independently_sampled_labels():
    for name, likelihood in [
        ("tanh_ce_mean_uneven", "categorical"),
        ("mse_sum", "gaussian"),
        ("bce_mean_one_logit", "bernoulli"),
    ]:
        model, loss, batches, names = _case(name)
        S, seed = 3, 11
        op = ls.fisher(ls.Objective(model, loss, batches, params=names), samples=S, seed=seed)
        assert op.likelihood == likelihood
        g = torch.Generator().manual_seed(seed)
        augmented = []
        for x, _ in batches:
            with torch.no_grad():
                out = model(x).double()
            if likelihood == "categorical":
                draws = torch.multinomial(torch.softmax(out, 1), S, replacement=True, generator=g).T
            elif likelihood == "gaussian":
                # MSE is the negative log-likelihood of N(f, 1/2): (f - y)^2 = -log p + const
                draws = out + 0.5**0.5 * torch.randn((S, *out.shape), generator=g, dtype=torch.float64)
            else:
                draws = torch.bernoulli(torch.sigmoid(out).expand(S, *out.shape).contiguous(), generator=g)
            augmented += [(x, draws[s]) for s in range(S)]
        dense = ref.dense_empirical_fisher(model, loss, augmented, names=names, reduction=loss.reduction)
        if loss.reduction == "sum":
            dense = dense / S
        assert _rel(op.to_dense(), dense) <= 1e-10, name
        got = op.to_dense()
        assert torch.allclose(got, got.T, atol=1e-14) and float(torch.linalg.eigvalsh(got)[0]) > -1e-12


def test_fisher_expectation_is_ggn():
    """Exact expectation for CE: sum_c p_c g(c) g(c)^T = J^T H_out J, then Monte Carlo over seeds."""
    model = ref.make_mlp((3, 4, 3))
    x, y = ref.make_classification_data(8, d=3)
    loss = nn.CrossEntropyLoss()
    G = ref.dense_ggn(model, loss, [(x, y)])
    probs = torch.softmax(model(x), 1).detach()
    exact = torch.zeros_like(G)
    for c in range(3):
        gc = ref.per_example_gradients(model, loss, [(x, torch.full_like(y, c))])
        exact += (gc * probs[:, c : c + 1]).T @ gc / len(y)
    assert _rel(exact, G) <= 1e-10
    obj = ls.Objective(model, loss, [(x, y)])
    avg = sum(ls.fisher(obj, samples=50, seed=s).to_dense() for s in range(12)) / 12
    one = ls.fisher(obj, samples=1, seed=0).to_dense()
    err_avg, err_one = _rel(avg, G), _rel(one, G)
    assert err_avg <= 0.08 and err_avg <= err_one / 4, (err_avg, err_one)


def test_fisher_mse_expectation_is_ggn():
    model = ref.make_mlp((3, 4, 2))
    x = ref.make_classification_data(6, d=3)[0]
    t = _randn(6, 2)
    obj = ls.Objective(model, nn.MSELoss(), [(x, t)])
    G = ref.dense_ggn(model, nn.MSELoss(), [(x, t)])
    avg = ls.fisher(obj, samples=4000, seed=1).to_dense()
    assert _rel(avg, G) <= 0.07  # the likelihood N(f, 1/2) whose negative log is the MSE


def test_fisher_is_fixed_and_reproducible():
    model, loss, batches, _ = _case("tanh_ce_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    a, b = ls.fisher(obj, samples=2, seed=4), ls.fisher(obj, samples=2, seed=4)
    V = _randn(obj.num_params, 3)
    assert torch.equal(a @ V, b @ V) and torch.equal(a @ V, a @ V)
    assert not torch.equal(a @ V, ls.fisher(obj, samples=2, seed=5) @ V)
    assert a.config()["samples"] == 2 and a.config()["seed"] == 4


def test_model_identical_after_raising_call():
    model, _, batches, _ = _case("tanh_ce_mean_uneven")
    calls = {"n": 0, "fail": False}

    def loss(out, t):
        if calls["fail"]:
            raise RuntimeError("loss failed")
        return nn.functional.cross_entropy(out, t)

    model.train()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    st = _state(model)
    obj = ls.Objective(model, loss, batches)
    for make in (HessianOperator, GGNOperator, ls.empirical_fisher):
        op = make(obj)
        calls["fail"] = True
        with pytest.raises(RuntimeError, match="loss failed"):
            op @ _randn(obj.num_params)
        calls["fail"] = False
        assert _same(model, st)
    # the Monte-Carlo Fisher differentiates its likelihood, not the loss: fail in the forward instead
    op = FisherOperator(obj, likelihood="categorical")

    def fail(module, args, out):
        raise RuntimeError("forward failed")

    hook = model.register_forward_hook(fail)
    try:
        with pytest.raises(RuntimeError, match="forward failed"):
            op @ _randn(obj.num_params)
    finally:
        hook.remove()
    assert _same(model, st)


def test_errors():
    model, loss, batches, _ = _case("tanh_ce_mean_uneven")
    obj = ls.Objective(model, loss, batches)
    op = ls.hessian(obj)
    p = obj.num_params
    with pytest.raises(ValueError, match=rf"shape \[{p}\].*got \({p + 1},\)"):
        op @ torch.zeros(p + 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"\[{p}, k\]"):
        op.matmat(torch.zeros(p - 1, 2))
    with pytest.raises(TypeError, match="torch.Tensor"):
        op.matmat(np.zeros((p, 1)))
    with pytest.raises(ValueError, match="engine must be one of"):
        ls.hessian(obj, engine="magic")
    with pytest.raises(ValueError, match="samples"):
        ls.fisher(obj, samples=0)
    with pytest.raises(ValueError, match="likelihood="):
        ls.fisher(ls.Objective(model, nn.HuberLoss(), (batches[0][0], _randn(3, 3))))
    with pytest.raises(ValueError, match="label smoothing"):
        ls.fisher(ls.Objective(model, nn.CrossEntropyLoss(label_smoothing=0.1), batches))
    with pytest.raises(TypeError, match="landscape.Objective"):
        ls.ggn(model)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["hessian", "ggn", "ef", "fisher"])
def test_operators_on_cuda_match_cpu(kind):
    model, loss, batches, _ = _case("cnn_bn_ce_mean_uneven")
    make = {"hessian": ls.hessian, "ggn": ls.ggn, "ef": ls.empirical_fisher, "fisher": ls.fisher}[kind]
    cpu = make(ls.Objective(model, loss, batches))
    gpu = make(ls.Objective(model, loss, batches, device="cuda"))
    assert gpu.device.type == "cuda" and next(model.parameters()).device.type == "cpu"
    V = _randn(cpu.shape[0], 4)
    assert _rel((gpu @ V.cuda()).cpu(), cpu @ V) <= 1e-10
    if kind == "hessian":
        assert gpu.engine_used in ("forward_over_reverse", "double_backward")


@pytest.mark.gpu
def test_auto_engine_on_cuda_double_backward_for_few_vectors_forward_mode_for_blocks():
    model, loss, batches, _ = _case("cnn_bn_ce_mean_uneven")
    cpu = ls.hessian(ls.Objective(model, loss, batches))
    gpu = ls.hessian(ls.Objective(model, loss, batches, device="cuda"))
    for k, engine in [(1, "double_backward"), (8, "forward_over_reverse"), (2, "double_backward")]:
        V = _randn(cpu.shape[0], k)
        assert _rel((gpu @ V.cuda()).cpu(), cpu @ V) <= 1e-10
        assert gpu.engine_used == engine
