"""The ``m`` sub-batch gradients of a plain MLP without ``vmap``: one pass over the whole batch.

:class:`optimizers.batched_chunks.ChunkVectoriser` needs, for ``m`` equal sub-batches ``k``, either
the ``m`` gradients ``grad L_k`` (at shared weights ``w`` or at per-chunk weights ``w_k``) or their
sum.  For a network that is a chain of ``nn.Linear`` layers and parameter-free per-example modules
(activations, ``Flatten``, ...) no ``vmap`` is needed:

* the forward pass runs once over the ``m b`` rows: ``F.linear`` with shared weights, a ``baddbmm``
  over the ``[m, b, in]`` view with per-chunk weights ``[m, out, in]``;
* one backward pass gives ``delta = dL/dz`` at every linear layer's output ``z`` (autograd computes
  no weight gradient);
* the weight gradients are the layer's (input, delta) products: chunk by chunk
  ``dW_k = delta_k^T a_k`` (one ``bmm``), or their sum ``delta^T a`` over all rows (one ``mm``;
  ``db`` likewise).  These are exactly the products autograd forms for ``nn.Linear`` in the loop.

On the benchmark's MLP (64-64-10, batch 256, m = 8, one CPU thread) a pass costs about 1.1x one
plain forward/backward, against 2.5x for the ``vmap`` pass (its ``functional_call`` and batching
overheads).  Anything else -- other layers (convolutions, normalisation), a module subclass that may
override ``forward``, hooks, dropout in train mode -- is left to the ``vmap`` engine
(:func:`plan` returns why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

__all__ = ["DirectChunks", "plan"]

_Layer = tuple[nn.Module, "str | None", "str | None"]  # a linear layer, its weight's and bias's names
_Tap = tuple[_Layer, torch.Tensor, torch.Tensor]  # the layer, its input, its output

#: parameter-free modules that act on every example (row) alone, whatever the batch size
_PER_EXAMPLE = frozenset(
    (
        nn.Identity,
        nn.Tanh,
        nn.ReLU,
        nn.ReLU6,
        nn.GELU,
        nn.Sigmoid,
        nn.Softplus,
        nn.ELU,
        nn.SiLU,
        nn.LeakyReLU,
        nn.Mish,
        nn.Hardtanh,
        nn.Hardswish,
        nn.Hardsigmoid,
        nn.SELU,
        nn.CELU,
        nn.Softsign,
        nn.Tanhshrink,
        nn.LogSigmoid,
    )
)
_DROPOUT = frozenset((nn.Dropout, nn.AlphaDropout, nn.FeatureAlphaDropout, nn.Dropout1d))
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def _why_not(mod: nn.Module) -> str | None:
    if any(getattr(mod, h, None) for h in _HOOKS):
        return f"{type(mod).__name__} has hooks"
    kind = type(mod)
    if kind is nn.Linear or kind in _PER_EXAMPLE:
        return None
    if kind is nn.Flatten:
        return None if mod.start_dim >= 1 else "Flatten over the batch dimension"
    if kind in _DROPOUT:
        return None if not mod.training else "dropout in train mode"
    if isinstance(mod, nn.Sequential) and kind.forward is nn.Sequential.forward:
        return None
    return f"{kind.__name__} (not a linear layer or a known per-example module)"


def plan(model: nn.Module) -> tuple[list[nn.Module] | None, str]:
    """``(leaf modules in call order, "")`` if ``model`` is such a chain, else ``(None, why)``."""
    if any(getattr(_module, h, None) for h in _GLOBAL_HOOKS):
        return None, "global module hooks"
    leaves: list[nn.Module] = []
    stack = [model]
    while stack:
        mod = stack.pop()
        why = _why_not(mod)
        if why is not None:
            return None, why
        if isinstance(mod, nn.Sequential):
            stack.extend(reversed(list(mod._modules.values())))
        elif type(mod) is nn.Linear or type(mod) is nn.Flatten or type(mod) in _PER_EXAMPLE:
            leaves.append(mod)
        # eval-mode dropout: the identity, skipped
    if not any(type(mod) is nn.Linear for mod in leaves):
        return None, "no linear layer"
    return leaves, ""


class DirectChunks:
    """Per-chunk losses and gradients of a :func:`plan`-able model (see the module docstring).

    ``names``: parameter id -> name of the tensors to differentiate (others are constants);
    ``x``: the ``m`` sub-batches concatenated ``[m b, ...]``.
    """

    def __init__(self, leaves: list[nn.Module], names: dict[int, str], m: int, x: torch.Tensor) -> None:
        self.m, self.x = m, x
        #: the call sequence: (0, module), (1, linear layer), (2, in-place module)
        self.leaves: list[tuple[int, Any]] = []
        for mod in leaves:
            if type(mod) is nn.Linear:
                b = mod.bias
                entry = (mod, names.get(id(mod.weight)), names.get(id(b)) if b is not None else None)
                self.leaves.append((1, entry))
            elif getattr(mod, "inplace", False):  # on a copy: z of a linear layer must stay intact
                self.leaves.append((2, mod))
            else:
                self.leaves.append((0, mod))

    def forward(self, params: dict[str, torch.Tensor], stacked: bool) -> tuple[torch.Tensor, list[_Tap]]:
        """``(outputs [m b, ...], taps)``; ``taps``: (layer, its input, its output ``z``) for every
        linear layer with a differentiated parameter, ``z`` part of the graph (requires grad)."""
        m, h = self.m, self.x
        taps = []
        for kind, item in self.leaves:
            if kind != 1:  # a per-example module (2: an in-place one)
                h = item(h.clone() if kind == 2 else h)
                continue
            mod, wn, bn = item
            w = params[wn] if wn is not None else mod.weight.detach()
            b = params[bn] if bn is not None else (None if mod.bias is None else mod.bias.detach())
            if stacked and (wn is not None or bn is not None):  # per-chunk weights [m, out, in]
                a3 = h.reshape(m, -1, h.shape[-1])
                wt = (w if w.dim() == 3 else w.expand(m, *w.shape)).transpose(1, 2)
                if b is None:
                    z = torch.bmm(a3, wt)
                else:
                    b3 = (b if b.dim() == 2 else b.expand(m, *b.shape)).unsqueeze(1)
                    z = torch.baddbmm(b3, a3, wt)
                z = z.reshape(*h.shape[:-1], z.shape[-1])
            else:
                z = F.linear(h, w, b)
            if wn is not None or bn is not None:
                if not z.requires_grad:
                    z.requires_grad_()
                taps.append((item, h, z))
            h = z
        return h, taps

    def grads(
        self,
        params: dict[str, torch.Tensor],
        stacked: bool,
        reduce: bool,
        losses_of: Callable[[torch.Tensor], torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``(grads by name, losses [m])``: the ``m`` gradients stacked ``[m, ...]``, or with
        ``reduce`` their sum; ``losses_of(outputs [m b, ...]) -> [m]``."""
        m = self.m
        outs, taps = self.forward(params, stacked)
        losses = losses_of(outs)
        deltas = torch.autograd.grad(losses.sum(), [z for _, _, z in taps])
        grads: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for ((_, wn, bn), a, _), d in zip(taps, deltas):
                if reduce:
                    d2 = d.reshape(-1, d.shape[-1])
                    gw = d2.t().mm(a.reshape(-1, a.shape[-1])) if wn is not None else None
                    gb = d2.sum(0) if bn is not None else None
                else:
                    d3 = d.reshape(m, -1, d.shape[-1])
                    a3 = a.reshape(m, -1, a.shape[-1])
                    gw = torch.bmm(d3.transpose(1, 2), a3) if wn is not None else None
                    gb = d3.sum(1) if bn is not None else None
                for name, g in ((wn, gw), (bn, gb)):
                    if name is not None:  # a tied parameter: the layers' contributions add up
                        grads[name] = grads[name] + g if name in grads else g
        return grads, losses.detach()
