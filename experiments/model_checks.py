"""The model against the data, before any training step: one forward pass of a copy of the model
built on the ``meta`` device (no memory, no arithmetic) on a batch of two examples of the training
data's shape.

A model whose first layer does not take the data's examples (an MLP with ``sizes = [32, ...]`` on
the 64 pixels of digits, a ResNet for 3 channels on grey images) or that has fewer outputs than the
data has classes would otherwise fail in the middle of the first epoch with torch's matmul shape
error or ``IndexError: Target 9 is out of bounds``. :func:`check_model_data` raises
:class:`experiments.config.ConfigError` naming the model, both sizes and the ``model.kwargs`` key
to change instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from experiments.config import ConfigError
from landscape.models import model_factory

__all__ = ["check_model_data", "data_classes"]


def data_classes(data: Any) -> int:
    """The number of classes of the data: the largest (clean) training or test label plus one, of the
    whole splits where the run's data knows it (``split_classes``; a subset may lack the largest
    labels)."""
    labels = [t for t in (getattr(data, "y_train_clean", None), data.y_train, data.y_test) if t is not None]
    seen = int(max(int(t.max()) for t in labels if t.numel())) + 1
    return max(seen, int(getattr(data, "split_classes", 0) or 0))


def _first_layer(model: nn.Module) -> nn.Module | None:
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)):
            return m
    return None


def _where(cfg: dict[str, Any]) -> str:
    m = cfg["model"]
    kw = f" with model.kwargs {m['kwargs']}" if m["kwargs"] else ""
    return f"model {m['name']!r}{kw}"


def _input_fix(cfg: dict[str, Any], layer: nn.Module | None, shape: tuple[int, ...]) -> str:
    """How to make the model take examples of ``shape``."""
    kw, name = cfg["model"]["kwargs"], cfg["model"]["name"]
    features = math.prod(shape)
    sizes = kw.get("sizes")
    if isinstance(sizes, list) and sizes:
        return f"set model.kwargs.sizes = {[features, *sizes[1:]]} (the first entry is the input size)"
    if name == "mlp":
        return f"set model.kwargs.sizes = [{features}, 128, 10] (input size first, number of classes last)"
    if isinstance(layer, nn.modules.conv._ConvNd) and len(shape) >= 2:
        side = f" and model.kwargs.input_size = {shape[-1]}" if "input_size" in kw or "lenet" in name else ""
        return f"set model.kwargs.in_channels = {shape[0]}{side}"
    if len(shape) >= 3:
        return f"set model.kwargs.in_channels = {shape[0]} and model.kwargs.input_size = {shape[-1]}"
    return (
        "choose a model for these examples (mlp with model.kwargs.sizes = "
        f'[{features}, ...]) or the image form of the data (e.g. data.name = "digits-image")'
    )


def _forward(cfg: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """The model's output for two examples of ``shape`` (on ``meta``; on the CPU where an operation
    has no meta kernel); ``dtype``: integer inputs (token ids) keep theirs, floating ones the default."""
    name, kwargs = cfg["model"]["name"], cfg["model"]["kwargs"]
    try:
        model = model_factory(name, device="meta", **kwargs).eval()
        with torch.no_grad():
            return model(torch.zeros((2, *shape), device="meta", dtype=dtype))
    except (NotImplementedError, RuntimeError):  # no meta kernel, or a real mismatch: ask the CPU
        model = model_factory(name, seed=0, **kwargs).eval()
        with torch.no_grad():
            return model(torch.zeros((2, *shape), dtype=dtype))


def check_model_data(cfg: dict[str, Any], data: Any) -> None:
    """Run the configured model once on a batch shaped like ``data.x_train`` (on ``meta``) and
    compare its output size with the data's number of classes.

    Raises:
        ConfigError: the model does not take the examples (naming its first layer's input size and
            the examples' shape) or has fewer outputs than the data has classes; each message names
            the ``model.kwargs`` to set.
    """
    shape = tuple(int(s) for s in data.x_train.shape[1:])
    spec = f"data.name {cfg['data']['name']!r}"
    try:
        out = _forward(cfg, shape, None if data.x_train.is_floating_point() else data.x_train.dtype)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        layer = _first_layer(model_factory(cfg["model"]["name"], device="meta", **cfg["model"]["kwargs"]))
        example = f"an example of {spec} has shape {list(shape)} ({math.prod(shape)} values)"
        if isinstance(layer, nn.Linear) and layer.in_features != math.prod(shape):
            what = f"takes inputs of {layer.in_features} features (its first nn.Linear), but {example}"
        elif isinstance(layer, nn.modules.conv._ConvNd) and len(shape) < 2:
            what = f"takes images (channels, height, width) (its first layer is a convolution), but {example}"
        elif isinstance(layer, nn.modules.conv._ConvNd) and layer.in_channels != shape[0]:
            what = f"takes images of in_channels = {layer.in_channels} (its first convolution), but {example}"
        else:
            what = f"cannot take the examples: {example}"
        torch_msg = " ".join(str(exc).split())[:300]
        raise ConfigError(
            f"{_where(cfg)} {what}; {_input_fix(cfg, layer, shape)} (torch: {torch_msg})"
        ) from None
    if out.ndim != 2:
        return  # not a classifier's (batch, classes) output: nothing to compare
    outputs, classes = int(out.shape[-1]), data_classes(data)
    if cfg["model"].get("logits", "c") == "c-1":  # the zero logit is appended: C - 1 outputs wanted
        if outputs != classes - 1:
            kw = cfg["model"]["kwargs"]
            sizes = kw.get("sizes")
            if isinstance(sizes, list) and sizes:
                fix = f"set model.kwargs.sizes = {[*sizes[:-1], classes - 1]} (the last entry: outputs)"
            else:
                fix = f"set model.kwargs.num_classes = {classes - 1}"
            raise ConfigError(
                f'{_where(cfg)} has {outputs} outputs, but model.logits = "c-1" needs C - 1 = '
                f"{classes - 1} for the {classes} classes of {spec} (the last class's logit is fixed "
                f'at 0); {fix}, or use model.logits = "c"'
            )
        return
    if outputs < classes:
        kw = cfg["model"]["kwargs"]
        sizes = kw.get("sizes")
        if isinstance(sizes, list) and sizes:
            fix = f"set model.kwargs.sizes = {[*sizes[:-1], classes]} (the last entry is the output size)"
        else:
            fix = f"set model.kwargs.num_classes = {classes}"
        raise ConfigError(
            f"{_where(cfg)} has {outputs} outputs, but {spec} has {classes} classes (labels 0 to "
            f"{classes - 1}); {fix}"
        )
