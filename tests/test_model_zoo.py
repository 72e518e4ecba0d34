"""The model zoo: parameter counts against the published architectures (derived by hand below),
forward shapes, shortcuts, normalisation layers (FRN against its formula), dropout placement.

Counting builds the large networks on the ``meta`` device (no memory, no initialisation), so the
36.5M-parameter WRN-28-10 costs nothing; only the small networks run a forward pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from landscape.models import (
    NORMS,
    FilterResponseNorm2d,
    available_models,
    count_parameters,
    model_factory,
)
from landscape.models.norms import group_count
from landscape.models.resnet import PadShortcut

# ---------------------------------------------------------------- hand counts from the papers' layouts


def conv(cin, cout, k, bias=False):
    return cin * cout * k * k + (cout if bias else 0)


def bn(c):
    return 2 * c


def linear(a, b):
    return a * b + b


def cifar_resnet_count(n, classes=10, projection=False):
    """He et al. 2016 Sec. 4.2: 3x3 conv 16, stages 16/32/64 of n basic blocks, FC."""
    total = conv(3, 16, 3) + bn(16)
    cin = 16
    for w in (16, 32, 64):
        for _ in range(n):
            total += conv(cin, w, 3) + bn(w) + conv(w, w, 3) + bn(w)
            if projection and cin != w:
                total += conv(cin, w, 1) + bn(w)
            cin = w
    return total + linear(64, classes)


def resnet_imagenet_layout_count(blocks, classes=10):
    total = conv(3, 64, 3) + bn(64)
    cin = 64
    for stage, n in enumerate(blocks):
        w = 64 * 2**stage
        for _ in range(n):
            total += conv(cin, w, 3) + bn(w) + conv(w, w, 3) + bn(w)
            if cin != w:
                total += conv(cin, w, 1) + bn(w)
            cin = w
    return total + linear(512, classes)


def wrn_count(depth, k, classes=10):
    """Zagoruyko & Komodakis 2016: pre-activation blocks, bias-free convs, 1x1 projections."""
    n = (depth - 4) // 6
    total, cin = conv(3, 16, 3), 16
    for w in (16 * k, 32 * k, 64 * k):
        for _ in range(n):
            total += bn(cin) + conv(cin, w, 3) + bn(w) + conv(w, w, 3) + (conv(cin, w, 1) if cin != w else 0)
            cin = w
    return total + bn(cin) + linear(cin, classes)


def preresnet_bottleneck_count(depth, classes=10):
    n = (depth - 2) // 9
    total, cin = conv(3, 16, 3), 16
    for p in (16, 32, 64):
        for _ in range(n):
            total += bn(cin) + conv(cin, p, 1) + bn(p) + conv(p, p, 3) + bn(p) + conv(p, 4 * p, 1)
            total += conv(cin, 4 * p, 1) if cin != 4 * p else 0
            cin = 4 * p
    return total + bn(cin) + linear(cin, classes)


# name, kwargs, hand count, exact number derived by hand, published figure in millions (He et al.
# 2016 Table 6; Zagoruyko & Komodakis 2016; He et al. 2016b; the SAM papers' ResNet-18/34)
COUNTS = [
    ("mlp-mnist", {}, linear(784, 500) + linear(500, 300) + linear(300, 10), 545_810, None),
    ("mlp-mnist", {"num_classes": 9}, linear(784, 500) + linear(500, 300) + linear(300, 9), 545_509, None),
    ("lenet5", {"input_size": 32}, conv(1, 6, 5, True) + conv(6, 16, 5, True) + linear(400, 120)
     + linear(120, 84) + linear(84, 10), 61_706, None),
    ("lenet5", {}, 61_706, 61_706, None),  # 28x28 with padding 2: the same layers
    ("lenet5-bsam", {}, conv(1, 6, 5, True) + conv(6, 16, 5, True) + conv(16, 120, 5, True)
     + linear(480, 64) + linear(64, 10), 82_126, None),
    ("resnet20", {}, cifar_resnet_count(3), 269_722, "0.27M"),
    ("resnet32", {}, cifar_resnet_count(5), 464_154, "0.46M"),
    ("resnet56", {}, cifar_resnet_count(9), 853_018, "0.85M"),
    ("resnet110", {}, cifar_resnet_count(18), 1_727_962, "1.7M"),
    ("resnet20", {"shortcut": "B"}, cifar_resnet_count(3, projection=True), 272_474, "0.27M"),
    ("resnet56", {"shortcut": "B"}, cifar_resnet_count(9, projection=True), 855_770, None),
    ("resnet20", {"num_classes": 100}, cifar_resnet_count(3, 100), 275_572, None),
    ("resnet18", {}, resnet_imagenet_layout_count((2, 2, 2, 2)), 11_173_962, "11.2M"),
    ("resnet34", {}, resnet_imagenet_layout_count((3, 4, 6, 3)), 21_282_122, "21.3M"),
    ("wrn16-4", {}, wrn_count(16, 4), 2_748_890, "2.7M"),
    ("wrn28-2", {}, wrn_count(28, 2), 1_467_610, "1.5M"),
    ("wrn28-10", {}, wrn_count(28, 10), 36_479_194, "36.5M"),
    ("wrn28-10", {"num_classes": 100}, wrn_count(28, 10, 100), 36_536_884, "36.5M"),
    ("preresnet164", {}, preresnet_bottleneck_count(164), 1_703_258, "1.7M"),
    ("preresnet164", {"num_classes": 100}, preresnet_bottleneck_count(164, 100), 1_726_388, "1.7M"),
]  # fmt: skip


@pytest.mark.parametrize("name, kwargs, formula, exact, published", COUNTS)
def test_parameter_counts_match_the_published_architectures(name, kwargs, formula, exact, published):
    model = model_factory(name, device="meta", **kwargs)
    assert formula == exact
    assert count_parameters(model) == exact
    if published is not None:  # the papers' figures, rounded to their last digit
        decimals = len(published[:-1].partition(".")[2])
        assert abs(exact / 1e6 - float(published[:-1])) <= 0.5 * 10**-decimals


def test_frn_resnet20_of_bsam_and_norm_variants_counts():
    # bSAM's ResNet-20-FRN: biased convs, FRN (gamma, beta, tau: 3C) after all 21 convolutions
    # (stem, 18 in blocks, 2 projections), no ReLU
    frn = model_factory("resnet20-frn", device="meta")
    convs = [m for m in frn.modules() if isinstance(m, nn.Conv2d)]
    frns = [m for m in frn.modules() if isinstance(m, FilterResponseNorm2d)]
    assert len(convs) == 21 and len(frns) == 21 and not any(isinstance(m, nn.ReLU) for m in frn.modules())
    by_hand = cifar_resnet_count(3, projection=True) + sum(c.out_channels for c in convs) * 2  # biases + tau
    assert count_parameters(frn) == by_hand == 274_042
    base = count_parameters(model_factory("resnet20", device="meta"))
    assert count_parameters(model_factory("resnet20", norm="group", device="meta")) == base  # 2C each
    assert count_parameters(model_factory("resnet20", norm="none", device="meta")) == base - 2 * (
        16 + 6 * 16 + 6 * 32 + 6 * 64
    )
    # FRN: 3C per norm (19 norms, option A)
    assert count_parameters(model_factory("resnet20", norm="frn", device="meta")) == base + (
        16 + 6 * 16 + 6 * 32 + 6 * 64
    )


# --------------------------------------------------------------------------------------- forward passes


@pytest.mark.parametrize(
    "name, kwargs, shape",
    [
        ("mlp-mnist", {}, (2, 1, 28, 28)),
        ("lenet5", {"input_size": 32, "in_channels": 3}, (2, 3, 32, 32)),
        ("lenet5-bsam", {"num_classes": 9}, (2, 1, 28, 28)),
        ("resnet20", {"num_classes": 100}, (2, 3, 32, 32)),
        # fully convolutional with global pooling: 8x8 inputs keep the CPU test fast
        ("resnet20-frn", {}, (2, 3, 8, 8)),
        ("resnet20", {"in_channels": 1, "norm": "group"}, (2, 1, 8, 8)),
        ("wrn16-4", {"dropout": 0.3}, (2, 3, 8, 8)),
        ("preresnet", {"depth": 20, "norm": "frn"}, (2, 3, 8, 8)),
        ("preresnet", {"depth": 56}, (2, 3, 8, 8)),
    ],
)
def test_forward_shapes(name, kwargs, shape):
    model = model_factory(name, seed=0, **kwargs)
    out = model(torch.randn(*shape, generator=torch.Generator().manual_seed(1)))
    assert out.shape == (shape[0], kwargs.get("num_classes", 10)) and bool(torch.isfinite(out).all())


def test_option_a_shortcut_is_subsample_and_zero_pad():
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    out = PadShortcut(16, 32, 2)(x)
    ref = np.zeros((2, 32, 4, 4))
    ref[:, 8:24] = x.numpy()[:, :, ::2, ::2]
    np.testing.assert_array_equal(out.numpy(), ref)
    r20 = model_factory("resnet20", device="meta")
    assert not any(isinstance(m, nn.Conv2d) and m.kernel_size == (1, 1) for m in r20.modules())
    assert sum(isinstance(m, PadShortcut) for m in r20.modules()) == 2


def test_filter_response_norm_matches_its_formula():
    frn = FilterResponseNorm2d(3).double()
    with torch.no_grad():
        frn.weight.copy_(torch.tensor([1.5, -0.5, 2.0], dtype=torch.float64))
        frn.bias.copy_(torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64))
        frn.tau.copy_(torch.tensor([-0.2, 0.0, 0.5], dtype=torch.float64))
    x = torch.randn(4, 3, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    a = x.numpy()
    nu2 = (a**2).mean(axis=(2, 3), keepdims=True)  # Singh & Krishnan 2020, Eq. 1
    y = np.array([1.5, -0.5, 2.0]).reshape(1, 3, 1, 1) * a / np.sqrt(nu2 + 1e-6) + np.array(
        [0.1, 0.2, -0.3]
    ).reshape(1, 3, 1, 1)
    z = np.maximum(y, np.array([-0.2, 0.0, 0.5]).reshape(1, 3, 1, 1))  # TLU, Eq. 3
    tol = {"rtol": 1e-13, "atol": 1e-14}
    np.testing.assert_allclose(frn(x).detach().numpy(), z, **tol)
    assert (z == np.array([-0.2, 0.0, 0.5]).reshape(1, 3, 1, 1)).sum() > 20  # the TLU clamps some
    frn.eval()
    np.testing.assert_allclose(frn(x).detach().numpy(), z, **tol)  # no batch statistics
    np.testing.assert_allclose(frn(x[:1]).detach().numpy(), z[:1], **tol)
    no_tlu = FilterResponseNorm2d(3, tlu=False).double()
    np.testing.assert_allclose(no_tlu(x).detach().numpy(), a / np.sqrt(nu2 + 1e-6), **tol)
    assert count_parameters(no_tlu) == 6 and count_parameters(frn) == 9


def test_group_norm_groups_and_batch_independence():
    assert [group_count(c) for c in (6, 16, 32, 64, 160, 640)] == [1, 4, 8, 16, 32, 32]
    model = model_factory("resnet20", norm="group", device="meta")
    gns = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert {(m.num_channels, m.num_groups) for m in gns} == {(16, 4), (32, 8), (64, 16)}
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    small = {"width": 16, "blocks": (1, 1, 1), "seed": 0}
    for norm in ("group", "frn", "none"):  # an example's output does not depend on the batch
        m = model_factory("resnet", norm=norm, **small).double().train()
        torch.testing.assert_close(m(x)[:1], m(x[:1]), rtol=1e-12, atol=1e-12)
    bnm = model_factory("resnet", **small).double().train()
    assert not torch.allclose(bnm(x)[:1], bnm(x[:1]))


# ---------------------------------------------------------------------------------------------- dropout


def _dropouts(model):
    return [m for m in model.modules() if isinstance(m, nn.Dropout)]


@pytest.mark.parametrize(
    "name, kwargs, count",
    [("mlp-mnist", {}, 2), ("lenet5", {}, 2), ("lenet5-bsam", {}, 1), ("resnet20", {}, 10),
     ("resnet18", {}, 9), ("wrn28-10", {}, 13), ("preresnet164", {}, 3 * 54 + 1)],
)  # fmt: skip
def test_dropout_modules_where_documented(name, kwargs, count):
    assert _dropouts(model_factory(name, device="meta", **kwargs)) == []  # p = 0: none at all
    drops = _dropouts(model_factory(name, device="meta", dropout=0.2, **kwargs))
    assert len(drops) == count and all(d.p == 0.2 for d in drops)


def test_dropout_sits_between_the_convolutions_and_before_the_head():
    model = model_factory("resnet", width=4, blocks=(1, 1), dropout=0.5, seed=0)
    order = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_hook(lambda m, i, o: order.append(names[m]))
             for m in model.modules() if not list(m.children())]  # fmt: skip
    model.eval()(torch.randn(1, 3, 8, 8))
    for h in hooks:
        h.remove()
    first = [n.split(".", 2)[2] for n in order if n.startswith("layers.0.")]
    assert first == ["conv1", "bn1", "act1", "drop", "conv2", "bn2", "shortcut", "act2"]
    assert order[-2:] == ["drop", "head"]
    x = torch.randn(4, 3, 8, 8)
    assert torch.equal(model(x), model(x))  # eval: deterministic
    model.train()
    torch.manual_seed(0)
    a = model(x)
    assert not torch.equal(a, model(x))


# ---------------------------------------------------------------------------------------------- registry


def test_registry_names_config_and_errors():
    names = set(available_models())
    assert {"mlp", "lenet5", "lenet5-digits", "resnet", "resnet20"} <= names  # the names that existed
    new = {"mlp-mnist", "lenet5-bsam", "resnet32", "resnet56", "resnet110", "resnet20-frn", "resnet18",
           "resnet34", "wrn", "wrn16-4", "wrn28-2", "wrn28-10", "preresnet", "preresnet164"}  # fmt: skip
    assert new <= names
    m = model_factory("resnet20", seed=3, num_classes=100)
    assert m.zoo_config == {"name": "resnet20", "seed": 3, "num_classes": 100}
    same = model_factory("resnet20", seed=3, num_classes=100)
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), same.parameters()))
    assert NORMS == ("batch", "group", "frn", "none")
    with pytest.raises(ValueError, match="unknown norm 'layer'"):
        model_factory("resnet20", norm="layer")
    with pytest.raises(ValueError, match="norm='frn' needs feature maps"):
        model_factory("mlp-mnist", norm="frn")
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\)"):
        model_factory("wrn16-4", dropout=1.0)
    with pytest.raises(ValueError, match="CIFAR ResNet depth must be 6n \\+ 2"):
        model_factory("resnet20", depth=21)
    with pytest.raises(ValueError, match="WRN depth must be 6n \\+ 4"):
        model_factory("wrn", depth=27)
    with pytest.raises(ValueError, match="PreResNet depth must be 9n \\+ 2"):
        model_factory("preresnet", depth=100)
    with pytest.raises(ValueError, match="shortcut must be 'A'"):
        model_factory("resnet20", shortcut="C")
