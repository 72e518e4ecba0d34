"""The model zoo in one import: every architecture, the normalisation layers and the registry.

* :mod:`~landscape.models.mlp`: :class:`MLP` and bSAM's 784-500-300-10 network;
* :mod:`~landscape.models.lenet`: :class:`LeNet5` (classic) and :class:`LeNet5BSAM`;
* :mod:`~landscape.models.resnet`: CIFAR ResNets (option A/B shortcuts), ResNet-18/34;
* :mod:`~landscape.models.wide_resnet`: :class:`WideResNet` (WRN-d-k);
* :mod:`~landscape.models.preresnet`: :class:`PreResNet` (PreResNet-164, ...);
* :mod:`~landscape.models.norms`: batch / group / FRN / no normalisation;
* :mod:`~landscape.models.registry`: :func:`model_factory` by name.
"""

from __future__ import annotations

from landscape.models.layers import ACTIVATIONS
from landscape.models.lenet import LeNet5, LeNet5BSAM
from landscape.models.mlp import MLP, mlp_mnist
from landscape.models.norms import NORMS, FilterResponseNorm2d, group_count, make_norm
from landscape.models.preresnet import PreActBlock, PreActBottleneck, PreResNet
from landscape.models.registry import available_models, count_parameters, model_factory, register_model
from landscape.models.resnet import (
    BasicBlock,
    PadShortcut,
    ResNet,
    cifar_resnet,
    resnet_cifar_imagenet_layout,
)
from landscape.models.wide_resnet import WideBasic, WideResNet

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "NORMS",
    "BasicBlock",
    "FilterResponseNorm2d",
    "LeNet5",
    "LeNet5BSAM",
    "PadShortcut",
    "PreActBlock",
    "PreActBottleneck",
    "PreResNet",
    "ResNet",
    "WideBasic",
    "WideResNet",
    "available_models",
    "cifar_resnet",
    "count_parameters",
    "group_count",
    "make_norm",
    "mlp_mnist",
    "model_factory",
    "register_model",
    "resnet_cifar_imagenet_layout",
]
