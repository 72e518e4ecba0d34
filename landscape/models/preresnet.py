"""Pre-activation ResNets (He et al. 2016b, "Identity mappings in deep residual networks", ECCV),
CIFAR layout: a 3x3 stem with 16 filters, three stages (16, 32, 64 base widths, stride 2 into
stages 2 and 3), a final norm-act, global average pooling, a linear head; convolutions without
bias, 1x1 projection shortcuts (no norm) where the shape changes.

* depth >= 44: bottleneck blocks norm-act-conv1x1-norm-act-conv3x3-norm-act-conv1x1 with
  expansion 4 and ``n = (depth - 2) / 9`` blocks per stage; PreResNet-164 (n = 18) has
  **1,703,258** parameters for 10 classes with BatchNorm (the paper's 1.7M), 1,726,388 for 100;
* smaller depths: basic blocks norm-act-conv3x3-norm-act-conv3x3, ``n = (depth - 2) / 6``.

This is the network of the SWAG / flat-seeking BNN CIFAR experiments (PreResNet-164).

Dropout (``dropout=p``): before every convolution of a block (after its norm-activation) and
before the linear head, the placement of the SWAG code's PreResNet dropout networks used for
MC-Dropout baselines.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import activation as make_activation
from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm


class PreActBlock(nn.Module):
    """Pre-activation basic block (expansion 1)."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, *, norm: str = "batch",
                 dropout: float = 0.0, activation: str = "relu"):  # fmt: skip
        super().__init__()
        self.bn1, self.act1, self.drop1 = (
            make_norm(norm, cin),
            make_activation(activation),
            maybe_dropout(dropout),
        )
        self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2, self.act2, self.drop2 = (
            make_norm(norm, planes),
            make_activation(activation),
            maybe_dropout(dropout),
        )
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, planes, 1, stride=stride, bias=False) if (stride != 1 or cin != planes) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.drop1(self.act1(self.bn1(x))))
        out = self.conv2(self.drop2(self.act2(self.bn2(out))))
        return out + (self.shortcut(x) if self.shortcut is not None else x)


class PreActBottleneck(nn.Module):
    """Pre-activation bottleneck block (expansion 4)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, *, norm: str = "batch",
                 dropout: float = 0.0, activation: str = "relu"):  # fmt: skip
        super().__init__()
        cout = planes * self.expansion
        self.bn1, self.act1, self.drop1 = (
            make_norm(norm, cin),
            make_activation(activation),
            maybe_dropout(dropout),
        )
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn2, self.act2, self.drop2 = (
            make_norm(norm, planes),
            make_activation(activation),
            maybe_dropout(dropout),
        )
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn3, self.act3, self.drop3 = (
            make_norm(norm, planes),
            make_activation(activation),
            maybe_dropout(dropout),
        )
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if (stride != 1 or cin != cout) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(self.drop1(self.act1(self.bn1(x))))
        out = self.conv2(self.drop2(self.act2(self.bn2(out))))
        out = self.conv3(self.drop3(self.act3(self.bn3(out))))
        return out + (self.shortcut(x) if self.shortcut is not None else x)


class PreResNet(nn.Module):
    """PreResNet-``depth`` for CIFAR; see the module docstring."""

    def __init__(
        self,
        depth: int = 164,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        norm: str = "batch",
        dropout: float = 0.0,
        activation: str = "relu",
    ):
        super().__init__()
        check_norm(norm)
        check_dropout(dropout)
        if isinstance(depth, int) and depth >= 44 and (depth - 2) % 9 == 0:
            block, n = PreActBottleneck, (depth - 2) // 9
        elif isinstance(depth, int) and 8 <= depth < 44 and (depth - 2) % 6 == 0:
            block, n = PreActBlock, (depth - 2) // 6
        else:
            raise ValueError(
                f"PreResNet depth must be 9n + 2 >= 47 (bottleneck: 56, 110, 164, ...) or 6n + 2 < 44 "
                f"(basic: 8, 14, 20, 26, 32, 38), got {depth!r}"
            )
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        cin = 16
        for stage, planes in enumerate((16, 32, 64)):
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                blocks.append(block(cin, planes, stride, norm=norm, dropout=dropout, activation=activation))
                cin = planes * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.bn = make_norm(norm, cin)
        self.act = make_activation(activation)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)
        self.depth = depth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn(self.blocks(self.conv1(x))))
        return self.head(self.drop(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)))
