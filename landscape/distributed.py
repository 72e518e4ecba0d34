"""Data-parallel curvature under ``torch.distributed`` (launch with ``torchrun``).

Every rank holds a shard of the data; a :class:`DistributedObjective` weights its local batches
with the *global* number of examples ``N = sum_r N_r`` (one ``all_reduce`` of the counts at
construction), and sums losses, gradients, evaluation counts and every operator matvec over the
ranks with ``all_reduce(SUM)``.  Because the whole-dataset loss is the sum
``L = sum_r sum_{b in rank r} w_b l_b`` with ``w_b = |B_b| / N`` (or ``1`` for a sum-reduced loss),
the distributed Hessian/GGN/empirical Fisher are exactly the single-process ones (up to the order
of floating-point summation).  The Monte-Carlo Fisher draws its labels on each rank from a
generator seeded with ``seed + 1000003 * rank``.

Example (``torchrun --nproc_per_node=2 script.py``)::

    import torch.distributed as dist, landscape as ls
    from landscape.distributed import DistributedObjective, shard
    dist.init_process_group("gloo")          # "nccl" on GPUs
    obj = DistributedObjective(model, loss_fn, shard((x, y)))
    H = ls.hessian(obj)                        # every matvec is summed over the ranks
    top = ls.eigenvalues(H, k=5)               # identical on every rank

All ranks must make the same sequence of calls (collectives), as with any ``torch.distributed`` code.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from landscape.inputs import _is_single_batch, _map_inputs
from landscape.objective import Objective

__all__ = ["DistributedObjective", "shard", "all_reduce_sum"]


def _rank_world(rank: int | None, world_size: int | None, group: Any = None) -> tuple[int, int]:
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "shard: torch.distributed is not initialised; call dist.init_process_group(...) first "
                "(torchrun sets the environment) or pass rank= and world_size= explicitly"
            )
        rank = dist.get_rank(group) if rank is None else rank
        world_size = dist.get_world_size(group) if world_size is None else world_size
    if not (0 <= rank < world_size):
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def shard(data: Any, rank: int | None = None, world_size: int | None = None, *, group: Any = None) -> Any:
    """This rank's part of ``data``.

    * one ``(inputs, targets)`` batch: the ``rank``-th of ``world_size`` contiguous, near-equal slices
      (``torch.tensor_split`` along the batch dimension; dict/tuple inputs are split alike);
    * a ``torch.utils.data.Dataset``: a ``Subset`` with the ``rank``-th contiguous block of indices;
    * a list/tuple of batches: batches ``rank, rank + world_size, ...``.

    ``rank``/``world_size`` default to those of the initialised process group.
    """
    rank, world_size = _rank_world(rank, world_size, group)
    if _is_single_batch(data):
        inputs, targets = data
        n = int(targets.shape[0])
        bounds = torch.tensor_split(torch.arange(n), world_size)[rank]
        lo, hi = (int(bounds[0]), int(bounds[-1]) + 1) if len(bounds) else (0, 0)
        return _map_inputs(inputs, lambda t: t[lo:hi]), targets[lo:hi]
    if isinstance(data, torch.utils.data.Dataset) and not isinstance(data, (list, tuple)):
        idx = torch.tensor_split(torch.arange(len(data)), world_size)[rank].tolist()
        return torch.utils.data.Subset(data, idx)
    if isinstance(data, (list, tuple)):
        return list(data)[rank::world_size]
    raise TypeError(
        "shard: data must be one (inputs, targets) batch, a torch Dataset or a list of batches; "
        f"got {type(data).__name__} (for a DataLoader use a DistributedSampler instead)"
    )


def all_reduce_sum(t: torch.Tensor, group: Any = None) -> torch.Tensor:
    """A new tensor holding the sum of ``t`` over the ranks of ``group``."""
    out = t.detach().clone().contiguous()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


class DistributedObjective(Objective):
    """An :class:`Objective` whose ``data`` is this rank's shard; reductions span all ranks.

    ``num_examples`` is the global ``N`` (``local_num_examples`` this rank's); ``loss``,
    ``gradient``, ``evaluate`` and every curvature operator built on it (``ls.hessian(obj)`` ...)
    return the same global result on every rank.  Parameters must be identical on every rank (as
    after DDP's broadcast).  It overrides the Objective's public hooks only: ``all_reduce`` (the
    Objective sums its example count and every reduction with it), ``like`` and ``settings``
    (``subset``/``with_data`` build a DistributedObjective on the same group) and ``config``.
    """

    def __init__(self, model, loss_fn, data, *, group: Any = None, **kwargs: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "DistributedObjective needs an initialised process group: call "
                "torch.distributed.init_process_group(...) (e.g. under torchrun) first"
            )
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        super().__init__(model, loss_fn, data, **kwargs)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        backend = dist.get_backend(self.group)  # gloo sums on the CPU
        dev = self.device if backend != "gloo" or self.device.type == "cpu" else torch.device("cpu")
        return all_reduce_sum(t.to(dev), self.group).to(t.device)

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "group": self.group}

    def like(self, data: Any, params: Any) -> Objective:
        return DistributedObjective(self.model, self.loss_fn, data, **{**self.settings(), "params": params})

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg.update(world_size=self.world_size, local_num_examples=self.local_num_examples)
        return cfg
