"""VGG networks with batch normalisation for 32x32 inputs (Simonyan & Zisserman 2015, "Very deep
convolutional networks for large-scale image recognition", ICLR; configuration E = VGG-19), in the
CIFAR form of kuangliu/pytorch-cifar (``models/vgg.py``), the VGG-19-BN of Fisher-SAM Table 1:

* 16 3x3 convolutions (biased, as in the reference) each followed by norm and ReLU, widths
  64, 64 | 128, 128 | 256 x4 | 512 x4 | 512 x4, a 2x2 max-pool after each group (32 -> 1);
* one linear layer 512 -> C (the ImageNet VGG's three-layer 4096-wide classifier is dropped).

VGG-19-BN: **20,040,522** parameters for 10 classes, 20,086,692 for 100.

Differences from the reference: the final 1x1 map is averaged globally (the same on 32x32 inputs;
other sizes work); ``dropout=p`` puts dropout before the head; ``norm`` may replace BatchNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from landscape.models.layers import check_dropout, maybe_dropout
from landscape.models.norms import check_norm, make_norm

#: channel plans (``"M"`` = 2x2 max-pool), Simonyan & Zisserman 2015, Table 1, columns A, B, D, E
VGG_PLANS: dict[int, tuple[int | str, ...]] = {
    11: (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    13: (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"),
    16: (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    19: (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512,
         "M"),
}  # fmt: skip


class VGG(nn.Module):
    """CIFAR VGG-``depth`` (11, 13, 16, 19) with a norm after every convolution; module docstring."""

    def __init__(
        self,
        depth: int = 19,
        num_classes: int = 10,
        in_channels: int = 3,
        *,
        norm: str = "batch",
        dropout: float = 0.0,
    ):
        super().__init__()
        if depth not in VGG_PLANS:
            raise ValueError(f"VGG depth must be one of {sorted(VGG_PLANS)}, got {depth!r}")
        check_norm(norm)
        check_dropout(dropout)
        layers: list[nn.Module] = []
        c = in_channels
        for item in VGG_PLANS[depth]:
            if item == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, int(item), 3, padding=1), make_norm(norm, int(item)), nn.ReLU()]
                c = int(item)
        self.features = nn.Sequential(*layers)
        self.drop = maybe_dropout(dropout)
        self.head = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1)
        return self.head(self.drop(out))
