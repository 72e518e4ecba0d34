"""``first_step`` / ``second_step`` (optimizers.perturbation, optimizers.bayes.bsam_split) against
``step(closure)``: the same update bit for bit (float64, an MLP and a CNN with BatchNorm, three
steps through momentum), ``step()`` after ``first_step`` finishing the step, ``cancel_step``
restoring everything, and the misuse errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from optimizers import ASAM, SAM, BayesianSAM, FisherSAM, FlatSGLD, MixSAM, RandomSAM, VariationalSAM

SGD = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
METHODS = {
    "sam": lambda ps, model: SAM(ps, torch.optim.SGD, rho=0.05, model=model, **SGD),
    "asam": lambda ps, model: ASAM(ps, torch.optim.SGD, rho=0.5, model=model, **SGD),
    "fisher_sam": lambda ps, model: FisherSAM(ps, torch.optim.SGD, rho=0.1, model=model, **SGD),
    "mixsam": lambda ps, model: MixSAM(ps, torch.optim.SGD, rho=0.05, seed=3, model=model, **SGD),
    "random_sam": lambda ps, model: RandomSAM(ps, torch.optim.SGD, rho=0.05, seed=3, model=model, **SGD),
    "vsam": lambda ps, model: VariationalSAM(
        ps, torch.optim.SGD, rho=0.05, num_data=64, seed=3, model=model, **SGD
    ),
    "bsam": lambda ps, model: BayesianSAM(ps, lr=0.05, num_data=64, rho=0.05, seed=3, model=model),
    "bsam_no_noise": lambda ps, model: BayesianSAM(
        ps, lr=0.05, num_data=64, rho=0.05, noise=False, model=model
    ),
}


def _model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        net = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    else:
        net = nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(100, 3)
        )
    return net.double()


def _batch(kind: str, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(50 + t)
    x = torch.randn((16, 6) if kind == "mlp" else (16, 2, 5, 5), generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (16,), generator=g)


def _split_step(opt, model, x, y, finish_with_step: bool) -> None:
    loss_fn = nn.CrossEntropyLoss()
    opt.zero_grad()
    if isinstance(opt, BayesianSAM) and opt.noise:
        opt.noise_step()
    if getattr(opt, "passes", 2) == 2:
        loss_fn(model(x), y).backward()
    opt.first_step(zero_grad=True)
    loss_fn(model(x), y).backward()
    if finish_with_step:
        assert opt.step() is None  # a trainer's optimizer.step() finishes the step begun above
    else:
        opt.second_step(zero_grad=True)


def _closure_step(opt, model, x, y) -> None:
    def closure():
        opt.zero_grad()
        loss = nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        return loss

    opt.step(closure)


@pytest.mark.parametrize("kind", ["mlp", "cnn_bn"])
@pytest.mark.parametrize("method", list(METHODS))
def test_split_step_equals_closure_step_bit_for_bit(method, kind):
    a = _model(kind)
    b = copy.deepcopy(a)
    opt_a, opt_b = METHODS[method](a.parameters(), a), METHODS[method](b.parameters(), b)
    start = [p.detach().clone() for p in a.parameters()]
    for t in range(3):
        x, y = _batch(kind, t)
        _closure_step(opt_a, a, x, y)
        _split_step(opt_b, b, x, y, finish_with_step=(t == 2))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    for ba, bb in zip(a.buffers(), b.buffers()):  # BatchNorm statistics of the passes at w only
        assert torch.equal(ba, bb)
    for pa, pb in zip(a.parameters(), b.parameters()):  # momentum / precision state
        for key, va in opt_a.state[pa].items():
            vb = opt_b.state[pb][key]
            assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else va == vb
    assert max(float((p.detach() - p0).abs().max()) for p, p0 in zip(a.parameters(), start)) > 1e-3
    for key in ("grad_norm", "eps_norm"):
        if key in opt_a.last:
            assert torch.equal(torch.as_tensor(opt_a.last[key]), torch.as_tensor(opt_b.last[key])), key


@pytest.mark.parametrize("method", ["sam", "bsam"])
def test_cancel_step_restores_weights_statistics_and_generator_free_state(method):
    model = _model("cnn_bn")
    opt = METHODS[method](model.parameters(), model)
    x, y = _batch("cnn_bn", 0)
    params = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    if method == "bsam":
        opt.noise_step()
    nn.CrossEntropyLoss()(model(x), y).backward()
    buffers = [b.detach().clone() for b in model.buffers()]  # after the first pass's update
    opt.first_step(zero_grad=True)
    nn.CrossEntropyLoss()(model(x), y).backward()
    opt.cancel_step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), buffers))
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(RuntimeError, match="no step is open"):
        opt.second_step()


def test_misuse_is_explained():
    model = _model("mlp")
    sam = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    with pytest.raises(RuntimeError, match="needs the gradient at w .* run loss.backward"):
        sam.first_step()
    with pytest.raises(RuntimeError, match="no step is open; begin a step with first_step"):
        sam.second_step()
    with pytest.raises(TypeError, match="first_step"):
        sam.step()  # no closure and no step under way
    x, y = _batch("mlp", 0)
    nn.CrossEntropyLoss()(model(x), y).backward()
    sam.first_step()
    with pytest.raises(RuntimeError, match="first_step\\(\\) refused: a step is open"):
        sam.first_step()
    m4 = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, m=4)
    with pytest.raises(ValueError, match="m=4"):
        m4.first_step()
    sgld = FlatSGLD(model.parameters(), lr=0.01, num_data=64)
    with pytest.raises(NotImplementedError, match="use step\\(closure\\)"):
        sgld.first_step()
    bsam = BayesianSAM(model.parameters(), lr=0.05, num_data=64, seed=0)
    with pytest.raises(RuntimeError, match="begin a step with noise_step\\(\\) before the first forward"):
        bsam.first_step()
