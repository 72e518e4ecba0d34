"""Small models to run on out of the box (MLP, LeNet-5, a small ResNet with BatchNorm) and a name
registry (:func:`model_factory`, :func:`register_model`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "elu": nn.ELU,
    "silu": nn.SiLU,
}


def _activation(name: str | Callable[[], nn.Module]) -> nn.Module:
    if callable(name) and not isinstance(name, str):
        return name()
    if name not in _ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


class MLP(nn.Sequential):
    """``Flatten -> Linear -> act -> ... -> Linear`` with layer widths ``sizes`` (input first).

    An ``nn.Sequential`` whose first parametrised layer is a ``Linear`` applied to the (flattened)
    input: :func:`landscape.surface` exploits this on CPU (the first layer's output is linear in
    the grid coordinates).
    """

    def __init__(self, sizes: Sequence[int], activation: str = "tanh", bias: bool = True):
        sizes = list(sizes)
        if len(sizes) < 2 or any(not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"sizes must list at least two positive ints (input, ..., output), got {sizes}")
        _activation(activation)  # validate even when there is no hidden layer
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b, bias=bias))
            if i < len(sizes) - 2:
                layers.append(_activation(activation))
        super().__init__(*layers)
        self.sizes = sizes
        self.activation = activation


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling, for square images of any size >= 8.

    ``input_size=28`` (MNIST) or 32 (CIFAR) uses the classic 5x5 kernels (padding 2 for 28);
    small inputs (8x8 digits) use 3x3 kernels with padding 1, so both pooling stages fit.
    """

    def __init__(
        self, in_channels: int = 1, num_classes: int = 10, input_size: int = 28, activation: str = "relu"
    ):
        super().__init__()
        if input_size < 8:
            raise ValueError(f"input_size must be >= 8, got {input_size}")
        if input_size >= 28:
            k, p1, p2 = 5, (2 if input_size == 28 else 0), 0
        else:
            k, p1, p2 = 3, 1, 1
        s = input_size + 2 * p1 - k + 1
        s //= 2
        s = s + 2 * p2 - k + 1
        s //= 2
        if s < 1:
            raise ValueError(f"input_size {input_size} too small for LeNet5")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, k, padding=p1),
            _activation(activation),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, k, padding=p2),
            _activation(activation),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * s * s, 120),
            _activation(activation),
            nn.Linear(120, 84),
            _activation(activation),
            nn.Linear(84, num_classes),
        )
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class BasicBlock(nn.Module):
    """conv-BN-ReLU-conv-BN plus (projected) identity shortcut (He et al. 2016, Fig. 2)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A small CIFAR-style ResNet with BatchNorm: a 3x3 stem, stages of :class:`BasicBlock` with
    widths ``width * 2**stage`` (stride 2 between stages), global average pooling, a linear head.

    ``ResNet(blocks=(3, 3, 3), width=16)`` is ResNet-20 (He et al. 2016, Sec. 4.2); the default
    ``(1, 1, 1)`` with width 8 is a few-thousand-parameter network for quick surfaces.
    """

    def __init__(
        self, in_channels: int = 3, num_classes: int = 10, width: int = 8, blocks: Sequence[int] = (1, 1, 1)
    ):
        super().__init__()
        if width < 1 or not blocks or any(b < 1 for b in blocks):
            raise ValueError(
                f"width must be >= 1 and blocks a non-empty list of ints >= 1, got {width}, {blocks}"
            )
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        layers: list[nn.Module] = []
        cin = width
        for stage, n in enumerate(blocks):
            cout = width * 2**stage
            for b in range(n):
                layers.append(BasicBlock(cin, cout, stride=2 if (stage > 0 and b == 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


# --------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator registering a model constructor under ``name`` for :func:`model_factory`."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        _REGISTRY[name] = fn
        return fn

    return deco


register_model("mlp")(lambda sizes=(64, 128, 10), activation="tanh", **kw: MLP(sizes, activation, **kw))
register_model("lenet5")(LeNet5)
register_model("lenet5-digits")(lambda **kw: LeNet5(**{"in_channels": 1, "input_size": 8, **kw}))
register_model("resnet")(ResNet)
register_model("resnet20")(lambda **kw: ResNet(**{"blocks": (3, 3, 3), "width": 16, **kw}))


def available_models() -> list[str]:
    return sorted(_REGISTRY)


def model_factory(
    name: str, *, seed: int | None = None, dtype: torch.dtype | None = None, **kwargs
) -> nn.Module:
    """Build a registered model by name (``available_models()``), optionally seeded and cast.

    ``seed`` initialises the weights reproducibly without touching the global RNG state.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; registered: {available_models()}")
    if seed is None:
        model = _REGISTRY[name](**kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = _REGISTRY[name](**kwargs)
    return model.to(dtype) if dtype is not None else model
