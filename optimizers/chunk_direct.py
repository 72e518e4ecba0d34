"""The ``m`` sub-batch gradients of a plain MLP without ``vmap``: one pass over the whole batch.

:func:`optimizers.m_sharpness.chunk_gradients` needs, for ``m`` equal sub-batches ``k``, either
the ``m`` gradients ``grad L_k`` (at shared weights ``w`` or at per-chunk weights ``w_k``) or their
sum.  For a network that is a chain of ``nn.Linear`` layers and parameter-free per-example modules
(activations, ``Flatten``, ...) no ``vmap`` is needed:

* the forward pass runs once over the ``m b`` rows: ``F.linear`` with shared weights, a ``baddbmm``
  over the ``[m, b, in]`` view with per-chunk weights ``[m, out, in]``;
* one backward pass gives ``delta = dL/dz`` at every linear layer's output ``z`` (autograd computes
  no weight gradient);
* the weight gradients are the layer's (input, delta) products: chunk by chunk
  ``dW_k = delta_k^T a_k`` (one ``bmm``; :func:`optimizers.layer_gradients.group_gradients`, the rule
  the per-example gradients of :mod:`optimizers.per_example` use with chunks of one example), or
  their sum ``delta^T a`` over all rows (one ``mm``; ``db`` likewise).  These are exactly the
  products autograd forms for ``nn.Linear`` in the loop.

On the benchmark's MLP (64-64-10, batch 256, m = 8, one CPU thread) a pass costs about 1.1x one
plain forward/backward, against 2.5x for the ``vmap`` pass (its ``functional_call`` and batching
overheads).  ``nn.Conv2d`` layers and spatial pooling are handled the same way (per-chunk weights as
one grouped convolution, see :mod:`optimizers.chunk_direct_conv`).  Besides ``nn.Sequential`` a
few model classes whose ``forward`` is known to be the chain of their children (:data:`CHAINS`,
e.g. LeNet-5) are planned.  Anything else -- other layers (normalisation, ...), a module subclass
that may override ``forward``, hooks, dropout in train mode -- is left to the ``vmap`` engine
(:func:`plan` and :func:`check_input` return why).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from optimizers.chunk_direct_conv import SPATIAL, conv_forward, conv_grads, conv_why_not, spatial_why_not
from optimizers.layer_gradients import group_gradients

__all__ = ["CHAINS", "DirectChunks", "check_input", "plan"]

_Layer = tuple[nn.Module, "str | None", "str | None"]  # a linear/conv layer, its weight's and bias's names
#: the layer, its input, its output, its input in the grouped layout of a per-chunk convolution
_Tap = tuple[_Layer, torch.Tensor, torch.Tensor, "torch.Tensor | None"]
_LAYERS = (nn.Linear, nn.Conv2d)

#: model classes (module, qualified name) whose ``forward`` is the chain of these children in this
#: order; a class is only taken for its exact self (no subclass, same ``forward``, same children)
CHAINS: dict[tuple[str, str], tuple[str, ...]] = {
    ("landscape.models.lenet", "LeNet5"): ("features", "classifier"),
    ("landscape.models.lenet", "LeNet5BSAM"): ("features", "classifier"),
}

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
_LEAVES = frozenset((*_LAYERS, nn.Flatten, *_PER_EXAMPLE, *SPATIAL))  # what plan() keeps
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
    if kind is nn.Conv2d:
        return conv_why_not(mod)
    if kind in SPATIAL:
        return spatial_why_not(mod)
    if kind is nn.Flatten:
        return None if mod.start_dim >= 1 else "Flatten over the batch dimension"
    if kind in _DROPOUT:
        return None if not mod.training else "dropout in train mode"
    if isinstance(mod, nn.Sequential) and kind.forward is nn.Sequential.forward:
        return None
    if _chain(mod) is not None:
        return None
    return f"{kind.__name__} (not a linear/conv layer or a known per-example module)"


def _chain(mod: nn.Module) -> list[nn.Module] | None:
    """The children of a :data:`CHAINS` model in call order (``None``: not such a model)."""
    kind = type(mod)
    names = CHAINS.get((kind.__module__, kind.__qualname__))
    if names is None or getattr(sys.modules.get(kind.__module__), kind.__qualname__, None) is not kind:
        return None
    fwd = vars(kind).get("forward")
    if fwd is None or set(fwd.__code__.co_names) != set(names) or tuple(mod._modules) != names:
        return None
    return [mod._modules[n] for n in names]


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
        elif type(mod) in _LEAVES:
            leaves.append(mod)
        elif type(mod) not in _DROPOUT:  # a CHAINS model
            stack.extend(reversed(_chain(mod)))
        # eval-mode dropout: the identity, skipped
    if not any(type(mod) in _LAYERS for mod in leaves):
        return None, "no linear layer or convolution"
    return leaves, ""


def check_input(leaves: list[nn.Module], x: torch.Tensor) -> str:
    """Why the planned chain cannot take the batch ``x`` chunk by chunk ("": it can): a convolution
    or pooling needs a batch of images ``[N, C, H, W]`` (a 3-d input would be one unbatched image)."""
    ndim = x.dim()
    for mod in leaves:
        if type(mod) is nn.Flatten:
            end = mod.end_dim % ndim
            if mod.start_dim >= ndim or end < mod.start_dim:
                return "Flatten dimensions out of range"
            ndim -= end - mod.start_dim
        elif (type(mod) is nn.Conv2d or type(mod) in SPATIAL) and ndim != 4:
            return f"{type(mod).__name__} on a {ndim}-d input"
    return ""


class DirectChunks:
    """Per-chunk losses and gradients of a :func:`plan`-able model (see the module docstring).

    ``names``: parameter id -> name of the tensors to differentiate (others are constants);
    ``x``: the ``m`` sub-batches concatenated ``[m b, ...]``.
    """

    def __init__(self, leaves: list[nn.Module], names: dict[int, str], m: int, x: torch.Tensor) -> None:
        self.m, self.x = m, x
        #: the call sequence: (0, module), (1, linear or conv layer), (2, in-place module)
        self.leaves: list[tuple[int, Any]] = []
        for mod in leaves:
            if type(mod) in _LAYERS:
                b = mod.bias
                entry = (mod, names.get(id(mod.weight)), names.get(id(b)) if b is not None else None)
                self.leaves.append((1, entry))
            elif getattr(mod, "inplace", False):  # on a copy: z of a layer must stay intact
                self.leaves.append((2, mod))
            else:
                self.leaves.append((0, mod))

    def forward(self, params: dict[str, torch.Tensor], stacked: bool) -> tuple[torch.Tensor, list[_Tap]]:
        """``(outputs [m b, ...], taps)``; ``taps``: (layer, its input, its output ``z``, the input in
        grouped layout or None) for every layer with a differentiated parameter, ``z`` part of the
        graph (requires grad)."""
        m, h = self.m, self.x
        taps = []
        for kind, item in self.leaves:
            if kind != 1:  # a per-example module (2: an in-place one)
                h = item(h.clone() if kind == 2 else h)
                continue
            mod, wn, bn = item
            w = params[wn] if wn is not None else mod.weight.detach()
            b = params[bn] if bn is not None else (None if mod.bias is None else mod.bias.detach())
            per_chunk = stacked and (wn is not None or bn is not None)  # per-chunk weights [m, ...]
            hg = None
            if type(mod) is nn.Conv2d:
                z, hg = conv_forward(mod, h, w, b, m, per_chunk)
            elif per_chunk:
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
                taps.append((item, h, z, hg))
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
        deltas = torch.autograd.grad(losses.sum(), [tap[2] for tap in taps])
        grads: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for ((mod, wn, bn), a, _, ag), d in zip(taps, deltas):
                if type(mod) is nn.Conv2d:
                    gw, gb = conv_grads(mod, a, ag, d, m, reduce, wn is not None, bn is not None)
                elif reduce:
                    d2 = d.reshape(-1, d.shape[-1])
                    gw = d2.t().mm(a.reshape(-1, a.shape[-1])) if wn is not None else None
                    gb = d2.sum(0) if bn is not None else None
                else:  # the per-group rule shared with the per-example gradients
                    want = tuple(n for n, k in (("weight", wn), ("bias", bn)) if k is not None)
                    per = group_gradients(mod, a, d, m, want)
                    gw, gb = per.get("weight"), per.get("bias")
                for name, g in ((wn, gw), (bn, gb)):
                    if name is not None:  # a tied parameter: the layers' contributions add up
                        grads[name] = grads[name] + g if name in grads else g
        return grads, losses.detach()
