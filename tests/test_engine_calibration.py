"""``engine="auto"`` chosen by measurement (landscape.curvature.autotune): with a scripted clock the
faster engine is kept per block width, the timings and the calibration's cost are recorded, every
product equals the dense float64 Hessian, a path that fails is dropped with its reason, and on a
CPU the default spends no calibration products."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature import HessianOperator
from landscape.curvature.autotune import PathTimer
from tests.references import dense_hessian, make_classification_data, make_mlp, scripted_clock


def _objective():
    model = make_mlp((4, 6, 3), "tanh", seed=0, dtype=torch.float64)
    x, y = make_classification_data(n=20, d=4, n_classes=3, seed=1, dtype=torch.float64)
    return model, ls.Objective(model, nn.CrossEntropyLoss(), [(x, y)]), x, y


@pytest.mark.parametrize(
    "durations, single, block",
    [
        ([5.0, 1.0, 2.0, 9.0], "forward_over_reverse", "double_backward"),
        ([1.0, 5.0, 9.0, 2.0], "double_backward", "forward_over_reverse"),
    ],
)
def test_the_faster_engine_is_kept_per_block_width(durations, single, block):
    model, obj, x, y = _objective()
    H = dense_hessian(model, nn.CrossEntropyLoss(), [(x, y)])
    eng = HessianOperator(obj, engine="auto", calibrate=True, timer=scripted_clock(durations))
    g = torch.Generator().manual_seed(0)
    v = torch.randn(H.shape[0], 1, generator=g, dtype=torch.float64)
    V = torch.randn(H.shape[0], 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(eng.matmat(v), H @ v, rtol=1e-10, atol=1e-12)
    assert eng.engine_used == single
    torch.testing.assert_close(eng.matmat(V), H @ V, rtol=1e-10, atol=1e-12)
    assert eng.engine_used == block
    torch.testing.assert_close(eng.matmat(v), H @ v, rtol=1e-10, atol=1e-12)  # no more timing
    assert eng.engine_used == single
    cfg = eng.config()
    assert cfg["calibrated_choice"] == {"single": single, "block": block}
    assert cfg["calibration_seconds"]["single"] == {
        "double_backward": durations[0],
        "forward_over_reverse": durations[1],
    }
    assert cfg["calibration_products"] == 2 * 2 * 1 + 2 * 2 * 5  # two runs of each engine per width


def test_a_failing_path_is_dropped_with_its_reason():
    calls = []

    def call(path, V):
        calls.append(path)
        if path == "b":
            raise RuntimeError("vmap over this model is not supported")
        return V * 2

    timer = PathTimer(("a", "b"), torch.device("cpu"), scripted_clock([1.0]))
    out = timer.run(torch.ones(3, 2), call)
    assert torch.equal(out, torch.full((3, 2), 2.0))
    assert timer.choice == {"block": "a"} and "vmap over this model" in timer.failed["b"]
    timer.run(torch.ones(3, 4), call)
    assert calls[-1] == "a" and calls.count("b") == 1  # the same width class: no new timing


def test_cpu_default_spends_no_calibration_products():
    _, obj, _, _ = _objective()
    op = ls.hessian(obj)
    p = op.shape[0]
    op @ torch.ones(p, 3, dtype=torch.float64)
    assert op.matvecs == 3
    cfg = op.config()
    assert cfg["calibrate"] is False and cfg["engine_used"] == "double_backward"
    with pytest.raises(ValueError, match="calibrate=True times the engines"):
        ls.hessian(obj, engine="double_backward", calibrate=True)
