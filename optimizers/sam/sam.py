"""SAM (Foret et al. 2021) and adaptive SAM / ASAM (Kwon et al. 2021).

Both are :class:`optimizers.perturbation.PerturbationOptimizer` subclasses: two closure calls per step
(at ``w`` and at ``w + eps``), descent by any ``torch.optim`` base optimizer on the shared param
groups; BatchNorm handling (``model=``) and m-sharpness (``m=``, closure ``closure(chunk)``) as
documented in :mod:`optimizers.perturbation`.  Weight decay belongs to the base optimizer (applied at
``w``, not part of the ascent).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from optimizers.m_sharpness import chunk_norms, per_chunk
from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer

__all__ = ["SAM", "ASAM"]

_SCALE_RULES = ("weight_name", "dim>1", "all")


class SAM(PerturbationOptimizer):
    r"""Sharpness-aware minimisation (Foret et al. 2021, eq. 2 and Alg. 1).

    ``eps = rho * g / (||g||_2 + 1e-12)`` with ``g`` the gradient at ``w`` and the norm global over
    every parameter with a gradient (a per-group ``rho`` scales that group's part of ``eps``).
    The base optimizer then steps with ``grad L(w + eps)`` at ``w``.

    Args:
        params: parameters or param groups.
        base_optimizer: ``torch.optim`` class, e.g. ``torch.optim.SGD``.
        rho: neighbourhood radius; default 0.05 (Foret et al. 2021, CIFAR-10 setting).
        model: optional module; its BatchNorm running statistics are updated by the first pass only.
        m: sub-batches for m-sharpness; with ``m > 1`` the closure is called as ``closure(k)`` and
            must compute the loss of sub-batch ``k`` (see :mod:`optimizers.perturbation`).
        **base_kwargs: the base optimizer's keyword arguments (``lr``, ``momentum``, ...).

    ``self.last``: ``loss`` (at ``w``), ``loss_perturbed`` (at ``w + eps``), ``grad_norm`` (``||g||``),
    ``eps_norm`` (``||eps||``, equal to ``rho``).

    Example::

        opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
        def closure():
            opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); return loss
        loss = opt.step(closure)
    """

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.05,  # Foret et al. 2021, Sec. 3 (CIFAR-10)
        *,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, model=model, m=m, defaults={"rho": rho}, **base_kwargs)

    def _perturbation(self, pairs, grads):
        gnorm = chunk_norms(grads)  # [m] (0-d for one chunk)
        scale = 1.0 / (gnorm + NORM_GUARD)
        rhos = {group["rho"] for group, _ in pairs}
        if len(rhos) == 1:  # one rho (the usual case): one foreach product, ||eps_k|| = rho ||g_k|| scale_k
            factor = scale.mul_(rhos.pop())
            scales = factor if factor.dim() == 0 else [per_chunk(factor, g) for g in grads]
            eps = torch._foreach_mul(list(grads), scales) if grads else []
            return eps, {"grad_norm": gnorm, "eps_norm": gnorm * factor}
        eps = [g * per_chunk(group["rho"] * scale, g) for (group, _), g in zip(pairs, grads)]
        return eps, {"grad_norm": gnorm, "eps_norm": chunk_norms(eps)}


class ASAM(PerturbationOptimizer):
    r"""Adaptive SAM (Kwon et al. 2021, eq. 11 / Alg. 1).

    ``T_w = |w| + eta`` elementwise for the parameters that are scaled, ``T = 1`` for the others;
    ``eps = rho * T_w^2 g / (||T_w g||_2 + 1e-12)`` (norm global over all parameters with a
    gradient), so that ``||T_w^{-1} eps|| = rho``.

    Which parameters are scaled (``scale``):

    * ``"weight_name"`` (default): every parameter whose *name* contains ``"weight"`` -- linear and
      convolution kernels and the affine weights of BatchNorm / LayerNorm / GroupNorm layers --
      and no other (biases keep ``T = 1``).  This is the rule of the authors' code (SamsungLabs
      ASAM, ``asam.py``, ``ASAM.ascent_step``: ``if 'weight' in n``); the paper states ``T_w``
      elementwise for "weight parameters" without naming the tensors.  It needs the parameter
      names: pass ``model=`` (names from ``model.named_parameters()``, matched by identity) or
      ``model.named_parameters()`` as ``params``.  A parameter whose name is unknown falls back
      to the ``"dim>1"`` rule, with a ``UserWarning`` (for networks whose only 1-D parameters
      are biases the two rules agree).
    * ``"dim>1"``: by shape -- tensors with more than one dimension (no normalisation-layer
      weights); this package's earlier default.
    * ``"all"``: every parameter (biases too); ``scale_all=True`` is the same.
    * a callable ``scale(name, param) -> bool`` (``name`` is ``None`` when unknown).

    On a 4-6-3 MLP with a LayerNorm whose weights lie in [0.1, 2] the ``"weight_name"`` and
    ``"dim>1"`` perturbations differ by 18.9 % in relative norm (0.34 % at the initial weights 1).

    Args:
        rho: default 0.5 (Kwon et al. 2021, CIFAR-10; 1.0 for CIFAR-100).
        eta: default 0.01 (the ``ASAM`` class default of the authors' code; their example
            script's ``--eta`` defaults to 0).
        scale: which parameters are scaled (above).
        scale_all: ``True`` is ``scale="all"`` (kept for compatibility).
        model: module (BatchNorm handling as :class:`SAM`) and the source of parameter names.
        (other arguments as :class:`SAM`.)

    ``self.last``: ``loss``, ``loss_perturbed``, ``grad_norm`` (``||g||``), ``scaled_grad_norm``
    (``||T g||``), ``eps_norm`` (``||eps||``), ``eps_scaled_norm`` (``||T^{-1} eps|| = rho``).
    ``self.scaled_names()`` lists the names (or shapes) of the scaled parameters.
    """

    _nonnegative_hparams = ("lr", "rho", "eta")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.5,  # Kwon et al. 2021, CIFAR-10 setting
        eta: float = 0.01,  # authors' code, ASAM class default
        *,
        scale: str | Callable[[str | None, torch.Tensor], bool] = "weight_name",
        scale_all: bool = False,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        if not callable(scale) and scale not in _SCALE_RULES:
            raise ValueError(
                f"scale must be one of {', '.join(repr(s) for s in _SCALE_RULES)} or a callable "
                f"(name, param) -> bool, got {scale!r}"
            )
        if scale_all:
            if scale not in ("weight_name", "all"):
                raise ValueError(f"scale_all=True contradicts scale={scale!r}; pass only one of them")
            scale = "all"
        super().__init__(
            params, base_optimizer, model=model, m=m, defaults={"rho": rho, "eta": eta}, **base_kwargs
        )
        self.scale = scale
        self._names: dict[torch.Tensor, str] = {}
        if model is not None:
            self._names.update({p: n for n, p in model.named_parameters()})
        for g in self.param_groups:
            for n, p in zip(g.get("param_names", ()), g["params"]):
                self._names.setdefault(p, n)
        self._scaled: dict[torch.Tensor, bool] = {}
        unnamed = [p for g in self.param_groups for p in g["params"] if p not in self._names]
        if scale == "weight_name" and unnamed:
            warnings.warn(
                f"ASAM: {len(unnamed)} parameter(s) have no name, so the official rule (scale the "
                "parameters whose name contains 'weight') cannot be applied to them; they are scaled "
                "if they have more than one dimension. Pass model= or model.named_parameters() to use "
                "the official rule, or scale='dim>1' to choose the shape rule explicitly",
                UserWarning,
                stacklevel=2,
            )

    def _is_scaled(self, p: torch.Tensor) -> bool:
        hit = self._scaled.get(p)
        if hit is None:
            name = self._names.get(p)
            if callable(self.scale):
                hit = bool(self.scale(name, p))
            elif self.scale == "all":
                hit = True
            elif self.scale == "weight_name" and name is not None:
                hit = "weight" in name
            else:  # "dim>1", or "weight_name" without a name
                hit = p.dim() > 1
            self._scaled[p] = hit
        return hit

    def scaled_names(self) -> list[str]:
        """Names (``shape ...`` when unknown) of the parameters scaled by ``|w| + eta``."""
        return [
            self._names.get(p, f"shape {tuple(p.shape)}")
            for g in self.param_groups
            for p in g["params"]
            if self._is_scaled(p)
        ]

    def _perturbation(self, pairs, grads):
        scales: list[torch.Tensor | None] = []
        tg: list[torch.Tensor] = []
        for (group, p), g in zip(pairs, grads):
            if self._is_scaled(p):  # T is the same for every chunk (all at w)
                t = p.detach().abs().add_(group["eta"])
                scales.append(t)
                tg.append(t * g)
            else:
                scales.append(None)
                tg.append(g)
        tnorm = chunk_norms(tg)
        inv = 1.0 / (tnorm + NORM_GUARD)
        eps: list[torch.Tensor] = []
        eps_scaled: list[torch.Tensor] = []
        for (group, _), t, v in zip(pairs, scales, tg):
            # eps = rho T (T g) / ||T g||;  T^{-1} eps = rho (T g) / ||T g||
            u = v * per_chunk(group["rho"] * inv, v)
            eps_scaled.append(u)
            eps.append(u if t is None else t * u)
        return eps, {
            "grad_norm": chunk_norms(grads),
            "scaled_grad_norm": tnorm,
            "eps_norm": chunk_norms(eps),
            "eps_scaled_norm": chunk_norms(eps_scaled),
        }
