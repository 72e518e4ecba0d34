"""Bottleneck ResNets for 224x224 ImageNet inputs (He, Zhang, Ren & Sun 2016, "Deep residual
learning for image recognition", CVPR, Table 1), in torchvision's layout (``resnet50/101/152``),
the ResNet-152 of the flat-BNN paper's Table 4 (its ImageNet code builds torchvision models):

* stem: 7x7 convolution stride 2 to 64 channels, norm, ReLU, 3x3 max-pool stride 2;
* four stages of bottleneck blocks conv1x1-norm-ReLU-conv3x3-norm-ReLU-conv1x1-norm, add, ReLU,
  widths 64-128-256-512 (x4 at the output), stride 2 into stages 2-4 **on the 3x3 convolution**
  (torchvision's "ResNet v1.5"; the paper strides the first 1x1), 1x1 projection (conv + norm)
  shortcuts where the shape changes;
* global average pooling and a linear head.

ResNet-152 (blocks 3, 8, 36, 3): **60,192,808** parameters for 1000 classes (torchvision's
count; the paper's 11.3 GFLOPs network). Differences from torchvision: ``dropout=p`` puts dropout
before the head; ``norm`` may replace BatchNorm; PyTorch's default initialisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm
from landscape.models.resnext import ResNeXtBlock

#: blocks per stage, He et al. 2016, Table 1
BOTTLENECK_LAYOUTS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
#: output width of a bottleneck block over its inner width
EXPANSION = 4


class ImageNetResNet(nn.Module):
    """Bottleneck ResNet with ``blocks`` per stage for ImageNet-size inputs; module docstring."""

    def __init__(
        self,
        blocks: Sequence[int] = (3, 8, 36, 3),
        num_classes: int = 1000,
        in_channels: int = 3,
        *,
        norm: str = "batch",
        dropout: float = 0.0,
    ):
        super().__init__()
        if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in blocks):
            raise ValueError(f"blocks must be a non-empty list of ints >= 1, got {blocks!r}")
        check_norm(norm)
        check_dropout(dropout)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False),
            make_norm(norm, 64),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        layers: list[nn.Module] = []
        cin = 64
        for stage, n in enumerate(blocks):
            planes = 64 * 2**stage
            for b in range(n):  # He et al.'s bottleneck: Xie et al.'s block with one group
                stride = 2 if (stage > 0 and b == 0) else 1
                layers.append(ResNeXtBlock(cin, planes, planes * EXPANSION, stride, 1, norm))
                cin = planes * EXPANSION
        self.layers = nn.Sequential(*layers)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1)
        return self.head(self.drop(torch.flatten(out, 1)))


def resnet_imagenet(depth: int = 152, num_classes: int = 1000, in_channels: int = 3, *, norm: str = "batch",
                    dropout: float = 0.0) -> ImageNetResNet:  # fmt: skip
    """ResNet-50/101/152 (torchvision layout) by depth."""
    if depth not in BOTTLENECK_LAYOUTS:
        raise ValueError(f"ImageNet ResNet depth must be one of {sorted(BOTTLENECK_LAYOUTS)}, got {depth!r}")
    return ImageNetResNet(BOTTLENECK_LAYOUTS[depth], num_classes, in_channels, norm=norm, dropout=dropout)
