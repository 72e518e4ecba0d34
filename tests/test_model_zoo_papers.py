"""The papers' networks in the model zoo (Fisher-SAM Tables 1-3, flat-seeking BNNs Tables 3-4):
parameter counts against hand counts of the published layouts and the published / reference
implementations' numbers, forward shapes, ShakeDrop's train / eval behaviour against its closed
form, and the ViT attention against ``nn.MultiheadAttention``.

Large networks are counted on the ``meta`` device (no memory, no initialisation); the ImageNet
forward passes are one slow test.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from landscape.models import available_models, count_parameters, model_factory
from landscape.models.pyramidnet import PyramidNet
from landscape.models.resnext import ResNeXt
from landscape.models.shakedrop import ShakeDrop, linear_decay_survival
from landscape.models.vit import SelfAttention, VisionTransformer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: big convolutions, no oversubscription

CIFAR_NETS = ("resnet10", "densenet121", "vgg19-bn", "resnext29-32x4d", "pyramidnet272")
IMAGENET_NETS = ("resnet152-imagenet", "densenet161-imagenet", "vit-b16", "deit-b")

# ------------------------------------------------------------------------- hand counts of the layouts


def conv(cin, cout, k, bias=False, groups=1):
    return cin // groups * cout * k * k + (cout if bias else 0)


def bn(c):
    return 2 * c


def linear(a, b):
    return a * b + b


def resnet10_count(classes):
    """He et al. 2016 Table 1 stages with one basic block each, CIFAR stem (3x3, 64, no pool)."""
    total, cin = conv(3, 64, 3) + bn(64), 64
    for w in (64, 128, 256, 512):
        total += conv(cin, w, 3) + bn(w) + conv(w, w, 3) + bn(w)
        total += conv(cin, w, 1) + bn(w) if cin != w else 0
        cin = w
    return total + linear(512, classes)


def densenet_count(growth, blocks, init, classes, imagenet_stem):
    """Huang et al. 2017 DenseNet-BC: bottleneck layers BN-1x1(4k)-BN-3x3(k), transitions BN-1x1
    halving the channels, final BN, FC."""
    total = conv(3, init, 7 if imagenet_stem else 3) + (bn(init) if imagenet_stem else 0)
    c = init
    for i, n in enumerate(blocks):
        for _ in range(n):
            total += bn(c) + conv(c, 4 * growth, 1) + bn(4 * growth) + conv(4 * growth, growth, 3)
            c += growth
        if i < len(blocks) - 1:
            total += bn(c) + conv(c, c // 2, 1)
            c //= 2
    return total + bn(c) + linear(c, classes)


def vgg19_bn_count(classes):
    """Simonyan & Zisserman 2015 configuration E, biased 3x3 convs + BN, one FC 512 -> C."""
    total, cin = 0, 3
    for w in (64, 64, 128, 128, *[256] * 4, *[512] * 8):
        total += conv(cin, w, 3, bias=True) + bn(w)
        cin = w
    return total + linear(512, classes)


def resnext29_count(cardinality, width, classes):
    """Xie et al. 2017 Sec. 5.2: 3x3 stem 64, 3 stages x 3 blocks, inner C*d*2^s, output 256*2^s."""
    total, cin = conv(3, 64, 3) + bn(64), 64
    for s in range(3):
        inner, out = cardinality * width * 2**s, 256 * 2**s
        for _ in range(3):
            total += conv(cin, inner, 1) + bn(inner) + conv(inner, inner, 3, groups=cardinality) + bn(inner)
            total += conv(inner, out, 1) + bn(out) + (conv(cin, out, 1) + bn(out) if cin != out else 0)
            cin = out
    return total + linear(1024, classes)


def pyramidnet_bottleneck_counts(depth, alpha, classes):
    """Han et al. 2017: widths 16 + k * alpha / (3n) rounded, bottleneck BN-1x1-BN-3x3-BN-1x1(4x)-BN,
    parameter-free shortcuts. Returns (conv + linear weights, BatchNorm parameters)."""
    n = (depth - 2) // 9
    weights, norms = conv(3, 16, 3), bn(16)
    cin, width = 16, 16.0
    for _ in range(3 * n):
        width += alpha / (3 * n)
        p = int(round(width))
        weights += conv(cin, p, 1) + conv(p, p, 3) + conv(p, 4 * p, 1)
        norms += bn(cin) + bn(p) + bn(p) + bn(4 * p)
        cin = 4 * p
    return weights + linear(cin, classes), norms + bn(cin)


def resnet152_count(classes):
    """He et al. 2016 Table 1, 152 layers: 7x7 stem + BN, bottlenecks (3, 8, 36, 3), projections."""
    total, cin = conv(3, 64, 7) + bn(64), 64
    for s, n in enumerate((3, 8, 36, 3)):
        p = 64 * 2**s
        for _ in range(n):
            total += conv(cin, p, 1) + bn(p) + conv(p, p, 3) + bn(p) + conv(p, 4 * p, 1) + bn(4 * p)
            total += conv(cin, 4 * p, 1) + bn(4 * p) if cin != 4 * p else 0
            cin = 4 * p
    return total + linear(2048, classes)


def vit_b16_count(classes):
    """Dosovitskiy et al. 2021 ViT-Base/16 at 224: patch embedding, class token, 197 positions,
    12 blocks (2 LN, QKV, projection, MLP 768-3072-768), final LN, head."""
    d, m = 768, 3072
    block = 2 * bn(d) + linear(d, 3 * d) + linear(d, d) + linear(d, m) + linear(m, d)
    return conv(3, d, 16, bias=True) + d + 197 * d + 12 * block + bn(d) + linear(d, classes)


# name, kwargs, hand count, exact count, where the reference number comes from
COUNTS = [
    ("resnet10", {}, resnet10_count(10), 4_903_242, "hand count (flat-BNN ResNet-10, resnet18's layout)"),
    ("resnet10", {"num_classes": 100}, resnet10_count(100), 4_949_412, "hand count"),
    # kuangliu/pytorch-cifar DenseNet121(): 6,956,298 parameters
    ("densenet121", {}, densenet_count(32, (6, 12, 24, 16), 64, 10, False), 6_956_298, "kuangliu"),
    ("densenet121", {"num_classes": 100}, densenet_count(32, (6, 12, 24, 16), 64, 100, False), 7_048_548,
     "kuangliu + 90 * 1025"),
    # kuangliu/pytorch-cifar VGG('VGG19'): 20,040,522 parameters
    ("vgg19-bn", {}, vgg19_bn_count(10), 20_040_522, "kuangliu"),
    ("vgg19-bn", {"num_classes": 100}, vgg19_bn_count(100), 20_086_692, "kuangliu + 90 * 513"),
    # homura resnext29_32x4d (the ASAM code's); kuangliu's 1x1-stem variant has 1,536 fewer: 4,774,218
    ("resnext29-32x4d", {}, resnext29_count(32, 4, 10), 4_775_754, "homura"),
    ("resnext29-32x4d", {"num_classes": 100}, resnext29_count(32, 4, 100), 4_868_004, "homura"),
    ("pyramidnet272", {}, sum(pyramidnet_bottleneck_counts(272, 200, 10)), 26_210_842, "Han et al."),
    ("pyramidnet272", {"num_classes": 100}, sum(pyramidnet_bottleneck_counts(272, 200, 100)), 26_288_692,
     "Han et al."),
    # torchvision.models.resnet152 / densenet161 / vit_b_16 parameter counts (torchvision docs)
    ("resnet152-imagenet", {}, resnet152_count(1000), 60_192_808, "torchvision"),
    ("densenet161-imagenet", {}, densenet_count(48, (6, 12, 36, 24), 96, 1000, True), 28_681_000,
     "torchvision"),
    ("vit-b16", {}, vit_b16_count(1000), 86_567_656, "torchvision"),
    # facebookresearch/deit deit_base_patch16_224 (timm): 86,567,656, the ViT-B/16 body
    ("deit-b", {}, vit_b16_count(1000), 86_567_656, "DeiT / timm"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, kwargs, formula, exact, source",
    COUNTS,
    ids=[f"{c[0]}-{c[1].get('num_classes', 'default')}" for c in COUNTS],
)
def test_parameter_counts_match_the_references(name, kwargs, formula, exact, source):
    assert formula == exact
    assert count_parameters(model_factory(name, device="meta", **kwargs)) == exact


def test_pyramidnet_counts_match_han_et_al_table():
    # Han et al. 2017's table (bottleneck PyramidNets): 272 / alpha 200: 26.0M; 200 / 240: 26.6M;
    # 236 / 220: 26.8M. Their counts are the convolution and linear weights, BN parameters excluded.
    for depth, alpha, published in ((272, 200, 26.0), (200, 240, 26.6), (236, 220, 26.8)):
        weights, norms = pyramidnet_bottleneck_counts(depth, alpha, 10)
        assert round(weights / 1e6, 1) == published
        with torch.device("meta"):
            model = PyramidNet(depth, alpha, 10)
        bn_params = sum(
            p.numel() for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()
        )
        assert (count_parameters(model) - bn_params, bn_params) == (weights, norms)
    assert pyramidnet_bottleneck_counts(272, 200, 10) == (25_999_978, 210_864)


def test_resnext_code_gives_xie_et_al_published_sizes():
    # Xie et al. 2017, Table 7 (CIFAR): ResNeXt-29 8x64d 34.4M, 16x64d 68.1M parameters, counted (as
    # Han et al.'s) without the BatchNorm scales and shifts: 34,369,226 and 68,054,730
    for cardinality, width, published in ((8, 64, 34.4), (16, 64, 68.1)):
        with torch.device("meta"):
            model = ResNeXt(29, cardinality, width)
        n = count_parameters(model)
        assert n == resnext29_count(cardinality, width, 10)
        bn_params = sum(
            p.numel() for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters()
        )
        assert round((n - bn_params) / 1e6, 1) == published


def test_layouts_of_the_reference_implementations():
    dn = model_factory("densenet121", device="meta")
    convs = [m for m in dn.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) + 1 == 121  # 120 convolutions + the classifier: DenseNet-"121"
    assert dn.head.in_features == 1024
    dn161 = model_factory("densenet161-imagenet", device="meta")
    assert (
        sum(isinstance(m, nn.Conv2d) for m in dn161.modules()) + 1 == 161 and dn161.head.in_features == 2208
    )
    r152 = model_factory("resnet152-imagenet", device="meta")
    # 152 layers: stem + 3 * 50 bottleneck convs + FC (projections not counted)
    assert sum(isinstance(m, nn.Conv2d) for m in r152.modules()) - 4 + 1 == 152
    strided = [m for m in r152.modules() if isinstance(m, nn.Conv2d) and m.stride == (2, 2)]
    assert [m.kernel_size for m in strided] == [(7, 7)] + [(3, 3), (1, 1)] * 3  # v1.5: stride on the 3x3
    vgg = model_factory("vgg19-bn", device="meta")
    assert sum(isinstance(m, nn.Conv2d) for m in vgg.modules()) + 3 == 19  # 16 convs + 3 FC in the paper
    pyr = model_factory("pyramidnet272", device="meta")
    assert len(pyr.blocks) == 90 and pyr.head.in_features == 4 * 216  # width 16 + 200, bottleneck x4
    assert 3 * 90 + 2 == 272
    r10 = model_factory("resnet10", device="meta")
    assert sum(isinstance(m, nn.Conv2d) for m in r10.modules()) - 3 + 1 == 10  # 3 projections


# ---------------------------------------------------------------------------------------- forward passes


@pytest.mark.parametrize("name", CIFAR_NETS)
def test_cifar_forward_shapes(name):
    model = model_factory(name, seed=0, num_classes=100).eval()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(x)
        again = model(x)
    assert out.shape == (2, 100) and bool(torch.isfinite(out).all())
    torch.testing.assert_close(out, again, rtol=0, atol=0)  # eval: deterministic, ShakeDrop included


@pytest.mark.slow
def test_imagenet_forward_shapes():
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    for name in IMAGENET_NETS:
        model = model_factory(name, seed=0).eval()
        with torch.no_grad():
            out = model(x)
        assert out.shape == (2, 1000) and bool(torch.isfinite(out).all()), name


def test_vit_attention_matches_multihead_attention():
    torch.manual_seed(0)
    attn = SelfAttention(32, 4, 0.0).double()
    ref = nn.MultiheadAttention(32, 4, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(attn.qkv.weight)
        ref.in_proj_bias.copy_(attn.qkv.bias)
        ref.out_proj.weight.copy_(attn.proj.weight)
        ref.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(3, 5, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(attn(x), ref(x, x, x, need_weights=False)[0], rtol=1e-12, atol=1e-12)


def test_small_vit_forward_and_token_count():
    vit = VisionTransformer(32, 8, 7, dim=64, depth=2, heads=4, mlp_dim=128)
    assert vit.pos_embed.shape == (1, (32 // 8) ** 2 + 1, 64)  # 16 patches + the class token
    out = vit(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4)))
    assert out.shape == (2, 7)
    assert torch.equal(out, torch.zeros(2, 7))  # torchvision's zero-initialised head
    deit = VisionTransformer(32, 8, 7, dim=64, depth=2, heads=4, mlp_dim=128, init="deit")
    w = torch.cat([m.weight.flatten() for m in deit.modules() if isinstance(m, nn.Linear)])
    # timm's trunc_normal_(std=0.02) cuts at +-2 (absolute): effectively N(0, 0.02^2)
    assert abs(float(w.detach().std()) - 0.02) < 0.0005 and abs(float(w.detach().mean())) < 0.0005
    with pytest.raises(ValueError, match="expects \\[N, C, 32, 32\\].*resize the inputs"):
        vit(torch.randn(1, 3, 24, 24))
    with pytest.raises(ValueError, match="image_size must be a positive multiple of patch_size"):
        VisionTransformer(30, 8)


# --------------------------------------------------------------------------------------------- ShakeDrop


def test_shakedrop_survival_rule():
    # Yamada et al. 2019, Sec. 4.1: p_l = 1 - (l / L)(1 - p_L), p_L = 0.5
    p = linear_decay_survival(90)
    assert (
        p[0] == pytest.approx(1 - 0.5 / 90) and p[-1] == pytest.approx(0.5) and p[44] == pytest.approx(0.75)
    )
    blocks = model_factory("pyramidnet272", device="meta").blocks
    assert [b.shakedrop.p for b in blocks] == p
    plain = model_factory("pyramidnet272", device="meta", shakedrop=False)
    assert not any(isinstance(m, ShakeDrop) for m in plain.modules())
    assert count_parameters(plain) == count_parameters(model_factory("pyramidnet272", device="meta"))


def test_shakedrop_forward_and_backward_factors_follow_the_closed_form():
    p, n = 0.6, 40_000
    sd = ShakeDrop(p, generator=torch.Generator().manual_seed(5)).double()
    x = torch.ones(n, 1, 1, 1, dtype=torch.float64, requires_grad=True)
    y = sd(x)
    y.sum().backward()
    forward, backward = y.detach().flatten(), x.grad.flatten()
    kept = forward == 1.0
    assert torch.equal(backward[kept], torch.ones(int(kept.sum()), dtype=torch.float64))
    assert float(forward.min()) >= -1 and float(backward[~kept].min()) >= 0 and float(backward.max()) <= 1
    # E[b + a - ab] = p, E[s^2] = p + (1 - p) / 3; E[b + beta - b beta] = p + (1 - p) / 2
    sd_f = math.sqrt(p + (1 - p) / 3 - p**2) / math.sqrt(n)
    assert abs(float(forward.mean()) - p) < 5 * sd_f
    assert abs(float((forward**2).mean()) - (p + (1 - p) / 3)) < 0.01
    sd_b = math.sqrt(p + (1 - p) / 3 - (p + (1 - p) / 2) ** 2) / math.sqrt(n)
    assert abs(float(backward.mean()) - (p + (1 - p) / 2)) < 5 * sd_b
    assert abs(float(kept.double().mean()) - p) < 5 * math.sqrt(p * (1 - p) / n)
    sd.eval()
    z = torch.randn(4, 3, 2, 2, dtype=torch.float64)
    assert torch.equal(sd(z), p * z)  # Eq. 9: the expected factor, deterministic
    with pytest.raises(ValueError, match="survival probability p must be in \\[0, 1\\]"):
        ShakeDrop(1.5)


def _scale_last_branch_norm(model, factors):
    for block, f in zip(model.blocks, factors):
        norm = block.branch[-1]
        with torch.no_grad():
            norm.weight.mul_(f)
            norm.bias.mul_(f)


def test_pyramidnet_eval_scales_each_branch_by_its_survival_probability():
    kwargs = {"depth": 20, "alpha": 12, "num_classes": 5}  # 2 bottleneck blocks per stage
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    shake = PyramidNet(**kwargs).double().train()
    torch.manual_seed(7)
    shake(x), shake(2 * x)  # non-trivial BatchNorm running statistics
    state = shake.state_dict()

    def plain_copy(**extra):
        model = PyramidNet(**kwargs, **extra).double()
        model.load_state_dict(state)
        return model

    # eval: p_l x branch, i.e. the plain network with each branch's last norm scaled by p_l
    plain = plain_copy(shakedrop=False)
    _scale_last_branch_norm(plain, linear_decay_survival(6))
    torch.testing.assert_close(shake.eval()(x), plain.eval()(x), rtol=1e-10, atol=1e-12)
    assert torch.equal(shake(x), shake(x))
    # train mode with p = 1 everywhere: ShakeDrop keeps every branch, the plain network's output
    sure, unscaled = plain_copy(shakedrop_final=1.0), plain_copy(shakedrop=False)
    torch.testing.assert_close(sure.train()(x), unscaled.train()(x), rtol=1e-12, atol=1e-12)
    # train mode: random, reproducible under a seed, and not the eval function
    shake.train()
    torch.manual_seed(8)
    a = shake(x)
    torch.manual_seed(8)
    assert torch.equal(a, shake(x))
    assert not torch.allclose(a, shake(x))


# ---------------------------------------------------------------------------------------------- registry


def test_registry_names_and_arguments():
    assert set(CIFAR_NETS + IMAGENET_NETS) <= set(available_models())
    assert model_factory("vgg19-bn", device="meta").head.out_features == 10
    assert model_factory("vit-b16", device="meta").head.out_features == 1000
    m = model_factory("resnext29-32x4d", device="meta", in_channels=1, norm="group", dropout=0.1)
    assert m.stem[0].in_channels == 1 and any(isinstance(x, nn.GroupNorm) for x in m.modules())
    assert [x.p for x in m.modules() if isinstance(x, nn.Dropout)] == [0.1]  # before the head only
    with pytest.raises(ValueError, match="PyramidNet depth must be bottleneck: 9n \\+ 2"):
        model_factory("pyramidnet272", depth=270)
    with pytest.raises(ValueError, match="VGG depth must be one of"):
        model_factory("vgg19-bn", depth=18)
    with pytest.raises(ValueError, match="unknown norm"):
        model_factory("densenet121", norm="layer")
