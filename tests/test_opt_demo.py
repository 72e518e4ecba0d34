"""The digits demo end to end: every method, metrics from landscape.metrics, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from landscape import metrics
from optimizers import demo

# every method family of the suite, with its flat-seeking (F-) version where there is one
REQUIRED = {
    "sgd", "adam", "sam", "asam", "fisher_sam", "random_sam", "mix_sam", "vsam", "mfvi", "bsam",
    "vogn", "ivon", "sgd_tracer", "adam_tracer", "mc_dropout", "f_mc_dropout", "deep_ensemble",
    "f_deep_ensemble", "sgvb", "f_sgvb", "sgvb_lrt", "f_sgvb_lrt", "swag", "swag_diag", "f_swag",
    "f_swag_diag", "sgld", "f_sgld", "laplace_diag", "laplace_last_layer", "sam_laplace_last_layer",
}  # fmt: skip


def _ece_by_hand(probs: np.ndarray, y: np.ndarray, bins: int) -> float:
    """Guo et al. 2017, eq. 3: equal-width confidence bins (right-closed, the first also left-closed)."""
    conf, pred = probs.max(1), probs.argmax(1)
    idx = np.clip(np.ceil(conf * bins).astype(int) - 1, 0, bins - 1)
    total = 0.0
    for b in range(bins):
        sel = idx == b
        if sel.any():
            total += sel.sum() / len(y) * abs((pred[sel] == y[sel]).mean() - conf[sel].mean())
    return float(total)


@pytest.fixture(scope="module")
def rows():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: a second thread only adds contention
    try:
        return demo.run_demo(demo.SUITE, epochs=2)
    finally:
        torch.set_num_threads(threads)


def test_demo_lists_every_method_with_metrics_from_landscape_metrics(rows):
    assert REQUIRED <= set(demo.SUITE)
    assert [r["method"] for r in rows] == list(demo.SUITE)
    _, _, xte, yte = demo.load_data()
    for r in rows:
        probs, probs_ood = r["probs"], r["probs_ood"]
        assert probs.shape == (len(yte), 10) and probs_ood.shape == (len(yte), 10)
        torch.testing.assert_close(probs.sum(1), torch.ones(len(yte)), rtol=0, atol=1e-5)
        ref = metrics.evaluate(probs, yte, probs_ood=probs_ood, n_bins=20)
        for key in ("accuracy", "nll", "ece", "brier", "auroc_misclassification", "auroc_ood_maxprob"):
            assert r[key] == ref[key], (r["method"], key)
        assert r["n_bins"] == 20
        # ranges, and accuracy / NLL / ECE once more by hand
        p, y = probs.double().numpy(), yte.numpy()
        assert r["accuracy"] == pytest.approx(float((p.argmax(1) == y).mean()), abs=1e-12)
        assert r["nll"] == pytest.approx(
            float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-12)).mean()), rel=1e-9
        )
        assert r["ece"] == pytest.approx(_ece_by_hand(p, y, 20), abs=1e-9)
        assert 0.5 < r["accuracy"] <= 1 and 0 < r["nll"] < 2.5 and 0 <= r["ece"] <= 1 and 0 <= r["brier"] <= 2
        assert 0 <= r["auroc_misclassification"] <= 1 and 0 <= r["auroc_ood_maxprob"] <= 1
    by = {r["method"]: r for r in rows}
    assert by["bsam"]["predictive"] == "BMA-32" and by["f_swag_diag"]["predictive"] == "SWAG-30"
    assert (
        by["deep_ensemble"]["predictive"] == "ensemble-5"
        and by["mc_dropout"]["predictive"] == "MC-dropout-30"
    )
    assert by["laplace_diag"]["predictive"].startswith("Laplace-probit")
    # the SAM versions differ from their baselines (they are not silently the same run)
    assert (
        by["f_sgvb"]["nll"] != by["sgvb"]["nll"]
        and by["f_deep_ensemble"]["nll"] != by["deep_ensemble"]["nll"]
    )


def test_ood_set_is_the_test_images_with_permuted_pixels():
    _, _, xte, _ = demo.load_data()
    ood = demo.ood_inputs(xte)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(perm, torch.arange(64))
    assert torch.equal(ood, xte[:, perm])
    assert torch.equal(ood.sort(1).values, xte.sort(1).values)  # same pixel values, other places


def test_demo_cli_quick_writes_json_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert demo.main(["--quick", "--methods", "sgd,swag", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ECE with 20 bins" in text and "pixels permuted" in text and "AUROC-OOD" in text
    data = json.loads(out.read_text())
    assert data["n_bins"] == 20 and [r["method"] for r in data["results"]] == ["sgd", "swag"]
    for r in data["results"]:
        assert "probs" not in r and r["epochs"] == 3 and r["accuracy"] > 0.8
        assert math.isfinite(r["auroc_ood_maxprob"])


def test_demo_rejects_unknown_method(capsys):
    assert demo.main(["--methods", "sgd,nope", "--epochs", "1"]) == 2
    assert "nope" in capsys.readouterr().err
    with pytest.raises(ValueError, match="epochs must be an integer >= 1"):
        demo.run_demo(["sgd"], epochs=0)
