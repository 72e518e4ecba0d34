"""ResNeXt for CIFAR (Xie, Girshick, Dollár, Tu & He 2017, "Aggregated residual transformations
for deep neural networks", CVPR, Sec. 5.2): ResNeXt-29 with cardinality C and bottleneck width d
("C x d d"), the ResNeXt-29-32x4d of Fisher-SAM Table 1.

Layout of the implementation ASAM (Kwon et al. 2021) trains and Fisher-SAM follows
(``homura.vision.models.cifar_resnet.resnext29_32x4d``): a 3x3 stem with 64 filters, norm, ReLU;
three stages of ``(depth - 2) / 9`` post-activation bottleneck blocks conv1x1-norm-ReLU-
grouped conv3x3 (C groups, stride 2 into stages 2 and 3)-norm-ReLU-conv1x1-norm, add, ReLU, with
inner width ``C * d * 2**stage`` and output width ``256 * 2**stage``; a 1x1 projection (conv +
norm) shortcut where the shape changes; global average pooling; a linear head. Convolutions have
no bias.

* ResNeXt-29 32x4d: **4,775,754** parameters for 10 classes, 4,868,004 for 100;
* the same code gives ResNeXt-29 8x64d 34,426,698 and 16x64d 68,155,210 parameters (10 classes);
  without the BatchNorm scales and shifts 34,369,226 and 68,054,730: Xie et al. 2017, Table 7's
  34.4M and 68.1M (their counts leave BatchNorm out, as Han et al.'s PyramidNet table).

kuangliu/pytorch-cifar's ``ResNeXt29_32x4d`` differs only in a 1x1 stem (1,536 parameters fewer:
4,774,218). Differences from the reference: ``dropout=p`` puts dropout before the head; ``norm``
may replace BatchNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm


class ResNeXtBlock(nn.Module):
    """Aggregated-transformation bottleneck (Xie et al. 2017, Fig. 3(c)); module docstring.  With
    ``cardinality=1`` it is He et al.'s post-activation bottleneck (stride on the 3x3 convolution),
    the block of :mod:`landscape.models.resnet_imagenet`."""

    def __init__(self, cin: int, inner: int, cout: int, stride: int, cardinality: int, norm: str):
        super().__init__()
        self.branch = nn.Sequential(
            nn.Conv2d(cin, inner, 1, bias=False),
            make_norm(norm, inner),
            nn.ReLU(),
            nn.Conv2d(inner, inner, 3, stride=stride, padding=1, groups=cardinality, bias=False),
            make_norm(norm, inner),
            nn.ReLU(),
            nn.Conv2d(inner, cout, 1, bias=False),
            make_norm(norm, cout),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), make_norm(norm, cout)
            )
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.branch(x) + self.shortcut(x))


class ResNeXt(nn.Module):
    """CIFAR ResNeXt-``depth`` (``9n + 2``) with ``cardinality`` groups of ``width`` channels."""

    def __init__(
        self,
        depth: int = 29,
        cardinality: int = 32,
        width: int = 4,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        norm: str = "batch",
        dropout: float = 0.0,
    ):
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 11 or (depth - 2) % 9:
            raise ValueError(f"ResNeXt depth must be 9n + 2 (29, ...), got {depth!r}")
        if cardinality < 1 or width < 1:
            raise ValueError(f"cardinality and width must be >= 1, got {cardinality}, {width}")
        check_norm(norm)
        check_dropout(dropout)
        n = (depth - 2) // 9
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), make_norm(norm, 64),
                                  nn.ReLU())  # fmt: skip
        blocks: list[nn.Module] = []
        cin = 64
        for stage in range(3):
            inner, cout = cardinality * width * 2**stage, 256 * 2**stage
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                blocks.append(ResNeXtBlock(cin, inner, cout, stride, cardinality, norm))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1)
        return self.head(self.drop(torch.flatten(out, 1)))
