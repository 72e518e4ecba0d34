"""Models to run on out of the box and a small training loop.

* ``zoo``: MLP, LeNet-5, a small ResNet, and the name registry (:func:`model_factory`);
* ``training``: :func:`train`, one closure-based loop for every optimizer of the suite.
"""

from landscape.models.training import train
from landscape.models.zoo import (
    MLP,
    BasicBlock,
    LeNet5,
    ResNet,
    available_models,
    model_factory,
    register_model,
)

__all__ = [
    "MLP",
    "BasicBlock",
    "LeNet5",
    "ResNet",
    "available_models",
    "model_factory",
    "register_model",
    "train",
]
