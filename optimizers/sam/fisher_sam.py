"""Fisher SAM (Kim et al. 2022, "Fisher SAM: Information geometry and SAM", ICML, eqs. 10-12 and Sec. 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landscape.checks import check_positive
from optimizers.m_sharpness import chunk_norms, chunk_sums, per_chunk
from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer

__all__ = ["FisherSAM"]


class FisherSAM(PerturbationOptimizer):
    r"""Fisher SAM: SAM with the Fisher-information ellipsoid ``eps^T F eps <= gamma^2``.

    Kim et al. 2022, eq. (10): ``eps = gamma F~^{-1} g / sqrt(g^T F~^{-1} g)`` (``+1e-12`` in the
    denominator), so ``eps^T F~ eps = gamma^2`` exactly.  Diagonal Fisher:

    * ``fisher=None`` (the paper's gradient-magnitude approximation, eq. 12 and Sec. 5):
      ``F~ = 1 + eta * g**2`` with ``g`` the mini-batch mean gradient, i.e. ``F~^{-1} = 1/(1 + eta g^2)``;
    * ``fisher`` a callable ``param -> diagonal Fisher`` (same shape, positive): used as is,
      ``F~ = fisher(param)`` (e.g. a toy problem's analytic Fisher).

    ``eta = 0`` gives SAM with ``rho = gamma``.  Note that rescaling ``F~^{-1} g`` to *Euclidean*
    length ``gamma`` is not Fisher SAM.

    Args:
        rho: the paper's ``gamma``, default 0.1 (Kim et al. 2022, Sec. 5.1, CIFAR).
        eta: Fisher strength, default 1.0 (Sec. 5.1; label-noise setting 0.001).
        fisher: optional callable giving the diagonal Fisher of a parameter tensor.
        grad_scale: factor by which the closure's gradients are scaled (AMP loss scale, or ``1/k``
            for gradient accumulation over ``k`` micro-batches); ``f`` is computed from
            ``grad / grad_scale`` so that it is the Fisher of the true mean gradient.
        (``base_optimizer``, ``model``, ``m``, ``**base_kwargs`` as :class:`optimizers.SAM`.)

    ``self.last``: ``loss``, ``loss_perturbed``, ``grad_norm`` (``||g||``), ``fisher_quadratic``
    (``g^T F~^{-1} g``), ``eps_norm`` (``||eps||``), ``eps_fisher_norm`` (``sqrt(eps^T F~ eps) = gamma``).
    """

    _nonnegative_hparams = ("lr", "rho", "eta")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.1,  # gamma; Kim et al. 2022, Sec. 5.1 (CIFAR-10/100)
        eta: float = 1.0,  # Kim et al. 2022, Sec. 5.1 (label noise: 0.001)
        *,
        fisher: Callable[[torch.Tensor], torch.Tensor] | None = None,
        grad_scale: float = 1.0,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        if fisher is not None and not callable(fisher):
            raise TypeError("fisher must be a callable param -> diagonal Fisher (same shape), or None")
        check_positive("grad_scale", grad_scale)
        self.fisher = fisher
        self.grad_scale = float(grad_scale)
        super().__init__(
            params, base_optimizer, model=model, m=m, defaults={"rho": rho, "eta": eta}, **base_kwargs
        )

    def _diag_fisher(self, group: dict[str, Any], p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.fisher is None:
            return g * g * group["eta"] + 1.0
        f = self.fisher(p)  # the Fisher at w: the same for every chunk
        if not isinstance(f, torch.Tensor) or f.shape != p.shape:
            raise ValueError(
                f"fisher(param) must return a tensor of the parameter's shape {tuple(p.shape)}, got "
                f"{getattr(f, 'shape', type(f).__name__)}"
            )
        f = f.detach().to(dtype=p.dtype, device=p.device)
        if not bool((f > 0).all()):
            raise ValueError("fisher(param) must be strictly positive (it is inverted); add a small damping")
        return f

    def _perturbation(self, pairs, grads):
        if self.grad_scale != 1.0:
            grads = [g / self.grad_scale for g in grads]
        fishers = [self._diag_fisher(group, p, g) for (group, p), g in zip(pairs, grads)]
        fg = [g / f for g, f in zip(grads, fishers)]  # F~^{-1} g, chunk by chunk
        quad = chunk_sums([g * v for g, v in zip(grads, fg)])
        inv = 1.0 / (quad.sqrt() + NORM_GUARD)
        eps = [v * per_chunk(group["rho"] * inv, v) for (group, _), v in zip(pairs, fg)]
        return eps, {
            "grad_norm": chunk_norms(grads),
            "fisher_quadratic": quad,
            "eps_norm": chunk_norms(eps),
            "eps_fisher_norm": chunk_sums([e * f * e for e, f in zip(eps, fishers)]).sqrt(),
        }
