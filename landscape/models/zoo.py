"""The model zoo in one import: every architecture, the normalisation layers and the registry.

* :mod:`~landscape.models.mlp`: :class:`MLP` and bSAM's 784-500-300-10 network;
* :mod:`~landscape.models.lenet`: :class:`LeNet5` (classic) and :class:`LeNet5BSAM`;
* :mod:`~landscape.models.resnet`: CIFAR ResNets (option A/B shortcuts), ResNet-10/18/34;
* :mod:`~landscape.models.wide_resnet`: :class:`WideResNet` (WRN-d-k);
* :mod:`~landscape.models.preresnet`: :class:`PreResNet` (PreResNet-164, ...);
* :mod:`~landscape.models.densenet`: :class:`DenseNet` (DenseNet-BC-121 for CIFAR,
  ``densenet121``; DenseNet-161 for ImageNet, ``densenet161-imagenet``);
* :mod:`~landscape.models.vgg`: :class:`VGG` (CIFAR VGG-19-BN, ``vgg19-bn``);
* :mod:`~landscape.models.resnext`: :class:`ResNeXt` (ResNeXt-29 32x4d, ``resnext29-32x4d``);
* :mod:`~landscape.models.pyramidnet`: :class:`PyramidNet` (PyramidNet-272, alpha 200,
  ``pyramidnet272``) with :mod:`~landscape.models.shakedrop`'s :class:`ShakeDrop`;
* :mod:`~landscape.models.resnet_imagenet`: :class:`ImageNetResNet` (ResNet-152,
  ``resnet152-imagenet``);
* :mod:`~landscape.models.vit`: :class:`VisionTransformer` (ViT-B/16 ``vit-b16``, DeiT-B
  ``deit-b``);
* :mod:`~landscape.models.norms`: batch / group / FRN / no normalisation;
* :mod:`~landscape.models.registry`: :func:`model_factory` by name.
"""

from __future__ import annotations

from landscape.models.densenet import DenseNet
from landscape.models.layers import ACTIVATIONS
from landscape.models.lenet import LeNet5, LeNet5BSAM
from landscape.models.mlp import MLP, mlp_mnist
from landscape.models.norms import NORMS, FilterResponseNorm2d, group_count, make_norm
from landscape.models.preresnet import PreActBlock, PreActBottleneck, PreResNet
from landscape.models.pyramidnet import PyramidNet
from landscape.models.registry import available_models, count_parameters, model_factory, register_model
from landscape.models.resnet import (
    BasicBlock,
    PadShortcut,
    ResNet,
    cifar_resnet,
    resnet_cifar_imagenet_layout,
)
from landscape.models.resnet_imagenet import ImageNetResNet
from landscape.models.resnext import ResNeXt
from landscape.models.shakedrop import ShakeDrop
from landscape.models.vgg import VGG
from landscape.models.vit import VisionTransformer
from landscape.models.wide_resnet import WideBasic, WideResNet

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "NORMS",
    "VGG",
    "BasicBlock",
    "DenseNet",
    "FilterResponseNorm2d",
    "ImageNetResNet",
    "LeNet5",
    "LeNet5BSAM",
    "PadShortcut",
    "PreActBlock",
    "PreActBottleneck",
    "PreResNet",
    "PyramidNet",
    "ResNeXt",
    "ResNet",
    "ShakeDrop",
    "VisionTransformer",
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
