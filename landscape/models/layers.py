"""Activations by name and the dropout option shared by the model zoo."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "elu": nn.ELU,
    "silu": nn.SiLU,
    "identity": nn.Identity,
}


def activation(name: str | Callable[[], nn.Module]) -> nn.Module:
    """A fresh activation module from a name of :data:`ACTIVATIONS` or a zero-argument factory."""
    if callable(name) and not isinstance(name, str):
        return name()
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]()


def check_dropout(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"dropout must be a probability in [0, 1), got {p!r}")
    return float(p)


def dropout_layers(p: float) -> list[nn.Module]:
    """``[nn.Dropout(p)]`` when ``p > 0``, else ``[]`` (models without dropout hold no dropout
    module, so MC-Dropout helpers do not mistake them for dropout networks)."""
    return [nn.Dropout(check_dropout(p))] if p > 0 else []


def maybe_dropout(p: float) -> nn.Module:
    """``nn.Dropout(p)`` when ``p > 0``, else ``nn.Identity()``."""
    layers = dropout_layers(p)
    return layers[0] if layers else nn.Identity()
