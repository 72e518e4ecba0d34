"""``python -m landscape sharpness``: a tiny saved model measured on digits; JSON/CSV numbers equal
the library's."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from torch import nn

from landscape.cli import build_parser, main
from landscape.data import load_digits
from landscape.objective import Objective
from landscape.sharpness import sharpness


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 5), nn.Tanh(), nn.Linear(5, 10))


def test_cli_writes_json_and_csv_with_the_right_numbers(tmp_path, capsys):
    model = tiny_model()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.7)  # differs from the factory's weights: the state dict must be loaded
    torch.save(model.state_dict(), tmp_path / "m.pt")
    out, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    argv = [
        "sharpness", "--model", "tests.test_sharpness_cli:tiny_model", "--state-dict", str(tmp_path / "m.pt"),
        "--data", "digits:test", "--limit", "150", "--batch-size", "64",
        "--measures", "gradient_norm,worst_case,average_case",
        "--set", "worst_case.solver=one_step", "--set", "worst_case.rho=0.1",
        "--set", "average_case.samples=4",
        "--out", str(out), "--csv", str(out_csv),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "worst_case" in printed and "average_case" in printed

    x, y = load_digits("test")
    data = [(x[:150][i : i + 64], y[:150][i : i + 64]) for i in range(0, 150, 64)]
    obj = Objective(model, nn.CrossEntropyLoss(), data, dtype=torch.float64)
    expected = {
        "gradient_norm": sharpness(obj, "gradient_norm").value,
        "worst_case": sharpness(obj, "worst_case", solver="one_step", rho=0.1).value,
        "average_case": sharpness(obj, "average_case", samples=4).value,
    }
    rows = json.loads(out.read_text())["rows"]
    assert [r["measure"] for r in rows] == list(expected)
    for r in rows:
        assert r["value"] == pytest.approx(expected[r["measure"]], rel=1e-10)
    assert rows[1]["config"]["rho"] == 0.1 and rows[1]["config"]["solver"] == "one_step"
    with open(out_csv, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [t["measure"] for t in table] == list(expected)
    for t in table:
        assert float(t["value"]) == pytest.approx(expected[t["measure"]], rel=1e-12)
    assert table[0]["stderr"] == "" and float(table[2]["stderr"]) > 0


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    # errors are one "error: <what> — <fix>" line on stderr and SystemExit(2) for usage errors
    assert "sharpness" in build_parser().format_help()
    with pytest.raises(SystemExit) as info:
        main(["sharpness", "--model", "tests.test_sharpness_cli:tiny_model", "--measures", "flatness"])
    assert info.value.code == 2 and "error: unknown measure" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["sharpness", "--model", "tiny_model", "--measures", "gradient_norm", "--limit", "10"])
    assert info.value.code == 2 and "module:function" in capsys.readouterr().err
