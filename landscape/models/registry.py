"""The model registry: :func:`model_factory` builds a model by name, :func:`register_model` adds
one, :func:`available_models` lists them, :func:`count_parameters` counts.

Registered names (all take ``num_classes`` and, except ``mlp``, ``in_channels``; the image nets
take ``norm`` and ``dropout``; see each class for where dropout acts):

* ``mlp`` (``sizes``, ``activation``), ``mlp-mnist`` (bSAM's 784-500-300-C);
* ``lenet5``, ``lenet5-digits`` (8x8 inputs), ``lenet5-bsam``;
* ``resnet`` (the generic small :class:`ResNet`), ``resnet20``, ``resnet32``, ``resnet44``,
  ``resnet56``, ``resnet110`` (He et al.'s CIFAR ResNets, option-A shortcuts), ``resnet20-frn``
  (bSAM's), ``resnet10``, ``resnet18``, ``resnet34`` (CIFAR stem);
* ``wrn`` (``depth``, ``widen_factor``), ``wrn16-4``, ``wrn28-2``, ``wrn28-10``;
* ``preresnet`` (``depth``), ``preresnet110``, ``preresnet164``;
* CIFAR nets of Fisher-SAM Table 1: ``densenet121``, ``vgg19-bn``, ``resnext29-32x4d``,
  ``pyramidnet272`` (alpha 200, bottleneck, ShakeDrop; ``shakedrop=False`` turns it off);
* ImageNet-size nets (224x224, 1000 classes by default; ``vit-b16`` and ``deit-b`` take no
  ``norm``): ``resnet152-imagenet``, ``densenet161-imagenet`` (flat-BNN Table 4), ``vit-b16``
  (Fisher-SAM Table 3), ``deit-b`` (Fisher-SAM Table 2);
* ``hf-classifier`` (``path``: a local Hugging Face checkpoint directory, ``num_classes``,
  ``attn_implementation``): :mod:`landscape.models.text`, for the int64 ``[N, 3, L]`` token inputs
  of the ``boolq`` / ``wic`` / ``rte`` data; its module (and transformers) is imported on first use.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landscape.models.densenet import densenet121_cifar, densenet161_imagenet
from landscape.models.lenet import LeNet5, LeNet5BSAM
from landscape.models.mlp import MLP, mlp_mnist
from landscape.models.preresnet import PreResNet
from landscape.models.pyramidnet import PyramidNet
from landscape.models.resnet import ResNet, cifar_resnet, resnet_cifar_imagenet_layout
from landscape.models.resnet_imagenet import resnet_imagenet
from landscape.models.resnext import ResNeXt
from landscape.models.vgg import VGG
from landscape.models.vit import deit_b, vit_b16
from landscape.models.wide_resnet import WideResNet

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model constructor under ``name`` for :func:`model_factory`."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = fn
        return fn

    return deco


def _with(fn: Callable[..., nn.Module], **defaults: Any) -> Callable[..., nn.Module]:
    """``fn`` with ``defaults`` the caller may override."""

    @functools.wraps(fn)
    def make(**kwargs: Any) -> nn.Module:
        return fn(**{**defaults, **kwargs})

    return make


register_model("mlp")(lambda sizes=(64, 128, 10), activation="tanh", **kw: MLP(sizes, activation, **kw))
register_model("mlp-mnist")(mlp_mnist)
register_model("lenet5")(LeNet5)
register_model("lenet5-digits")(_with(LeNet5, in_channels=1, input_size=8))
register_model("lenet5-bsam")(LeNet5BSAM)
register_model("resnet")(ResNet)
for _depth in (20, 32, 44, 56, 110):
    register_model(f"resnet{_depth}")(_with(cifar_resnet, depth=_depth))
register_model("resnet20-frn")(
    _with(cifar_resnet, depth=20, norm="frn", shortcut="B", bias=True, activation="identity")
)
register_model("resnet18")(_with(resnet_cifar_imagenet_layout, depth=18))
register_model("resnet34")(_with(resnet_cifar_imagenet_layout, depth=34))
register_model("wrn")(WideResNet)
for _d, _k in ((16, 4), (28, 2), (28, 10)):
    register_model(f"wrn{_d}-{_k}")(_with(WideResNet, depth=_d, widen_factor=_k))
register_model("preresnet")(PreResNet)
register_model("preresnet110")(_with(PreResNet, depth=110))
register_model("preresnet164")(_with(PreResNet, depth=164))
# the papers' remaining networks (Fisher-SAM Tables 1-3, flat-seeking BNNs Tables 3-4)
register_model("resnet10")(_with(resnet_cifar_imagenet_layout, depth=10))
register_model("densenet121")(densenet121_cifar)
register_model("vgg19-bn")(_with(VGG, depth=19))
register_model("resnext29-32x4d")(_with(ResNeXt, depth=29, cardinality=32, width=4))
register_model("pyramidnet272")(_with(PyramidNet, depth=272, alpha=200, bottleneck=True))
register_model("resnet152-imagenet")(_with(resnet_imagenet, depth=152))
register_model("densenet161-imagenet")(densenet161_imagenet)
register_model("vit-b16")(vit_b16)
register_model("deit-b")(deit_b)


@register_model("hf-classifier")
def _hf_classifier(**kwargs: Any) -> nn.Module:
    from landscape.models.text import hf_classifier  # lazily: importing the zoo never imports transformers

    return hf_classifier(**kwargs)


def available_models() -> list[str]:
    return sorted(_REGISTRY)


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (each shared tensor once); works on ``meta`` models too."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def model_factory(
    name: str,
    *,
    seed: int | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a registered model by name (``available_models()``), optionally seeded and cast.

    ``seed`` initialises the weights reproducibly without touching the global RNG state.
    ``device`` builds the parameters there directly (``device="meta"`` allocates nothing: the
    way to count the parameters of a large network instantly). The model's ``zoo_config``
    attribute records the name and arguments.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; registered: {available_models()}")

    def build() -> nn.Module:
        if device is None:
            return _REGISTRY[name](**kwargs)
        with torch.device(device):
            return _REGISTRY[name](**kwargs)

    if seed is None:
        model = build()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build()
    model = model.to(dtype) if dtype is not None else model
    model.zoo_config = {"name": name, "seed": seed, **kwargs}
    return model
