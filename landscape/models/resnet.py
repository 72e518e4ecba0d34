"""Residual networks with post-activation basic blocks (He et al. 2016, "Deep residual learning
for image recognition"), CIFAR style: a 3x3 stem without max-pool, stages of
:class:`BasicBlock`, global average pooling, one linear layer.

* CIFAR ResNet-(6n+2) (He et al. 2016, Sec. 4.2): widths 16-32-64, n blocks per stage, **option A**
  shortcuts (identity; on a stride-2 / width-doubling block the input is subsampled by 2 and
  zero-padded in channels, no parameters). With BatchNorm (scale + shift) and a biased linear
  head, 10 classes: ResNet-20 **269,722**, ResNet-32 464,154, ResNet-56 **853,018** parameters
  (the paper's 0.27M / 0.46M / 0.85M). With option-B projection shortcuts (1x1 conv + BN) the
  two stage transitions add 16*32 + 64 + 32*64 + 128 = 2,752: 272,474 and 855,770.
* ResNet-18 / ResNet-34 in the CIFAR form common in SAM papers: 3x3 stem with 64 filters and no
  max-pool, stages 64-128-256-512 with (2, 2, 2, 2) / (3, 4, 6, 3) blocks and projection
  shortcuts: 11,173,962 / 21,282,122 parameters for 10 classes.
* ResNet-10 of the flat-seeking BNN paper (Nguyen et al. 2023, Table 3, beside ResNet-18): the
  same CIFAR layout with one basic block per stage, (1, 1, 1, 1): 4,903,242 parameters for 10
  classes, 4,949,412 for 100.
* ResNet-20-FRN of the bSAM code (Möllenhoff & Khan 2023, after Izmailov et al. 2021): biased
  convolutions, FRN + TLU after every convolution (projection shortcuts included) and no other
  activation: ``cifar_resnet(20, norm="frn", shortcut="B", bias=True, activation="identity")``,
  274,042 parameters.

Dropout (``dropout=p``): inside every block between the two convolutions (after the first
norm-activation, the placement of Zagoruyko & Komodakis 2016) and before the linear head, as in
the dropout networks used for MC-Dropout baselines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import activation as make_activation
from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm

SHORTCUTS = ("A", "B")


class PadShortcut(nn.Module):
    """Option-A shortcut (He et al. 2016, Sec. 3.3): subsample by ``stride`` and zero-pad the
    channels from ``cin`` to ``cout`` (split evenly before and after); no parameters."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        if cout < cin:
            raise ValueError(f"option-A shortcuts cannot reduce channels ({cin} -> {cout})")
        self.cin, self.cout, self.stride = cin, cout, stride
        self.front = (cout - cin) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        back = self.cout - self.cin - self.front
        return F.pad(x, (0, 0, 0, 0, self.front, back)) if (self.front or back) else x

    def extra_repr(self) -> str:
        return f"{self.cin} -> {self.cout}, stride={self.stride}"


class BasicBlock(nn.Module):
    """conv-norm-act-[dropout]-conv-norm plus shortcut, then act (He et al. 2016, Fig. 2).

    ``shortcut="B"`` projects with 1x1 conv + norm when the shape changes, ``"A"`` pads with zeros
    (:class:`PadShortcut`); identity otherwise.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        stride: int = 1,
        *,
        shortcut: str = "B",
        norm: str = "batch",
        dropout: float = 0.0,
        bias: bool = False,
        activation: str | Callable[[], nn.Module] = "relu",
    ):
        super().__init__()
        if shortcut not in SHORTCUTS:
            raise ValueError(
                f"shortcut must be 'A' (zero-padding identity) or 'B' (projection), got {shortcut!r}"
            )
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)
        self.bn1 = make_norm(norm, cout)
        self.act1 = make_activation(activation)
        self.drop = maybe_dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=bias)
        self.bn2 = make_norm(norm, cout)
        self.act2 = make_activation(activation)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            if shortcut == "A":
                self.shortcut = PadShortcut(cin, cout, stride)
            else:
                self.shortcut = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride=stride, bias=bias), make_norm(norm, cout)
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.drop(self.act1(self.bn1(self.conv1(x))))
        out = self.bn2(self.conv2(out))
        return self.act2(out + self.shortcut(x))


class ResNet(nn.Module):
    """A CIFAR-style ResNet: a 3x3 stem, stages of :class:`BasicBlock` with widths
    ``width * 2**stage`` (stride 2 between stages), global average pooling, a linear head.

    ``ResNet(blocks=(3, 3, 3), width=16, shortcut="A")`` is ResNet-20 (He et al. 2016, Sec. 4.2);
    the default ``(1, 1, 1)`` with width 8 is a few-thousand-parameter network for quick surfaces.

    Args:
        shortcut: ``"B"`` (default here, projection) or ``"A"`` (zero-padding identity).
        norm: ``"batch"`` (default), ``"group"``, ``"frn"`` or ``"none"`` after every convolution.
        dropout: see the module docstring (blocks and before the head).
        bias: biases in the convolutions (off with BatchNorm, as usual).
        activation: the block and stem nonlinearity (``"identity"`` when FRN's TLU is the only
            nonlinearity, as in bSAM's ResNet-20-FRN).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        width: int = 8,
        blocks: Sequence[int] = (1, 1, 1),
        *,
        shortcut: str = "B",
        norm: str = "batch",
        dropout: float = 0.0,
        bias: bool = False,
        activation: str | Callable[[], nn.Module] = "relu",
    ):
        super().__init__()
        if width < 1 or not blocks or any(b < 1 for b in blocks):
            raise ValueError(
                f"width must be >= 1 and blocks a non-empty list of ints >= 1, got {width}, {blocks}"
            )
        check_norm(norm)
        check_dropout(dropout)
        make_activation(activation)
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=bias),
            make_norm(norm, width),
            make_activation(activation),
        )
        layers: list[nn.Module] = []
        cin = width
        for stage, n in enumerate(blocks):
            cout = width * 2**stage
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                layers.append(
                    BasicBlock(
                        cin,
                        cout,
                        stride,
                        shortcut=shortcut,
                        norm=norm,
                        dropout=dropout,
                        bias=bias,
                        activation=activation,
                    )  # fmt: skip
                )
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        return self.head(self.drop(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)))


def cifar_resnet(
    depth: int = 20,
    num_classes: int = 10,
    in_channels: int = 3,
    *,
    shortcut: str = "A",
    norm: str = "batch",
    dropout: float = 0.0,
    bias: bool = False,
    activation: str | Callable[[], nn.Module] = "relu",
) -> ResNet:
    """He et al.'s CIFAR ResNet-``depth`` (``depth = 6n + 2``: 20, 32, 44, 56, 110), option-A
    shortcuts by default."""
    if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n + 2 (20, 32, 44, 56, 110, ...), got {depth!r}")
    n = (depth - 2) // 6
    return ResNet(in_channels, num_classes, 16, (n, n, n), shortcut=shortcut, norm=norm,
                  dropout=dropout, bias=bias, activation=activation)  # fmt: skip


_IMAGENET_STYLE = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


def resnet_cifar_imagenet_layout(
    depth: int = 18,
    num_classes: int = 10,
    in_channels: int = 3,
    *,
    norm: str = "batch",
    dropout: float = 0.0,
) -> ResNet:
    """ResNet-10 / ResNet-18 / ResNet-34 (He et al. 2016, Table 1 stage layout; ResNet-10 has one
    block per stage) adapted to 32x32 inputs: a 3x3 stem with 64 filters, no max-pool, projection
    shortcuts."""
    if depth not in _IMAGENET_STYLE:
        raise ValueError(f"depth must be one of {sorted(_IMAGENET_STYLE)}, got {depth!r}")
    return ResNet(in_channels, num_classes, 64, _IMAGENET_STYLE[depth], shortcut="B", norm=norm,
                  dropout=dropout)  # fmt: skip
