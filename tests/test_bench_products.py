"""Smoke run of ``benchmarks/bench_products.py --quick`` on its smallest model: every product row is
there and every library's product agrees with ``landscape``'s in float64."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("curvlinops")
pytest.importorskip("hessian_eigenthings")
pytest.importorskip("pyhessian")

from benchmarks import bench_products as bp  # noqa: E402
from benchmarks._models import make_problem  # noqa: E402
from landscape.io import read_json  # noqa: E402
from tests.references import dense_hessian  # noqa: E402


@pytest.mark.slow
def test_quick_run_has_every_row_and_all_products_agree(tmp_path):
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
