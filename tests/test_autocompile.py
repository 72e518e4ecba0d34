"""``compile="auto"`` (landscape.curvature.autocompile): an operator compiles only when the measured
eager time of the products left, times the expected saving, exceeds the expected compile time.

Decisions are driven by a scripted clock (deterministic); compiled operators use dynamo's
``"eager"`` backend (the real ``CompiledOperator`` machinery without inductor's code generation,
fast enough for the default suite).  Every product is compared with a dense float64 matrix built
independently (``tests.references``)."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature import autocompile as ac
from landscape.curvature.compiled import compile_operator
from tests.references import dense_ggn, dense_hessian, make_classification_data, make_mlp, scripted_clock

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@pytest.fixture(autouse=True)
def _fresh_registry():
    ac._MEASURED.clear()
    yield
    ac._MEASURED.clear()


def _problem():
    model = make_mlp((4, 6, 3), "tanh", seed=0, dtype=torch.float64)
    x, y = make_classification_data(n=24, d=4, n_classes=3, seed=1, dtype=torch.float64)
    return model, ls.Objective(model, nn.CrossEntropyLoss(), (x, y)), x, y


def _eager_compile(op, **kw):
    return compile_operator(op, backend="eager", **kw)


def _block(p: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(p, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_priors_never_compile_where_the_cpu_benchmark_saw_compiling_lose():
    """The CPU priors are the largest compiled/eager ratio and compile time of the committed product
    benchmark (eager = the CPU default path: Hessian ``auto``, GGN ``forward``)."""
    rows, compile_s = [], []
    for name in ("products_cpu.json", "products_cpu_transformer_wrn.json"):
        rows += json.loads((RESULTS / name).read_text())["rows"]
    x = {(r["model"], r["method"]): r["x_gradient"] for r in rows}
    compile_s = [r["compile_s"] for r in rows if r.get("compile_s") is not None]
    models = sorted({m for m, _ in x})
    assert len(models) == 4
    hess = max(x[m, "landscape compiled hessian"] / x[m, "landscape auto"] for m in models)
    ggn = max(x[m, "landscape compiled ggn"] / x[m, "landscape ggn forward"] for m in models)
    assert ac.PRIOR_RATIO["hessian", "cpu"] == math.ceil(hess * 100) / 100
    assert ac.PRIOR_RATIO["ggn", "cpu"] == math.ceil(ggn * 100) / 100
    assert ac.PRIOR_COMPILE_SECONDS["cpu"] == math.ceil(max(compile_s) * 10) / 10
    assert min(ac.PRIOR_RATIO["hessian", "cpu"], ac.PRIOR_RATIO["ggn", "cpu"]) > 1.0  # never on a CPU


def test_cpu_priors_keep_the_eager_operator_with_the_reason():
    model, obj, x, y = _problem()
    H = ls.hessian(obj)
    op = ac.AutoCompiledOperator(H, 10**9, timer=scripted_clock([1.0]), compile_fn=_no_compile)
    V = _block(H.shape[0], 2)
    ref = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    for _ in range(3):
        assert _rel(op.matmat(V), ref @ V) < 1e-12
    rec = op.config()["autocompile"]
    assert rec["decision"] == "eager" and rec["state"] == "eager"
    assert rec["predicted_ratio"] == ac.PRIOR_RATIO["hessian", "cpu"]
    assert rec["eager_seconds_per_product"] == 0.5  # the second block: 1 s for 2 products
    assert rec["products_left"] == 10**9 - 4
    assert "<= expected compile time" in rec["reason"]
    assert op.matvecs == 6


def _no_compile(op, **kw):
    raise AssertionError("compiled although the rule said eager")


def test_compiles_when_the_saving_pays_and_products_equal_the_dense_ggn(monkeypatch):
    monkeypatch.setitem(ac.PRIOR_RATIO, ("ggn", "cpu"), 0.5)
    monkeypatch.setitem(ac.PRIOR_COMPILE_SECONDS, "cpu", 10.0)
    model, obj, x, y = _problem()
    G = ls.ggn(obj)
    ref = dense_ggn(model, nn.CrossEntropyLoss(), [(x, y)])
    # the second block (3 products) takes 0.3 s: 0.1 s each, 1000 - 6 left -> saving 49.7 s > 10 s;
    # the first compiled block takes 0.15 s (ratio 0.5): compiled from then on
    op = ac.AutoCompiledOperator(G, 1000, timer=scripted_clock([0.3, 0.15]), compile_fn=_eager_compile)
    for i in range(5):
        out = op.matmat(_block(G.shape[0], 3, seed=i))
        assert _rel(out, ref @ _block(G.shape[0], 3, seed=i)) < 1e-12
    rec = op.config()["autocompile"]
    assert rec["decision"] == "compile" and rec["state"] == "compiled"
    assert rec["predicted_saving_seconds"] == pytest.approx(994 * 0.1 * 0.5)
    assert rec["measured_ratio"] == pytest.approx(0.5)
    assert rec["compiled_products"] == 9
    assert op.config()["compiled"] is True and op.config()["backend"] == "eager"
    # a later decision on the same signature uses what was measured, not the priors
    sig = ac._signature(G, 3)
    assert ac.measured()[sig]["ratio"] == pytest.approx(0.5)
    again = ac.AutoCompiledOperator(ls.ggn(obj), 1000, timer=scripted_clock([0.3]), compile_fn=_no_compile)
    monkeypatch.setitem(ac._MEASURED, sig, {"ratio": 0.99, "compile_seconds": 5.0})
    again.matmat(_block(G.shape[0], 3))
    again.matmat(_block(G.shape[0], 3))
    rec = again.config()["autocompile"]
    assert rec["decision"] == "eager"  # 994 x 0.1 x 0.01 = 0.99 s < 5 s measured
    assert rec["prediction_source"] == {
        "ratio": "measured in this process",
        "compile_seconds": "measured in this process",
    }


def test_a_compiled_product_that_is_not_faster_goes_back_to_eager(monkeypatch):
    monkeypatch.setitem(ac.PRIOR_RATIO, ("hessian", "cpu"), 0.2)
    monkeypatch.setitem(ac.PRIOR_COMPILE_SECONDS, "cpu", 1.0)
    model, obj, x, y = _problem()
    H = ls.hessian(obj)
    ref = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    op = ac.AutoCompiledOperator(H, 500, timer=scripted_clock([0.1, 0.2]), compile_fn=_eager_compile)
    calls = []
    for i in range(4):
        V = _block(H.shape[0], 1, seed=i)
        assert _rel(op.matmat(V), ref @ V) < 1e-12
        calls.append(op.state)
    rec = op.config()["autocompile"]
    assert calls == ["measuring", "compiled", "eager", "eager"]
    assert rec["decision"] == "compiled, then eager" and rec["measured_ratio"] == pytest.approx(2.0)
    assert "eager from now on" in rec["reason"]


def test_a_failed_compile_is_recorded_and_products_stay_eager(monkeypatch):
    monkeypatch.setitem(ac.PRIOR_RATIO, ("hessian", "cpu"), 0.2)
    monkeypatch.setitem(ac.PRIOR_COMPILE_SECONDS, "cpu", 1.0)

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no compiler on this machine")

    def compile_fn(op, **kw):
        return compile_operator(op, backend=broken_backend, **kw)

    model, obj, x, y = _problem()
    H = ls.hessian(obj)
    ref = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    op = ac.AutoCompiledOperator(H, 500, timer=scripted_clock([0.1]), compile_fn=compile_fn)
    for i in range(3):
        V = _block(H.shape[0], 2, seed=i)
        assert _rel(op.matmat(V), ref @ V) < 1e-12
    rec = op.config()["autocompile"]
    assert rec["decision"] == "eager" and rec["reason"].startswith("compile failed:")
    assert "no compiler on this machine" in rec["reason"]


def test_only_the_compiled_width_runs_compiled(monkeypatch):
    monkeypatch.setitem(ac.PRIOR_RATIO, ("ggn", "cpu"), 0.1)
    monkeypatch.setitem(ac.PRIOR_COMPILE_SECONDS, "cpu", 1.0)
    model, obj, x, y = _problem()
    G = ls.ggn(obj)
    ref = dense_ggn(model, nn.CrossEntropyLoss(), [(x, y)])
    op = ac.AutoCompiledOperator(G, 10**4, timer=scripted_clock([0.2, 0.1]), compile_fn=_eager_compile)
    for k in (2, 2, 2, 5, 2):
        V = _block(G.shape[0], k, seed=k)
        assert _rel(op.matmat(V), ref @ V) < 1e-12
    assert op.config()["autocompile"]["compiled_products"] == 4  # the width-5 block ran eagerly
    assert op.compiled._widths == {2}


def test_estimators_take_compile_and_record_the_decision():
    model, obj, x, y = _problem()
    ref = torch.linalg.eigvalsh(dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)]))
    res = ls.eigenvalues(obj, k=2, max_matvecs=40)
    auto = res.config["operator"]["operator"]["autocompile"]
    assert auto["decision"] == "eager" and auto["products_planned"] == 40
    assert torch.allclose(res.values.sort().values, ref[-2:], rtol=1e-8)
    res = ls.eigenvalues(obj, k=2, max_matvecs=40, compile=False)
    assert "autocompile" not in res.config["operator"]["operator"]
    tr = ls.trace(ls.ggn(obj), max_matvecs=30, method="hutchinson")
    assert tr.config["operator"]["operator"]["autocompile"]["products_planned"] == 30
    dens = ls.spectral_density(obj, runs=3, lanczos_steps=7)
    assert dens.config["operator"]["operator"]["autocompile"]["products_planned"] == 21


def test_compile_true_compiles_and_matches_the_dense_spectrum():
    model, obj, x, y = _problem()
    ref = torch.linalg.eigvalsh(dense_ggn(model, nn.CrossEntropyLoss(), [(x, y)]))
    res = ls.eigenvalues(ls.ggn(obj), k=3, max_matvecs=60, compile=True)
    assert res.config["operator"]["operator"]["compiled"] is True
    assert torch.allclose(res.values.sort().values, ref[-3:], rtol=1e-8, atol=1e-12)


def test_bad_compile_arguments_name_the_fix():
    model, obj, x, y = _problem()
    with pytest.raises(ValueError, match="compile must be True, False or 'auto'"):
        ls.eigenvalues(obj, k=1, compile="always")
    with pytest.raises(TypeError, match="compile=True needs a Hessian or GGN operator"):
        ls.trace(torch.eye(5, dtype=torch.float64), compile=True)
    with pytest.raises(ValueError, match="products must be a non-negative int"):
        ac.AutoCompiledOperator(ls.hessian(obj), -1)
    # dense matrices and other operators run as they are under "auto"
    assert ls.trace(torch.eye(5, dtype=torch.float64), method="exact").value == 5.0


def test_compiled_operator_budget_measures_on_the_eager_path():
    """``max_memory``: the widths' peaks are measured on the eager product, the compiled graph runs
    the planned chunks; every column equals the unbudgeted product."""
    model, obj, x, y = _problem()
    H = ls.hessian(obj, max_memory="1GiB")
    C = compile_operator(H, backend="eager")
    assert C.config()["memory_budget"]["max_memory"] == "1GiB"
    ref = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    V = _block(H.shape[0], 6)
    seen = []
    run = C._compiled_chunks

    def recorded(block):
        seen.append(int(block.shape[1]))
        return run(block)

    C._compiled_chunks = recorded
    assert _rel(C.matmat(V), ref @ V) < 1e-12
    budget = C.config()["memory_budget"]
    assert budget["measured_columns"] == 6  # widths 1, 2, 3: measured eagerly
    assert 1 not in seen and 2 not in seen  # ... not through the compiled graph
    unbudgeted = compile_operator(H, backend="eager", max_memory=None)
    assert unbudgeted.config()["memory_budget"] is None
