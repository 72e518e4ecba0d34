"""The digits demo end to end (quick mode) and its CLI."""

from __future__ import annotations

import json

import pytest

from optimizers import demo


def test_demo_quick_sgd_and_sam_learn_digits(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert demo.main(["--quick", "--optimizers", "sgd,sam", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "sgd" in text and "sam" in text and "ECE" in text
    rows = json.loads(out.read_text())["results"]
    assert [r["optimizer"] for r in rows] == ["sgd", "sam"]
    for r in rows:
        assert r["accuracy"] > 0.8
        assert 0 < r["nll"] < 1.0
        assert 0 <= r["ece"] < 0.2
        assert r["epochs"] == 3


def test_demo_bayesian_rows_use_model_average():
    rows = demo.run_demo(["bsam", "f_swag_diag"], epochs=2)
    assert rows[0]["predictive"] == "BMA-32" and rows[1]["predictive"] == "SWAG-30"
    assert all(r["accuracy"] > 0.5 for r in rows)


def test_demo_rejects_unknown_optimizer(capsys):
    assert demo.main(["--optimizers", "sgd,nope", "--epochs", "1"]) == 2
    assert "nope" in capsys.readouterr().err
    with pytest.raises(ValueError, match="epochs"):
        demo.run_demo(["sgd"], epochs=0)
