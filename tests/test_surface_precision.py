"""Loss surfaces within a memory budget (batch_points="auto", max_memory=) and in reduced precision
(precision="float32"/"tf32"/"bf16", with the error against full precision recorded)."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from landscape import directions as D
from landscape.curvature.memory import PeakTracker
from landscape.objective import Objective
from landscape.surface import surface
from landscape.surface.budget import PointChunks
from landscape.surface.evaluators import _VmapEvaluator
from landscape.surface.precision import Precision, error_stats
from tests.references import make_classification_data, make_cnn_bn, make_mlp, split_batches
from tests.test_surface import assert_same, snapshot

CE = nn.CrossEntropyLoss()


# ----------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def linear_setup():
    """A float64 linear model with MSE: the loss at every point has a closed form."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 6, generator=g, dtype=torch.float64)
    y = torch.randn(120, 3, generator=g, dtype=torch.float64)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 3)).double()
    obj = Objective(model, nn.MSELoss(), split_batches(x, y, [50, 40, 30]))
    d1, d2 = D.random(obj, seed=2), D.random(obj, seed=3)
    return model, x, y, obj, d1, d2


def closed_form(model, x, y, dirs, c) -> float:
    """``mean((X W(c)^T + b(c) - Y)^2)`` with ``W(c) = W + sum_i c_i D_i`` (and ``b`` alike)."""
    W, b = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    for ci, d in zip(c, dirs):
        W, b = W + ci * d["0.weight"], b + ci * d["0.bias"]
    return float(((x @ W.T + b - y) ** 2).mean())


def evaluate_peak(obj, dirs, points) -> int:
    """Peak bytes (PeakTracker) of one vmap evaluate call on ``points``, as the surface runs it."""
    with obj.guard(), torch.no_grad():
        ev = _VmapEvaluator(obj, dirs, "eval")
        ev.want_accuracy = False
        with PeakTracker() as t:
            ev.evaluate(points)
    return t.peak


def legacy_flags():
    return (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.backends.cuda.matmul.fp32_precision,
        torch.backends.mkldnn.matmul.fp32_precision,
        torch.backends.cudnn.conv.fp32_precision,
    )


@pytest.fixture
def odd_flags():
    """Non-default global flags for the duration of a test (restored by hand afterwards)."""
    before = legacy_flags()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("medium")
    try:
        yield legacy_flags()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before[0]
        torch.backends.cudnn.allow_tf32 = before[1]
        torch.set_float32_matmul_precision(before[2])
        torch.backends.cuda.matmul.fp32_precision = before[3]
        torch.backends.mkldnn.matmul.fp32_precision = before[4]
        torch.backends.cudnn.conv.fp32_precision = before[5]


# ----------------------------------------------------------------------------- batch_points="auto"
def test_auto_chunk_fits_budget_and_values_are_exact(linear_setup):
    model, x, y, obj, d1, d2 = linear_setup
    xs, ys = np.linspace(-1, 1, 7), np.linspace(-0.5, 1.5, 6)
    p1 = evaluate_peak(obj, [d1, d2], [(0.1, 0.2)])
    p2 = evaluate_peak(obj, [d1, d2], [(0.1, 0.2), (0.3, -0.4)])
    assert 0 < p1 < p2
    budget = p1 + int(4.5 * (p2 - p1))
    snap = snapshot(model)
    s = surface(
        obj, [d1, d2], [xs, ys], strategy="vmap", batch_points="auto", max_memory=budget, metrics=("loss",)
    )
    assert_same(model, snap)
    bp = s.config["batch_points"]
    k = bp["used"]
    assert bp["requested"] == "auto" and bp["budget_bytes"] == budget and bp["tracker"] == "dispatch"
    assert k >= 3 and bp["chosen"] == k and bp["peaks"]["1"] == p1 and bp["peaks"]["2"] == p2
    assert bp["measured_chunks"][:3] == [1, 2, k] and "points per call" in bp["reason"]
    assert bp["fit"]["b"] == pytest.approx(p2 - p1) and bp["fit"]["a"] == pytest.approx(2 * p1 - p2)
    pts = [(float(a), float(b)) for a in xs[: k // 2 + 1] for b in ys][:k]
    assert evaluate_peak(obj, [d1, d2], pts) <= budget  # the chosen chunk, measured independently
    assert evaluate_peak(obj, [d1, d2], [*pts, (0.0, 0.0)]) > budget  # and the largest one
    # every point is independent: bit-identical whatever the chunking, and the closed form
    one = surface(obj, [d1, d2], [xs, ys], strategy="vmap", batch_points=1, metrics=("loss",))
    np.testing.assert_array_equal(s.loss, one.loss)
    for bpts in (5, 64):
        fixed = surface(obj, [d1, d2], [xs, ys], strategy="vmap", batch_points=bpts, metrics=("loss",))
        np.testing.assert_array_equal(s.loss, fixed.loss)
    loop = surface(obj, [d1, d2], [xs, ys], strategy="loop", metrics=("loss",))
    np.testing.assert_allclose(s.loss, loop.loss, rtol=0, atol=1e-12)
    exact = np.array([[closed_form(model, x, y, [d1, d2], (a, b)) for b in ys] for a in xs])
    np.testing.assert_allclose(s.loss, exact, rtol=0, atol=1e-12)


def test_budget_too_small_for_two_points_runs_one_per_call(linear_setup):
    model, x, y, obj, d1, d2 = linear_setup
    xs = np.linspace(-1, 1, 5)
    p1 = evaluate_peak(obj, [d1], [(0.5,)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one point fits: no warning
        s = surface(obj, [d1], [xs], strategy="vmap", max_memory=int(1.5 * p1), metrics=("loss",))
    bp = s.config["batch_points"]
    assert bp["used"] == 1 and bp["chunks"] == {"1": 5} and bp["requested"] is None
    assert bp["reason"].startswith("one point per call: two points could exceed the budget")
    assert bp["measured_chunks"] == [1] and bp["peaks"] == {"1": p1} and bp["warning"] is None
    np.testing.assert_array_equal(
        s.loss, surface(obj, [d1], [xs], strategy="vmap", batch_points=1, metrics=("loss",)).loss
    )
    np.testing.assert_allclose(s.loss, [closed_form(model, x, y, [d1], (c,)) for c in xs], rtol=0, atol=1e-12)
    with pytest.warns(RuntimeWarning, match="one grid point needs"):
        t = surface(obj, [d1], [xs], strategy="vmap", max_memory=p1 // 2, metrics=("loss",))
    assert t.config["batch_points"]["used"] == 1 and "one point needs" in t.config["batch_points"]["reason"]
    np.testing.assert_array_equal(t.loss, s.loss)


def test_batch_points_defaults_and_bad_values(linear_setup):
    _, _, _, obj, d1, _ = linear_setup
    xs = np.linspace(-1, 1, 3)
    s = surface(obj, [d1], [xs], strategy="vmap", metrics=("loss",))  # CPU: 64, as before
    assert s.config["batch_points"] == {
        "requested": None,
        "used": 64,
        "reason": s.config["batch_points"]["reason"],
    }
    assert "default on cpu" in s.config["batch_points"]["reason"]
    loop = surface(obj, [d1], [xs], strategy="loop", batch_points="auto", metrics=("loss",))
    assert (
        loop.config["batch_points"]["used"] == 64
        and "one point per call" in loop.config["batch_points"]["reason"]
    )
    for bad in (0, -3, 2.5, "big", True):
        with pytest.raises(ValueError, match="batch_points must be a positive int or 'auto'"):
            surface(obj, [d1], [xs], strategy="vmap", batch_points=bad)
    with pytest.raises(ValueError, match="max_memory chooses batch_points"):
        surface(obj, [d1], [xs], strategy="vmap", batch_points=8, max_memory="1MB")
    with pytest.raises(ValueError, match="not a memory size"):
        surface(obj, [d1], [xs], strategy="vmap", max_memory="lots")


def test_convolutions_agree_across_chunk_widths_to_rounding():
    """Batched convolutions may pick another kernel per chunk width (module docstring of
    landscape.surface.budget): the values agree to rounding, not necessarily bit for bit."""
    x, y = make_classification_data(n=40, n_classes=3, seed=4, image=True)
    obj = Objective(make_cnn_bn(seed=5), CE, (x, y))
    d1, d2 = D.random(obj, "filter", seed=6), D.random(obj, "filter", seed=7)
    cs = [np.linspace(-1, 1, 4), np.linspace(-1, 1, 3)]
    auto = surface(obj, [d1, d2], cs, strategy="vmap", max_memory="1GiB")
    for other in (
        surface(obj, [d1, d2], cs, strategy="vmap", batch_points=1),
        surface(obj, [d1, d2], cs, strategy="loop"),
    ):
        np.testing.assert_allclose(auto.loss, other.loss, rtol=1e-13, atol=0)
        np.testing.assert_array_equal(auto.accuracy, other.accuracy)


# ----------------------------------------------------------------------------- precision
@pytest.fixture(scope="module")
def f32_setup():
    x, y = make_classification_data(n=200, d=10, n_classes=4, seed=8, dtype=torch.float32)
    model = make_mlp((10, 32, 16, 4), seed=9, dtype=torch.float32)
    obj = Objective(model, CE, split_batches(x, y, [120, 80]))
    return model, obj, D.random(obj, "filter", seed=10), D.random(obj, "filter", seed=11)


@pytest.mark.parametrize("strategy", ["loop", "linear_first_layer", "vmap"])
def test_bf16_within_tolerance_and_error_report_is_recomputable(f32_setup, strategy):
    model, obj, d1, d2 = f32_setup
    cs = [np.linspace(-1, 1, 5), np.linspace(-1, 1, 5)]
    snap = snapshot(model)
    full = surface(obj, [d1, d2], cs, strategy=strategy)
    low = surface(obj, [d1, d2], cs, strategy=strategy, precision="bf16")
    assert_same(model, snap)
    np.testing.assert_allclose(low.loss, full.loss, rtol=2e-2)
    assert full.config["precision"]["error"] is None and full.config["precision"]["used"] == "default"
    p = low.config["precision"]
    assert p["requested"] == "bf16" and "autocast" in p["effect"]
    err = p["error"]
    idx = [tuple(ix) for ix in err["points"]]
    assert idx == [(i, j) for i in (0, 2, 4) for j in (0, 2, 4)]  # corners, edge midpoints, centre
    ref = np.array([full.loss[ix] for ix in idx])
    red = np.array([low.loss[ix] for ix in idx])
    assert err["loss_full"] == ref.tolist() and err["loss_reduced"] == red.tolist()
    stats = error_stats(red, ref)
    diff = np.abs(red - ref)
    assert stats["loss_abs_diff_max"] == diff.max() and stats["loss_rel_diff_median"] == np.median(
        diff / np.abs(ref)
    )
    for key, value in stats.items():
        assert err[key] == value, key
    assert 0 < err["loss_abs_diff_max"] and err["loss_rel_diff_max"] < 2e-2  # bf16 did something
    acc = np.abs(np.array([low.accuracy[ix] for ix in idx]) - np.array([full.accuracy[ix] for ix in idx]))
    assert err["accuracy_abs_diff_max"] == acc.max() and err["accuracy_abs_diff_median"] == np.median(acc)


def test_tf32_on_cpu_is_float32_bit_for_bit(f32_setup):
    _, obj, d1, d2 = f32_setup
    cs = [np.linspace(-1, 1, 4), np.linspace(-1, 1, 3)]
    base = surface(obj, [d1, d2], cs, strategy="vmap")
    for prec in ("float32", "tf32"):
        s = surface(obj, [d1, d2], cs, strategy="vmap", precision=prec)
        np.testing.assert_array_equal(s.loss, base.loss)
        np.testing.assert_array_equal(s.accuracy, base.accuracy)
        assert s.config["precision"]["error"] is None
    assert s.config["precision"]["effect"].startswith("no effect on cpu")
    assert s.config["precision"]["flags_during_call"] is None  # no flag touched


def test_bad_precision_values(f32_setup, linear_setup):
    _, obj, d1, _ = f32_setup
    with pytest.raises(ValueError, match=r"precision must be one of \('float32', 'tf32', 'bf16'\)"):
        surface(obj, [d1], [np.linspace(-1, 1, 3)], precision="fp16")
    _, _, _, obj64, e1, _ = linear_setup
    for prec in ("bf16", "tf32", "float32"):
        with pytest.raises(ValueError, match="needs a float32 objective.*float64.*silently mix"):
            surface(obj64, [e1], [np.linspace(-1, 1, 3)], precision=prec)


class Boom(nn.Module):
    """Cross-entropy that raises once armed, after recording the global state it saw."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.seen: list = []

    def forward(self, out, y):
        if self.armed:
            self.seen.append((legacy_flags(), torch.is_autocast_enabled("cpu"), out.dtype))
            raise RuntimeError("boom")
        return nn.functional.cross_entropy(out, y)


def test_flags_and_model_restored_also_on_error(f32_setup, odd_flags):
    model, obj, d1, d2 = f32_setup
    cs = [np.linspace(-1, 1, 3), np.linspace(-1, 1, 3)]
    model.train()
    model[0].weight.grad = torch.full_like(model[0].weight, 0.5)
    try:
        snap = snapshot(model)
        for prec in ("float32", "tf32", "bf16"):
            surface(obj, [d1, d2], cs, strategy="vmap", precision=prec)
            assert legacy_flags() == odd_flags and not torch.is_autocast_enabled("cpu")
            assert_same(model, snap)
        loss = Boom()
        bobj = Objective(model, loss, obj.data)
        loss.armed = True
        for prec, flags, autocast in (
            ("float32", (False, False, "highest"), False),
            ("bf16", odd_flags[:3], True),
            ("tf32", odd_flags[:3], False),  # on CPU: nothing touched
        ):
            with pytest.raises(RuntimeError, match="boom"):
                surface(bobj, [d1, d2], cs, strategy="loop", precision=prec)
            seen_flags, seen_autocast, out_dtype = loss.seen[-1]
            assert seen_flags[:3] == flags and seen_autocast is autocast
            assert out_dtype == (torch.bfloat16 if prec == "bf16" else torch.float32)
            assert legacy_flags() == odd_flags and not torch.is_autocast_enabled("cpu")
            assert_same(model, snap)
    finally:
        model.eval()
        model[0].weight.grad = None


def test_tf32_context_on_cuda_sets_and_restores_flags(f32_setup, odd_flags):
    """The CUDA branch only sets flags: checked without a GPU by pointing the context at cuda."""
    _, obj, _, _ = f32_setup
    p = Precision("tf32", obj)
    p.device = torch.device("cuda")
    with pytest.raises(KeyError):
        with p.context():
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
            assert torch.get_float32_matmul_precision() == "high"
            raise KeyError("inside")
    assert legacy_flags() == odd_flags
    assert p.flags_during["cudnn.allow_tf32"] is True
    with p.full_precision():
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert legacy_flags() == odd_flags


def test_resume_refuses_another_precision(f32_setup, tmp_path):
    _, obj, d1, d2 = f32_setup
    cs = [np.linspace(-1, 1, 3), np.linspace(-1, 1, 3)]
    path = tmp_path / "s.npz"
    s = surface(obj, [d1, d2], cs, strategy="loop", precision="bf16", resume=path)
    again = surface(obj, [d1, d2], cs, strategy="loop", precision="bf16", resume=path)
    np.testing.assert_array_equal(again.loss, s.loss)
    assert again.evaluations == 0 and again.config["precision"]["error"] == s.config["precision"]["error"] | {
        "seconds": again.config["precision"]["error"]["seconds"]
    }
    with pytest.raises(ValueError, match="precision"):
        surface(obj, [d1, d2], cs, strategy="loop", resume=path)


def test_error_subset_shapes(monkeypatch):
    assert len(Precision.subset((5, 5))) == 9 and Precision.subset((2, 7))[:3] == [(0, 0), (0, 3), (0, 6)]
    assert [ix[0] for ix in Precision.subset((20,))] == [0, 2, 5, 7, 10, 12, 14, 17, 19]
    assert Precision.subset((4,)) == [(0,), (1,), (2,), (3,)]
    monkeypatch.setattr(
        importlib.import_module("landscape.surface.budget"), "free_memory", lambda device: 2**30
    )
    gpu = PointChunks(None, None, "vmap", "cuda")  # the GPU default: auto, half the free memory
    assert gpu.auto and gpu.budget == 2**29 and gpu.config()["budget_from"].startswith("default: 50%")
    cpu = PointChunks(None, None, "vmap", "cpu")
    assert not cpu.auto and cpu.width == 64


class FakeEvaluator:
    """Allocates ``peak_of(k, first_call)`` bytes per call of ``k`` points (seen by PeakTracker)."""

    def __init__(self, peak_of):
        self.peak_of, self.calls = peak_of, []

    def evaluate(self, points):
        nbytes = self.peak_of(len(points), not self.calls)
        self.calls.append((len(points), nbytes))
        x = torch.empty(nbytes, dtype=torch.uint8)
        del x
        return [(0.0, None)] * len(points)


def drive(plan, ev, n):
    start = 0
    while start < n:
        w = plan.next(n - start)
        plan.evaluate(ev, [(0.0,)] * w)
        start += w


def test_plan_grows_past_first_call_costs_and_shrinks_when_superlinear():
    # one-time costs in the first call spoil the (1, 2) fit (b = 0): the width grows in steps from
    # measured points (never past 4x or the line through the origin) to the exact optimum
    plan, ev = (
        PointChunks("auto", 20_000, "vmap", "cpu"),
        FakeEvaluator(lambda k, f: 1000 + 100 * k + 5000 * f),
    )
    drive(plan, ev, 2000)
    assert [k for k, _ in ev.calls[:5]] == [1, 2, 33, 153, 190] and plan.config()["used"] == 190
    assert all(nb <= 20_000 for _, nb in ev.calls) and plan.config()["fit"] == {"a": 1000.0, "b": 100.0}
    # a superlinear peak: the chunk the line predicts is over the budget, k shrinks to a measured fit
    plan, ev = (
        PointChunks("auto", 20_000, "vmap", "cpu"),
        FakeEvaluator(lambda k, f: 1000 + 100 * k + 2 * k * k),
    )
    drive(plan, ev, 2000)
    cfg = plan.config()
    assert cfg["used"] == 50 and cfg["peaks"]["112"] > 20_000 and "112 points measured" in cfg["reason"]
    assert {nb for k, nb in ev.calls if k == cfg["used"]} == {cfg["peaks"]["50"]} and cfg["peaks"][
        "50"
    ] <= 20_000
