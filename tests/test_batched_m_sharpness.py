"""Vectorised m-sharpness (optimizers.m_sharpness) against the sequential loop, float64 on CPU."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

from optimizers import ASAM, SAM, FisherSAM
from optimizers.perturbation import make_closure

TOL = 1e-10
METHODS = {
    "sam": lambda ps, **kw: SAM(ps, torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, weight_decay=5e-4, **kw),
    "asam": lambda ps, **kw: ASAM(ps, torch.optim.SGD, rho=0.5, lr=0.1, momentum=0.9, **kw),
    "fisher_sam": lambda ps, **kw: FisherSAM(
        ps, torch.optim.SGD, rho=0.1, eta=1.0, lr=0.1, momentum=0.9, **kw
    ),
}


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _cnn(momentum: float | None = 0.1) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1),
        nn.BatchNorm2d(4, momentum=momentum),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 5 * 5, 8),
        nn.BatchNorm1d(8, momentum=momentum),
        nn.Tanh(),
        nn.Linear(8, 3),
    )


def _data(kind: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (batch, 6) if kind == "mlp" else (batch, 2, 5, 5)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 3, (batch,), generator=g)


def _run(method: str, model: nn.Module, kind: str, *, batch: int = 16, m: int = 4, steps: int = 3, **kw):
    opt = METHODS[method](model.parameters(), model=model, m=m, **kw)
    losses = []
    for t in range(steps):
        x, y = _data(kind, batch, seed=100 + t)
        losses.append(opt.step(make_closure(opt, model, nn.CrossEntropyLoss(), x, y)))
    return opt, losses


def _assert_same(model_a, opt_a, model_b, opt_b) -> None:
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
        sa, sb = opt_a.base_optimizer.state[pa], opt_b.base_optimizer.state[pb]
        torch.testing.assert_close(sa["momentum_buffer"], sb["momentum_buffer"], atol=TOL, rtol=0)
    for ba, bb in zip(model_a.buffers(), model_b.buffers()):
        assert ba.dtype == bb.dtype
        torch.testing.assert_close(ba, bb, atol=TOL, rtol=0)
    torch.testing.assert_close(opt_a.last["loss"], opt_b.last["loss"], atol=TOL, rtol=0)
    torch.testing.assert_close(opt_a.last["loss_perturbed"], opt_b.last["loss_perturbed"], atol=TOL, rtol=0)
    assert set(opt_a.last) == set(opt_b.last)
    for ra, rb in zip(opt_a.last["per_chunk"], opt_b.last["per_chunk"]):
        assert list(ra) == list(rb)
        for key in ra:
            torch.testing.assert_close(ra[key], rb[key], atol=TOL, rtol=0)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("kind", ["mlp", "cnn_bn"])
def test_batched_equals_loop(method: str, kind: str) -> None:
    torch.manual_seed(0)
    model = (_mlp() if kind == "mlp" else _cnn()).double().train()
    loop_model = copy.deepcopy(model)
    opt_b, losses_b = _run(method, model, kind)
    opt_l, losses_l = _run(method, loop_model, kind, batched_m=False)
    assert opt_b.last["m_sharpness"] == opt_b.config["m_sharpness"] == "batched"
    assert opt_l.last["m_sharpness"] == "sequential: batched_m=False"
    _assert_same(model, opt_b, loop_model, opt_l)
    for a, b in zip(losses_b, losses_l):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)
    if kind == "cnn_bn":
        assert int(model[1].num_batches_tracked) == 3 * 4


def test_batched_cumulative_batchnorm_momentum_none() -> None:
    torch.manual_seed(1)
    model = _cnn(momentum=None).double().train()
    loop_model = copy.deepcopy(model)
    opt_b, _ = _run("sam", model, "cnn")
    opt_l, _ = _run("sam", loop_model, "cnn", batched_m=False)
    assert opt_b.last["m_sharpness"] == "batched"
    _assert_same(model, opt_b, loop_model, opt_l)


def test_uneven_chunks_fall_back() -> None:
    torch.manual_seed(2)
    model = _mlp().double()
    loop_model = copy.deepcopy(model)
    opt, _ = _run("sam", model, "mlp", batch=18, steps=1)
    assert opt.last["m_sharpness"].startswith("sequential: uneven")
    opt_l, _ = _run("sam", loop_model, "mlp", batch=18, steps=1, batched_m=False)
    _assert_same(model, opt, loop_model, opt_l)


def test_opaque_closure_and_bn_without_model_fall_back() -> None:
    torch.manual_seed(3)
    model = _mlp().double()
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, m=4)
    x, y = _data("mlp", 16, seed=0)
    inner = make_closure(opt, model, nn.CrossEntropyLoss(), x, y)
    opt.step(lambda chunk=None: inner(chunk))
    assert opt.last["m_sharpness"].startswith("sequential: opaque closure")
    cnn = _cnn().double().train()
    opt = SAM(cnn.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, m=4)  # no model=
    x, y = _data("cnn", 16, seed=0)
    opt.step(make_closure(opt, cnn, nn.CrossEntropyLoss(), x, y))
    assert "BatchNorm in train mode without model=" in opt.last["m_sharpness"]


class _Counting(nn.Module):
    """Mutates a buffer in forward: not reproducible by the batched path."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float64))

    def forward(self, x):
        self.calls.add_(1)
        return self.lin(x)


class _Dropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("factory,reason", [(_Counting, "mutates buffer"), (_Dropout, "vmap failed")])
def test_unvectorisable_model_falls_back(factory, reason) -> None:
    torch.manual_seed(4)
    model = factory().double().train()
    loop_model = copy.deepcopy(model)
    opt, _ = _run("sam", model, "mlp", steps=2)
    assert opt.last["m_sharpness"].startswith("sequential:") and reason in opt.last["m_sharpness"]
    assert reason in opt.config["m_sharpness"]
    if factory is _Counting:  # deterministic: the fallback is exactly the loop (buffers untouched)
        opt_l, _ = _run("sam", loop_model, "mlp", steps=2, batched_m=False)
        _assert_same(model, opt, loop_model, opt_l)
        assert float(model.calls) == 2 * 2 * 4


class _UnusedHead(nn.Module):
    """A second head the loss never uses: the loop leaves its gradient None (SGD skips it, weight
    decay and momentum included); vmap would give zeros, so the batched path must not be taken."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3)
        self.unused = nn.Linear(6, 2)

    def forward(self, x):
        return self.lin(x)


def test_parameters_the_loss_does_not_use_fall_back_to_the_loop() -> None:
    torch.manual_seed(6)
    model = _UnusedHead().double()
    loop_model = copy.deepcopy(model)
    initial = model.unused.weight.detach().clone()
    opt, _ = _run("sam", model, "mlp", steps=2)
    assert "parameters the loss does not use (unused.weight" in opt.last["m_sharpness"]
    opt_l, _ = _run("sam", loop_model, "mlp", steps=2, batched_m=False)
    for pa, pb in zip(model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
    # untouched, as in the loop: no gradient, so no weight decay and no momentum buffer
    assert torch.equal(model.unused.weight, initial)
    assert "momentum_buffer" not in opt.base_optimizer.state[model.unused.weight]


def test_timing_batched_vs_loop_m8(capsys) -> None:
    """Not an assertion on speed: prints batched vs loop wall time (MLP, m = 8, CPU)."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    x, y = torch.randn(256, 32), torch.randint(0, 10, (256,))
    times = {}
    for batched in (True, False):
        net = copy.deepcopy(model)
        opt = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.01, m=8, model=net, batched_m=batched)
        closure = make_closure(opt, net, nn.CrossEntropyLoss(), x, y)
        opt.step(closure)  # warm-up
        t0 = time.perf_counter()
        for _ in range(10):
            opt.step(closure)
        times[batched] = (time.perf_counter() - t0) / 10
        assert opt.last["m_sharpness"] == ("batched" if batched else "sequential: batched_m=False")
    with capsys.disabled():
        print(
            f"\n[m-sharpness m=8 MLP B=256 CPU] batched {times[True] * 1e3:.2f} ms/step, "
            f"loop {times[False] * 1e3:.2f} ms/step"
        )


def test_experiment_runner_closures_are_vectorised(tmp_path) -> None:
    """The runner's closures (experiments.closures) carry model/loss/chunks: m > 1 runs batched,
    with the same step as the loop."""
    from tests.test_experiments_methods import trainer

    hyper = "methods.m.hyperparameters={rho = 0.05, m = 4, momentum = 0.9}"
    runs = []
    for batched in (True, False):
        (tmp_path / str(batched)).mkdir()
        tr = trainer(tmp_path / str(batched), "methods.m.optimizer=sam", hyper)
        tr.inner.batched_m = batched  # the runner's hyperparameter check does not know batched_m
        idx = torch.randperm(tr.n, generator=torch.Generator().manual_seed(0))[:64]
        x, y = tr._batch(idx)
        closure = tr.closures(x, y, len(idx), tr.scaler)
        assert closure.batched_unavailable is None and len(closure.x_chunks) == 4
        tr.opt.step(closure)
        assert tr.inner.last["m_sharpness"] == ("batched" if batched else "sequential: batched_m=False")
        runs.append(tr)
    for pa, pb in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["mlp", "cnn_bn"])
@pytest.mark.parametrize("noise", [True, False])
def test_bsam_batched_equals_loop(kind: str, noise: bool) -> None:
    from optimizers import BayesianSAM

    torch.manual_seed(6)
    model = (_mlp() if kind == "mlp" else _cnn()).double().train()
    twin = copy.deepcopy(model)
    opts = []
    for net, batched in ((model, True), (twin, False)):
        opt = BayesianSAM(net.parameters(), lr=0.1, num_data=1000, rho=0.05, m=4, noise=noise, seed=3,
                          model=net, batched_m=batched)  # fmt: skip
        for t in range(3):
            x, y = _data(kind, 16, seed=200 + t)
            opt.step(make_closure(opt, net, nn.CrossEntropyLoss(), x, y))
        opts.append(opt)
    assert opts[0].last["m_sharpness"] == "batched"
    assert opts[1].last["m_sharpness"] == "sequential: batched_m=False"
    for pa, pb in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
        for key in ("s", "exp_avg"):
            torch.testing.assert_close(opts[0].state[pa][key], opts[1].state[pb][key], atol=TOL, rtol=0)
    for ba, bb in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(ba, bb, atol=TOL, rtol=0)
    for key in ("loss", "loss_perturbed", "grad_norm", "eps_norm", "noise_norm"):
        torch.testing.assert_close(torch.as_tensor(opts[0].last[key]), torch.as_tensor(opts[1].last[key]),
                                   atol=TOL, rtol=0)  # fmt: skip
    assert opts[0].generator.get_state().equal(opts[1].generator.get_state())


def test_batched_equals_loop_with_a_rho_per_param_group() -> None:
    torch.manual_seed(0)
    model = _mlp().double()
    twin = copy.deepcopy(model)

    def make(mod, batched):
        ps = list(mod.parameters())
        groups = [{"params": ps[:2], "rho": 0.2}, {"params": ps[2:]}]
        return SAM(groups, torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9, model=mod, m=4, batched_m=batched)

    opts = [make(model, True), make(twin, False)]
    for t in range(3):
        x, y = _data("mlp", 16, seed=200 + t)
        for opt, mod in zip(opts, (model, twin)):
            opt.step(make_closure(opt, mod, nn.CrossEntropyLoss(), x, y))
    assert opts[0].last["m_sharpness"] == "batched"
    _assert_same(model, opts[0], twin, opts[1])
