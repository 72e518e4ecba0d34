"""SAM (Foret et al. 2021) and adaptive SAM / ASAM (Kwon et al. 2021).

Both are :class:`optimizers.perturbation.PerturbationOptimizer` subclasses: two closure calls per step
(at ``w`` and at ``w + eps``), descent by any ``torch.optim`` base optimizer on the shared param
groups; BatchNorm handling (``model=``) and m-sharpness (``m=``, closure ``closure(chunk)``) as
documented in :mod:`optimizers.perturbation`.  Weight decay belongs to the base optimizer (applied at
``w``, not part of the ascent).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer, check_nonnegative, global_norm

__all__ = ["SAM", "ASAM"]


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
        check_nonnegative("rho", rho)
        super().__init__(params, base_optimizer, model=model, m=m, defaults={"rho": rho}, **base_kwargs)

    def _perturbation(self, pairs):
        grads = [p.grad for _, p in pairs]
        gnorm = global_norm(grads)
        scale = 1.0 / (gnorm + NORM_GUARD)
        eps = [g * (group["rho"] * scale) for (group, _), g in zip(pairs, grads)]
        return eps, {"grad_norm": gnorm, "eps_norm": global_norm(eps)}


class ASAM(PerturbationOptimizer):
    r"""Adaptive SAM (Kwon et al. 2021, eq. 11 / Alg. 1).

    Scaling ``T_w = |w| + eta`` elementwise for weight tensors (``dim > 1``); ``T = 1`` for 1-D
    tensors (biases, BatchNorm affine parameters) unless ``scale_all=True``.
    ``eps = rho * T_w^2 g / (||T_w g||_2 + 1e-12)`` (norm global over all parameters with a gradient),
    so that ``||T_w^{-1} eps|| = rho``.

    Args:
        rho: default 0.5 (Kwon et al. 2021, CIFAR-10; 1.0 for CIFAR-100).
        eta: default 0.01 (Kwon et al. 2021).
        scale_all: also scale 1-D tensors by ``|w| + eta``.
        (other arguments as :class:`SAM`.)

    ``self.last``: ``loss``, ``loss_perturbed``, ``grad_norm`` (``||g||``), ``scaled_grad_norm``
    (``||T g||``), ``eps_norm`` (``||eps||``), ``eps_scaled_norm`` (``||T^{-1} eps|| = rho``).
    """

    _nonnegative_hparams = ("lr", "rho", "eta")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.5,  # Kwon et al. 2021, CIFAR-10 setting
        eta: float = 0.01,  # Kwon et al. 2021
        *,
        scale_all: bool = False,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        check_nonnegative("rho", rho)
        check_nonnegative("eta", eta)
        super().__init__(
            params,
            base_optimizer,
            model=model,
            m=m,
            defaults={"rho": rho, "eta": eta, "scale_all": bool(scale_all)},
            **base_kwargs,
        )

    def _perturbation(self, pairs):
        scales: list[torch.Tensor | None] = []
        tg: list[torch.Tensor] = []
        for group, p in pairs:
            if p.dim() > 1 or group["scale_all"]:
                t = p.detach().abs().add_(group["eta"])
                scales.append(t)
                tg.append(t * p.grad)
            else:
                scales.append(None)
                tg.append(p.grad)
        tnorm = global_norm(tg)
        inv = 1.0 / (tnorm + NORM_GUARD)
        eps: list[torch.Tensor] = []
        eps_scaled: list[torch.Tensor] = []
        for (group, _), t, v in zip(pairs, scales, tg):
            # eps = rho T (T g) / ||T g||;  T^{-1} eps = rho (T g) / ||T g||
            u = v * (group["rho"] * inv)
            eps_scaled.append(u)
            eps.append(u if t is None else t * u)
        grads = [p.grad for _, p in pairs]
        return eps, {
            "grad_norm": global_norm(grads),
            "scaled_grad_norm": tnorm,
            "eps_norm": global_norm(eps),
            "eps_scaled_norm": global_norm(eps_scaled),
        }
