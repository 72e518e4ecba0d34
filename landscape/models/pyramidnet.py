"""Additive PyramidNets (Han, Kim & Kim 2017, "Deep pyramidal residual networks", CVPR) for
CIFAR, with optional ShakeDrop (:mod:`~landscape.models.shakedrop`): the PyramidNet-272
(alpha = 200, bottleneck) + ShakeDrop of SAM (Foret et al. 2021, Table 1) and Fisher-SAM (Kim et
al. 2022, Table 1).

Layout, following the authors' PyTorch code (github.com/dyhan0920/PyramidNet-PyTorch,
``PyramidNet.py``): a 3x3 stem with 16 filters and a norm (no activation); three stages of
``n = (depth - 2) / 9`` bottleneck blocks (``(depth - 2) / 6`` basic blocks) whose width grows by
``alpha / (3 n)`` per block, rounded with Python's ``round`` (stride 2 into stages 2 and 3); a final
norm-ReLU, global average pooling and a linear head. The bottleneck block is
norm-conv1x1-norm-ReLU-conv3x3-norm-ReLU-conv1x1-norm (expansion 4, no ReLU after the first norm
nor after the addition), the basic block norm-conv3x3-norm-ReLU-conv3x3-norm. The shortcut has no
parameters: 2x2 average pooling where the block strides, then zero channels appended to the
branch's width.

PyramidNet-272, alpha = 200: **26,210,842** parameters for 10 classes, 26,288,692 for 100. Han et
al. 2017's table gives 26.0M: the convolution and linear weights alone (25,999,978), without the
210,864 BatchNorm scales and shifts; their other bottleneck PyramidNets agree the same way
(PyramidNet-200, alpha 240: 26.6M; PyramidNet-236, alpha 220: 26.8M).

Differences from the reference: global average pooling instead of the fixed 8x8 pool (identical on
32x32 inputs; other sizes work); ``dropout=p`` adds dropout before the head (the reference has none);
``norm`` may replace BatchNorm. ShakeDrop (``shakedrop=True``, default) multiplies each block's
branch before the addition with survival probability ``p_l = 1 - (l / L) 0.5`` (Yamada et al. 2019,
Sec. 4.1); ``shakedrop=False`` gives the plain PyramidNet; in eval mode the branch is scaled by
``p_l`` (deterministic).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm
from landscape.models.shakedrop import ShakeDrop, linear_decay_survival


class PyramidBottleneck(nn.Module):
    """Pyramidal bottleneck block (Han et al. 2017, Fig. 6(d)); see the module docstring."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, *, norm: str, survival: float | None):
        super().__init__()
        cout = planes * self.expansion
        self.branch = nn.Sequential(
            make_norm(norm, cin),
            nn.Conv2d(cin, planes, 1, bias=False),
            make_norm(norm, planes),
            nn.ReLU(),
            nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False),
            make_norm(norm, planes),
            nn.ReLU(),
            nn.Conv2d(planes, cout, 1, bias=False),
            make_norm(norm, cout),
        )
        self.shakedrop = ShakeDrop(survival) if survival is not None else nn.Identity()
        self.stride, self.cin, self.cout = stride, cin, cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shakedrop(self.branch(x))
        return out + _pad_shortcut(x, self.stride, self.cout)


class PyramidBasic(nn.Module):
    """Pyramidal basic block (Han et al. 2017, Fig. 6(b)); see the module docstring."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, *, norm: str, survival: float | None):
        super().__init__()
        self.branch = nn.Sequential(
            make_norm(norm, cin),
            nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False),
            make_norm(norm, planes),
            nn.ReLU(),
            nn.Conv2d(planes, planes, 3, padding=1, bias=False),
            make_norm(norm, planes),
        )
        self.shakedrop = ShakeDrop(survival) if survival is not None else nn.Identity()
        self.stride, self.cin, self.cout = stride, cin, planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shakedrop(self.branch(x))
        return out + _pad_shortcut(x, self.stride, self.cout)


def _pad_shortcut(x: torch.Tensor, stride: int, cout: int) -> torch.Tensor:
    """Average-pool by ``stride`` and append zero channels up to ``cout`` (Han et al. 2017, Sec.
    3.2: zero-padded identity shortcuts)."""
    if stride != 1:
        x = F.avg_pool2d(x, stride, stride)
    extra = cout - x.shape[1]
    return F.pad(x, (0, 0, 0, 0, 0, extra)) if extra else x


class PyramidNet(nn.Module):
    """Additive PyramidNet-``depth`` with widening factor ``alpha``; see the module docstring.

    Args:
        depth: ``9n + 2`` with ``bottleneck=True`` (164, 200, 272, ...), ``6n + 2`` otherwise.
        alpha: total width increase over the network (200 for PyramidNet-272).
        shakedrop: multiply each branch by ShakeDrop noise (Yamada et al. 2019).
        shakedrop_final: the last block's survival probability ``p_L`` (0.5 in the paper).
    """

    def __init__(
        self,
        depth: int = 272,
        alpha: float = 200,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        bottleneck: bool = True,
        shakedrop: bool = True,
        shakedrop_final: float = 0.5,
        norm: str = "batch",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_norm(norm)
        check_dropout(dropout)
        per = 9 if bottleneck else 6
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < per + 2 or (depth - 2) % per:
            kind = "bottleneck: 9n + 2 (164, 200, 272)" if bottleneck else "basic: 6n + 2 (110, ...)"
            raise ValueError(f"PyramidNet depth must be {kind}, got {depth!r}")
        if not alpha > 0:
            raise ValueError(f"PyramidNet alpha (widening factor) must be positive, got {alpha!r}")
        n = (depth - 2) // per
        block = PyramidBottleneck if bottleneck else PyramidBasic
        survival = linear_decay_survival(3 * n, shakedrop_final) if shakedrop else [None] * (3 * n)
        add = alpha / (3 * n)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), make_norm(norm, 16))
        blocks: list[nn.Module] = []
        width, cin = 16.0, 16
        for i in range(3 * n):
            width += add
            stride = 2 if (i > 0 and i % n == 0) else 1
            planes = int(round(width))
            blocks.append(block(cin, planes, stride, norm=norm, survival=survival[i]))
            cin = planes * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.final = nn.Sequential(make_norm(norm, cin), nn.ReLU())
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)
        self.depth, self.alpha = depth, alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.final(self.blocks(self.stem(x)))
        return self.head(self.drop(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)))
