"""Wide residual networks (Zagoruyko & Komodakis 2016, "Wide residual networks", BMVC).

WRN-d-k: a 3x3 stem with 16 filters, three stages of ``n = (d - 4) / 6`` pre-activation blocks
(norm-act-conv3x3-norm-act-[dropout]-conv3x3) with widths 16k, 32k, 64k (stride 2 into stages 2
and 3), a 1x1 projection shortcut (taken after the block's first norm-activation, as in the
authors' code) where the shape changes, a final norm-act, global average pooling and a linear
head. Convolutions have no bias. Parameter counts for 10 classes with BatchNorm:
WRN-16-4 2,748,890 (the paper's 2.7M), WRN-28-2 1,467,610, WRN-28-10 **36,479,194** (36.5M).

Dropout (``dropout=p``): between the two convolutions of every block (the paper's Sec. 2.4
placement) and before the linear head (as in the WRN-28-10 dropout network of the SWAG code
used for MC-Dropout baselines).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import activation as make_activation
from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm


class WideBasic(nn.Module):
    """Pre-activation wide block; see the module docstring."""

    def __init__(self, cin: int, cout: int, stride: int = 1, *, norm: str = "batch",
                 dropout: float = 0.0, activation: str = "relu"):  # fmt: skip
        super().__init__()
        self.bn1 = make_norm(norm, cin)
        self.act1 = make_activation(activation)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn2 = make_norm(norm, cout)
        self.act2 = make_activation(activation)
        self.drop = maybe_dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.shortcut = (
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if (stride != 1 or cin != cout) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o1 = self.act1(self.bn1(x))
        out = self.conv2(self.drop(self.act2(self.bn2(self.conv1(o1)))))
        return out + (self.shortcut(o1) if self.shortcut is not None else x)


class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` (``depth = 6n + 4``); see the module docstring."""

    def __init__(
        self,
        depth: int = 28,
        widen_factor: int = 10,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        norm: str = "batch",
        dropout: float = 0.0,
        activation: str = "relu",
    ):
        super().__init__()
        if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
            raise ValueError(f"WRN depth must be 6n + 4 (10, 16, 22, 28, 40, ...), got {depth!r}")
        if isinstance(widen_factor, bool) or not isinstance(widen_factor, int) or widen_factor < 1:
            raise ValueError(f"widen_factor must be a positive int, got {widen_factor!r}")
        check_norm(norm)
        check_dropout(dropout)
        n = (depth - 4) // 6
        widths = (16 * widen_factor, 32 * widen_factor, 64 * widen_factor)
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        cin = 16
        for stage, w in enumerate(widths):
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                blocks.append(WideBasic(cin, w, stride, norm=norm, dropout=dropout, activation=activation))
                cin = w
        self.blocks = nn.Sequential(*blocks)
        self.bn = make_norm(norm, cin)
        self.act = make_activation(activation)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)
        self.depth, self.widen_factor = depth, widen_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn(self.blocks(self.conv1(x))))
        return self.head(self.drop(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)))
