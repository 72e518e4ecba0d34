"""F-SWAG / SWAG moments and F-SGLD against closed forms and hand-computed steps (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import grad

from optimizers import SAM
from optimizers.bayes import SWAG, FlatSGLD, f_swag
from tests.references import flatten_params, make_classification_data, make_mlp, total_loss_fn


def _setup():
    model = make_mlp((4, 6, 3), seed=0)
    x, y = make_classification_data(n=20, d=4, n_classes=3, seed=2)
    return model, x, y


def _closure(opt, model, x, y):
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        return loss

    return closure


@pytest.mark.parametrize("diag_only", [False, True])
def test_swag_moments_equal_numpy_statistics_of_snapshots(diag_only):
    model, x, y = _setup()
    sam = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.2, momentum=0.9)
    swag = SWAG(sam, rank=4, collect_every=2, start_step=3, diag_only=diag_only, seed=0)
    closure = _closure(swag, model, x, y)
    snaps = []
    for t in range(1, 16):
        swag.step(closure)
        if t > 3 and (t - 3) % 2 == 0:
            snaps.append(flatten_params(model).numpy())
    W = np.stack(snaps)  # [n, p]
    assert swag.n_collected == len(snaps) == 6
    np.testing.assert_allclose(swag.mean.numpy(), W.mean(0), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(swag.variance.numpy(), np.maximum(W.var(0), 1e-30), rtol=1e-7, atol=1e-15)
    # deviation columns: theta_i - running mean after i collections, the last K = 4 of them
    running = np.cumsum(W, 0) / np.arange(1, len(W) + 1)[:, None]
    D = (W - running)[-4:].T
    np.testing.assert_allclose(swag.deviations.numpy(), D, rtol=1e-10, atol=1e-14)


def test_swag_sample_formula_and_bit_exact_restore():
    model, x, y = _setup()
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.3), rank=3, seed=0)
    closure = _closure(swag, model, x, y)
    for _ in range(5):
        swag.step(closure)
    current = flatten_params(model)
    mean, var, D = swag.mean, swag.variance, swag.deviations
    g = torch.Generator().manual_seed(4)
    z1 = torch.randn(mean.shape, generator=g, dtype=torch.float64)
    z2 = torch.randn((3,), generator=g, dtype=torch.float64)
    expected = mean + 0.5 * (var.sqrt() * z1 / math.sqrt(2) + D @ z2 / math.sqrt(2 * 2))
    with swag.sample(torch.Generator().manual_seed(4), scale=0.5):
        torch.testing.assert_close(flatten_params(model), expected, rtol=1e-12, atol=1e-14)
    assert torch.equal(flatten_params(model), current)
    g = torch.Generator().manual_seed(4)
    z1 = torch.randn(mean.shape, generator=g, dtype=torch.float64)
    w_diag = swag.sample_weights(torch.Generator().manual_seed(4), diag_only=True)
    torch.testing.assert_close(w_diag, mean + var.sqrt() * z1, rtol=1e-12, atol=1e-14)
    with swag.swa():
        torch.testing.assert_close(flatten_params(model), mean)
    probs = swag.bayesian_model_average(model, x, samples=3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(x), dtype=torch.float64))
    assert torch.equal(flatten_params(model), current)


def test_swag_errors():
    model, _, _ = _setup()
    with pytest.raises(TypeError, match="optimizer"):
        SWAG(model.parameters())
    with pytest.raises(ValueError, match="rank"):
        SWAG(torch.optim.SGD(model.parameters(), lr=0.1), rank=1)
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="collected"):
        swag.mean  # noqa: B018


def test_f_swag_is_swag_around_sam():
    model, x, y = _setup()
    fs = f_swag(model.parameters(), rho=0.05, lr=0.1, diag_only=True, seed=0)
    assert isinstance(fs.optimizer, SAM) and fs.diag_only
    fs.step(_closure(fs, model, x, y))
    assert float(fs.last["eps_norm"]) == pytest.approx(0.05, rel=1e-9)


@pytest.mark.parametrize("steps", [1, 3])
def test_flat_sgld_matches_hand_computed_steps(steps):
    model, x, y = _setup()
    L, w = total_loss_fn(model, F.cross_entropy, [(x, y)])
    lr, N, rho, T, lam = 0.1, 50, 0.05, 0.5, 2.0
    opt = FlatSGLD(model.parameters(), lr=lr, num_data=N, rho=rho, temperature=T, prior_precision=lam, seed=3)
    gen = torch.Generator().manual_seed(3)
    closure = _closure(opt, model, x, y)
    for _ in range(steps):
        g = grad(L)(w)
        g_eps = grad(L)(w + rho * g / (g.norm() + 1e-12))
        z = torch.cat(
            [torch.randn(p.shape, generator=gen, dtype=p.dtype).reshape(-1) for p in model.parameters()]
        )
        w = w - lr * (g_eps + lam * w / N) + math.sqrt(2 * lr * T / N) * z
        opt.step(closure)
    torch.testing.assert_close(flatten_params(model), w, rtol=1e-12, atol=1e-12)
    assert opt.last["noise_std"] == pytest.approx(math.sqrt(2 * lr * T / N))
    assert opt.last["n_samples"] == steps
    probs = opt.bayesian_model_average(model, x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(x), dtype=torch.float64))


def test_flat_sgld_validation():
    model, _, _ = _setup()
    with pytest.raises(ValueError, match="num_data"):
        FlatSGLD(model.parameters(), lr=0.1, num_data=0)
    with pytest.raises(ValueError, match="temperature"):
        FlatSGLD(model.parameters(), lr=0.1, num_data=10, temperature=-1.0)
    with pytest.raises(ValueError, match="rho"):
        FlatSGLD(model.parameters(), lr=0.1, num_data=10, rho=-1.0)


def test_flat_sgld_resume_keeps_the_stored_samples_and_their_average():
    """Interrupted after 3 steps and restored from ``state_dict`` into a fresh model and optimizer,
    F-SGLD continues bit-identically and its model average covers the samples of both parts."""
    import copy

    model, x, y = _setup()
    kw = dict(lr=0.1, num_data=50, rho=0.05, temperature=0.5, prior_precision=2.0, max_samples=4)
    ref_model = copy.deepcopy(model)
    ref = FlatSGLD(ref_model.parameters(), seed=3, **kw)
    for _ in range(6):
        ref.step(_closure(ref, ref_model, x, y))

    opt = FlatSGLD(model.parameters(), seed=3, **kw)
    for _ in range(3):
        opt.step(_closure(opt, model, x, y))
    saved_w, saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(saved_w)
    resumed = FlatSGLD(fresh.parameters(), seed=99, **kw)
    resumed.load_state_dict(saved)
    assert len(resumed.samples) == 3
    for _ in range(3):
        resumed.step(_closure(resumed, fresh, x, y))
    assert len(resumed.samples) == 4 == len(ref.samples)  # max_samples keeps the newest
    for a, b in zip(resumed.samples, ref.samples):
        assert all(torch.equal(s, t) for s, t in zip(a, b))
    torch.testing.assert_close(
        resumed.bayesian_model_average(fresh, x), ref.bayesian_model_average(ref_model, x), rtol=0, atol=0
    )
    bad = copy.deepcopy(saved)
    bad["extra"]["samples"][0] = bad["extra"]["samples"][0][:-1]
    before = [s[0].clone() for s in resumed.samples]
    with pytest.raises(ValueError, match="stored samples do not match"):
        resumed.load_state_dict(bad)
    assert all(torch.equal(a, s[0]) for a, s in zip(before, resumed.samples))
