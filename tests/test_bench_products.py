"""Smoke run of ``benchmarks/bench_products.py --quick`` on its smallest model: every product row is
there and every library's product agrees with ``landscape``'s in float64 (peers installed by
``benchmarks/install_peers.sh``); without the peers the run still completes, their rows skipped with
a note (the README's smoke run).  ``bench_products`` imports the peers only inside their stages, so
this module itself needs none of them."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from benchmarks import bench_products as bp
from benchmarks._models import make_problem
from landscape.io import read_json
from tests.references import dense_hessian

PEER_MODULES = ("curvlinops", "hessian_eigenthings", "pyhessian")


@pytest.mark.slow
def test_quick_run_has_every_row_and_all_products_agree(tmp_path):
    pytest.importorskip("curvlinops")
    pytest.importorskip("hessian_eigenthings")
    pytest.importorskip("pyhessian")
    argv = [
        "--quick",
        "--models",
        "mlp",
        "--repeats",
        "1",
        "--dtype",
        "float64",
        "--no-compile",
        "--no-memory",
        "--threads",
        "1",
        "--out",
        str(tmp_path),
        "--name",
        "smoke",
    ]
    data = read_json(bp.main(argv))
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {m for m in bp.METHODS if "compiled" not in m}
    for m, r in rows.items():
        assert "error" not in r, (m, r.get("error"))
        assert r["ms"] > 0 and r["x_gradient"] > 0
        if r["product"] != "gradient":
            assert r["rel_err"] < 1e-5, (m, r["rel_err"])
            assert r["x_best_peer"] > 0
    # the spectra: every library and task present, budgets respected, the reference trace exact
    pairs = {(s["task"], s["method"]) for s in data["spectra"]}
    assert len(pairs) == len(data["spectra"]) == 21
    assert {t for t, _ in pairs} == {"top-1 eigenvalue", "top-5 eigenvalues", "trace"}
    for s in data["spectra"]:
        if s["error"] is None:
            assert s["matvecs"] <= s["budget"] and math.isfinite(s["rel_error"]), s
    pr = make_problem("mlp", quick=True, dtype=torch.float64)
    H = dense_hessian(pr.model, pr.loss_fn, [(pr.x, pr.y)])
    ref = data["spectra_reference"]["mlp"]
    assert ref["trace_method"] == "exact"
    assert ref["trace"] == pytest.approx(float(torch.trace(H)), rel=1e-10)
    top = torch.linalg.eigvalsh(H)
    top = top[torch.argsort(top.abs(), descending=True)][:5]
    assert ref["eigenvalues"] == pytest.approx(top.tolist(), rel=1e-6)


def test_bad_model_name_is_refused():
    with pytest.raises(SystemExit):
        bp.parse(["--models", "resnet20,vgg"])
    with pytest.raises(ValueError, match="unknown benchmark model 'vgg'"):
        make_problem("vgg")


def test_quick_run_without_the_peers_skips_their_rows_with_a_note(tmp_path, monkeypatch, capsys):
    """The peers made uninstalled (``None`` in ``sys.modules``: ``import`` fails, ``find_spec`` finds
    nothing): their rows are skipped with a note naming the package and the install script -- not
    built, not sent to a memory process, no error -- the spectra are skipped, and every landscape row
    is still built, timed and checked."""
    for module in PEER_MODULES:
        monkeypatch.setitem(sys.modules, module, None)
        with pytest.raises(ImportError):
            __import__(module)
    memory_runs = []

    def fake_memory(args, name, method):  # the memory child process, recorded instead of started
        memory_runs.append(method)
        return {"peak_rss_mb": 1.0, "how": "test"}

    monkeypatch.setattr(bp, "_memory", fake_memory)
    argv = ["--quick", "--models", "mlp", "--repeats", "1", "--no-compile", "--threads", "1"]
    data = read_json(bp.main([*argv, "--memory-repeats", "1", "--out", str(tmp_path), "--name", "np"]))
    out = capsys.readouterr().out
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {m for m in bp.METHODS if "compiled" not in m}
    peer_rows = {
        m for m, (_, lib, _) in bp.METHODS.items() if lib in ("pyhessian", "curvlinops", "eigenthings")
    }
    assert len(peer_rows) == 8
    assert {m for m, r in rows.items() if "skipped" in r} == peer_rows
    for m in peer_rows:
        module = bp.PEER_MODULES[rows[m]["library"]]
        assert (
            rows[m]["skipped"] == f"peer package {module!r} not installed (bash benchmarks/install_peers.sh)"
        )
        assert "error" not in rows[m] and "ms" not in rows[m] and "peak_mb" not in rows[m]
        assert f"skipped {m}" in out
    assert sorted(memory_runs) == sorted(set(rows) - peer_rows)
    for m in set(rows) - peer_rows:
        assert "error" not in rows[m] and rows[m]["ms"] > 0 and rows[m]["peak_mb"] == 1.0, m
        if m != "gradient":  # landscape's products against the reference engine, float32
            assert rows[m]["rel_err"] < 1e-5, (m, rows[m]["rel_err"])
    assert data["spectra"] == []
    assert data["spectra_reference"]["mlp"] == {
        "skipped": "missing peers: pyhessian, curvlinops, hessian_eigenthings"
    }
    assert "spectra skipped: peer package(s)" in out
