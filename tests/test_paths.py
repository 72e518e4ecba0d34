"""Paths between minima: the straight line, trained Bezier / polygonal-chain curves, the plane.

References: the Objective's own losses (end points, bit for bit), closed-form BatchNorm statistics
and a hand-written forward, the curve formulas of Garipov et al. 2018 written out, one hand-computed
SGD step of the bend (chain rule through the curve), and the geometry of the Gram-Schmidt plane.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.objective import Objective
from landscape.results import load_result
from landscape.surface.curves import Curve, curve_weights, evaluate_path, fit_curve
from landscape.surface.path_result import PathResult
from landscape.surface.paths import _combine, interpolate, recompute_bn
from landscape.surface.planes import curve_plane, plane, plane_directions
from tests import references as ref

CE = nn.CrossEntropyLoss()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one intra-op thread (two threads on a loaded two-core machine spin for 20x longer)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------ helpers


def _snapshot(model: nn.Module):
    tensors = [
        (n, t, t.detach().clone(), t.requires_grad, t.grad, None if t.grad is None else t.grad.clone())
        for n, t in [*model.named_parameters(), *model.named_buffers()]
    ]
    flags = [m.training for m in model.modules()]
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]
    return tensors, flags, hooks


def _assert_unchanged(model: nn.Module, snap) -> None:
    tensors, flags, hooks = snap
    now = dict([*model.named_parameters(), *model.named_buffers()])
    for n, t, saved, rg, g, g_saved in tensors:
        assert now[n] is t, f"{n}: another tensor object"
        assert t.dtype == saved.dtype and t.detach().numpy().tobytes() == saved.numpy().tobytes(), n
        assert t.requires_grad == rg and t.grad is g, n
        if g is not None:
            assert torch.equal(g, g_saved), n
    assert [m.training for m in model.modules()] == flags
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()] == hooks


def _bn_mlp(seed: int, hidden: int = 5) -> nn.Sequential:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(3, hidden), nn.BatchNorm1d(hidden), nn.Tanh(), nn.Linear(hidden, 3)
    ).double()
    with torch.no_grad():  # stored statistics far from the data's: eval != recompute
        model[1].running_mean.uniform_(-1.0, 1.0)
        model[1].running_var.uniform_(0.3, 3.0)
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.3, 0.3)
    return model


def _rings(n: int = 200, seed: int = 0):
    """Two noisy concentric rings (radius 1: class 0, radius 2: class 1), float64."""
    g = torch.Generator().manual_seed(seed)
    r = torch.where(torch.arange(n) % 2 == 0, 1.0, 2.0).double()
    ang = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    x = torch.stack([r * ang.cos(), r * ang.sin()], 1) + 0.1 * torch.randn(
        n, 2, generator=g, dtype=torch.float64
    )
    return x, (torch.arange(n) % 2).long()


@pytest.fixture(scope="module")
def permuted_pair():
    """A trained 2-8-2 tanh MLP and the same function with its hidden units rotated by 4: equal
    losses, but the midpoint of the line averages unrelated units (a barrier)."""
    x, y = _rings()
    a = ref.make_mlp((2, 8, 2), seed=0)
    opt = torch.optim.Adam(a.parameters(), lr=0.05)
    for _ in range(400):
        opt.zero_grad()
        CE(a(x), y).backward()
        opt.step()
    for p in a.parameters():
        p.grad = None
    perm = torch.roll(torch.arange(8), 4)
    b = ref.make_mlp((2, 8, 2), seed=1)
    with torch.no_grad():
        b[0].weight.copy_(a[0].weight[perm])
        b[0].bias.copy_(a[0].bias[perm])
        b[2].weight.copy_(a[2].weight[:, perm])
        b[2].bias.copy_(a[2].bias)
    return a, b, (x, y)


# ------------------------------------------------------------------------------ exact end points


def test_combine_is_exact_at_the_ends_where_the_naive_formula_rounds():
    a, b = {"w": torch.tensor([1.0, 0.1])}, {"w": torch.tensor([1e-20, 0.7])}
    naive = a["w"] + 1.0 * (b["w"] - a["w"])
    assert not torch.equal(naive, b["w"])  # 1 + (1e-20 - 1) = 0, not 1e-20
    assert torch.equal(_combine([0.0, 1.0], [a, b], ["w"])["w"], b["w"])
    assert torch.equal(_combine([1.0, 0.0], [a, b], ["w"])["w"], a["w"])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_line_end_losses_equal_the_objective_bit_for_bit(dtype):
    x, y = ref.make_classification_data(n=23, d=4, n_classes=3, dtype=dtype)
    data = ref.split_batches(x, y, [10, 8, 5])
    a = ref.make_mlp((4, 6, 3), seed=0, dtype=dtype)
    b = ref.make_mlp((4, 6, 3), seed=1, dtype=dtype)
    res = interpolate(a, b, CE, data, n_points=7)
    ea, eb = Objective(a, CE, data).evaluate(), Objective(b, CE, data).evaluate()
    assert res.loss[0] == float(Objective(a, CE, data).loss()) == res.loss_a == ea["loss"]
    assert res.loss[-1] == float(Objective(b, CE, data).loss()) == res.loss_b == eb["loss"]
    assert res.accuracy[0] == ea["accuracy"] and res.accuracy[-1] == eb["accuracy"]
    # an inner point against the line formed by hand and evaluated by the Objective
    t = res.t[2]
    mid = {
        n: (1 - t) * pa.detach() + t * pb.detach()
        for (n, pa), pb in zip(a.named_parameters(), b.parameters())
    }
    assert res.loss[2] == pytest.approx(
        float(Objective(a, CE, data).loss(mid)), rel=1e-12 if dtype == torch.float64 else 1e-6
    )


def test_bn_eval_policy_ends_are_the_models_own_bit_for_bit_and_train_policy_too():
    x, y = ref.make_classification_data(n=20, d=3, n_classes=3)
    data = ref.split_batches(x, y, [12, 8])
    a, b = _bn_mlp(0), _bn_mlp(1)
    res = interpolate(a, b, CE, data, n_points=5, bn="eval")
    assert res.loss_a == float(Objective(a, CE, data).loss())
    assert res.loss_b == float(Objective(b, CE, data).loss())
    assert res.config["bn"] == "eval" and res.config["bn_layers"] == 1
    tr = interpolate(a, b, CE, data, n_points=3, bn="train")
    assert tr.loss_a == float(Objective(a, CE, data, mode="train").loss())
    assert tr.loss_b == float(Objective(b, CE, data, mode="train").loss())


def test_recompute_bn_gives_the_exact_statistics_of_the_pre_bn_activations():
    x, y = ref.make_classification_data(n=23, d=3, n_classes=3)
    data = ref.split_batches(x, y, [10, 9, 4])  # uneven: pooled, not averaged per batch
    model = _bn_mlp(0)
    before = _snapshot(model)
    bufs = recompute_bn(Objective(model, CE, data))
    _assert_unchanged(model, before)
    z = x @ model[0].weight.detach().T + model[0].bias.detach()
    torch.testing.assert_close(bufs["1.running_mean"], z.mean(0), rtol=0, atol=1e-13)
    torch.testing.assert_close(bufs["1.running_var"], z.var(0, unbiased=True), rtol=1e-12, atol=0)
    assert int(bufs["1.num_batches_tracked"]) == 3
    # a conv net: BatchNorm2d statistics pool batch and positions
    xi, yi = ref.make_classification_data(n=9, n_classes=3, image=True)
    cnn = ref.make_cnn_bn()
    bufs = recompute_bn(Objective(cnn, CE, ref.split_batches(xi, yi, [5, 4])))
    h = F.conv2d(xi, cnn[0].weight.detach(), cnn[0].bias.detach())
    flat = h.transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(bufs["1.running_mean"], flat.mean(1), rtol=0, atol=1e-13)
    torch.testing.assert_close(bufs["1.running_var"], flat.var(1, unbiased=True), rtol=1e-12, atol=0)


def test_recompute_policy_end_loss_is_a_hand_forward_with_recomputed_statistics():
    x, y = ref.make_classification_data(n=21, d=3, n_classes=3)
    data = ref.split_batches(x, y, [11, 10])
    a, b = _bn_mlp(0), _bn_mlp(1)
    res = interpolate(a, b, CE, data, n_points=5)  # bn="recompute" is the default
    assert res.config["bn"] == "recompute" and res.config["bn_data"] == "data"
    for model, value in ((a, res.loss_a), (b, res.loss_b)):
        lin, bn, out = model[0], model[1], model[3]
        z = x @ lin.weight.detach().T + lin.bias.detach()
        zn = (z - z.mean(0)) / torch.sqrt(
            z.var(0, unbiased=True) + bn.eps
        ) * bn.weight.detach() + bn.bias.detach()
        logits = torch.tanh(zn) @ out.weight.detach().T + out.bias.detach()
        assert value == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)
        assert value != pytest.approx(
            float(Objective(model, CE, data).loss()), rel=1e-3
        )  # stale stats differ
    # separate statistics data: recorded, and used
    other = interpolate(a, b, CE, data, n_points=3, bn_data=[(x[:15], y[:15])])
    assert other.config["bn_data"].startswith("bn_data (15")
    assert other.loss_a != res.loss_a


# --------------------------------------------------------------------------------------- barriers


def test_barrier_fields_equal_a_hand_computation_and_the_result_round_trips(tmp_path):
    x, y = ref.make_classification_data(n=30, d=4, n_classes=3)
    a, b = ref.make_mlp((4, 6, 3), seed=0), ref.make_mlp((4, 6, 3), seed=3)
    res = interpolate(a, b, CE, (x, y), ts=np.linspace(-0.25, 1.25, 13))
    t, loss, acc = np.array(res.t), np.array(res.loss), np.array(res.accuracy)
    inside = (t >= 0) & (t <= 1)
    la, lb = res.loss_a, res.loss_b
    assert la == res.loss[2] and lb == res.loss[10]  # t = 0 and t = 1 are on this grid
    chord = (1 - t) * la + t * lb
    assert res.barrier == np.max((loss - chord)[inside])
    assert res.t_barrier == t[inside][np.argmax((loss - chord)[inside])]
    assert res.max_loss == np.max(loss[inside])
    assert res.barrier_max_ends == np.max(loss[inside]) - max(la, lb)
    assert res.barrier_mean_ends == np.max(loss[inside]) - (la + lb) / 2
    err, (ea, eb) = 1 - acc, (1 - acc[2], 1 - acc[10])
    assert res.error_barrier == pytest.approx(np.max((err - ((1 - t) * ea + t * eb))[inside]), abs=1e-15)
    assert "L(t) - ((1 - t) L(0)" in res.config["barrier_definition"]
    res.save(tmp_path / "line.json")
    back = load_result(tmp_path / "line.json")
    assert isinstance(back, PathResult) and back.loss == res.loss and back.barrier == res.barrier
    ax = res.plot()
    assert len(ax.lines) == 2 and np.allclose(ax.lines[0].get_ydata(), loss)
    fig = res.to_plotly(metric="error")
    assert len(fig.data) == 2 and np.allclose(fig.data[0].y, err)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_ends_outside_the_given_ts_are_evaluated_for_the_barrier():
    x, y = ref.make_classification_data(n=16, d=4, n_classes=3)
    a, b = ref.make_mlp((4, 5, 3), seed=0), ref.make_mlp((4, 5, 3), seed=2)
    res = interpolate(a, b, CE, (x, y), ts=[0.25, 0.5, 0.75])
    assert res.evaluations == 5 and res.loss_a == float(Objective(a, CE, (x, y)).loss())
    excess = [lv - ((1 - t) * res.loss_a + t * res.loss_b) for t, lv in zip(res.t, res.loss)]
    assert res.barrier == max(0.0, *excess)


# ----------------------------------------------------------------------------------------- curves


def test_curve_points_follow_garipovs_formulas_and_start_as_the_line(permuted_pair):
    a, b, data = permuted_pair
    torch.manual_seed(5)
    c = {n: torch.randn_like(p) for n, p in a.named_parameters()}
    for kind in ("bezier", "polychain"):
        curve = fit_curve(a, b, CE, data, kind=kind, steps=0, init=c)
        pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
        for t in (0.25, 0.7):
            if kind == "bezier":
                w = ((1 - t) ** 2, 2 * t * (1 - t), t**2)
            else:
                w = (1 - 2 * t, 2 * t, 0.0) if t <= 0.5 else (0.0, 2 - 2 * t, 2 * t - 1)
            pt = curve.params_at(t)
            for n in pa:
                torch.testing.assert_close(
                    pt[n], w[0] * pa[n] + w[1] * c[n] + w[2] * pb[n], rtol=1e-14, atol=1e-14
                )
        ends = curve.point(0.0), curve.point(1.0)
        assert all(torch.equal(ends[0][n], pa[n]) and torch.equal(ends[1][n], pb[n]) for n in pa)
    assert all(torch.equal(curve.point(0.5)[n], c[n]) for n in pa)  # the polychain's bend
    # the midpoint bend makes both curves the straight line
    line = interpolate(a, b, CE, data, n_points=11)
    for kind in ("bezier", "polychain"):
        flat = evaluate_path(fit_curve(a, b, CE, data, kind=kind, steps=0), n_points=11)
        np.testing.assert_allclose(flat.loss, line.loss, rtol=1e-12)
        assert flat.loss_a == line.loss_a and flat.loss_b == line.loss_b


def test_one_sgd_step_of_the_bend_is_the_chain_rule_by_hand(permuted_pair):
    a, b, data = permuted_pair
    lr, seed = 0.1, 7
    curve = fit_curve(a, b, CE, data, kind="bezier", steps=1, lr=lr, optimizer="sgd", momentum=0.0, seed=seed)
    t = float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    assert curve.history["t"] == [t]
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    c0 = {n: 0.5 * pa[n].detach() + 0.5 * pb[n].detach() for n in pa}
    phi = {n: (1 - t) ** 2 * pa[n].detach() + 2 * t * (1 - t) * c0[n] + t**2 * pb[n].detach() for n in pa}
    obj = Objective(a, CE, data)
    grad = obj.unflatten(obj.gradient(phi))  # dL/dphi; dphi/dc = 2 t (1 - t)
    for n in pa:
        torch.testing.assert_close(
            curve.theta_c[n], c0[n] - lr * 2 * t * (1 - t) * grad[n], rtol=1e-12, atol=1e-14
        )
    assert curve.history["loss"][0] == pytest.approx(float(obj.loss(phi)), rel=1e-12)


def test_trained_curves_remove_the_barrier_of_the_line_and_leave_models_untouched(permuted_pair):
    a, b, data = permuted_pair
    snaps = _snapshot(a), _snapshot(b)
    assert float(Objective(b, CE, data).loss()) == pytest.approx(
        float(Objective(a, CE, data).loss()), rel=1e-12
    )
    line = interpolate(a, b, CE, data, n_points=21)
    bez = fit_curve(a, b, CE, data, kind="bezier", steps=600, lr=0.05, seed=0)
    res = evaluate_path(bez, n_points=21)
    chain = evaluate_path(
        fit_curve(a, b, CE, data, kind="polychain", steps=600, lr=0.05, seed=0), n_points=21
    )
    assert line.barrier > 1.0 and line.max_loss > 1.0
    assert res.max_loss < 0.15 * line.max_loss and chain.max_loss < 0.15 * line.max_loss
    assert res.barrier < 0.15 * line.barrier and res.path == "bezier"
    assert res.loss_a == line.loss_a and res.loss_b == line.loss_b  # same ends, bit for bit
    again = fit_curve(a, b, CE, data, kind="bezier", steps=20, lr=0.05, seed=0)
    assert all(
        torch.equal(again.theta_c[n], fit_curve(a, b, CE, data, steps=20, lr=0.05, seed=0).theta_c[n])
        for n in again.names
    )
    for m, s in zip((a, b), snaps):
        _assert_unchanged(m, s)
    # the plane through the three points: coordinates reproduce the models, the curve lies in it
    for normalize in (False, True):
        d1, d2, pts = plane_directions(a, b, bez.theta_c, normalize=normalize)
        names = list(d1)
        dot = sum(float((d1[n] * d2[n]).sum()) for n in names)
        assert abs(dot) < 1e-12 * math.sqrt(sum(float((d1[n] ** 2).sum()) for n in names))
        for key, theta in (
            ("a", dict(a.named_parameters())),
            ("b", dict(b.named_parameters())),
            ("bend", bez.theta_c),
        ):
            x, y = pts[key]
            for n in names:
                rebuilt = a.state_dict()[n] + x * d1[n] + y * d2[n]
                assert float((rebuilt - theta[n].detach()).abs().max()) < 1e-12
    pl = curve_plane(bez, grid=5, n_curve=11)
    assert pl.points["bend"][1] == 1.0 and pl.surface.config["plane"]["points"]["b"] == [1.0, 0.0]
    assert pl.surface.loss.shape == (5, 5) and np.all(np.isfinite(pl.surface.loss))
    for t, (x, y) in zip(np.linspace(0, 1, 11), pl.curve):
        phi = bez.params_at(float(t))
        for n in names:
            assert (
                float(
                    (a.state_dict()[n] + x * pl.directions[0][n] + y * pl.directions[1][n] - phi[n])
                    .abs()
                    .max()
                )
                < 1e-12
            )
    for m, s in zip((a, b), snaps):
        _assert_unchanged(m, s)


def test_plane_surface_at_the_corners_is_the_models_losses(permuted_pair):
    a, b, data = permuted_pair
    torch.manual_seed(1)
    bend = {n: p.detach() + 0.1 * torch.randn_like(p) for n, p in a.named_parameters()}
    pl = plane(a, b, bend, CE, data, coords=[np.array([0.0, 1.0]), np.array([0.0, 1.0])], kind="bezier")
    assert pl.surface.loss[0, 0] == float(Objective(a, CE, data).loss())
    assert pl.surface.loss[1, 0] == pytest.approx(float(Objective(b, CE, data).loss()), rel=1e-9)
    x_c, y_c = pl.points["bend"]
    assert y_c == 1.0 and np.allclose(pl.curve[[0, -1]], [[0, 0], [1, 0]])
    assert np.allclose(pl.curve[25], 0.5 * np.array([x_c, y_c]) + 0.25 * np.array([1.0, 0.0]))  # t = 1/2
    ax = pl.plot()
    assert len(ax.texts) >= 3
    import matplotlib.pyplot as plt

    plt.close("all")


def test_curve_with_batchnorm_recomputes_statistics_at_each_point():
    x, y = ref.make_classification_data(n=24, d=3, n_classes=3)
    data = ref.split_batches(x, y, [12, 12])
    a, b = _bn_mlp(0), _bn_mlp(1)
    snaps = _snapshot(a), _snapshot(b)
    curve = fit_curve(a, b, CE, data, kind="bezier", steps=30, lr=0.01, seed=1)
    assert curve.config["bn_during_training"] == "batch statistics"
    res = evaluate_path(curve, n_points=5)
    m = curve.model_at(0.5)
    z = x @ m[0].weight.detach().T + m[0].bias.detach()
    torch.testing.assert_close(m[1].running_mean, z.mean(0), rtol=0, atol=1e-13)
    torch.testing.assert_close(m[1].running_var, z.var(0, unbiased=True), rtol=1e-12, atol=0)
    assert float(Objective(m, CE, data).loss()) == res.loss[2]  # the evaluated point, bit for bit
    xt, yt = ref.make_classification_data(n=10, d=3, n_classes=3, seed=9)  # "test" data
    test = evaluate_path(curve, data=(xt, yt), n_points=5)
    assert test.config["bn_data"].startswith("the curve's training data (24")
    assert float(Objective(m, CE, (xt, yt)).loss()) == test.loss[2]  # statistics from the training data
    for model, s in zip((a, b), snaps):
        _assert_unchanged(model, s)


# --------------------------------------------------------------------------------- bad arguments


def test_errors_name_the_problem_and_leave_the_models_untouched():
    x, y = ref.make_classification_data(n=12, d=3, n_classes=3)
    a, b = _bn_mlp(0), _bn_mlp(1)
    snaps = _snapshot(a), _snapshot(b)
    with pytest.raises(ValueError, match="one architecture"):
        interpolate(a, _bn_mlp(0, hidden=4), CE, (x, y))
    with pytest.raises(ValueError, match="one architecture"):
        interpolate(a, ref.make_mlp((3, 5, 3)), CE, (x, y))
    with pytest.raises(ValueError, match="bn must be one of"):
        interpolate(a, b, CE, (x, y), bn="stale")
    with pytest.raises(ValueError, match="bn_data is used only with bn='recompute'"):
        interpolate(a, b, CE, (x, y), bn="eval", bn_data=(x, y))
    with pytest.raises(ValueError, match="n_points must be an int >= 2"):
        interpolate(a, b, CE, (x, y), n_points=1)
    with pytest.raises(ValueError, match="strictly increasing"):
        interpolate(a, b, CE, (x, y), ts=[0.5, 0.1])
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        interpolate(a, b, CE, (x, y), bn_data=[(x[:1], y[:1])])  # raises inside the BN pass
    with pytest.raises(ValueError, match="kind must be one of"):
        fit_curve(a, b, CE, (x, y), kind="spline")
    with pytest.raises(ValueError, match="batch_size applies to one"):
        fit_curve(a, b, CE, ref.split_batches(x, y, [6, 6]), batch_size=4)
    curve = fit_curve(a, b, CE, (x, y), steps=0)
    with pytest.raises(ValueError, match="defined for t in \\[0, 1\\]"):
        evaluate_path(curve, ts=[0.0, 1.5])
    with pytest.raises(ValueError, match="t must lie in \\[0, 1\\]"):
        curve.point(1.5)
    with pytest.raises(TypeError, match="takes a Curve"):
        evaluate_path(a)
    with pytest.raises(ValueError, match="train the curve first"):
        curve_plane(curve)
    for m, s in zip((a, b), snaps):
        _assert_unchanged(m, s)
    assert isinstance(curve, Curve) and curve_weights("bezier", 1.0) == (0.0, 0.0, 1.0)


@pytest.mark.gpu
def test_paths_curves_and_plane_on_cuda_match_cpu():
    x, y = ref.make_classification_data(n=24, d=3, n_classes=3)
    data = ref.split_batches(x, y, [12, 12])
    a, b = _bn_mlp(0), _bn_mlp(1)
    snaps = _snapshot(a), _snapshot(b)
    cpu = interpolate(a, b, CE, data, n_points=5)
    gpu = interpolate(a, b, CE, data, n_points=5, device="cuda")
    np.testing.assert_allclose(gpu.loss, cpu.loss, rtol=1e-10)
    assert gpu.config["objective"]["device"].startswith("cuda")
    c_cpu = fit_curve(a, b, CE, (x, y), steps=5, lr=0.01, batch_size=8, seed=3)
    c_gpu = fit_curve(a, b, CE, (x, y), steps=5, lr=0.01, batch_size=8, seed=3, device="cuda")
    assert c_gpu.history["t"] == c_cpu.history["t"]
    for n in c_cpu.names:
        assert c_gpu.theta_c[n].device.type == "cuda"
        torch.testing.assert_close(c_gpu.theta_c[n].cpu(), c_cpu.theta_c[n], rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(
        evaluate_path(c_gpu, n_points=3).loss, evaluate_path(c_cpu, n_points=3).loss, rtol=1e-9
    )
    pg, pc = curve_plane(c_gpu, grid=3), curve_plane(c_cpu, grid=3)
    np.testing.assert_allclose(pg.surface.loss, pc.surface.loss, rtol=1e-9)
    for m, s in zip((a, b), snaps):
        _assert_unchanged(m, s)
