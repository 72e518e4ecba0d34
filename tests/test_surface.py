"""Loss surfaces: values against independent evaluations of hand-perturbed model copies."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from landscape import directions as D
from landscape.objective import Objective
from landscape.surface import Surface, load_surface, model_hash, surface
from tests.references import make_classification_data, make_cnn_bn, make_mlp, split_batches

ROOT = Path(__file__).resolve().parents[1]
CE = nn.CrossEntropyLoss()


def snapshot(model: nn.Module):
    return (
        {n: p.detach().clone() for n, p in model.named_parameters()},
        {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()},
        {n: b.detach().clone() for n, b in model.named_buffers()},
        [m.training for m in model.modules()],
    )


def assert_same(model: nn.Module, snap) -> None:
    params, grads, bufs, modes = snap
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), params[n]) and p.dtype == params[n].dtype, n
        assert (p.grad is None) == (grads[n] is None) and (p.grad is None or torch.equal(p.grad, grads[n]))
    for n, b in model.named_buffers():
        assert torch.equal(b, bufs[n]), n
    assert [m.training for m in model.modules()] == modes


def independent_loss(model, dirs, c, batches, mode="eval", recompute_bn=False):
    """Loss of a deep copy moved by hand to theta + sum c_i d_i, with plain forward passes."""
    m = copy.deepcopy(model)
    with torch.no_grad():
        named = dict(m.named_parameters())
        named.update(dict(m.named_buffers()))
        for ci, d in zip(c, dirs):
            for n, t in d.items():
                named[n].add_(ci * t)
        if recompute_bn:
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm2d):
                    mod.reset_running_stats()
                    mod.momentum = None
            m.train()
            for x, _ in batches:
                m(x)
        m.train(mode == "train")
        n_total = sum(len(y) for _, y in batches)
        loss = sum(CE(m(x), y) * len(y) / n_total for x, y in batches)
        correct = sum(int((m(x).argmax(1) == y).sum()) for x, y in batches)
    return float(loss), correct / n_total


@pytest.fixture(scope="module")
def mlp_setup():
    x, y = make_classification_data(n=60, d=5, n_classes=3, seed=1)
    model = make_mlp((5, 7, 6, 3), seed=2)
    batches = split_batches(x, y, [25, 20, 15])
    obj = Objective(model, CE, batches)
    d1 = D.random(obj, "filter", seed=0)
    d2 = D.random(obj, "filter", seed=1)
    return model, batches, obj, d1, d2


@pytest.mark.parametrize("strategy", ["loop", "linear_first_layer", "vmap"])
def test_centre_and_cells_match_independent_evaluation(mlp_setup, strategy):
    model, batches, obj, d1, d2 = mlp_setup
    snap = snapshot(model)
    xs, ys = np.linspace(-1, 1, 5), np.linspace(-0.5, 1.0, 4)  # non-square; ys has no 0
    xs2, ys2 = np.array([-1.0, -0.5, 0.0]), np.array([-0.3, 0.0, 0.3, 0.6, 0.9])  # range ending at 0
    s = surface(obj, [d1, d2], [xs, ys], strategy=strategy, batch_points=3)
    assert s.loss.shape == (5, 4) and s.accuracy.shape == (5, 4) and s.complete
    s2 = surface(obj, [d1, d2], [xs2, ys2], strategy=strategy)
    assert s2.loss.shape == (3, 5)
    ref0 = float(obj.loss())
    if strategy != "vmap":
        assert s2.loss[2, 1] == ref0  # bit-exact centre
    else:
        assert s2.loss[2, 1] == pytest.approx(ref0, rel=1e-12)
    rng = np.random.default_rng(0)
    for i, j in [(0, 0), (4, 3), *zip(rng.integers(0, 5, 3), rng.integers(0, 4, 3))]:
        lv, acc = independent_loss(model, [d1, d2], (xs[i], ys[j]), batches)
        assert s.loss[i, j] == pytest.approx(lv, rel=1e-10, abs=1e-12)
        assert s.accuracy[i, j] == pytest.approx(acc, abs=1e-12)
    for i, j in [(0, 4), (1, 2)]:
        lv, _ = independent_loss(model, [d1, d2], (xs2[i], ys2[j]), batches)
        assert s2.loss[i, j] == pytest.approx(lv, rel=1e-10)
    assert_same(model, snap)


def test_strategies_agree_and_1d(mlp_setup):
    model, batches, obj, d1, d2 = mlp_setup
    xs, ys = np.linspace(-2, 2, 6), np.linspace(-1, 1, 3)
    loop = surface(obj, [d1, d2], [xs, ys], strategy="loop")
    lin = surface(obj, [d1, d2], [xs, ys], strategy="linear_first_layer")
    vm = surface(obj, [d1, d2], [xs, ys], strategy="vmap", batch_points=4)
    assert lin.strategy == "linear_first_layer"
    np.testing.assert_allclose(lin.loss, loop.loss, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(vm.loss, loop.loss, rtol=1e-10, atol=1e-10)
    np.testing.assert_array_equal(vm.accuracy, loop.accuracy)
    one = surface(obj, [d1], [xs])
    assert one.loss.shape == (6,) and one.ndim == 1
    np.testing.assert_array_equal(surface(obj, d1, xs).loss, one.loss)  # bare direction and coords
    for i in (0, 3, 5):
        assert one.loss[i] == pytest.approx(independent_loss(model, [d1], (xs[i],), batches)[0], rel=1e-10)
    # auto picks the linear strategy on CPU for an nn.Sequential MLP
    assert surface(obj, [d1], [xs[:2]]).strategy == "linear_first_layer"


def test_float32_centre_exact():
    x, y = make_classification_data(n=40, d=5, n_classes=3, seed=3, dtype=torch.float32)
    model = make_mlp((5, 8, 3), seed=4, dtype=torch.float32)
    obj = Objective(model, CE, split_batches(x, y, [17, 23]))
    d1, d2 = D.random(obj, seed=5), D.random(obj, seed=6)
    for strategy in ("loop", "linear_first_layer"):
        s = surface(obj, [d1, d2], [np.linspace(-1, 1, 3), np.linspace(-1, 1, 5)], strategy=strategy)
        assert s.loss[1, 2] == float(obj.loss())


def test_batchnorm_policies_and_model_untouched():
    x, y = make_classification_data(n=30, n_classes=3, seed=7, image=True)
    model = make_cnn_bn(seed=8)
    model.train()  # the caller's mode must survive
    model[0].weight.grad = torch.ones_like(model[0].weight)
    batches = split_batches(x, y, [12, 18])
    snap = snapshot(model)
    obj = Objective(model, CE, batches)
    d1 = D.random(obj, "filter", seed=0, ignore_1d=False)
    xs = np.array([-0.5, 0.0, 0.7])
    ev = surface(obj, [d1], [xs])
    assert ev.config["bn_policy"] == "eval" and ev.loss[1] == float(obj.loss())
    for i in (0, 2):
        assert ev.loss[i] == pytest.approx(independent_loss(model, [d1], (xs[i],), batches)[0], rel=1e-10)
    tr = surface(obj, [d1], [xs], bn_policy="train")
    assert tr.loss[1] == pytest.approx(float(Objective(model, CE, batches, mode="train").loss()), rel=1e-12)
    assert abs(tr.loss[1] - ev.loss[1]) > 1e-3  # the policies really differ here
    rc = surface(obj, [d1], [xs], bn_policy="recompute")
    for i in range(3):
        ref = independent_loss(model, [d1], (xs[i],), batches, recompute_bn=True)[0]
        assert rc.loss[i] == pytest.approx(ref, rel=1e-10)
    assert_same(model, snap)
    assert model[1].momentum == 0.1

    # also when the evaluation raises half-way
    calls = {"n": 0}

    def bad_loss(out, tgt):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("boom")
        return CE(out, tgt)

    bad = Objective(model, bad_loss, batches)
    with pytest.raises(RuntimeError, match="boom"):
        surface(bad, [d1], [xs], bn_policy="recompute")
    assert_same(model, snap)
    assert model[1].momentum == 0.1


def test_between_with_buffers_reaches_other_model():
    x, y = make_classification_data(n=20, n_classes=3, seed=9, image=True)
    a, b = make_cnn_bn(seed=10), make_cnn_bn(seed=11)
    obj = Objective(a, CE, (x, y))
    d = D.between(a, b, include_buffers=True)
    assert "1.running_mean" in d and "1.num_batches_tracked" not in d
    s = surface(obj, [d], [np.array([0.0, 1.0])])
    assert s.loss[0] == float(obj.loss())
    assert s.loss[1] == pytest.approx(float(Objective(b, CE, (x, y)).loss()), rel=1e-10)


def test_resume_from_partial_file(mlp_setup, tmp_path):
    _, _, obj, d1, d2 = mlp_setup
    xs, ys = np.linspace(-1, 1, 4), np.linspace(-1, 0, 3)
    full = surface(obj, [d1, d2], [xs, ys], strategy="loop")
    part = load_surface(full.save(tmp_path / "full.npz"))
    part.mask[1:, :] = False
    part.mask[0, 2] = False
    for v in part.values.values():
        v[~part.mask] = np.nan
    path = tmp_path / "partial.npz"
    part.save(path)
    resumed = surface(obj, [d1, d2], [xs, ys], strategy="loop", resume=path)
    assert resumed.evaluations == 10  # only the 10 missing points were evaluated
    np.testing.assert_array_equal(resumed.loss, full.loss)
    np.testing.assert_array_equal(resumed.accuracy, full.accuracy)
    again = load_surface(path)
    assert again.complete
    np.testing.assert_array_equal(again.loss, full.loss)
    # a different configuration refuses to resume
    with pytest.raises(ValueError, match="cannot resume"):
        surface(obj, [d2, d1], [xs, ys], resume=path)


def test_save_load_round_trip_and_exports(mlp_setup, tmp_path):
    _, _, obj, d1, d2 = mlp_setup
    xs, ys = np.linspace(-1, 1, 4), np.linspace(-2, 1, 3)
    s = surface(obj, [d1, d2], [xs, ys])
    t = load_surface(s.save(tmp_path / "s.npz"))
    assert isinstance(t, Surface)
    np.testing.assert_array_equal(t.loss, s.loss)
    np.testing.assert_array_equal(t.accuracy, s.accuracy)
    np.testing.assert_array_equal(t.xs, xs)
    np.testing.assert_array_equal(t.ys, ys)
    for a, b in zip(t.directions, [d1, d2]):
        assert set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in b)
    assert t.config["directions"][1]["seed"] == 1 and t.config["directions"][0]["normalization"] == "filter"
    assert t.config["model_hash"] == model_hash(obj.model)
    assert t.config["bn_policy"] == "eval" and t.config["objective"]["num_examples"] == 60

    # VTK: parse the points back (x fastest)
    t.to_vtk(tmp_path / "s.vtk")
    lines = (tmp_path / "s.vtk").read_text().splitlines()
    assert lines[4] == "DIMENSIONS 4 3 1"
    pts = np.array([[float(v) for v in ln.split()] for ln in lines[6 : 6 + 12]])
    np.testing.assert_allclose(pts[:, 2].reshape(3, 4).T, s.loss, rtol=1e-15)
    np.testing.assert_array_equal(pts[:4, 0], xs)

    fig = s.to_plotly(trajectory=np.array([[0.0, 0.0], [0.5, -1.0]]))
    np.testing.assert_allclose(np.asarray(fig.data[0].z), s.loss.T)
    np.testing.assert_allclose(fig.data[1].z, s.interpolate([[0.0, 0.0], [0.5, -1.0]]))
    s.to_html(tmp_path / "s.html", include_plotlyjs="cdn")
    assert "plotly" in (tmp_path / "s.html").read_text()

    import matplotlib

    matplotlib.use("Agg")
    for kind in ("contour", "heatmap", "surface"):
        ax = s.plot(kind, trajectory=np.array([[0.0, 0.0], [0.5, -1.0]]))
        if kind != "surface":
            assert ax.get_xlim()[0] <= -1 and ax.get_xlim()[1] >= 1
    one = surface(obj, [d1], [xs])
    ax = one.plot()
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), one.loss)


def test_interpolate_is_bilinear(mlp_setup):
    _, _, obj, d1, d2 = mlp_setup
    s = surface(obj, [d1, d2], [np.array([0.0, 1.0]), np.array([0.0, 2.0])])
    v = s.interpolate([[0.5, 1.0]])[0]
    assert v == pytest.approx(s.loss.mean(), rel=1e-12)


def test_bad_inputs(mlp_setup):
    model, _, obj, d1, d2 = mlp_setup
    with pytest.raises(ValueError, match="coords"):
        surface(obj, [d1, d2], [np.linspace(-1, 1, 3)])
    with pytest.raises(ValueError, match="neither a parameter"):
        surface(obj, [{"nope": torch.zeros(2)}], [np.zeros(2)])
    with pytest.raises(ValueError, match="shape"):
        surface(obj, [{"0.weight": torch.zeros(2)}], [np.zeros(2)])
    with pytest.raises(TypeError, match="Objective"):
        surface(model, [d1], [np.zeros(2)])
    with pytest.raises(ValueError, match="bn_policy"):
        surface(obj, [d1], [np.zeros(2)], bn_policy="batch")
    with pytest.raises(ValueError, match="finite"):
        surface(obj, [d1], [np.array([0.0, np.nan])])


@pytest.mark.distributed
def test_cli_torchrun_two_gloo_processes(tmp_path):
    torch.manual_seed(0)
    from landscape.data import batches as make_batches
    from landscape.data import load_digits
    from landscape.models import model_factory

    model = model_factory("mlp", sizes=(64, 16, 10), seed=3)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    out = tmp_path / "s.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "landscape", "surface", "--model", "mlp", "--model-kwargs", '{"sizes": [64, 16, 10]}',
        "--state-dict", str(tmp_path / "m.pt"), "--data", "digits", "--limit", "300", "--grid", "5", "4",
        "--range", "-1", "1", "--out", str(out), "--quiet", "--dtype", "float64",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = load_surface(out)
    assert s.config["world_size"] == 2 and s.complete
    x, y = load_digits("all")
    obj = Objective(model.double(), CE, make_batches(x[:300].double(), y[:300], 2048))
    dirs = [D.random(obj, "filter", seed=0), D.random(obj, "filter", seed=1)]
    ref = surface(obj, dirs, [np.linspace(-1, 1, 5), np.linspace(-1, 1, 4)])
    np.testing.assert_allclose(s.loss, ref.loss, rtol=1e-12)
    np.testing.assert_allclose(s.accuracy, ref.accuracy, rtol=1e-12)


def test_dataloader_data_gives_same_values(mlp_setup):
    from torch.utils.data import DataLoader, TensorDataset

    _, batches, obj, d1, d2 = mlp_setup
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    obj_dl = Objective(obj.model, CE, DataLoader(TensorDataset(x, y), batch_size=25, shuffle=False))
    xs = np.linspace(-1, 1, 3)
    for strategy in ("loop", "linear_first_layer"):
        a = surface(obj_dl, [d1, d2], [xs, xs], strategy=strategy)
        b = surface(obj, [d1, d2], [xs, xs], strategy=strategy)
        np.testing.assert_allclose(a.loss, b.loss, rtol=1e-12)
        np.testing.assert_array_equal(a.accuracy, b.accuracy)


def test_interrupted_run_checkpoints_and_resumes(mlp_setup, tmp_path):
    _, batches, _, d1, d2 = mlp_setup
    state = {"calls": 0, "fail_after": 3 * 4 * 3 + 1}  # 3 batches per point: fails in point 14

    def flaky_ce(out, tgt):
        state["calls"] += 1
        if state["fail_after"] is not None and state["calls"] > state["fail_after"]:
            raise KeyboardInterrupt
        return CE(out, tgt)

    obj = Objective(mlp_setup[0], flaky_ce, batches)
    xs, ys = np.linspace(-1, 1, 5), np.linspace(-1, 1, 4)
    path = tmp_path / "run.npz"
    with pytest.raises(KeyboardInterrupt):
        surface(obj, [d1, d2], [xs, ys], strategy="loop", resume=path, checkpoint_every=0.0, batch_points=4)
    part = load_surface(path)
    assert part.mask.sum() == 12 and not part.complete  # three chunks of 4 points were saved
    assert np.isnan(part.loss[~part.mask]).all()
    state["fail_after"] = None
    done = surface(obj, [d1, d2], [xs, ys], strategy="loop", resume=path)
    assert done.evaluations == 8
    ref = surface(obj, [d1, d2], [xs, ys], strategy="loop")
    np.testing.assert_array_equal(done.loss, ref.loss)
    np.testing.assert_array_equal(load_surface(path).loss, ref.loss)


@pytest.mark.gpu
def test_vmap_on_cuda_matches_cpu(mlp_setup):
    model, batches, obj, d1, d2 = mlp_setup
    cuda = Objective(model, CE, batches, device="cuda")
    xs = np.linspace(-1, 1, 7)
    a = surface(cuda, [d1, d2], [xs, xs])
    assert a.strategy == "vmap"
    b = surface(obj, [d1, d2], [xs, xs], strategy="loop")
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-10)


def test_linear_strategy_with_batchnorm_in_the_rest():
    x, y = make_classification_data(n=30, d=5, n_classes=3, seed=12)
    torch.manual_seed(13)
    model = nn.Sequential(
        nn.Flatten(), nn.Linear(5, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3)
    ).double()
    with torch.no_grad():
        model[2].running_mean.uniform_(-0.5, 0.5)
        model[2].running_var.uniform_(0.5, 2.0)
    batches = split_batches(x, y, [14, 16])
    obj = Objective(model, CE, batches)
    d1 = D.random(obj, "filter", seed=0, ignore_1d=False)
    d2 = D.random(obj, "layer", seed=1, ignore_1d=False)
    xs, ys = np.linspace(-1, 1, 3), np.linspace(-1, 0, 3)
    lin = surface(obj, [d1, d2], [xs, ys], strategy="linear_first_layer")
    assert lin.loss[1, 2] == float(obj.loss())
    for i, j in [(0, 0), (2, 1)]:
        ref = independent_loss(model, [d1, d2], (xs[i], ys[j]), batches)[0]
        assert lin.loss[i, j] == pytest.approx(ref, rel=1e-10)
