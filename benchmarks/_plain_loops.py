"""The two hand-written baselines of ``bench_training.py``: a minimal PyTorch training loop (the
floor) and a one-file two-pass SAM step (the anchor of the SAM rows), in plain PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["PlainLoop", "minimal_sgd_step", "one_file_sam_step"]


def one_file_sam_step(
    model: nn.Module, base: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, rho: float = 0.05
) -> torch.Tensor:
    """One SAM step (Foret et al. 2021, Alg. 1): ``g = grad L(w)``, ``e = rho g / (||g|| + 1e-12)``,
    the gradient at ``w + e``, ``w`` restored, then ``base.step()`` at ``w``; BatchNorm running
    statistics are those of the first pass. ``torch._foreach_*`` as in ``torch.optim``. Returns the
    loss at ``w``."""
    params = [p for p in model.parameters() if p.requires_grad]
    stats = [b for m in model.modules() if isinstance(m, _BatchNorm) for b in m.buffers()]
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params)
    with torch.no_grad():
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        eps = torch._foreach_mul(grads, rho / (norm + 1e-12))
        saved, saved_stats = [p.clone() for p in params], [b.clone() for b in stats]
        torch._foreach_add_(params, eps)
    base.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        torch._foreach_copy_(params, saved)
        if stats:
            torch._foreach_copy_(stats, saved_stats)
    base.step()
    return loss.detach()


def minimal_sgd_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()


class PlainLoop:
    """The minimal loop: per epoch ``randperm`` on the device, full batches of the on-device data,
    the runner's augmentation function, ``step(x, y)``; nothing read back, logged or saved."""

    def __init__(self, x, y, batch_size: int, augment: Callable[[torch.Tensor], torch.Tensor] | None, step):
        self.x, self.y, self.bs, self.augment, self.step = x, y, batch_size, augment, step
        self.steps_per_epoch = len(y) // batch_size

    def epoch(self) -> None:
        perm = torch.randperm(len(self.y), device=self.x.device)
        for b in range(self.steps_per_epoch):
            idx = perm[b * self.bs : (b + 1) * self.bs]
            x = self.x[idx]
            self.step(self.augment(x) if self.augment is not None else x, self.y[idx])
