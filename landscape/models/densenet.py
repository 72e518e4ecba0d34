"""DenseNet-BC (Huang, Liu, van der Maaten & Weinberger 2017, "Densely connected convolutional
networks", CVPR): dense blocks of bottleneck layers norm-ReLU-conv1x1(4k)-norm-ReLU-conv3x3(k)
whose output (k = growth rate channels) is concatenated to their input; transitions
norm-ReLU-conv1x1 halving the channels (compression 0.5, floor), then 2x2 average pooling; a final
norm-ReLU, global average pooling and a linear head. Convolutions have no bias.

* ``densenet121`` (CIFAR, Fisher-SAM Table 1's DenseNet-121): growth 32, blocks (6, 12, 24, 16)
  and the CIFAR stem of kuangliu/pytorch-cifar (``models/densenet.py``, the usual CIFAR
  DenseNet-121 of the SAM-family papers): one 3x3 convolution to 2k = 64 channels, no norm or
  pooling, so the maps go 32 -> 16 -> 8 -> 4. **6,956,298** parameters for 10 classes, 7,048,548
  for 100.
* ``densenet161-imagenet`` (the flat-BNN paper's Table 4 DenseNet-161): torchvision's
  ``densenet161`` layout: growth 48, blocks (6, 12, 36, 24), the ImageNet stem 7x7 conv stride 2
  to 96 channels, norm, ReLU, 3x3 max-pool stride 2. **28,681,000** parameters for 1000 classes
  (torchvision's count).

Differences from the references: ``dropout=p`` puts dropout before the head (torchvision's
``drop_rate`` acts after every dense layer instead); ``norm`` may replace BatchNorm; weights keep
PyTorch's default initialisation (torchvision uses Kaiming-normal convolutions and zero biases).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm

STEMS = ("cifar", "imagenet")


class DenseLayer(nn.Module):
    """Bottleneck dense layer: ``cat([x, conv3x3(relu(norm(conv1x1(relu(norm(x))))))])``."""

    def __init__(self, cin: int, growth: int, bn_size: int, norm: str):
        super().__init__()
        self.layers = nn.Sequential(
            make_norm(norm, cin),
            nn.ReLU(),
            nn.Conv2d(cin, bn_size * growth, 1, bias=False),
            make_norm(norm, bn_size * growth),
            nn.ReLU(),
            nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, self.layers(x)], dim=1)


def _transition(cin: int, cout: int, norm: str) -> nn.Sequential:
    return nn.Sequential(
        make_norm(norm, cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.AvgPool2d(2)
    )


class DenseNet(nn.Module):
    """DenseNet-BC with growth rate ``growth`` and ``blocks`` layers per dense block.

    Args:
        stem: ``"cifar"`` (3x3 conv to ``init_features``) or ``"imagenet"`` (7x7 stride-2 conv,
            norm, ReLU, 3x3 stride-2 max-pool); see the module docstring.
        init_features: channels after the stem (``2 * growth`` when ``None``, as both references).
        bn_size: the bottleneck width factor (4 in the paper).
        compression: transition channel factor (0.5: DenseNet-BC).
    """

    def __init__(
        self,
        growth: int = 32,
        blocks: Sequence[int] = (6, 12, 24, 16),
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        stem: str = "cifar",
        init_features: int | None = None,
        bn_size: int = 4,
        compression: float = 0.5,
        norm: str = "batch",
        dropout: float = 0.0,
    ):
        super().__init__()
        if stem not in STEMS:
            raise ValueError(f"stem must be one of {STEMS}, got {stem!r}")
        if growth < 1 or bn_size < 1 or not blocks or any(b < 1 for b in blocks):
            raise ValueError(
                f"growth and bn_size must be >= 1 and blocks non-empty ints >= 1, got {growth}, "
                f"{bn_size}, {blocks}"
            )
        if not 0.0 < compression <= 1.0:
            raise ValueError(f"compression must be in (0, 1], got {compression}")
        check_norm(norm)
        check_dropout(dropout)
        c = 2 * growth if init_features is None else init_features
        if stem == "cifar":
            layers: list[nn.Module] = [nn.Conv2d(in_channels, c, 3, padding=1, bias=False)]
        else:
            layers = [
                nn.Conv2d(in_channels, c, 7, stride=2, padding=3, bias=False),
                make_norm(norm, c),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
        for i, n in enumerate(blocks):
            for _ in range(n):
                layers.append(DenseLayer(c, growth, bn_size, norm))
                c += growth
            if i < len(blocks) - 1:
                out = int(c * compression)
                layers.append(_transition(c, out, norm))
                c = out
        layers += [make_norm(norm, c), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.head(self.drop(torch.flatten(out, 1)))


def densenet121_cifar(num_classes: int = 10, in_channels: int = 3, *, norm: str = "batch",
                      dropout: float = 0.0) -> DenseNet:  # fmt: skip
    """DenseNet-BC-121 for 32x32 inputs (kuangliu/pytorch-cifar layout); module docstring."""
    return DenseNet(32, (6, 12, 24, 16), num_classes, in_channels, stem="cifar", norm=norm, dropout=dropout)


def densenet161_imagenet(num_classes: int = 1000, in_channels: int = 3, *, norm: str = "batch",
                         dropout: float = 0.0) -> DenseNet:  # fmt: skip
    """DenseNet-161 for 224x224 inputs (torchvision ``densenet161`` layout); module docstring."""
    return DenseNet(48, (6, 12, 36, 24), num_classes, in_channels, stem="imagenet", init_features=96,
                    norm=norm, dropout=dropout)  # fmt: skip
