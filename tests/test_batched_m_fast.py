"""The direct engine of batched m-sharpness (optimizers.chunk_direct: no vmap for chains of linear
layers) against independent references in float64: per-chunk autograd written out by hand, and the
sequential loop of the optimizers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from optimizers import ASAM, SAM, BayesianSAM, FisherSAM
from optimizers.batched_chunks import ChunkVectoriser, chunk_norms
from optimizers.chunk_direct import plan
from optimizers.perturbation import _summarise_stacked, make_closure

TOL = 1e-10
DT = torch.float64
SGD = dict(lr=0.1, momentum=0.9)
METHODS = {
    "sam": lambda ps, **kw: SAM(ps, torch.optim.SGD, rho=0.05, weight_decay=5e-4, **SGD, **kw),
    "asam": lambda ps, **kw: ASAM(ps, torch.optim.SGD, rho=0.5, **SGD, **kw),
    "fisher_sam": lambda ps, **kw: FisherSAM(ps, torch.optim.SGD, rho=0.1, eta=1.0, **SGD, **kw),
}


class _Tied(nn.Sequential):
    """Two linear layers sharing one weight matrix (the gradients of both uses add up)."""

    def __init__(self) -> None:
        first = nn.Linear(6, 6)
        second = nn.Linear(6, 6)
        second.weight = first.weight
        super().__init__(first, nn.Tanh(), second, nn.GELU(), nn.Linear(6, 3))


def _models() -> dict[str, callable]:
    return {
        "mlp": lambda: nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)),
        "flatten_nested_no_bias": lambda: nn.Sequential(
            nn.Flatten(),
            nn.Sequential(nn.Linear(6, 8, bias=False), nn.ReLU()),
            nn.Linear(8, 8),
            nn.SiLU(),
            nn.Dropout(0.5).eval(),  # eval mode: the identity
            nn.Linear(8, 3),
        ),
        "tied": _Tied,
        "inplace": lambda: nn.Sequential(  # in-place activations must not overwrite a layer's output
            nn.Linear(6, 8),
            nn.ReLU(inplace=True),
            nn.Linear(8, 8),
            nn.LeakyReLU(0.1, inplace=True),
            nn.Linear(8, 3),
        ),
        "tokens": lambda: nn.Sequential(nn.Linear(6, 8), nn.ELU(), nn.Flatten(), nn.Linear(16, 3)),
    }


def _data(name: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = {"flatten_nested_no_bias": (batch, 2, 3), "tokens": (batch, 2, 6)}.get(name, (batch, 6))
    return torch.randn(shape, generator=g, dtype=DT), torch.randint(0, 3, (batch,), generator=g)


def _hand_chunk_grads(model, params, x_chunks, y_chunks, points=None):
    """Per-chunk losses and gradients, one plain autograd call per chunk (``points[k]``: the
    parameter values of chunk ``k``, written into the model for its call)."""
    losses, grads = [], []
    saved = [p.detach().clone() for p in params]
    for k, (xk, yk) in enumerate(zip(x_chunks, y_chunks)):
        with torch.no_grad():
            for p, v in zip(params, points[k] if points is not None else saved):
                p.copy_(v)
        loss = F.cross_entropy(model(xk), yk)
        losses.append(loss.detach())
        grads.append(torch.autograd.grad(loss, params))
    with torch.no_grad():
        for p, v in zip(params, saved):
            p.copy_(v)
    return torch.stack(losses), [torch.stack([g[i] for g in grads]) for i in range(len(params))]


@pytest.mark.parametrize("name", sorted(_models()))
def test_direct_engine_grads_equal_per_chunk_autograd(name: str) -> None:
    torch.manual_seed(0)
    model = _models()[name]().to(DT)
    params = [p for p in model.parameters()]
    m = 4
    x, y = _data(name, 16, seed=1)
    xs, ys = torch.tensor_split(x, m), torch.tensor_split(y, m)
    vec = ChunkVectoriser(model, nn.CrossEntropyLoss(), params, xs, ys)
    assert vec.engine == "direct"
    names = vec.names
    # shared weights: the m gradients at w
    want_l, want_g = _hand_chunk_grads(model, params, xs, ys)
    with torch.enable_grad():
        g, losses, bn = vec.grads({n: p.detach() for n, p in zip(names, params)}, stacked=False)
    assert bn == {}
    torch.testing.assert_close(losses, want_l, atol=TOL, rtol=0)
    for n, w in zip(names, want_g):
        torch.testing.assert_close(g[n], w, atol=TOL, rtol=0)
    # per-chunk weights: the m gradients at w_k, and their sum
    gen = torch.Generator().manual_seed(2)
    noise = lambda p: 0.1 * torch.randn(p.shape, generator=gen, dtype=DT)  # noqa: E731
    points = [[p.detach() + noise(p) for p in params] for _ in range(m)]
    want_l, want_g = _hand_chunk_grads(model, params, xs, ys, points)
    stacked = {n: torch.stack([pt[i] for pt in points]) for i, n in enumerate(names)}
    for reduce in (False, True):
        with torch.enable_grad():
            g, losses, _ = vec.grads(stacked, stacked=True, reduce=reduce)
        torch.testing.assert_close(losses, want_l, atol=TOL, rtol=0)
        for n, w in zip(names, want_g):
            torch.testing.assert_close(g[n], w.sum(0) if reduce else w, atol=TOL, rtol=0)


def _steps(method: str, model: nn.Module, name: str, *, m: int = 4, steps: int = 3, params=None, **kw):
    opt = METHODS[method](model.parameters() if params is None else params, model=model, m=m, **kw)
    for t in range(steps):
        x, y = _data(name, 16, seed=100 + t)
        opt.step(make_closure(opt, model, nn.CrossEntropyLoss(), x, y))
    return opt


def _assert_same(model_a, opt_a, model_b, opt_b) -> None:
    for pa, pb in zip(model_a.parameters(), model_b.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
    assert set(opt_a.last) == set(opt_b.last)
    for key in ("loss", "loss_perturbed"):
        torch.testing.assert_close(opt_a.last[key], opt_b.last[key], atol=TOL, rtol=0)
    for ra, rb in zip(opt_a.last["per_chunk"], opt_b.last["per_chunk"]):
        assert list(ra) == list(rb)
        for key in ra:
            torch.testing.assert_close(ra[key], rb[key], atol=TOL, rtol=0)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("name", sorted(_models()))
def test_direct_engine_step_equals_loop(method: str, name: str) -> None:
    torch.manual_seed(3)
    model = _models()[name]().to(DT)
    twin = copy.deepcopy(model)
    opt = _steps(method, model, name)
    loop = _steps(method, twin, name, batched_m=False)
    assert opt.last["m_sharpness"] == "batched" and opt.config["m_sharpness_engine"] == "direct"
    _assert_same(model, opt, twin, loop)


def test_direct_engine_equals_vmap_engine_and_frozen_layers_stay_constant() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)).to(DT)
    model[2].weight.requires_grad_(False)  # a frozen weight (its bias trains)
    twins = [copy.deepcopy(model) for _ in range(2)]
    groups = lambda mod: [  # noqa: E731 - per-group rho, the first layer outside the optimizer
        {"params": [mod[2].bias], "rho": 0.2},
        {"params": list(mod[4].parameters())},
    ]
    opt = _steps("sam", model, "mlp", params=groups(model))
    vm = METHODS["sam"](groups(twins[0]), model=twins[0], m=4)
    vm.batched_engine = "vmap"
    for t in range(3):
        x, y = _data("mlp", 16, seed=100 + t)
        vm.step(make_closure(vm, twins[0], nn.CrossEntropyLoss(), x, y))
    loop = _steps("sam", twins[1], "mlp", params=groups(twins[1]), batched_m=False)
    assert opt.config["m_sharpness_engine"] == "direct" and vm.config["m_sharpness_engine"] == "vmap"
    _assert_same(model, opt, twins[0], vm)
    _assert_same(model, opt, twins[1], loop)
    for frozen in (model[0].weight, model[0].bias, model[2].weight):  # never stepped
        assert torch.equal(frozen, dict(zip(model.parameters(), twins[1].parameters()))[frozen])


@pytest.mark.parametrize("kind", ["mlp", "tied"])
@pytest.mark.parametrize("noise", [True, False])
def test_bsam_direct_engine_equals_loop(kind: str, noise: bool) -> None:
    torch.manual_seed(5)
    model = _models()[kind]().to(DT)
    twin = copy.deepcopy(model)
    opts = []
    for net, batched in ((model, True), (twin, False)):
        opt = BayesianSAM(net.parameters(), lr=0.1, num_data=1000, rho=0.05, m=4, noise=noise, seed=3,
                          model=net, batched_m=batched)  # fmt: skip
        for t in range(3):
            x, y = _data(kind, 16, seed=200 + t)
            opt.step(make_closure(opt, net, nn.CrossEntropyLoss(), x, y))
        opts.append(opt)
    assert opts[0].last["m_sharpness"] == "batched" and opts[0].config["m_sharpness_engine"] == "direct"
    for pa, pb in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(pa, pb, atol=TOL, rtol=0)
        for key in ("s", "exp_avg"):
            torch.testing.assert_close(opts[0].state[pa][key], opts[1].state[pb][key], atol=TOL, rtol=0)
    for key in ("loss", "loss_perturbed", "grad_norm", "eps_norm"):
        a, b = torch.as_tensor(opts[0].last[key]), torch.as_tensor(opts[1].last[key])
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


class _MyLinear(nn.Linear):  # a subclass may override forward: not assumed to be nn.Linear
    pass


@pytest.mark.parametrize(
    "factory,why",
    [
        (lambda: nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)), "BatchNorm1d"),
        (lambda: nn.Sequential(nn.Linear(6, 4), nn.LayerNorm(4), nn.Linear(4, 3)), "LayerNorm"),
        (lambda: nn.Sequential(_MyLinear(6, 3)), "_MyLinear"),
        (lambda: nn.Sequential(nn.Flatten(0), nn.Linear(6, 3)), "Flatten over the batch"),
        (lambda: nn.Sequential(nn.Linear(6, 4), nn.Dropout(0.5), nn.Linear(4, 3)), "dropout in train mode"),
        (lambda: nn.Sequential(nn.Tanh()), "no linear layer"),
    ],
)
def test_plan_refuses_what_it_does_not_know(factory, why) -> None:
    leaves, reason = plan(factory().train())
    assert leaves is None and why in reason


def test_hooks_send_the_step_to_vmap_with_the_same_result() -> None:
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(DT)
    seen = []
    model[1].register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    assert plan(model)[0] is None and "hooks" in plan(model)[1]
    twin = copy.deepcopy(model)
    opt = _steps("sam", model, "mlp", steps=2)
    assert opt.last["m_sharpness"] == "batched" and opt.config["m_sharpness_engine"] == "vmap"
    loop = _steps("sam", twin, "mlp", steps=2, batched_m=False)
    _assert_same(model, opt, twin, loop)


def test_dropout_in_train_mode_still_falls_back_to_the_loop() -> None:
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.3), nn.Linear(8, 3)).to(DT).train()
    opt = _steps("sam", model, "mlp", steps=1)
    assert opt.last["m_sharpness"].startswith("sequential: vmap failed")


def test_chunk_norms_and_stacked_summary_match_their_definitions() -> None:
    g = torch.Generator().manual_seed(8)
    ts = [torch.randn(4, 3, 2, generator=g, dtype=DT), torch.randn(4, 5, generator=g, dtype=DT)]
    want = torch.stack([torch.cat([t[k].reshape(-1) for t in ts]).norm() for k in range(4)])
    torch.testing.assert_close(chunk_norms(ts), want, atol=1e-14, rtol=0)
    torch.testing.assert_close(chunk_norms(ts[:1]), ts[0].reshape(4, -1).norm(dim=1), atol=1e-14, rtol=0)
    for second in (torch.randn(4, generator=g, dtype=DT), torch.randn(4, generator=g)):  # mixed dtypes too
        stacked = {"loss": torch.randn(4, generator=g, dtype=DT), "grad_norm": second}
        out = _summarise_stacked(stacked)
        assert list(out) == ["loss", "grad_norm", "per_chunk"] and len(out["per_chunk"]) == 4
        for key, v in stacked.items():
            assert out[key].dtype == v.dtype and torch.equal(out[key], v.mean())
            for k, rec in enumerate(out["per_chunk"]):
                assert list(rec) == ["loss", "grad_norm"] and rec[key].dim() == 0
                assert torch.equal(rec[key], v[k])


VARIANTS = {
    "asam_all": lambda ps, **kw: ASAM(ps, torch.optim.SGD, rho=0.5, scale="all", **SGD, **kw),
    "asam_dim": lambda ps, **kw: ASAM(ps, torch.optim.SGD, rho=0.5, eta=0.1, scale="dim>1", **SGD, **kw),
    "fisher_grad_scale": lambda ps, **kw: FisherSAM(
        ps, torch.optim.SGD, rho=0.1, eta=0.5, grad_scale=2.0, **SGD, **kw
    ),
    "fisher_callable": lambda ps, **kw: FisherSAM(
        ps, torch.optim.SGD, rho=0.1, fisher=lambda p: p.detach().abs() + 0.5, **SGD, **kw
    ),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batched_perturbation_hooks_equal_the_loop_for_each_variant(variant: str) -> None:
    """ASAM's and Fisher-SAM's ``_perturbation_batched`` (Fisher-SAM with a ``fisher`` callable
    declines it: the callable is then called chunk by chunk, as in the loop), per-group rho/eta."""
    torch.manual_seed(9)
    model = _models()["mlp"]().to(DT)
    twin = copy.deepcopy(model)
    opts = []
    for net, batched in ((model, True), (twin, False)):
        ps = list(net.parameters())
        groups = [{"params": ps[:2], "rho": 0.3, "eta": 0.05}, {"params": ps[2:]}]
        opt = VARIANTS[variant](groups, model=net, m=4, batched_m=batched)
        for t in range(3):
            x, y = _data("mlp", 16, seed=300 + t)
            opt.step(make_closure(opt, net, nn.CrossEntropyLoss(), x, y))
        opts.append(opt)
    assert opts[0].last["m_sharpness"] == "batched"
    _assert_same(model, opts[0], twin, opts[1])
    pairs = [(opts[0].param_groups[0], p) for p in model.parameters()]
    ones = [torch.ones(4, *p.shape, dtype=DT) for p in model.parameters()]
    assert (opts[0]._perturbation_batched(pairs, ones) is None) is (variant == "fisher_callable")
