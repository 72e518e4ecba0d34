"""BatchNorm synchronised across data-parallel ranks, on every device and backend (gloo included).

``torch.nn.SyncBatchNorm`` refuses CPU tensors (it needs CUDA, XPU, HPU or a private-use device),
so ``distributed.sync_batchnorm = true`` replaces every BatchNorm layer by
:class:`SyncedBatchNorm`, which computes the statistics of the *global* batch with two
``all_reduce`` calls per layer (sums, then centred sums of squares) and differentiates through
them, so a data-parallel step equals the single-process step on the global batch (up to the order
of floating-point summation), running statistics included.

The gradient: rank ``r`` minimises its local mean loss ``L_r`` and the trainer all-reduces
``sum_r w_r grad L_r`` with ``w_r = n_r / n`` (:mod:`experiments.parallel`). The statistics
``S = sum_r s_r`` couple the ranks, and the gradient of ``sum_r w_r L_r`` with respect to ``s_r`` is
``sum_r' w_r' dL_r'/dS``; the backward of the reduction therefore returns
``(1 / w_r) sum_r' w_r' dL_r'/dS`` to rank ``r``, which the trainer's weighting by ``w_r`` turns into
the exact global gradient, also for shards of unequal size.

The layers synchronise only while :class:`BatchNormSync` is ``active`` (the trainer's training
steps); evaluation on rank 0 (eval mode, or SWAG's BatchNorm update) runs them as plain BatchNorm.
The parameters and buffers keep their names, so checkpoints load into the unconverted model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from experiments.parallel import DistContext

__all__ = ["BatchNormSync", "SyncedBatchNorm", "convert_batchnorm"]


@dataclass
class BatchNormSync:
    """Shared state of the synchronised layers: the process context, whether to synchronise now,
    and this rank's weight ``n_r / n`` in the current (sub-)batch."""

    ctx: DistContext
    active: bool = False
    weight: float = 1.0


class _WeightedAllReduce(torch.autograd.Function):
    """Forward: ``sum_r t_r``; backward: ``(1 / w_r) sum_r' w_r' g_r'`` (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, weight: float, dist_ctx: DistContext) -> torch.Tensor:
        ctx.weight, ctx.dist_ctx = weight, dist_ctx
        return dist_ctx.all_reduce_sum(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        total = ctx.dist_ctx.all_reduce_sum(grad * ctx.weight)
        if ctx.weight == 0:
            return torch.zeros_like(grad), None, None
        return total / ctx.weight, None, None


class SyncedBatchNorm(_BatchNorm):
    """BatchNorm over ``[N, C, *]`` inputs with global-batch statistics while ``sync.active``."""

    def __init__(self, num_features: int, sync: BatchNormSync, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        self.sync = sync

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"SyncedBatchNorm expects inputs [N, C, *], got shape {tuple(x.shape)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sync = self.sync
        if not (self.training and sync.active and sync.ctx.data_parallel):
            return super().forward(x)
        self._check_input_dim(x)
        c = x.shape[1]
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        count = x.new_full((1,), x.numel() // c if c else 0)
        total = _WeightedAllReduce.apply(torch.cat([x.sum(dims), count]), sync.weight, sync.ctx)
        n = float(total[-1])
        if n < 2:
            raise ValueError(f"SyncedBatchNorm: {n:g} value(s) per channel over all ranks; need at least 2")
        mean = total[:c] / n
        centred = x - mean.view(shape)
        var = _WeightedAllReduce.apply((centred * centred).sum(dims), sync.weight, sync.ctx) / n
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(var.detach() * (n / (n - 1)), alpha=factor)
        y = centred * torch.rsqrt(var.view(shape) + self.eps)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def convert_batchnorm(model: nn.Module, sync: BatchNormSync) -> int:
    """Replace every BatchNorm layer of ``model`` (in place) by a :class:`SyncedBatchNorm` holding the
    same parameter and buffer objects; returns the number of layers replaced."""
    count = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if isinstance(child, _BatchNorm) and not isinstance(child, (SyncedBatchNorm, nn.SyncBatchNorm)):
                new = SyncedBatchNorm(
                    child.num_features,
                    sync,
                    eps=child.eps,
                    momentum=child.momentum,
                    affine=child.affine,
                    track_running_stats=child.track_running_stats,
                    device="meta",
                )
                for attr in ("weight", "bias"):
                    setattr(new, attr, getattr(child, attr))
                for attr in ("running_mean", "running_var", "num_batches_tracked"):
                    new._buffers[attr] = child._buffers.get(attr)
                new.train(child.training)
                setattr(mod, name, new)
                count += 1
    return count
