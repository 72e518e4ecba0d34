"""LeNet-5 variants.

* :class:`LeNet5`: the classic LeNet-5 layout (LeCun et al. 1998) with ReLU and 2x2 max pooling:
  conv 5x5 (6) - pool - conv 5x5 (16) - pool - FC 120 - FC 84 - FC C. For a 1 x 32 x 32 input
  (or 1 x 28 x 28 with padding 2 in the first convolution, the usual MNIST adaptation) and 10
  classes it has 156 + 2,416 + 48,120 + 10,164 + 850 = **61,706** parameters (3 input channels:
  62,006).
* :class:`LeNet5BSAM`: the "LeNet-5" of the bSAM code (Möllenhoff & Khan 2023, Fashion-MNIST):
  three 5x5 "same" convolutions with 6, 16, 120 filters, each followed by ReLU and a 3x3 / stride 2
  max-pool, then FC 64 and the output layer. For 1 x 28 x 28 inputs: 156 + 2,416 + 48,120 +
  30,784 + 65 C parameters (82,126 with C = 10; 82,061 with the code's C - 1 = 9 outputs).
"""

from __future__ import annotations

import torch
from torch import nn

from landscape.models.layers import activation as make_activation
from landscape.models.layers import check_dropout, dropout_layers
from landscape.models.norms import check_norm, make_norm


def _conv_block(cin: int, cout: int, k: int, pad: int, norm: str, act: str) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, padding=pad)]
    if norm != "none":
        layers.append(make_norm(norm, cout))
    layers.append(make_activation(act))
    return layers


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) with ReLU and max pooling, for square images of any size >= 8.

    ``input_size=28`` (MNIST) or 32 (CIFAR) uses the classic 5x5 kernels (padding 2 for 28);
    small inputs (8x8 digits) use 3x3 kernels with padding 1, so both pooling stages fit.

    Args:
        norm: ``"none"`` (default), ``"batch"``, ``"group"`` or ``"frn"`` after each convolution.
        dropout: probability of the dropout after each hidden fully connected layer's activation
            (before the next ``Linear``, the MC-Dropout placement of Gal & Ghahramani 2016).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        input_size: int = 28,
        activation: str = "relu",
        *,
        norm: str = "none",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_norm(norm)
        check_dropout(dropout)
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
            *_conv_block(in_channels, 6, k, p1, norm, activation),
            nn.MaxPool2d(2),
            *_conv_block(6, 16, k, p2, norm, activation),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * s * s, 120),
            make_activation(activation),
            *dropout_layers(dropout),
            nn.Linear(120, 84),
            make_activation(activation),
            *dropout_layers(dropout),
            nn.Linear(84, num_classes),
        )
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class LeNet5BSAM(nn.Module):
    """The LeNet-5 of the bSAM code (see the module docstring), for square inputs >= 15 pixels.

    ``dropout`` acts after the FC-64 activation; ``norm`` after each convolution.
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        input_size: int = 28,
        activation: str = "relu",
        *,
        norm: str = "none",
        dropout: float = 0.0,
    ):
        super().__init__()
        check_norm(norm)
        check_dropout(dropout)
        s = input_size
        for _ in range(3):
            s = (s - 3) // 2 + 1
        if input_size < 15 or s < 1:
            raise ValueError(f"input_size must be >= 15 for three 3x3/2 poolings, got {input_size}")
        blocks: list[nn.Module] = []
        for cin, cout in ((in_channels, 6), (6, 16), (16, 120)):
            blocks += [*_conv_block(cin, cout, 5, 2, norm, activation), nn.MaxPool2d(3, 2)]
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(120 * s * s, 64),
            make_activation(activation),
            *dropout_layers(dropout),
            nn.Linear(64, num_classes),
        )
        self.input_size = input_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
