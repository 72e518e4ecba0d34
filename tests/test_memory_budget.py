"""Curvature blocks within a memory budget (``max_memory=``, landscape.curvature.memory): the peak
tracker against allocations of known size (plain, under ``vmap`` and forward-mode AD), budgeted
16-column blocks of the Hessian, GGN and Fisher under 3x the peak of one product while the
unbudgeted block is over it, budgeted products equal to the unbudgeted ones and to a dense float64
Hessian, what ``config()`` records, budget errors, and the caller's model left untouched."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn
from torch.func import functional_call

import landscape as ls
from landscape.curvature import HVPEngine, memory
from landscape.curvature.memory import BlockBudget, PeakTracker, parse_budget, track_peak

F64 = 8


# --------------------------------------------------------------------------------------------
# the tracker
# --------------------------------------------------------------------------------------------
def test_tracker_counts_plain_tensors_to_the_byte():
    with track_peak() as t:
        a = torch.empty(1000)  # 4000 B
        b = torch.zeros(250, dtype=torch.float64)  # 2000 B
        v = a.view(10, 100)  # a view: no new memory
        a.add_(1.0)  # in place: no new memory
        del a, v
        c = torch.ones(3, dtype=torch.int64)  # 24 B, after a's 4000 B were freed
    assert t.peak == 6000
    assert t.live == 2000 + 24
    del b, c


def test_tracker_ignores_what_existed_before_the_block():
    x = torch.randn(200, 200)
    with track_peak() as t:
        y = x.T  # a view of an existing storage
        x.mul_(2.0)
        z = x.clone()
    assert t.peak == t.live == 200 * 200 * 4
    del y, z


def test_tracker_matmul_chain():
    """``(A B) C`` with ``A: [64, 128]``, ``B: [128, 32]``, ``C: [32, 16]``: the intermediate
    ``[64, 32]`` and the result ``[64, 16]`` are alive together at the peak."""
    g = torch.Generator().manual_seed(0)
    A, B, C = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((64, 128), (128, 32), (32, 16)))
    with track_peak() as t:
        out = (A @ B) @ C
    expected = (64 * 32 + 64 * 16) * F64
    assert abs(t.peak - expected) <= 0.03 * expected
    assert t.live == 64 * 16 * F64
    del out


def test_tracker_sees_vmap_and_forward_mode_allocations():
    W = torch.randn(100, 100, dtype=torch.float64)
    xs = torch.randn(7, 100, dtype=torch.float64)
    with track_peak() as t:
        out = torch.func.vmap(lambda x: (W * x).sum(0))(xs)  # a batched [7, 100, 100] product
    assert t.peak >= 7 * 100 * 100 * F64
    assert t.live == 7 * 100 * F64
    del out
    tangent = torch.ones_like(W)
    with track_peak() as t, fwAD.dual_level():
        y = fwAD.make_dual(W, tangent) * 3.0  # primal and tangent: two [100, 100] results
        primal, tan = fwAD.unpack_dual(y)
        assert torch.equal(tan, torch.full_like(W, 3.0))
    assert t.peak >= 2 * 100 * 100 * F64
    with track_peak() as t:
        _, jv = torch.func.jvp(lambda w: (w @ w).sin(), (W,), (tangent,))
    assert t.peak >= 3 * 100 * 100 * F64  # w @ w, its tangent and the sin
    del y, primal, tan, jv


def test_track_peak_method_checks():
    with pytest.raises(ValueError, match="CUDA"):
        with track_peak("cpu", method="allocator"):
            pass
    with pytest.raises(ValueError, match="method"):
        with track_peak("cpu", method="guess"):
            pass
    assert isinstance(PeakTracker(), torch.utils._python_dispatch.TorchDispatchMode)


# --------------------------------------------------------------------------------------------
# budgets
# --------------------------------------------------------------------------------------------
def test_parse_budget_forms():
    assert parse_budget(None, "cpu") is None
    assert parse_budget(12345, "cpu") == 12345
    assert parse_budget("2GiB", "cpu") == 2 * 2**30
    assert parse_budget("512MB", "cpu") == 512 * 10**6
    assert parse_budget(" 1.5 kib ", "cpu") == 1536
    assert parse_budget("1000", "cpu") == 1000
    free = memory.free_memory("cpu")
    assert free > 0
    assert 0 < parse_budget(0.5, "cpu") <= free
    assert 0 < parse_budget("25%", "cpu") <= free


@pytest.mark.parametrize(
    "bad, problem",
    [
        ("-1", "not a positive size"),
        ("lots", "not a memory size"),
        ("5 parsecs", "not a memory size"),
        (0, "not positive"),
        (-3, "not positive"),
        (1.5, r"fraction of the free device memory in \(0, 1\]"),
        (0.0, r"fraction of the free device memory in \(0, 1\]"),
        (float("nan"), r"fraction of the free device memory in \(0, 1\]"),
        ("150%", "more than all of the free memory"),
    ],
)
def test_bad_budgets_raise_naming_the_problem_and_the_fix(bad, problem):
    model, obj = _mlp_objective(n=32)
    before = _snapshot(model)
    for build in (ls.hessian, ls.ggn, ls.fisher, ls.empirical_fisher):
        with pytest.raises(ValueError, match=problem) as err:
            build(obj, max_memory=bad)
        assert "'2GiB'" in str(err.value) and "None for no limit" in str(err.value)  # the fix
    with pytest.raises(TypeError, match="max_memory must be"):
        ls.hessian(obj, max_memory=[1])
    _assert_same(model, before)


def test_fraction_without_meminfo_is_a_clear_error(monkeypatch):
    import builtins

    real_open = builtins.open

    def no_meminfo(path, *a, **kw):
        if str(path) == "/proc/meminfo":
            raise OSError("no such file")
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", no_meminfo)
    with pytest.raises(ValueError, match="MemAvailable.*pass bytes"):
        parse_budget(0.5, "cpu")
    assert parse_budget("1GiB", "cpu") == 2**30  # bytes need no free-memory lookup


# --------------------------------------------------------------------------------------------
# budgeted blocks
# --------------------------------------------------------------------------------------------
def _mlp_objective(n: int = 512, seed: int = 0):
    """A float64 tanh MLP (5,829 parameters) on ``n`` examples: activations dominate the products."""
    torch.manual_seed(seed)
    layers = [nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5)]
    model = nn.Sequential(*layers).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(n, 20, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (n,), generator=g)
    return model, ls.Objective(model, nn.CrossEntropyLoss(), (x, y))


def _probes(p: int, k: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(p, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _peak(op, V):
    with track_peak() as t:
        out = op @ V
    return t.peak, out


BUILDERS = {
    "hessian": lambda obj, **kw: ls.hessian(obj, engine="forward_over_reverse", **kw),
    "ggn": lambda obj, **kw: ls.ggn(obj, **kw),
    "fisher": lambda obj, **kw: ls.fisher(obj, samples=1, seed=0, **kw),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_sixteen_columns_stay_under_three_single_products(kind):
    build = BUILDERS[kind]
    model, obj = _mlp_objective()
    V = _probes(obj.num_params, 16)
    single, _ = _peak(build(obj), V[:, :1])  # X: one product on a fresh operator
    whole, ref = _peak(build(obj), V)
    assert whole > 3 * single  # the unbudgeted block is over the budget ...
    op = build(obj, max_memory=3 * single)
    for call in range(2):  # first call: measured; second: the fit, nothing measured
        measured = op.config()["memory_budget"]["measured_columns"]
        peak, out = _peak(op, V)
        assert peak <= 3 * single  # ... the budgeted one is not
        scale = float(ref.abs().max())
        assert float((out - ref).abs().max()) <= 1e-12 * scale
        cfg = op.config()["memory_budget"]
        assert sum(cfg["last_chunks"]) == 16 and max(cfg["last_chunks"]) < 16
        if call == 1:
            assert cfg["measured_columns"] == measured
            assert len(set(cfg["last_chunks"][:-1])) == 1  # equal chunks, the rest last
    assert op.matvecs == 32


def test_config_records_budget_fit_and_chunk_size():
    _, obj = _mlp_objective()
    op = ls.hessian(obj, engine="forward_over_reverse", max_memory="12MB")
    assert op.config()["memory_budget"]["chunk_size"] is None
    op @ _probes(obj.num_params, 16)
    cfg = op.config()["memory_budget"]
    assert cfg["max_memory"] == "12MB" and cfg["budget_bytes"] == 12 * 10**6
    assert cfg["tracker"] == "dispatch"
    assert cfg["last_chunks"][:3] == [1, 2, 3]  # the measured columns are columns of the product
    assert cfg["measured_columns"] == 6
    fit = cfg["fits"]["forward_over_reverse/block"]
    assert set(fit["points"]) == {"2", "3"} and fit["a"] > 0 and fit["b"] > 0
    c = cfg["chunk_size"]
    out_bytes = obj.num_params * 16 * F64
    assert fit["a"] + fit["b"] * c + out_bytes <= 12 * 10**6 < fit["a"] + fit["b"] * (c + 1) + out_bytes
    assert cfg["reason"].startswith(f"chunks of {c}")
    assert cfg["warning"] is None
    assert ls.hessian(obj).config()["memory_budget"] is None


def test_a_block_that_fits_runs_unsplit_after_the_first_call():
    _, obj = _mlp_objective()
    op = ls.ggn(obj, max_memory="1GiB")
    V = _probes(obj.num_params, 8)
    ref = ls.ggn(obj) @ V
    op @ V
    measured = op.config()["memory_budget"]["measured_columns"]
    out = op @ V
    cfg = op.config()["memory_budget"]
    assert cfg["last_chunks"] == [8] and cfg["reason"].startswith("whole block")
    assert cfg["measured_columns"] == measured
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=0)


def test_one_column_over_the_budget_warns_and_goes_column_by_column():
    _, obj = _mlp_objective(n=64)
    V = _probes(obj.num_params, 4)
    ref = ls.hessian(obj, engine="forward_over_reverse") @ V
    op = ls.hessian(obj, engine="forward_over_reverse", max_memory="1KiB")
    with pytest.warns(RuntimeWarning, match="one column of the hessian product needs"):
        out = op @ V
    assert torch.equal(out, ref)
    cfg = op.config()["memory_budget"]
    assert cfg["last_chunks"] == [1, 1, 1, 1] and "column by column" in cfg["reason"]
    assert cfg["warning"] is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per operator
        op @ V


def test_no_budget_runs_no_tracker(monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("the tracker ran without a budget")

    monkeypatch.setattr(memory, "track_peak", boom)
    _, obj = _mlp_objective(n=32)
    V = _probes(obj.num_params, 4)
    for build in (*BUILDERS.values(), lambda o: ls.hessian(o)):
        build(obj) @ V


def test_budgeted_products_equal_a_dense_float64_hessian():
    """Tiny model: ``torch.autograd.functional.hessian`` of the loss in the flat parameters."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(10, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (10,), generator=g)
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(theta):
        parts, off = {}, 0
        for n, s in zip(names, shapes):
            parts[n] = theta[off : off + s.numel()].view(s)
            off += s.numel()
        return nn.functional.cross_entropy(functional_call(model, parts, (x,)), y)

    H = torch.autograd.functional.hessian(loss, flat)
    obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y))
    V = _probes(obj.num_params, 9)
    scale = float((H @ V).abs().max())
    for engine in ("double_backward", "forward_over_reverse"):
        op = ls.hessian(obj, engine=engine, max_memory="64KiB")
        for _ in range(2):
            out = op @ V
            assert float((out - H @ V).abs().max()) <= 1e-12 * scale
        plain = ls.hessian(obj, engine=engine) @ V
        assert float((out - plain).abs().max()) <= 1e-12 * scale
    assert float((ls.hvp(obj, V, max_memory="64KiB") - H @ V).abs().max()) <= 1e-12 * scale


def test_deprecated_hessian_engine_warns_takes_a_budget_and_keys_fits_by_path():
    _, obj = _mlp_objective(n=64)
    V = _probes(obj.num_params, 8)
    ref = ls.hessian(obj) @ V
    with pytest.warns(DeprecationWarning, match="HVPEngine is deprecated.*landscape.hessian"):
        engine = HVPEngine(obj, engine="forward_over_reverse", max_memory="2MB")
    out = engine.matmat(V)
    assert float((out - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
    cfg = engine.config()["memory_budget"]
    assert cfg["budget_bytes"] == 2 * 10**6 and sum(cfg["last_chunks"]) == 8
    assert engine.path_key(1) == "forward_over_reverse/single"
    assert engine.path_key(5) == "forward_over_reverse/block"


def test_calibration_runs_are_not_taken_as_memory_points():
    """``calibrate=True`` times both engines on the first block of each width class: the memory of
    those calls is not that of one path, so their points are dropped and measured again."""
    _, obj = _mlp_objective(n=64)
    V = _probes(obj.num_params, 12)
    ref = ls.hessian(obj) @ V
    op = ls.hessian(obj, calibrate=True, max_memory="64MB")
    out = op @ V
    assert float((out - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
    cfg = op.config()["memory_budget"]
    assert cfg["dropped_points"] == 2  # the calibrating single and block calls
    assert all(not key.startswith("uncalibrated") for key in cfg["fits"])
    assert op.config()["calibrated_choice"].keys() == {"single", "block"}


def test_block_budget_plans_from_a_scripted_product():
    """A product whose peak is exactly ``a + b w`` (one ``[w, n]`` buffer plus a constant one): the
    fit recovers ``a`` and ``b`` and chunks fill the budget."""
    n, a = 10_000, 50_000

    def fn(V):
        keep = torch.empty(a // F64, dtype=torch.float64)
        work = torch.ones(V.shape[1], n, dtype=torch.float64)
        out = V * (work.sum() / work.numel())  # V itself: one [p, w] result
        del keep, work
        return out

    p, k = 100, 20
    V = _probes(p, k)
    out_bytes = p * k * F64
    budget = BlockBudget(a + 64 + 5 * (n + p) * F64 + out_bytes, "cpu")  # 64: the scalars
    out = budget.run(V, fn, lambda w: "single" if w == 1 else "block")
    assert torch.equal(out, V)
    fit = budget.fit("block")
    assert fit is not None
    assert abs(fit[0] - a) <= 64 and fit[1] == (n + p) * F64
    assert budget.last_chunks == [1, 2, 3, 5, 5, 4]


# --------------------------------------------------------------------------------------------
# the caller's model
# --------------------------------------------------------------------------------------------
def _bn_model():
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3)).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    model.train()
    model[1].eval()  # mixed flags
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    return model


def _snapshot(model):
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        [m.training for m in model.modules()],
    )


def _assert_same(model, snap):
    state, grads, flags = snap
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k
    for n, p in model.named_parameters():
        assert (p.grad is None and grads[n] is None) or torch.equal(p.grad, grads[n]), n
    assert [m.training for m in model.modules()] == flags


def test_the_callers_model_is_untouched():
    model = _bn_model()
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(40, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (40,), generator=g)
    obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y))
    snap = _snapshot(model)
    V = _probes(obj.num_params, 6)
    for build in (*BUILDERS.values(), lambda o, **kw: ls.hessian(o, **kw)):
        build(obj, max_memory="48KiB") @ V
        _assert_same(model, snap)
        with pytest.raises(ValueError):
            build(obj, max_memory="-1")
        _assert_same(model, snap)


def test_the_curvature_monitor_passes_its_budget_to_every_check(monkeypatch):
    """``CurvatureMonitor(max_memory=...)``: each check's Hessian gets the budget; the trace block is
    split by it and the numbers equal an unbudgeted monitor's and the dense float64 Hessian's."""
    from landscape.curvature import monitor as monitor_mod
    from tests.references import dense_hessian, make_classification_data, make_mlp

    model = make_mlp((4, 6, 3), "tanh", seed=0, dtype=torch.float64)
    x, y = make_classification_data(n=24, d=4, n_classes=3, seed=1, dtype=torch.float64)
    built = []
    real = monitor_mod.hessian

    def recording(obj, **kw):
        op = real(obj, **kw)
        built.append(op)
        return op

    monkeypatch.setattr(monitor_mod, "hessian", recording)
    kw = dict(lr=0.1, max_matvecs=60, tol=1e-10, trace_probes=6)
    budgeted = ls.CurvatureMonitor((x, y), nn.CrossEntropyLoss(), max_memory=4 * 2**20, **kw)
    plain = ls.CurvatureMonitor((x, y), nn.CrossEntropyLoss(), **kw)
    a, b = budgeted.check(model, 0), plain.check(model, 0)
    budget = built[0].config()["memory_budget"]
    assert budget["budget_bytes"] == 4 * 2**20 and budget["measured_columns"] > 0
    assert built[1].config()["memory_budget"] is None
    assert budgeted.config()["max_memory"] == 4 * 2**20
    assert a["trace"] == b["trace"]  # double backward computes every column alone: bit-identical
    H = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    assert a["lambda_max"] == pytest.approx(float(torch.linalg.eigvalsh(H)[-1]), rel=1e-9)
    with pytest.raises(ValueError, match="is not a memory size"):
        ls.CurvatureMonitor((x, y), nn.CrossEntropyLoss(), lr=0.1, max_memory="lots")
