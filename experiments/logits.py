"""The C-1-output likelihood: a network with ``C - 1`` outputs whose last class's logit is fixed at 0.

bSAM (Möllenhoff & Khan 2023, App. G.1): "Our neural network outputs the natural parameters of the
categorical distribution as a minimal exponential family (number of classes minus one output
neurons)" -- the 784-500-300-9 MLP of their Table 6. The categorical distribution is then
``softmax([f(x), 0])``: class ``c < C - 1`` has probability ``exp(f_c) / (1 + sum_j exp(f_j))`` and
the last class ``1 / (1 + sum_j exp(f_j))``.

``model.logits = "c-1"`` makes the runner call :func:`append_zero_logit` once on the built model:
a forward hook appends the zero column to every output, so training, evaluation, the Bayesian
methods (weight samples, MC-Dropout, ensembles) and the sharpness measures all see ``C`` logits
through the model's own ``__call__`` (``torch.func.functional_call`` and ``torch.compile`` run
module hooks too). A hook rather than a wrapper module: the parameters keep their names and the
state dict stays the network's own (no ``inner.`` prefix), so checkpoints, initial weights
(``model.checkpoint``) and run directories load into the plain network unchanged. The per-chunk
MLP gradient engine (:mod:`optimizers.chunk_direct`) sees the hook and leaves such a model to the
``vmap`` engine.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["append_zero_logit", "has_zero_logit", "zero_logit_hook"]


def zero_logit_hook(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    """``[f(x), 0]``: ``output`` (``[..., C - 1]``) with a column of zeros appended (a forward hook)."""
    return torch.cat([output, output.new_zeros((*output.shape[:-1], 1))], dim=-1)


def has_zero_logit(model: nn.Module) -> bool:
    """Whether :func:`append_zero_logit` was applied to ``model``."""
    return any(h is zero_logit_hook for h in model._forward_hooks.values())


def append_zero_logit(model: nn.Module) -> nn.Module:
    """Make ``model``'s ``C - 1`` outputs the logits ``[f(x), 0]`` of ``C`` classes (in place; once:
    a second call changes nothing). Returns ``model``."""
    if not has_zero_logit(model):
        model.register_forward_hook(zero_logit_hook)
    return model
