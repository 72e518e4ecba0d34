"""Multilayer perceptrons: :class:`MLP` and bSAM's MNIST network."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

from landscape.models.layers import activation as make_activation
from landscape.models.layers import check_dropout, dropout_layers
from landscape.models.norms import make_norm1d


class MLP(nn.Sequential):
    """``Flatten -> Linear -> [norm] -> act -> [dropout] -> ... -> Linear`` with layer widths
    ``sizes`` (input first).

    An ``nn.Sequential`` whose first parametrised layer is a ``Linear`` applied to the (flattened)
    input: :func:`landscape.surface` exploits this on CPU (the first layer's output is linear in
    the grid coordinates).

    Args:
        norm: ``"none"`` (default), ``"batch"`` or ``"group"`` after every hidden ``Linear``
            (``"frn"`` needs feature maps and is refused).
        dropout: probability of the dropout after every hidden activation (Srivastava et al.
            2014; the MC-Dropout placement of Gal & Ghahramani 2016); 0 adds no dropout module.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        activation: str | Callable[[], nn.Module] = "tanh",
        bias: bool = True,
        *,
        norm: str = "none",
        dropout: float = 0.0,
    ):
        sizes = list(sizes)
        if len(sizes) < 2 or any(not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"sizes must list at least two positive ints (input, ..., output), got {sizes}")
        make_activation(activation)  # validate even when there is no hidden layer
        check_dropout(dropout)
        if len(sizes) > 2:
            make_norm1d(norm, sizes[1])  # validate the norm name early
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b, bias=bias))
            if i < len(sizes) - 2:
                if norm != "none":
                    layers.append(make_norm1d(norm, b))
                layers.append(make_activation(activation))
                layers.extend(dropout_layers(dropout))
        super().__init__(*layers)
        self.sizes = sizes
        self.activation = activation
        self.norm, self.dropout = norm, float(dropout)


def mlp_mnist(
    num_classes: int = 10,
    in_channels: int = 1,
    input_size: int = 28,
    *,
    hidden: Sequence[int] = (500, 300),
    activation: str = "relu",
    norm: str = "none",
    dropout: float = 0.0,
) -> MLP:
    """bSAM's MNIST network (Möllenhoff & Khan 2023, App. on MNIST): a 784-500-300-C MLP with
    ReLU. With ``num_classes=10``: 784*500+500 + 500*300+300 + 300*10+10 = 545,810 parameters.

    (The paper's code uses ``C - 1 = 9`` outputs, the minimal parametrisation of a categorical
    likelihood, and ELU in its code: ``num_classes=9, activation="elu"`` gives that network,
    545,509 parameters.)
    """
    sizes = [in_channels * input_size * input_size, *hidden, num_classes]
    return MLP(sizes, activation, norm=norm, dropout=dropout)
