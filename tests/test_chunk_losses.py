"""The m sub-batch losses of one batched output (optimizers.m_sharpness.chunk_losses) and the batched
m-sharpness step under each of its three ways, against the per-sub-batch loss calls of the loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimizers import SAM
from optimizers import m_sharpness as chunk_losses
from optimizers.m_sharpness import flat_cross_entropy
from optimizers.perturbation import make_closure

M, B, C = 4, 6, 5


def _outs_targets(seed: int, probs: bool = False, ignore: int | None = None):
    g = torch.Generator().manual_seed(seed)
    outs = torch.randn(M, B, C, generator=g, dtype=torch.float64)
    if probs:
        return outs, torch.softmax(torch.randn(M, B, C, generator=g, dtype=torch.float64), -1)
    ys = torch.randint(0, C, (M, B), generator=g)
    if ignore is not None:
        ys[0, :2] = ignore
        ys[2, 3] = ignore
    return outs, ys


WEIGHT = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25], dtype=torch.float64)
CASES = {
    "plain": (dict(), dict()),
    "smoothing": (dict(label_smoothing=0.1), dict()),
    "weights": (dict(weight=WEIGHT), dict()),
    "ignore_index": (dict(ignore_index=3), dict(ignore=3)),
    "weights_ignore": (dict(weight=WEIGHT, ignore_index=-100), dict(ignore=-100)),
    "weights_smoothing_ignore": (dict(weight=WEIGHT, label_smoothing=0.1, ignore_index=2), dict(ignore=2)),
    "probability_targets": (dict(), dict(probs=True)),
    "probability_targets_smoothing": (dict(label_smoothing=0.2), dict(probs=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flat_cross_entropy_equals_per_chunk_calls(case: str) -> None:
    kwargs, data = CASES[case]
    loss_fn = nn.CrossEntropyLoss(**kwargs)
    outs, ys = _outs_targets(0, **data)
    got = flat_cross_entropy(loss_fn)(outs, ys)
    want = torch.stack([loss_fn(outs[k], ys[k]) for k in range(M)])
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-13)
    # and the gradients with respect to the outputs (what the backward pass sees)
    o1 = outs.clone().requires_grad_()
    o2 = outs.clone().requires_grad_()
    (g1,) = torch.autograd.grad(flat_cross_entropy(loss_fn)(o1, ys).sum(), o1)
    (g2,) = torch.autograd.grad(sum(loss_fn(o2[k], ys[k]) for k in range(M)), o2)
    torch.testing.assert_close(g1, g2, atol=1e-13, rtol=1e-13)


def test_flat_cross_entropy_declines_what_it_does_not_know() -> None:
    assert flat_cross_entropy(nn.CrossEntropyLoss(reduction="sum")) is None
    assert flat_cross_entropy(F.cross_entropy) is None
    assert flat_cross_entropy(nn.MSELoss()) is None

    class Custom(nn.CrossEntropyLoss):  # a subclass may change forward: not assumed
        pass

    assert flat_cross_entropy(Custom()) is None
    f = flat_cross_entropy(nn.CrossEntropyLoss())
    assert f(torch.randn(M, B, 2, 3), torch.randint(0, 2, (M, B, 3))) is None  # per-pixel outputs
    assert f((torch.randn(M, B, C),), torch.randint(0, C, (M, B))) is None  # not a tensor


def _item_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss that reads a value on the host: cannot run under vmap (way 3 of chunk_losses)."""
    scale = 1.0 + 0.0 * float(out.detach().abs().max())
    return F.cross_entropy(out, y) * scale


LOSSES = {
    "flat_cross_entropy": lambda: nn.CrossEntropyLoss(label_smoothing=0.05),
    "loss_under_vmap": lambda: lambda out, y: F.cross_entropy(out, y, label_smoothing=0.05),
    "loss_per_chunk": lambda: _item_loss,
}


@pytest.mark.parametrize("way", sorted(LOSSES))
def test_batched_sam_step_equals_loop_for_each_way_of_computing_the_losses(way: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    loop_model = copy.deepcopy(model)
    loss_fn = LOSSES[way]()
    opts = [
        SAM(mod.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, model=mod, m=4, batched_m=b)
        for mod, b in ((model, True), (loop_model, False))
    ]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(16, 6, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (16,), generator=g)
        for opt, mod in zip(opts, (model, loop_model)):
            opt.step(make_closure(opt, mod, loss_fn, x, y))
    assert opts[0].last["m_sharpness"] == "batched"
    if way != "flat_cross_entropy":  # the batched path learnt whether the loss runs under vmap
        assert chunk_losses._LOSS_IN_VMAP[loss_fn] is (way == "loss_under_vmap")
    assert opts[1].last["m_sharpness"].startswith("sequential")
    for pa, pb in zip(model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(pa, pb, atol=1e-10, rtol=0)
    for key in ("loss", "loss_perturbed", "grad_norm", "eps_norm"):
        torch.testing.assert_close(opts[0].last[key], opts[1].last[key], atol=1e-10, rtol=0)
