"""Models (shapes, parameter counts, registry) and the closure-based training loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from landscape.models import MLP, LeNet5, ResNet, available_models, model_factory, train
from tests.references import make_classification_data, split_batches


def test_mlp_counts_and_forward():
    m = MLP([64, 128, 10], "tanh")
    assert sum(p.numel() for p in m.parameters()) == 64 * 128 + 128 + 128 * 10 + 10
    assert isinstance(m[0], nn.Flatten) and isinstance(m[2], nn.Tanh) and isinstance(m[1], nn.Linear)
    assert m(torch.randn(7, 1, 8, 8)).shape == (7, 10)
    with pytest.raises(ValueError, match="sizes"):
        MLP([5])
    with pytest.raises(ValueError, match="activation"):
        MLP([2, 3], "swish2")


@pytest.mark.parametrize("size,chans,flat", [(28, 1, 16 * 5 * 5), (32, 3, 16 * 5 * 5), (8, 1, 16 * 2 * 2)])
def test_lenet_sizes(size, chans, flat):
    m = LeNet5(in_channels=chans, input_size=size)
    assert m.classifier[1].in_features == flat
    assert m(torch.randn(2, chans, size, size)).shape == (2, 10)
    convs = [mod for mod in m.modules() if isinstance(mod, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [6, 16]


def test_resnet_and_registry():
    r = ResNet(in_channels=1, num_classes=10, width=4, blocks=(1, 1))
    assert r(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert any(isinstance(m, nn.BatchNorm2d) for m in r.modules())
    r20 = model_factory("resnet20")
    n_blocks = sum(1 for m in r20.modules() if m.__class__.__name__ == "BasicBlock")
    assert n_blocks == 9  # ResNet-20: 3 stages x 3 blocks (6n + 2 = 20 layers)
    assert {"mlp", "lenet5", "lenet5-digits", "resnet", "resnet20"} <= set(available_models())
    a, b = model_factory("mlp", seed=3), model_factory("mlp", seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert model_factory("lenet5-digits", dtype=torch.float64)(
        torch.randn(2, 1, 8, 8, dtype=torch.float64)
    ).shape == (2, 10)
    with pytest.raises(ValueError, match="registered"):
        model_factory("vgg")


def test_train_sgd_step_matches_hand_computation():
    x, y = make_classification_data(n=12, d=4, seed=0)
    m = MLP([4, 5, 3]).double()
    w0 = {n: p.detach().clone() for n, p in m.named_parameters()}
    loss_fn = nn.CrossEntropyLoss()
    out = torch.func.functional_call(m, {n: t.requires_grad_(True) for n, t in w0.items()}, (x,))
    grads = torch.autograd.grad(loss_fn(out, y), list(w0.values()))
    ref0 = float(loss_fn(out, y).detach())
    m.eval()
    hist = train(m, (x, y), lambda p: torch.optim.SGD(p, lr=0.1), epochs=1)
    assert not m.training  # mode restored
    assert hist["loss"] == [pytest.approx(ref0, rel=1e-14)]
    for (n, p), g in zip(m.named_parameters(), grads):
        torch.testing.assert_close(p.detach(), w0[n].detach() - 0.1 * g, rtol=1e-14, atol=1e-15)


class TwoEvalOptimizer(torch.optim.Optimizer):
    """Calls the closure twice per step (like SAM) and descends with the second gradient."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.calls = 0

    @torch.no_grad()
    def step(self, closure):
        with torch.enable_grad():
            first = closure()
        self.calls += 1
        with torch.enable_grad():
            closure()
        self.calls += 1
        for g in self.param_groups:
            for p in g["params"]:
                p.add_(p.grad, alpha=-g["lr"])
        return first


def test_train_closure_contract_minibatches_and_callback():
    x, y = make_classification_data(n=20, d=4, seed=1)
    m = MLP([4, 6, 3]).double()
    seen = []
    opt_box = {}

    def factory(p):
        opt_box["opt"] = TwoEvalOptimizer(p, 0.05)
        return opt_box["opt"]

    hist = train(
        m, (x, y), factory, epochs=2, batch_size=8, seed=0, callback=lambda s, mod, loss: seen.append(s)
    )
    assert seen == list(range(1, 7)) and len(hist["epoch_loss"]) == 2
    assert opt_box["opt"].calls == 12
    # minibatch order is seeded: same seed -> same weights
    a, b = MLP([4, 6, 3]).double(), MLP([4, 6, 3]).double()
    b.load_state_dict(a.state_dict())
    train(a, (x, y), lambda p: torch.optim.SGD(p, lr=0.1), epochs=2, batch_size=7, seed=4)
    train(b, (x, y), lambda p: torch.optim.SGD(p, lr=0.1), epochs=2, batch_size=7, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    train(m, split_batches(x, y, [10, 10]), lambda p: torch.optim.SGD(p, lr=0.1), epochs=1)
    with pytest.raises(TypeError, match="Optimizer"):
        train(m, (x, y), lambda p: None)


def test_train_with_suite_sam_if_available():
    optimizers = pytest.importorskip("optimizers")
    SAM = getattr(optimizers, "SAM", None)
    if SAM is None:
        pytest.skip("optimizers.SAM not available")
    x, y = make_classification_data(n=16, d=4, seed=2)
    m = MLP([4, 5, 3]).double()
    w0 = [p.detach().clone() for p in m.parameters()]
    train(m, (x, y), lambda p: SAM(p, torch.optim.SGD, rho=0.05, lr=0.1), epochs=1)
    # hand-computed SAM step: gradient at w + rho g/||g||
    loss_fn = nn.CrossEntropyLoss()
    names = [n for n, _ in m.named_parameters()]

    def grad_at(ws):
        ps = {n: w.clone().requires_grad_(True) for n, w in zip(names, ws)}
        out = torch.func.functional_call(m, ps, (x,))
        return torch.autograd.grad(loss_fn(out, y), list(ps.values()))

    g = grad_at(w0)
    gn = torch.sqrt(sum((t**2).sum() for t in g))
    g2 = grad_at([w + 0.05 * t / gn for w, t in zip(w0, g)])
    for p, w, t in zip(m.parameters(), w0, g2):
        torch.testing.assert_close(p.detach(), w - 0.1 * t, rtol=1e-10, atol=1e-12)
