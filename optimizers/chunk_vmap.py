"""The ``vmap`` engine of :mod:`optimizers.m_sharpness`: any model, one ``vmap`` per pass.

The ``m`` sub-batches are stacked ``[m, b, ...]`` and the model runs once under ``vmap`` over
``torch.func.functional_call``, the parameters shared (``in_dims=None``: a stride-0 expansion) or
per chunk (``[m, ...]``); one ``autograd.grad`` of the summed losses gives the ``m`` gradients
(chunk ``k``'s loss depends on slice ``k`` only).

BatchNorm in train mode: each chunk is normalised with its own statistics (``vmap`` gives exactly
that). Running statistics are reproduced as the loop leaves them (one EMA update per chunk, in chunk
order, from the pass at ``w`` only): the vmapped pass runs with per-chunk scratch buffers and
``momentum=None`` on a fresh ``num_batches_tracked = 0``, so each scratch buffer receives exactly the
chunk's statistics ``s_k``; the ``m`` updates ``r <- (1 - f) r + f s_k`` (``f = momentum``, or
``1 / num_batches_tracked`` for cumulative averages) are then applied in order. Any other buffer
that the forward pass mutates cannot be reproduced: :func:`VmapChunks.grads` names it and the
optimizer falls back to the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["VmapChunks", "bn_with_stats"]


def bn_with_stats(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """BatchNorm layers that update running statistics in the next forward pass."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, _BatchNorm)
        and mod.training
        and mod.track_running_stats
        and mod.running_mean is not None
    ]


def _prefix(name: str, buf: str) -> str:
    return f"{name}.{buf}" if name else buf


class VmapChunks:
    """Per-chunk losses and gradients of ``model`` on the stacked sub-batches ``xs [m, b, ...]``;
    ``names``: the parameters differentiated (the others are constants)."""

    def __init__(self, model: nn.Module, names: list[str], xs: torch.Tensor) -> None:
        self.model, self.xs, self.m = model, xs, xs.shape[0]
        diff = set(names)
        self.const = {n: p.detach() for n, p in model.named_parameters() if n not in diff}
        self.bn = bn_with_stats(model)
        stats = {
            _prefix(n, b) for n, _ in self.bn for b in ("running_mean", "running_var", "num_batches_tracked")
        }
        self.other = {n: b for n, b in model.named_buffers() if n not in stats}

    def grads(
        self, params: dict[str, torch.Tensor], stacked: bool, loss_fn: Any, ys: Any, losses: Callable
    ) -> tuple[
        dict[str, torch.Tensor], torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]
    ]:
        """``(grads [m, ...] by name, losses [m], {bn name: (mean [m, C], var [m, C])}, mutated)``;
        ``mutated``: buffers (not BatchNorm statistics) the pass changed (then the loop must run).
        ``losses(outputs, outputs_and_losses)``: the m losses (``optimizers.m_sharpness.chunk_losses``)."""
        m, model = self.m, self.model
        scratch: dict[str, torch.Tensor] = {}
        counters: dict[str, torch.Tensor] = {}
        for name, mod in self.bn:
            for b in ("running_mean", "running_var"):
                buf = getattr(mod, b)
                scratch[_prefix(name, b)] = torch.zeros((m, *buf.shape), dtype=buf.dtype, device=buf.device)
            counters[_prefix(name, "num_batches_tracked")] = torch.zeros_like(mod.num_batches_tracked)
        other = {n: b.clone() for n, b in self.other.items()}
        versions = {n: b._version for n, b in other.items()}
        fixed = {**self.const, **counters, **other}  # unbatched: captured, not mapped

        def forward(batched, x):  # batched: the parameters and the BatchNorm scratch buffers
            out = functional_call(model, {**batched, **fixed}, (x,))
            return out, {n: batched[n] for n in scratch}  # scratch now holds the chunk's statistics

        def forward_loss(batched, x, y):  # the chunk's loss too: one vmapped loss call, not m
            out, stats = forward(batched, x)
            return loss_fn(out, y), stats

        # one leaf [m, ...] per parameter (shared weights: a stride-0 expansion, no copy)
        leaves = [(t if stacked else t.expand(m, *t.shape)).requires_grad_() for t in params.values()]
        momenta = [mod.momentum for _, mod in self.bn]
        try:
            for _, mod in self.bn:
                mod.momentum = None  # factor 1 / num_batches_tracked = 1: scratch <- chunk statistics
            batched = {**dict(zip(params, leaves)), **scratch}
            values, stats = losses(
                lambda: vmap(forward)(batched, self.xs), lambda: vmap(forward_loss)(batched, self.xs, ys)
            )
            grads = torch.autograd.grad(values.sum(), leaves)
        finally:
            for (_, mod), mu in zip(self.bn, momenta):
                mod.momentum = mu
        mutated = [n for n, b in other.items() if b._version != versions[n]]
        bn_stats = {
            name: (stats[_prefix(name, "running_mean")], stats[_prefix(name, "running_var")])
            for name, _ in self.bn
        }
        return dict(zip(params, grads)), values.detach(), bn_stats, mutated

    @torch.no_grad()
    def apply_bn_updates(self, bn_stats: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The ``m`` running-statistics updates of the loop, chunk by chunk, from per-chunk stats."""
        for name, mod in self.bn:
            means, vars_ = bn_stats[name]
            for k in range(self.m):
                mod.num_batches_tracked.add_(1)
                f = 1.0 / float(mod.num_batches_tracked) if mod.momentum is None else mod.momentum
                mod.running_mean.copy_(means[k] * f + mod.running_mean * (1.0 - f))
                mod.running_var.copy_(vars_[k] * f + mod.running_var * (1.0 - f))
