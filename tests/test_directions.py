"""Directions (random/filter-normalised, PCA, eigen, between) and trajectory projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from landscape import directions as D
from landscape.models import train
from landscape.objective import Objective
from landscape.surface.trajectory import TrajectoryRecorder, project
from tests.references import dense_hessian, make_classification_data, make_cnn_bn, make_mlp, split_batches


def test_filter_normalisation_per_filter_linear_and_conv():
    model = make_cnn_bn(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = D.random(model, "filter", seed=3)
    for n, w in model.named_parameters():
        if w.ndim <= 1:
            assert torch.count_nonzero(d[n]) == 0, n  # biases and BN zeroed by default
            continue
        for j in range(w.shape[0]):
            assert float(d[n][j].norm()) == pytest.approx(float(w[j].detach().norm()), rel=1e-6, abs=1e-12), (
                n,
                j,
            )
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    dw = D.random(model, "filter", seed=3, ignore_1d="weight")
    assert torch.equal(dw["1.weight"], model[1].weight.detach()) and torch.equal(
        dw["0.weight"], d["0.weight"]
    )
    dn = D.random(model, "filter", seed=3, ignore_1d=False)
    assert float(dn["0.bias"].norm()) == pytest.approx(float(model[0].bias.detach().norm()), rel=1e-6)
    assert d.config == {**d.config, "seed": 3, "normalization": "filter", "distribution": "gaussian"}


def test_layer_weight_model_and_raw_gaussian():
    model = make_mlp((64, 128, 10), seed=1)
    raw = D.random(model, None, seed=7)
    v = raw["0.weight"]
    assert abs(float(v.mean())) < 0.05 and abs(float(v.std()) - 1) < 0.05  # N(0, 1), not U(0, 1)
    assert float((v < 0).double().mean()) == pytest.approx(0.5, abs=0.03)
    w = {n: p.detach() for n, p in model.named_parameters()}
    wn = D.random(model, "weight", seed=7)
    assert torch.equal(wn["0.weight"], raw["0.weight"] * w["0.weight"])
    ln = D.random(model, "layer", seed=7)
    assert float(ln["2.weight"].norm()) == pytest.approx(float(w["2.weight"].norm()), rel=1e-6)
    mn = D.random(model, "model", seed=7)
    total_w = float(torch.sqrt(sum((p.detach() ** 2).sum() for p in w.values())))
    assert mn.norm() == pytest.approx(total_w, rel=1e-6)
    assert torch.equal(D.random(model, seed=7)["0.weight"], D.random(model, seed=7)["0.weight"])
    assert not torch.equal(D.random(model, seed=7)["0.weight"], D.random(model, seed=8)["0.weight"])
    g = torch.Generator().manual_seed(7)
    assert torch.equal(D.random(model, None, seed=g)["0.weight"], raw["0.weight"])
    with pytest.raises(ValueError, match="normalization"):
        D.random(model, "filters")


def test_objective_directions_follow_selection_and_dtype():
    x, y = make_classification_data(n=10, d=4, seed=0)
    model = make_mlp((4, 5, 3), seed=0)
    obj = Objective(model, nn.CrossEntropyLoss(), (x, y), params=["2"], dtype=torch.float32)
    d = D.random(obj, seed=0)
    assert list(d) == ["2.weight", "2.bias"] and d["2.weight"].dtype == torch.float32


def test_pca_matches_numpy_svd():
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 4), "b": (5,)}
    traj = [{n: torch.as_tensor(rng.normal(size=s)) for n, s in shapes.items()} for _ in range(8)]
    dirs = D.pca(traj, k=2)
    mat = np.stack([np.concatenate([t["a"].numpy().ravel(), t["b"].numpy()]) for t in traj])
    m = mat - mat[-1]
    m = m - m.mean(0)
    _, s, vt = np.linalg.svd(m, full_matrices=False)
    for i in range(2):
        got = torch.cat([dirs[i]["a"].reshape(-1), dirs[i]["b"]]).numpy()
        assert abs(float(got @ vt[i])) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(dirs.explained_variance_ratio, s**2 / (s**2).sum(), rtol=1e-12, atol=1e-15)
    assert dirs[0].config["explained_variance_ratio"] == pytest.approx(s[0] ** 2 / (s**2).sum())


def test_eigen_directions_match_dense_hessian():
    x, y = make_classification_data(n=30, d=3, seed=2)
    model = make_mlp((3, 4, 3), seed=5)
    loss = nn.CrossEntropyLoss()
    obj = Objective(model, loss, (x, y))
    dirs = D.eigen(obj, k=2, tol=1e-10)
    H = dense_hessian(model, loss, [(x, y)])
    evals, evecs = torch.linalg.eigh(H)
    for i in range(2):
        v = obj.flatten(dirs[i])
        assert abs(float(v @ evecs[:, -1 - i])) == pytest.approx(1.0, abs=1e-6)
        assert dirs[i].config["eigenvalue"] == pytest.approx(float(evals[-1 - i]), rel=1e-7)


def test_between_and_errors():
    a, b = make_mlp((3, 4, 2), seed=0), make_mlp((3, 4, 2), seed=1)
    d = D.between(a, b)
    assert torch.equal(d["0.weight"], b[0].weight.detach() - a[0].weight.detach())
    with pytest.raises(ValueError, match="architecture"):
        D.between(a, make_mlp((3, 5, 2)))


def test_projection_of_trajectory_in_plane_and_off_plane():
    model = make_mlp((3, 4, 2), seed=0)
    d1, d2 = D.random(model, None, seed=1), D.random(model, None, seed=2)
    origin = {n: p.detach().clone() for n, p in model.named_parameters()}
    ab = [(0.1 * t, -0.2 * t + 0.05 * t**2) for t in range(6)]
    traj = [{n: origin[n] + a * d1[n] + b * d2[n] for n in origin} for a, b in ab]
    pr = project(traj, [d1, d2], origin)
    np.testing.assert_allclose(pr.coords, np.array(ab), atol=1e-12)
    assert pr.max_residual < 1e-12
    # add a component orthogonal to the plane: the residual equals its norm
    flat = torch.cat(
        [torch.cat([d1[n].reshape(-1) for n in origin]), torch.cat([d2[n].reshape(-1) for n in origin])]
    )
    Dm = flat.reshape(2, -1).T
    e = torch.randn(Dm.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e = e - Dm @ torch.linalg.lstsq(Dm, e[:, None]).solution[:, 0]
    off, k = {}, 0
    for n, t in origin.items():
        off[n] = t + e[k : k + t.numel()].reshape(t.shape)
        k += t.numel()
    pr2 = project([off], [d1, d2], origin)
    assert pr2.residual_norm[0] == pytest.approx(float(e.norm()), rel=1e-10)
    assert np.abs(pr2.coords).max() < 1e-10


def test_recorder_with_training_and_on_the_fly_projection():
    x, y = make_classification_data(n=40, d=4, seed=3)
    model = make_mlp((4, 6, 3), seed=3)
    origin = {n: p.detach().clone() for n, p in model.named_parameters()}
    d1, d2 = D.random(model, "filter", seed=0), D.random(model, "filter", seed=1)
    stored = TrajectoryRecorder(every=2)
    live = TrajectoryRecorder(every=2, directions=[d1, d2], origin=origin, store=False)
    stored.record(model, 0)

    def both(step, m, loss):
        stored(step, m, loss)
        live(step, m, loss)

    hist = train(
        model, split_batches(x, y, [20, 20]), lambda p: torch.optim.SGD(p, lr=0.3), epochs=3, callback=both
    )
    assert len(hist["loss"]) == 6 and stored.steps == [0, 2, 4, 6] and live.steps == [2, 4, 6]
    assert torch.equal(stored.weights[-1], torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    pr = project(stored, [d1, d2], origin)
    np.testing.assert_allclose(live.coords, pr.coords[1:], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(live.residuals, pr.residual_norm[1:], rtol=1e-10)
    assert pr.residual_norm[0] == 0.0 and pr.residual_norm[-1] > 0
    pc = D.pca(stored, k=2)
    assert len(pc) == 2 and sum(pc.explained_variance_ratio) == pytest.approx(1.0)
