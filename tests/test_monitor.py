"""CurvatureMonitor: sharpness during training against dense float64 Hessians, Adam's preconditioned
sharpness against a dense P^{-1} H built by hand from the optimizer's state, stability thresholds
against simulated optimizers on quadratics, cost accounting, model safety, and (slow) the edge of
stability of full-batch gradient descent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import nn

import landscape as ls
from landscape.curvature.monitor import (
    CurvatureMonitor,
    MonitorResult,
    adam_preconditioner,
    stability_threshold,
)
from landscape.models import train
from tests import references as ref


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one thread is much faster than two on a shared, loaded machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _problem(seed: int = 0, n: int = 48, sizes=(5, 8, 8, 2)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, sizes[0], generator=g, dtype=torch.float64)
    y = torch.randn(n, sizes[-1], generator=g, dtype=torch.float64)
    return ref.make_mlp(sizes, seed=seed), (x, y)


def _dense_top(model, data, loss_fn=None):
    H = ref.dense_hessian(model, loss_fn or nn.MSELoss(), [data])
    return float(torch.linalg.eigvalsh(H)[-1]), H


# ------------------------------------------------------------------------------------ lambda_max
def test_lambda_max_matches_full_lanczos_and_dense_hessian_during_training():
    model, data = _problem()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    mon = CurvatureMonitor(data, nn.MSELoss(), every=4, optimizer=opt, tol=1e-10, max_matvecs=300)
    seen = []

    def callback(step, m, loss):
        rec = mon(step, m, loss)
        if rec is not None:
            full = ls.eigenvalues(ls.hessian(ls.Objective(m, nn.MSELoss(), data)), k=1, tol=1e-12)
            dense, _ = _dense_top(m, data)
            seen.append((rec, float(full.values[0]), dense))

    hist = train(model, data, opt, epochs=16, loss_fn=nn.MSELoss(), callback=callback)
    assert [r["step"] for r, _, _ in seen] == [4, 8, 12, 16]
    for rec, full, dense in seen:
        assert rec["converged"] and rec["residual"] <= 1e-10 * abs(rec["lambda_max"])
        assert rec["lambda_max"] == pytest.approx(full, rel=1e-6)
        assert rec["lambda_max"] == pytest.approx(dense, rel=1e-6)
        assert rec["threshold"] == pytest.approx(2 / 0.2) and rec["threshold_rule"].startswith("2/lr")
        assert rec["train_loss"] == hist["loss"][rec["step"] - 1]
    # the recorded batch loss is the loss after the step's update: the next step's training loss
    assert seen[0][0]["loss"] == pytest.approx(hist["loss"][4], rel=1e-12)
    assert len({round(r["lambda_max"], 6) for r, _, _ in seen}) == 4  # the model did change


def test_warm_start_needs_fewer_products_than_cold_start():
    model, data = _problem(1, sizes=(6, 12, 12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    kw = dict(every=1, tol=1e-3, max_matvecs=200)  # the default tolerance
    warm = CurvatureMonitor(data, nn.MSELoss(), warm_start=True, **kw)
    cold = CurvatureMonitor(data, nn.MSELoss(), warm_start=False, **kw)

    def callback(step, m, loss):
        warm(step, m, loss)
        cold(step, m, loss)

    train(model, data, opt, epochs=12, loss_fn=nn.MSELoss(), callback=callback)
    w = [h["lanczos_matvecs"] for h in warm.history[1:]]
    c = [h["lanczos_matvecs"] for h in cold.history[1:]]
    assert all(h["converged"] for h in warm.history + cold.history)
    assert [h["warm"] for h in warm.history] == [False] + [True] * 11
    assert not any(h["warm"] for h in cold.history)
    for a, b in zip(warm.history, cold.history):
        assert a["lambda_max"] == pytest.approx(b["lambda_max"], rel=1e-4)
    assert sum(w) < 0.5 * sum(c), (w, c)


def test_call_conventions_and_every():
    model, data = _problem()
    mon = CurvatureMonitor(data, nn.MSELoss(), every=3, lr=0.5)
    assert mon(model, 1) is None and mon.step(model, 2) is None
    rec = mon(model, 3)
    assert rec["step"] == 3 and rec["threshold"] == pytest.approx(4.0)
    assert mon.step(model) is None  # 4th call, counted
    assert mon(5, model, 0.1) is None
    assert mon(6, model, 0.25)["train_loss"] == 0.25
    assert [h["step"] for h in mon.history] == [3, 6]
    forced = mon.check(model, 7)
    assert forced["step"] == 7 and len(mon.history) == 3
    with pytest.raises(TypeError, match="monitor\\(step, model, loss\\)"):
        mon(3, 4)
    with pytest.raises(TypeError, match="step must be an int"):
        mon.step(model, 2.0)
    other, _ = _problem(2)
    with pytest.raises(ValueError, match="bound to another model"):
        mon.check(other, 8)


# ------------------------------------------------------------------------------------ Adam
@pytest.mark.parametrize("amsgrad", [False, True])
def test_preconditioned_sharpness_matches_dense_inverse_preconditioner_times_hessian(amsgrad):
    model, data = _problem(3)
    lr, (b1, b2), eps = 0.01, (0.8, 0.95), 1e-3
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(b1, b2), eps=eps, amsgrad=amsgrad)
    mon = CurvatureMonitor(data, nn.MSELoss(), every=5, optimizer=opt, tol=1e-10, max_matvecs=300)
    assert mon.preconditioned
    first = mon.check(model, 0)  # before the first step: no state yet
    assert first["precond_lambda_max"] is None and "no state yet" in first["note"]
    train(model, data, opt, epochs=10, loss_fn=nn.MSELoss(), callback=mon)
    rec = mon.history[-1]
    assert rec["step"] == 10 and rec["adam_step"] == 10
    lam, H = _dense_top(model, data)
    # P by hand from Adam's state (Cohen et al. 2022): (1 - b1^t) (sqrt(v_t / (1 - b2^t)) + eps)
    P = []
    for p in model.parameters():
        st = opt.state[p]
        t = float(st["step"])
        v = st["max_exp_avg_sq" if amsgrad else "exp_avg_sq"].reshape(-1)
        P.append((1 - b1**t) * (torch.sqrt(v / (1 - b2**t)) + eps))
    P = torch.cat(P)
    eigs = scipy.linalg.eigvals(np.diag(1 / P.numpy()) @ H.numpy())
    assert np.abs(eigs.imag).max() < 1e-8 * np.abs(eigs.real).max()
    assert rec["precond_lambda_max"] == pytest.approx(float(eigs.real.max()), rel=1e-6)
    assert rec["precond_converged"]
    assert rec["lambda_max"] == pytest.approx(lam, rel=1e-6)
    assert rec["precond_threshold"] == pytest.approx((2 + 2 * b1) / ((1 - b1) * lr))
    assert rec["threshold"] is None  # 2/lr says nothing about Adam


def test_adam_preconditioner_reproduces_adams_step():
    """With P as defined, Adam's update is exactly x <- x - lr P^{-1} m_t (Cohen et al. 2022)."""
    model, data = _problem(4)
    opt = torch.optim.Adam(model.parameters(), lr=0.03, betas=(0.9, 0.99), eps=1e-4)
    train(model, data, opt, epochs=3, loss_fn=nn.MSELoss())
    params = list(model.parameters())
    before = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    train(model, data, opt, epochs=1, loss_fn=nn.MSELoss())
    after = torch.cat([p.detach().reshape(-1) for p in params])
    m = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in params])
    P = adam_preconditioner(opt, params)
    torch.testing.assert_close(after - before, -0.03 * m / P, rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------ thresholds
def _final_distance(make_opt, a: float, steps: int = 500) -> float:
    """|x| after ``steps`` steps of the optimizer on the 1-D quadratic a x^2 / 2 from x = 1."""
    x = torch.ones(1, dtype=torch.float64, requires_grad=True)
    opt = make_opt([x])
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * a * x**2).sum().backward()
        opt.step()
    return abs(float(x.detach()))


@pytest.mark.parametrize(
    "kw, rule",
    [
        (dict(lr=0.3), "gradient descent"),
        (dict(lr=0.3, momentum=0.9), "heavy ball"),
        (dict(lr=0.3, momentum=0.5, dampening=0.5), "heavy ball"),
        (dict(lr=0.3, momentum=0.9, nesterov=True), "Nesterov"),
    ],
)
def test_sgd_thresholds_are_the_stability_limits_of_torch_sgd(kw, rule):
    x = torch.zeros(1, requires_grad=True)
    thr = stability_threshold(torch.optim.SGD([x], **kw))
    assert rule in thr["rule"] and thr["applies_to"] == "lambda_max" and thr["lr"] == 0.3
    make = lambda ps: torch.optim.SGD(ps, **kw)
    assert _final_distance(make, 0.99 * thr["value"]) < 1e-4  # 1 % below: converges
    assert _final_distance(make, 1.01 * thr["value"]) > 1e4  # 1 % above: diverges


def test_adam_threshold_and_unknown_optimizers():
    x = torch.zeros(1, requires_grad=True)
    thr = stability_threshold(torch.optim.Adam([x], lr=1e-3))  # beta1 = 0.9: 38 / lr
    assert thr["value"] == pytest.approx(38e3) and thr["applies_to"] == "precond_lambda_max"
    assert stability_threshold(torch.optim.Adagrad([x], lr=0.1))["value"] is None
    y = torch.zeros(1, requires_grad=True)
    mixed = torch.optim.SGD([{"params": [x], "lr": 0.1}, {"params": [y], "lr": 0.2}])
    assert stability_threshold(mixed)["value"] is None and "differ" in stability_threshold(mixed)["rule"]
    assert stability_threshold(mixed, [y])["value"] == pytest.approx(10.0)


# ------------------------------------------------------------------------------------ trace, budget
def test_trace_is_hutchinson_on_the_batch_hessian():
    model, data = _problem(5)
    mon = CurvatureMonitor(data, nn.MSELoss(), trace_probes=400, seed=3)
    rec = mon.check(model, 0)
    _, H = _dense_top(model, data)
    exact = float(torch.trace(H))
    assert rec["trace_matvecs"] == 400 and rec["matvecs"] == rec["lanczos_matvecs"] + 400
    assert abs(rec["trace"] - exact) <= 4 * rec["trace_stderr"]
    assert rec["trace_stderr"] < 0.2 * abs(exact)
    again = mon.check(model, 1)  # the same seeded probes at every check
    assert again["trace"] == rec["trace"]


def test_budget_bounds_the_total_and_skipped_checks_are_recorded():
    model, data = _problem(6, sizes=(6, 12, 12, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = CurvatureMonitor(
        data, nn.MSELoss(), every=2, optimizer=opt, max_matvecs=15, tol=1e-12, budget=40, trace_probes=6
    )
    train(model, data, opt, epochs=20, loss_fn=nn.MSELoss(), callback=mon)
    hist = mon.history
    assert len(hist) == 10 and mon.total_matvecs <= 40
    assert sum(h["matvecs"] for h in hist) == mon.total_matvecs == hist[-1]["total_matvecs"]
    # 40 = (15 + 6) + (15, trace unaffordable) + (the 4 left); then nothing is affordable
    assert [h["status"] for h in hist] == ["ok", "partial", "partial"] + ["skipped"] * 7
    assert [h["lanczos_matvecs"] for h in hist[:3]] == [15, 15, 4]
    assert [h["trace_matvecs"] for h in hist[:3]] == [6, None, None]
    assert mon.total_matvecs == 40
    assert all("trace skipped: HVP budget" in h["note"] for h in hist[1:3])
    assert all(h["lambda_max"] is None and h["matvecs"] == 0 for h in hist[3:])
    assert "budget exhausted (40 of 40 used)" in hist[3]["note"]
    res = mon.result()
    assert (res.checks, res.skipped, res.matvecs) == (3, 7, 40)


# ------------------------------------------------------------------------------------ model safety
class _BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.bn, self.fc2 = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


def _snapshot(model):
    return (
        {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()},
        {n: b.clone() for n, b in model.named_buffers()},
        [m.training for m in model.modules()],
        [id(p) for p in model.parameters()],
        [p.requires_grad for p in model.parameters()],
    )


def _same(a, b):
    for da, db in zip(a[:3], b[:3]):
        assert da.keys() == db.keys()
        for k in da:
            if da[k] is None or db[k] is None:
                assert da[k] is None and db[k] is None
            else:
                assert torch.equal(da[k], db[k]) and da[k].dtype == db[k].dtype
    assert a[3:] == b[3:]


def test_model_is_bit_identical_after_every_check():
    model = _BNNet().double()
    _, data = _problem(7)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    mon = CurvatureMonitor(data, nn.MSELoss(), every=1, optimizer=opt, trace_probes=3)
    for step in range(1, 4):
        opt.zero_grad()
        nn.MSELoss()(model(data[0]), data[1]).backward()
        opt.step()
        model.fc2.weight.grad = None  # a mix of present and absent gradients
        model.bn.eval() if step == 2 else model.bn.train()
        before = _snapshot(model)
        rec = mon(model, step)
        assert rec["lambda_max"] is not None and rec["precond_lambda_max"] is not None
        _same(before, _snapshot(model))
    # the check also leaves the model intact when it raises
    bad = CurvatureMonitor((data[0], torch.full_like(data[1], math.nan)), nn.MSELoss())
    before = _snapshot(model)
    with pytest.raises(ValueError):
        bad.check(model, 0)
    _same(before, _snapshot(model))


# ------------------------------------------------------------------------------------ results
def test_result_round_trip_and_plots(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    model, data = _problem(8)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    mon = CurvatureMonitor(data, nn.MSELoss(), every=2, optimizer=opt, trace_probes=2)
    train(model, data, opt, epochs=6, loss_fn=nn.MSELoss(), callback=mon)
    res = mon.result()
    res.save(tmp_path / "m.json")
    back = ls.load_result(tmp_path / "m.json")
    assert isinstance(back, MonitorResult) and back.history == res.history
    assert back.config["optimizer"] == "Adam" and back.config["objective"]["num_params"] == 138
    steps, lam = back.series("lambda_max")
    assert steps.tolist() == [2, 4, 6] and lam.tolist() == [h["lambda_max"] for h in mon.history]
    ax = mon.plot(label="Adam")
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {
        "Adam: lambda_max(H)",
        "Adam: lambda_max(P^-1 H)",
        "Adam: threshold of lambda_max(P^-1 H)",
    }
    np.testing.assert_array_equal(
        lines["Adam: lambda_max(P^-1 H)"].get_ydata(), back.series("precond_lambda_max")[1]
    )
    np.testing.assert_allclose(lines["Adam: threshold of lambda_max(P^-1 H)"].get_ydata(), 38 / 0.01)
    fig = mon.to_plotly()
    assert [t.name for t in fig.data] == [
        "lambda_max(H)",
        "lambda_max(P^-1 H)",
        "threshold of lambda_max(P^-1 H)",
    ]
    np.testing.assert_array_equal(np.asarray(fig.data[0].y), lam)


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "kw, err, fragment",
    [
        (dict(every=0), ValueError, "every must be"),
        (dict(every=1.5), TypeError, "every must be an integer"),
        (dict(max_matvecs=1), ValueError, "max_matvecs must be an integer in \\[2"),
        (dict(tol=-1.0), ValueError, "tol must be"),
        (dict(budget=0), ValueError, "budget must be"),
        (dict(trace_probes=1), ValueError, "at least 2"),
        (dict(seed=-1), ValueError, "seed must be"),
        (dict(preconditioned="yes"), ValueError, "preconditioned must be one of"),
        (dict(preconditioned=True), ValueError, "needs optimizer=<torch.optim.Adam"),
        (dict(optimizer="sgd"), TypeError, "optimizer must be a torch.optim.Optimizer"),
        (dict(lr=0.0), ValueError, "lr must be"),
        (dict(threshold=math.nan), ValueError, "threshold must be"),
    ],
)
def test_bad_arguments(kw, err, fragment):
    _, data = _problem()
    with pytest.raises(err, match=fragment):
        CurvatureMonitor(data, nn.MSELoss(), **kw)


def test_bad_setup_errors():
    model, data = _problem()
    with pytest.raises(ValueError, match="data is required"):
        CurvatureMonitor(None, nn.MSELoss())
    with pytest.raises(TypeError, match="loss_fn must be callable"):
        CurvatureMonitor(data, "mse")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="either optimizer"):
        CurvatureMonitor(data, nn.MSELoss(), optimizer=opt, lr=0.1)
    partial = torch.optim.SGD(model[0].parameters(), lr=0.1)
    mon = CurvatureMonitor(data, nn.MSELoss(), optimizer=partial)
    with pytest.raises(ValueError, match="not optimised by the optimizer given; pass params="):
        mon.check(model, 0)
    ok = CurvatureMonitor(data, nn.MSELoss(), optimizer=partial, params=model[0])
    assert ok.check(model, 0)["threshold"] == pytest.approx(20.0)


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_cuda_model_and_adam_state_give_the_cpu_numbers():
    out = {}
    for dev in ("cpu", "cuda"):
        model, (x, y) = _problem(9, n=64)
        model, data = model.to(dev), (x.to(dev), y.to(dev))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        mon = CurvatureMonitor(data, nn.MSELoss(), every=3, optimizer=opt, tol=1e-10, max_matvecs=300)
        train(model, data, opt, epochs=6, loss_fn=nn.MSELoss(), callback=mon)
        before = _snapshot(model)
        mon.check(model, 7)
        _same(before, _snapshot(model))
        out[dev] = [(h["lambda_max"], h["precond_lambda_max"]) for h in mon.history]
    np.testing.assert_allclose(np.array(out["cuda"]), np.array(out["cpu"]), rtol=1e-7)


# ------------------------------------------------------------------------------------ slow: EoS
@pytest.mark.slow
def test_edge_of_stability_of_full_batch_gradient_descent():
    """Cohen et al. 2021: with MSE, full-batch GD sharpens progressively until lambda_max reaches
    2/lr, then hovers there while the loss keeps decreasing, non-monotonically."""
    from landscape.data import load_digits
    from landscape.models import MLP

    x, labels = load_digits("train", dtype=torch.float64)
    x, labels = x[:500], labels[:500]
    y = nn.functional.one_hot(labels, 10).to(torch.float64)
    torch.manual_seed(0)
    model = MLP([64, 32, 32, 10], "tanh").to(torch.float64)
    lr, steps = 2.0, 600
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = CurvatureMonitor((x, y), nn.MSELoss(), every=10, optimizer=opt, max_matvecs=30)
    mon.check(model, 0)
    hist = train(model, (x, y), opt, epochs=steps, loss_fn=nn.MSELoss(), callback=mon)
    st, lam = mon.result().series("lambda_max")
    loss = np.array(hist["loss"])
    thr = 2 / lr
    assert all(h["threshold"] == thr for h in mon.history)
    assert lam[0] < 0.7 * thr  # starts well below 2/lr ...
    onset = int(st[np.argmax(lam >= 0.95 * thr)])  # ... and rises to it (progressive sharpening)
    assert 0 < onset < steps - 200
    last = st >= steps - 200
    assert np.all(np.abs(lam[last] / thr - 1) <= 0.10), lam[last]
    assert loss[-1] < 0.7 * loss[onset]  # the loss still decreases overall ...
    assert int((np.diff(loss[onset:]) > 0).sum()) >= 10  # ... but not monotonically
    assert int((np.diff(loss[: onset // 2]) > 0).sum()) == 0  # stable phase: monotone
