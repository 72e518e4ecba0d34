"""A tiny training loop that drives every optimizer of the suite through a closure."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

# -------------------------------------------------------------------------------------- training


def _as_batches(data, batch_size: int | None, gen: torch.Generator):
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], torch.Tensor):
        x, y = data
        n = len(x)
        bs = n if batch_size is None else batch_size
        perm = torch.randperm(n, generator=gen) if bs < n else torch.arange(n)
        return [(x[perm[i : i + bs]], y[perm[i : i + bs]]) for i in range(0, n, bs)]
    if batch_size is not None:
        raise ValueError("batch_size applies only when data is an (inputs, targets) pair of tensors")
    return data


def train(
    model: nn.Module,
    data: Any,
    optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | torch.optim.Optimizer,
    epochs: int = 1,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    batch_size: int | None = None,
    callback: Callable[[int, nn.Module, float], Any] | None = None,
    seed: int = 0,
    progress: bool = False,
    device: str | torch.device | None = None,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, list[float]]:
    """Train ``model`` in place with any optimizer of the suite through a closure.

    Every step calls ``optimizer.step(closure)`` with ``closure() = zero_grad; forward; backward;
    return loss``, the contract shared by SGD/Adam and the SAM-family and Bayesian optimizers
    (which call the closure more than once per step).

    Args:
        data: an ``(inputs, targets)`` pair of tensors (shuffled into ``batch_size`` batches each
            epoch with a generator seeded by ``seed``; one full batch when ``batch_size`` is None)
            or any re-iterable of batches (list, DataLoader).
        optimizer_factory: ``params -> Optimizer`` (e.g. ``lambda p: torch.optim.SGD(p, lr=0.1)``)
            or an already constructed optimizer.
        loss_fn: defaults to cross-entropy.
        callback: ``callback(step, model, loss)`` after every step (e.g. a
            :class:`landscape.surface.trajectory.TrajectoryRecorder`); ``step`` counts from 1.
        device: move the batches there (the model is expected to live there already).
        transform: applied to each batch's inputs once per step, before the closure (e.g.
            :class:`landscape.data.transforms.RandomCropFlip`), so every closure evaluation of a
            step (SAM's two passes) sees the same augmented batch.

    Returns:
        ``{"loss": per-step losses, "epoch_loss": mean loss per epoch}``. The model's train/eval
        mode is restored at the end.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative int, got {epochs!r}")
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    if isinstance(optimizer_factory, torch.optim.Optimizer):
        opt = optimizer_factory
    elif callable(optimizer_factory):
        opt = optimizer_factory(model.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer_factory must return a torch.optim.Optimizer, got {type(opt).__name__}"
            )
    else:
        raise TypeError("optimizer_factory must be a callable params -> Optimizer or an Optimizer")
    gen = torch.Generator().manual_seed(seed)
    was_training = model.training
    history: dict[str, list[float]] = {"loss": [], "epoch_loss": []}
    step = 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=epochs, desc="train", unit="epoch")
    try:
        model.train()
        for _ in range(epochs):
            total, count = 0.0, 0
            for x, y in _as_batches(data, batch_size, gen):
                if device is not None:
                    x, y = x.to(device), y.to(device)
                if transform is not None:
                    x = transform(x)

                def closure(x=x, y=y):
                    opt.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    return loss

                loss = opt.step(closure)
                if loss is None:  # optimizers that do not return the closure's value
                    with torch.no_grad():
                        loss = loss_fn(model(x), y)
                value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
                if not math.isfinite(value):
                    raise FloatingPointError(f"training diverged at step {step + 1}: loss {value}")
                step += 1
                history["loss"].append(value)
                total += value * len(y)
                count += len(y)
                if callback is not None:
                    callback(step, model, value)
            history["epoch_loss"].append(total / max(count, 1))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{history['epoch_loss'][-1]:.4g}")
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    return history
