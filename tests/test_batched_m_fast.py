"""The direct engine of batched m-sharpness (optimizers.m_sharpness; optimizers.chunk_direct: no
vmap for chains of linear layers) against independent references in float64: per-chunk autograd
written out by hand, and the sequential loop of the optimizers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.lenet import LeNet5, LeNet5BSAM
from optimizers import ASAM, SAM, BayesianSAM, FisherSAM
from optimizers.chunk_direct import check_input, plan
from optimizers.m_sharpness import ChunkEngine, chunk_gradients, chunk_norms, summarise_stacked
from optimizers.perturbation import make_closure

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


def _grads(vec, points: dict, stacked: bool, reduce: bool = False):
    """:func:`chunk_gradients` with the points and gradients by parameter name."""
    g, losses, bn = chunk_gradients(vec, list(points.values()), stacked=stacked, reduce=reduce)
    return dict(zip(vec.names, g)), losses, bn


@pytest.mark.parametrize("name", sorted(_models()))
def test_direct_engine_grads_equal_per_chunk_autograd(name: str) -> None:
    torch.manual_seed(0)
    model = _models()[name]().to(DT)
    params = [p for p in model.parameters()]
    m = 4
    x, y = _data(name, 16, seed=1)
    xs, ys = torch.tensor_split(x, m), torch.tensor_split(y, m)
    vec = ChunkEngine(model, nn.CrossEntropyLoss(), params, xs, ys)
    assert vec.name == "direct"
    names = vec.names
    # shared weights: the m gradients at w
    want_l, want_g = _hand_chunk_grads(model, params, xs, ys)
    with torch.enable_grad():
        g, losses, bn = _grads(vec, {n: p.detach() for n, p in zip(names, params)}, stacked=False)
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
            g, losses, _ = _grads(vec, stacked, stacked=True, reduce=reduce)
        torch.testing.assert_close(losses, want_l, atol=TOL, rtol=0)
        for n, w in zip(names, want_g):
            torch.testing.assert_close(g[n], w.sum(0) if reduce else w, atol=TOL, rtol=0)


def _steps(
    method: str,
    model: nn.Module,
    name: str,
    *,
    m: int = 4,
    steps: int = 3,
    params=None,
    data=None,
    engine: str | None = None,
    **kw,
):
    opt = METHODS[method](model.parameters() if params is None else params, model=model, m=m, **kw)
    if engine is not None:
        opt.batched_engine = engine
    for t in range(steps):
        x, y = (data or _data)(name, 16, seed=100 + t)
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
    vm = _steps("sam", twins[0], "mlp", params=groups(twins[0]), engine="vmap")
    loop = _steps("sam", twins[1], "mlp", params=groups(twins[1]), batched_m=False)
    assert opt.config["m_sharpness_engine"] == "direct" and vm.config["m_sharpness_engine"] == "vmap"
    _assert_same(model, opt, twins[0], vm)
    _assert_same(model, opt, twins[1], loop)
    for frozen in (model[0].weight, model[0].bias, model[2].weight):  # never stepped
        assert torch.equal(frozen, dict(zip(model.parameters(), twins[1].parameters()))[frozen])


def _assert_bsam_direct_equals_loop(model: nn.Module, name: str, noise: bool, data) -> None:
    """Three bSAM steps with m = 4 on the direct engine and on the loop of a twin: weights, the
    posterior state ``s`` / ``exp_avg`` and the step's records agree to ``TOL``."""
    twin = copy.deepcopy(model)
    opts = []
    for net, batched in ((model, True), (twin, False)):
        opt = BayesianSAM(net.parameters(), lr=0.1, num_data=1000, rho=0.05, m=4, noise=noise, seed=3,
                          model=net, batched_m=batched)  # fmt: skip
        for t in range(3):
            x, y = data(name, 16, seed=200 + t)
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


@pytest.mark.parametrize("kind", ["mlp", "tied"])
@pytest.mark.parametrize("noise", [True, False])
def test_bsam_direct_engine_equals_loop(kind: str, noise: bool) -> None:
    torch.manual_seed(5)
    _assert_bsam_direct_equals_loop(_models()[kind]().to(DT), kind, noise, _data)


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
        out = summarise_stacked(stacked)
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
    """ASAM's and Fisher-SAM's rules on a stack of chunks (Fisher-SAM with a ``fisher`` callable too:
    the Fisher at ``w`` is the same for every chunk), per-group rho/eta, against the loop."""
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
    eps, diag = opts[0]._perturbation(pairs, ones)
    assert [e.shape for e in eps] == [o.shape for o in ones] and all(v.shape == (4,) for v in diag.values())


# --- convolutions (optimizers.chunk_direct_conv) -----------------------------------------------


def _cnns() -> dict[str, callable]:
    return {
        "cnn": lambda: nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False),
            nn.Tanh(),
            nn.Flatten(),
            nn.Linear(24, 3),
        ),
        "cnn_dilated_groups": lambda: nn.Sequential(
            nn.Conv2d(2, 4, 3, dilation=2, padding="same"),
            nn.GELU(),
            nn.Conv2d(4, 6, 3, groups=2, stride=(2, 1), padding=(1, 0)),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(24, 3),
        ),
        "cnn_valid_inplace": lambda: nn.Sequential(
            nn.Conv2d(2, 3, (3, 2), padding="valid"),
            nn.ReLU(inplace=True),
            nn.Conv2d(3, 4, 2, dilation=(1, 2)),
            nn.AdaptiveMaxPool2d((2, 3)),
            nn.AvgPool2d(2, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
            nn.Flatten(),
            nn.Linear(16, 5),
            nn.SiLU(),
            nn.Linear(5, 3),
        ),
        "lenet5": lambda: LeNet5(in_channels=2, num_classes=3, input_size=8),
        "lenet5_bsam": lambda: LeNet5BSAM(in_channels=2, num_classes=3, input_size=15),
    }


def _cnn_data(name: str, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    size = 15 if name == "lenet5_bsam" else 8
    return torch.randn(batch, 2, size, size, generator=g, dtype=DT), torch.randint(
        0, 3, (batch,), generator=g
    )


@pytest.mark.parametrize("name", sorted(_cnns()))
def test_conv_engine_grads_equal_per_chunk_autograd(name: str) -> None:
    """Shared weights (the m gradients at w), per-chunk weights (the m gradients at w_k) and their
    sum, against one autograd call per chunk; the first layer frozen, so only some layers tap."""
    torch.manual_seed(10)
    model = _cnns()[name]().to(DT)
    m = 4
    x, y = _cnn_data(name, 16, seed=11)
    xs, ys = torch.tensor_split(x, m), torch.tensor_split(y, m)
    for params in (list(model.parameters()), list(model.parameters())[1:]):
        vec = ChunkEngine(model, nn.CrossEntropyLoss(), params, xs, ys)
        assert vec.name == "direct", vec.direct_unavailable
        names = vec.names
        want_l, want_g = _hand_chunk_grads(model, params, xs, ys)
        with torch.enable_grad():
            g, losses, _ = _grads(vec, {n: p.detach() for n, p in zip(names, params)}, stacked=False)
        torch.testing.assert_close(losses, want_l, atol=TOL, rtol=0)
        for n, w in zip(names, want_g):
            torch.testing.assert_close(g[n], w, atol=TOL, rtol=0)
        gen = torch.Generator().manual_seed(12)
        points = [
            [p.detach() + 0.1 * torch.randn(p.shape, generator=gen, dtype=DT) for p in params]
            for _ in range(m)
        ]
        want_l, want_g = _hand_chunk_grads(model, params, xs, ys, points)
        stacked = {n: torch.stack([pt[i] for pt in points]) for i, n in enumerate(names)}
        for reduce in (False, True):
            with torch.enable_grad():
                g, losses, _ = _grads(vec, stacked, stacked=True, reduce=reduce)
            torch.testing.assert_close(losses, want_l, atol=TOL, rtol=0)
            for n, w in zip(names, want_g):
                torch.testing.assert_close(g[n], w.sum(0) if reduce else w, atol=TOL, rtol=0)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("name", sorted(_cnns()))
def test_conv_engine_step_equals_loop(method: str, name: str) -> None:
    torch.manual_seed(13)
    model = _cnns()[name]().to(DT)
    twin = copy.deepcopy(model)
    opt = _steps(method, model, name, data=_cnn_data)
    loop = _steps(method, twin, name, data=_cnn_data, batched_m=False)
    assert opt.last["m_sharpness"] == "batched" and opt.config["m_sharpness_engine"] == "direct"
    _assert_same(model, opt, twin, loop)


def test_conv_engine_with_frozen_layers_equals_vmap_and_loop() -> None:
    """A frozen convolution, a convolution with only its bias trained, per-group rho."""
    torch.manual_seed(14)
    model = _cnns()["cnn"]().to(DT)
    model[0].weight.requires_grad_(False)  # its bias trains
    twins = [copy.deepcopy(model) for _ in range(2)]
    groups = lambda mod: [  # noqa: E731 - the second convolution outside the optimizer
        {"params": [mod[0].bias], "rho": 0.2},
        {"params": list(mod[6].parameters())},
    ]
    opt = _steps("sam", model, "cnn", params=groups(model), data=_cnn_data)
    vm = _steps("sam", twins[0], "cnn", params=groups(twins[0]), data=_cnn_data, engine="vmap")
    loop = _steps("sam", twins[1], "cnn", params=groups(twins[1]), data=_cnn_data, batched_m=False)
    assert opt.config["m_sharpness_engine"] == "direct" and vm.config["m_sharpness_engine"] == "vmap"
    _assert_same(model, opt, twins[0], vm)
    _assert_same(model, opt, twins[1], loop)
    for frozen in (model[0].weight, model[3].weight):  # never stepped
        assert torch.equal(frozen, dict(zip(model.parameters(), twins[1].parameters()))[frozen])


@pytest.mark.parametrize("noise", [True, False])
def test_bsam_conv_engine_equals_loop(noise: bool) -> None:
    torch.manual_seed(15)
    _assert_bsam_direct_equals_loop(_cnns()["lenet5"]().to(DT), "lenet5", noise, _cnn_data)


class _MyLeNet(LeNet5):  # a subclass may override forward: not assumed to be LeNet5
    pass


class _LeNetForward(LeNet5):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x) * 2)


def _conv(**kw) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(2, 3, 3, **kw), nn.Flatten(), nn.Linear(108, 3))


@pytest.mark.parametrize(
    "factory,why",
    [
        (lambda: _conv(padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
        (lambda: nn.Sequential(nn.Conv2d(2, 3, 2, padding="same"), nn.Flatten()), "asymmetric 'same'"),
        (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.MaxPool2d(2, return_indices=True)), "return_indices"),
        (lambda: nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten()), "Conv1d"),
        (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)), "BatchNorm2d"),
        (lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.Dropout2d(0.5)), "Dropout2d"),
        (lambda: nn.Sequential(nn.MaxPool2d(2), nn.Flatten()), "no linear layer"),
        (lambda: LeNet5(in_channels=2, num_classes=3, input_size=8, norm="batch"), "BatchNorm2d"),
        (lambda: LeNet5(in_channels=2, num_classes=3, input_size=8, norm="group"), "GroupNorm"),
        (lambda: LeNet5(in_channels=2, num_classes=3, input_size=8, dropout=0.5), "dropout in train mode"),
        (lambda: _MyLeNet(in_channels=2, num_classes=3, input_size=8), "_MyLeNet"),
        (lambda: _LeNetForward(in_channels=2, num_classes=3, input_size=8), "_LeNetForward"),
    ],
)
def test_plan_refuses_convolutions_it_does_not_know(factory, why) -> None:
    leaves, reason = plan(factory().train())
    assert leaves is None and why in reason


def test_lenet5_plans_in_call_order_and_eval_dropout_is_skipped() -> None:
    model = LeNet5(in_channels=2, num_classes=3, input_size=8, dropout=0.5).eval()
    leaves, reason = plan(model)
    want = [mod for mod in model.modules() if not list(mod.children()) and type(mod) is not nn.Dropout]
    assert reason == "" and leaves == want and len(want) == 12  # the eval-mode dropouts left out


def test_conv_on_unbatched_images_goes_to_vmap() -> None:
    """A 3-d batch would be one unbatched image to Conv2d: not per-example, left to vmap."""
    torch.manual_seed(16)
    leaves = [nn.Conv2d(4, 3, 3), nn.Flatten(), nn.Linear(12, 3)]
    assert "Conv2d on a 3-d input" in check_input(leaves, torch.zeros(4, 4, 4))
    assert "MaxPool2d on a 2-d input" in check_input([nn.Flatten(), nn.MaxPool2d(2)], torch.zeros(4, 2, 3, 3))
    assert check_input(leaves, torch.zeros(4, 4, 4, 4)) == ""
    net = nn.Sequential(nn.Conv2d(4, 3, 3), nn.Flatten(0), nn.Linear(12, 3))
    assert "Flatten over the batch" in plan(net)[1]
    net = nn.Sequential(nn.Conv2d(16, 3, 3), nn.Flatten(), nn.Linear(4, 3)).to(DT)
    x = torch.randn(16, 4, 4, dtype=DT)  # 16 "examples" of [4, 4]: the conv sees [16, 4, 4] as one image
    vec = ChunkEngine(net, lambda out, y: out.square().mean(), list(net.parameters()),
                          torch.tensor_split(x, 1), torch.tensor_split(torch.zeros(16), 1))  # fmt: skip
    assert vec.name == "vmap" and "3-d input" in vec.direct_unavailable


def test_batchnorm_cnn_still_goes_to_vmap_and_equals_the_loop() -> None:
    torch.manual_seed(17)
    model = LeNet5(in_channels=2, num_classes=3, input_size=8, norm="batch").to(DT)
    assert "BatchNorm2d" in plan(model)[1]
    twin = copy.deepcopy(model)
    opt = _steps("sam", model, "lenet5", steps=2, data=_cnn_data)
    loop = _steps("sam", twin, "lenet5", steps=2, data=_cnn_data, batched_m=False)
    assert opt.last["m_sharpness"] == "batched" and opt.config["m_sharpness_engine"] == "vmap"
    _assert_same(model, opt, twin, loop)
    for ba, bb in zip(model.buffers(), twin.buffers()):
        torch.testing.assert_close(ba, bb, atol=TOL, rtol=0)
