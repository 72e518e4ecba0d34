"""``jvp="auto"`` of the GGN (and Fisher) operators chosen by measurement
(landscape.curvature.autotune.PathTimer): with a scripted clock the faster ``J V`` path is kept per
block width, later products run only that path, timings and choice are in ``config()``, every
product equals an independently built dense float64 GGN, a path that fails is dropped with its
reason, and on a CPU the default is forward mode bit for bit, with no timing."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature.ggn import GGNOperator
from tests.references import dense_ggn, make_classification_data, make_mlp, scripted_clock

ggn_mod = importlib.import_module("landscape.curvature.output_space")  # the GGN's J V paths


def _problem(batches=(20,)):
    model = make_mlp((4, 6, 3), "tanh", seed=0, dtype=torch.float64)
    x, y = make_classification_data(n=sum(batches), d=4, n_classes=3, seed=1, dtype=torch.float64)
    parts = list(zip(x.split(list(batches)), y.split(list(batches))))
    return model, ls.Objective(model, nn.CrossEntropyLoss(), parts), x


def _dense_ggn_ce(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The GGN of the mean cross-entropy over ``x``, built by ``tests.references.dense_ggn`` (Jacobian
    and output Hessian by autodiff). The cross-entropy's output Hessian ``diag(p) - p p^T`` does not
    depend on the labels, so any labels give the same matrix."""
    labels = torch.zeros(x.shape[0], dtype=torch.long)
    return dense_ggn(model, nn.CrossEntropyLoss(), [(x, labels)])


def _no_clock():
    raise AssertionError("the clock was read: a calibration ran")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _vectors(p: int):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(p, 1, generator=g, dtype=torch.float64)
    return v, torch.randn(p, 5, generator=g, dtype=torch.float64)


def _record_paths(op: GGNOperator) -> list[str]:
    calls: list[str] = []
    run = op._run

    def recorded(path, V):
        calls.append(path)
        return run(path, V)

    op._run = recorded
    return calls


@pytest.mark.parametrize("batches", [(20,), (8, 12)])  # kept factors / rebuilt every product
@pytest.mark.parametrize(
    "durations, single, block",
    [
        ([5.0, 1.0, 2.0, 9.0], "linearize", "forward"),
        ([1.0, 5.0, 9.0, 2.0], "forward", "linearize"),
    ],
)
def test_the_faster_path_is_kept_per_block_width(durations, single, block, batches):
    model, obj, x = _problem(batches)
    G = _dense_ggn_ce(model, x)
    op = GGNOperator(obj, calibrate=True, timer=scripted_clock(durations))
    calls = _record_paths(op)
    v, V = _vectors(G.shape[0])
    assert _rel(op @ v, G @ v) <= 1e-10
    assert calls == ["forward", "forward", "linearize", "linearize"]  # untimed + timed each
    assert op.config()["jvp_used"] == single
    assert _rel(op @ V, G @ V) <= 1e-10
    assert op.config()["jvp_used"] == block
    calls.clear()
    for w in (v, V, v):  # no more timing: the chosen path of each width only
        assert _rel(op @ w, G @ w) <= 1e-10
    assert calls == [single, block, single]
    cfg = op.config()
    assert cfg["jvp"] == "auto" and cfg["calibrate"] is True and cfg["jvp_used"] == single
    assert cfg["calibrated_choice"] == {"single": single, "block": block}
    assert cfg["calibration_seconds"] == {
        "single": {"forward": durations[0], "linearize": durations[1]},
        "block": {"forward": durations[2], "linearize": durations[3]},
    }
    assert cfg["calibration_products"] == 2 * 2 * 1 + 2 * 2 * 5 and cfg["calibration_failed"] == {}


@pytest.mark.parametrize("path, other", [("forward", "linearize"), ("linearize", "jvp")])
def test_the_path_not_chosen_is_never_run_again(path, other, monkeypatch):
    model, obj, x = _problem()
    G = _dense_ggn_ce(model, x)
    fast, slow = 1.0, 5.0
    durations = [fast, slow] * 2 if path == "forward" else [slow, fast] * 2
    op = ls.ggn(obj, calibrate=True)
    op._timer.timer = scripted_clock(durations)
    v, V = _vectors(G.shape[0])
    op @ v, op @ V  # calibration of both widths
    if path == "forward":  # the traced linearisation is not kept when no width uses it
        assert all(lin.jvp_lin is None for lin in op._kept)
    counted = []
    real = getattr(ggn_mod, other)
    monkeypatch.setattr(ggn_mod, other, lambda *a, **k: (counted.append(1), real(*a, **k))[1])
    for w in (v, V, V, v):
        assert _rel(op @ w, G @ w) <= 1e-10
    assert counted == [] and op.config()["calibrated_choice"] == {"single": path, "block": path}


def test_a_failing_path_is_dropped_with_its_reason(monkeypatch):
    model, obj, x = _problem()
    G = _dense_ggn_ce(model, x)

    def broken(*args, **kwargs):
        raise RuntimeError("linearize is not supported by this model")

    monkeypatch.setattr(ggn_mod, "linearize", broken)
    op = ls.ggn(obj, calibrate=True)
    op._timer.timer = scripted_clock([3.0, 4.0])  # only forward mode is timed
    v, V = _vectors(G.shape[0])
    for w in (v, V, V):
        assert _rel(op @ w, G @ w) <= 1e-10
    cfg = op.config()
    assert cfg["calibrated_choice"] == {"single": "forward", "block": "forward"}
    assert "linearize is not supported" in cfg["calibration_failed"]["linearize"]
    assert cfg["calibration_seconds"] == {"single": {"forward": 3.0}, "block": {"forward": 4.0}}
    assert cfg["jvp_used"] == "forward" and cfg["jvp_fallback_reason"] is None


def test_without_forward_mode_the_double_vjp_runs(monkeypatch):
    model, obj, x = _problem()
    G = _dense_ggn_ce(model, x)

    def broken(*args, **kwargs):
        raise NotImplementedError("no forward-mode AD here")

    monkeypatch.setattr(ggn_mod, "linearize", broken)
    monkeypatch.setattr(ggn_mod, "jvp", broken)
    op = GGNOperator(obj, calibrate=True, timer=_no_clock)
    v, V = _vectors(G.shape[0])
    for w in (V, v, V):
        assert _rel(op @ w, G @ w) <= 1e-10
    cfg = op.config()
    assert cfg["jvp_used"] == "double_vjp" and cfg["calibrated_choice"] == {}
    assert set(cfg["calibration_failed"]) == {"forward", "linearize"}
    assert "forward: NotImplementedError" in cfg["jvp_fallback_reason"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_default_is_forward_mode_bit_for_bit_without_timing(dtype):
    model = make_mlp((4, 6, 3), "tanh", seed=0, dtype=dtype)
    x, y = make_classification_data(n=20, d=4, n_classes=3, seed=1, dtype=dtype)
    obj = ls.Objective(model, nn.CrossEntropyLoss(), [(x, y)])
    auto = GGNOperator(obj, timer=_no_clock)  # jvp="auto", calibrate="auto"
    forward = ls.ggn(obj, jvp="forward")
    v, V = (t.to(dtype) for t in _vectors(auto.shape[0]))
    for w in (v, V, V, v):
        assert torch.equal(auto @ w, forward @ w)
    cfg = auto.config()
    assert cfg["jvp"] == "auto" and cfg["jvp_used"] == "forward" and cfg["calibrate"] is False
    assert "calibrated_choice" not in cfg and auto._timer is None
    for make in (ls.empirical_fisher, ls.fisher):  # the Fisher operators share the default
        a, f = make(obj), make(obj, jvp="forward")
        assert torch.equal(a @ V, f @ V) and a.config()["jvp_used"] == "forward"


def test_bad_values_name_the_accepted_ones():
    _, obj, _ = _problem()
    with pytest.raises(ValueError, match="jvp must be one of .*'auto', 'forward', 'linearize', 'double_vjp'"):
        ls.ggn(obj, jvp="fast")
    with pytest.raises(ValueError, match="calibrate must be True, False or 'auto'"):
        ls.ggn(obj, calibrate="sometimes")
    with pytest.raises(ValueError, match="calibrate must be True, False or 'auto'"):
        ls.empirical_fisher(obj, calibrate="sometimes")
    with pytest.raises(ValueError, match="calibrate=True times the jvp paths"):
        ls.ggn(obj, jvp="forward", calibrate=True)


def test_calibration_leaves_the_model_untouched():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)).double()
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    x, y = make_classification_data(n=20, d=4, n_classes=3, seed=1, dtype=torch.float64)
    model.train()
    model[2].eval()  # mixed flags
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    before = {k: t.clone() for k, t in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    flags = [m.training for m in model.modules()]
    op = ls.ggn(ls.Objective(model, nn.CrossEntropyLoss(), [(x, y)]), calibrate=True)
    v, V = _vectors(op.shape[0])
    op @ v, op @ V, op @ V
    assert set(op.config()["calibrated_choice"]) == {"single", "block"}
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert flags == [m.training for m in model.modules()]


def test_memory_fits_are_kept_per_chosen_path():
    model, obj, x = _problem()
    G = _dense_ggn_ce(model, x)
    clock = scripted_clock([5.0, 1.0] * 2)  # linearize faster for both widths
    op = GGNOperator(obj, calibrate=True, timer=clock, max_memory="1GiB")
    V = _vectors(G.shape[0])[1]
    for _ in range(2):
        assert _rel(op @ V, G @ V) <= 1e-10
    budget = op.config()["memory_budget"]
    assert budget["dropped_points"] >= 1  # the calls that calibrated are not points
    assert budget["fits"] and all(key.startswith("linearize/") for key in budget["fits"])


def test_fisher_operators_calibrate_the_same_paths():
    model, obj, x = _problem()
    v, V = _vectors(sum(p.numel() for p in model.parameters()))
    for make in (ls.empirical_fisher, ls.fisher):
        want = make(obj, jvp="forward")
        op = make(obj, calibrate=True)
        op._timer.timer = scripted_clock([5.0, 1.0, 1.0, 5.0])
        for w in (v, V, v, V):
            assert _rel(op @ w, want @ w) <= 1e-12
        cfg = op.config()
        assert cfg["calibrated_choice"] == {"single": "linearize", "block": "forward"}
        assert cfg["method_used"] == "output_space"


def test_a_coupled_model_still_falls_back_to_per_example_fisher():
    """The separability check of the output-space Fisher raises inside the timed paths: it decides
    the method, it is not a path's failure."""

    class Centred(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_mlp((4, 5, 3), seed=4)

        def forward(self, x):
            h = self.net[0](x)
            return self.net[2](torch.tanh(h - 0.5 * h.mean(dim=0, keepdim=True)))

    x, y = make_classification_data(n=8, d=4, n_classes=3, seed=1, dtype=torch.float64)
    obj = ls.Objective(Centred(), nn.CrossEntropyLoss(), [(x, y)])
    op = ls.empirical_fisher(obj, calibrate=True)
    op._timer.timer = _no_clock
    ref = ls.empirical_fisher(obj, method="per_example")
    V = _vectors(op.shape[0])[1]
    assert _rel(op @ V, ref @ V) <= 1e-12
    cfg = op.config()
    assert cfg["method_used"] == "per_example" and "couples the examples" in cfg["fallback_reason"]
