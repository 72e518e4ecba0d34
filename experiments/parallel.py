"""Several processes (``torchrun``): split the grid of runs, or train one run data-parallel.

``distributed.mode = "grid"`` (default): rank ``r`` of ``W`` runs the runs ``r, r + W, ...`` of the
grid (variants x methods x seeds, in a fixed order); no process group is needed.

``distributed.mode = "data_parallel"``: every rank trains the same run on its contiguous slice
(``torch.tensor_split``) of each global batch, which all ranks draw identically (same data-order
and augmentation generators). After each backward pass the closure replaces every gradient by the
batch-size-weighted sum over the ranks, ``g = sum_r (n_r / n) g_r`` (one ``all_reduce``), which is
the gradient of the global batch's mean loss, so each optimizer step equals the single-process step
on the global batch up to the order of floating-point summation. For the SAM family (two passes):

* ``perturbation = "global"`` (default): both passes are all-reduced, so the perturbation uses the
  global-batch gradient: single-process SAM on the global batch;
* ``perturbation = "local"``: the pass at ``w`` is *not* all-reduced, so each rank perturbs with
  its own gradient (m-sharpness across devices, Foret et al. 2021, Sec. 4.1, with ``m`` = number of
  ranks); the descent gradients at the ranks' perturbed points are all-reduced. With equal slices
  this is single-process SAM with ``m = W``.

BatchNorm: by default (``distributed.sync_batchnorm = false``) each rank normalises with the
statistics of its own slice and keeps its own running statistics (rank 0's are checkpointed), so a
model with BatchNorm does not train exactly as one process on the global batch would. With
``sync_batchnorm = true`` every BatchNorm layer uses the statistics of the global batch
(:mod:`experiments.sync_batchnorm`, on CPU/gloo as well as CUDA/NCCL; ``torch.nn.SyncBatchNorm``
supports no CPU tensors), which makes the step equal the single-process one again; it cannot be
combined with ``perturbation = "local"`` (per-device perturbations need per-device statistics).
Rank 0 writes checkpoints and results.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DistContext", "from_environment"]


@dataclass
class DistContext:
    """Where this process stands: ``rank`` of ``world``, the mode and the perturbation option."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    mode: str = "grid"
    perturbation: str = "global"
    initialized_here: bool = False

    @property
    def data_parallel(self) -> bool:
        return self.mode == "data_parallel" and self.world > 1

    @property
    def is_main(self) -> bool:
        """Writes files: rank 0 in data-parallel mode, every rank (its own runs) in grid mode."""
        return self.rank == 0 or not self.data_parallel

    def my_runs(self, runs: list[Any]) -> list[Any]:
        return runs if self.data_parallel or self.world == 1 else runs[self.rank :: self.world]

    def shard(self, n: int) -> tuple[int, int]:
        """``(start, stop)`` of this rank's slice of a global batch of ``n`` examples."""
        if not self.data_parallel:
            return 0, n
        bounds = torch.tensor_split(torch.arange(n), self.world)[self.rank]
        return (int(bounds[0]), int(bounds[-1]) + 1) if len(bounds) else (0, 0)

    def _comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.cpu() if dist.get_backend() == "gloo" and t.device.type != "cpu" else t

    @torch.no_grad()
    def reduce_grads(self, params: list[torch.Tensor], weight: float) -> None:
        """``p.grad <- sum_r weight_r p.grad_r`` over the ranks (one flat ``all_reduce``)."""
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).mul_(weight)
        buf = self._comm(flat)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        flat = buf.to(flat.device)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    @torch.no_grad()
    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """``sum_r t_r`` over the ranks, as a new tensor on ``t``'s device (``t`` is unchanged)."""
        buf = self._comm(t.detach().clone())
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        return buf.to(t.device)

    @torch.no_grad()
    def reduce_value(self, value: torch.Tensor, weight: float) -> torch.Tensor:
        buf = self._comm(value.detach().reshape(1).to(torch.float64) * weight)
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        return buf.reshape(()).to(value.device, value.dtype)

    def barrier(self) -> None:
        if self.data_parallel:
            dist.barrier()

    def close(self) -> None:
        if self.initialized_here and dist.is_initialized():
            try:
                dist.barrier()  # no rank tears gloo down while another still talks to it
            finally:
                dist.destroy_process_group()
                self.initialized_here = False


def from_environment(dist_cfg: dict[str, Any], device: torch.device) -> DistContext:
    """Read ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (set by ``torchrun``); in data-parallel mode
    with several ranks, initialise the process group (gloo on CPU, nccl on CUDA unless set)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    ctx = DistContext(rank, world, local, dist_cfg["mode"], dist_cfg["perturbation"])
    if ctx.data_parallel and not dist.is_initialized():
        backend = dist_cfg["backend"]
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend)
        ctx.initialized_here = True
    return ctx
