"""Models to run on out of the box and a small training loop.

* ``zoo``: MLP, LeNet-5, CIFAR ResNets (20/32/44/56/110, 10/18/34), Wide ResNets, PreResNets,
  DenseNet-121, VGG-19-BN, ResNeXt-29, PyramidNet-272 + ShakeDrop (CIFAR), ResNet-152,
  DenseNet-161, ViT-B/16, DeiT-B (ImageNet size), with batch / group / FRN / no normalisation and a
  dropout option, and the name registry (:func:`model_factory`);
* ``training``: :func:`train`, one closure-based loop for every optimizer of the suite.
"""

from landscape.models.training import train
from landscape.models.zoo import (
    MLP,
    NORMS,
    BasicBlock,
    FilterResponseNorm2d,
    LeNet5,
    LeNet5BSAM,
    PreResNet,
    ResNet,
    WideResNet,
    available_models,
    cifar_resnet,
    count_parameters,
    model_factory,
    register_model,
)

__all__ = [
    "MLP",
    "NORMS",
    "BasicBlock",
    "FilterResponseNorm2d",
    "LeNet5",
    "LeNet5BSAM",
    "PreResNet",
    "ResNet",
    "WideResNet",
    "available_models",
    "cifar_resnet",
    "count_parameters",
    "model_factory",
    "register_model",
    "train",
]
