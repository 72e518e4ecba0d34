"""F-SGVB, F-SGVB-LRT and their "+ Geometry" variants (Nguyen et al. 2023, Sec. 3.3, eqs. 6-7).

The flat-seeking versions of the mean-field Gaussian BNNs of :mod:`optimizers.bayes.sgvb`: SAM on
the posterior means with the noise held fixed between the two passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from optimizers.bayes.sgvb import _noise_mode, _require_layers, kl_divergence
from optimizers.m_sharpness import chunk_norms, per_chunk
from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer
from optimizers.posterior import check_nonneg, check_num_data

__all__ = ["FlatSGVB"]


class FlatSGVB(PerturbationOptimizer):
    r"""Flat-seeking SGVB: SAM on the posterior means (Nguyen et al. 2023, Sec. 3.3, eqs. 6-7).

    One step, with the closure returning the mean negative log-likelihood of the batch (*not* the
    ELBO: the optimizer adds the KL itself):

    1. the closure runs with fresh noise ``eps`` (recorded): ``g = grad_mu L(mu + sigma eps)``;
    2. ``mu' = mu + rho * T g / ||T g||`` with ``T = 1`` (F-SGVB, ``geometry=False``) or
       ``T = |mu| / sigma`` elementwise (``geometry=True``, the paper's "+ Geometry"); the norm is
       global over the perturbed tensors; ``sigma`` (``rho`` parameters) is not perturbed;
    3. the closure runs again at ``(mu', sigma)`` with the *same* ``eps`` (replayed: the paper's
       ``W' = mu' + sigma eps``), giving the gradients in ``mu`` and in ``rho``;
    4. the KL gradient ``kl_weight * grad KL(q || p) / N``, evaluated at ``(mu, sigma)`` (the KL
       is outside the maximisation in eq. 6), is added, and the base optimizer steps on all
       parameters.

    Layers with ``local_reparam=True`` give F-SGVB-LRT (``eps`` is then the pre-activation noise).
    Parameters that are not Bayesian (BatchNorm affine, ...) are perturbed as in SAM (``T = 1``).
    ``perturb_std=True`` also perturbs the ``rho`` parameters (``T = 1``), as a SAM applied to
    all parameters would.  BatchNorm running statistics are updated by the first pass only (the
    model is handed to the SAM machinery as ``model=``); m-sharpness (``m > 1``, closure
    ``closure(k)``) as in :class:`optimizers.SAM`, each sub-batch recording and replaying its own
    noise.  ``rho`` defaults to 0.05, SAM's CIFAR-10 value (the paper gives none for F-SGVB).

    The paper's step formula normalises by ``||T g||`` (Euclidean length ``rho``); it is followed
    here, although the exact maximiser of the linearised loss over its ball
    ``(mu' - mu)^T diag(T)^{-1} (mu' - mu) <= rho^2`` would be ``rho T g / sqrt(g^T T g)``.

    ``self.last``: ``loss`` (at ``mu``), ``loss_perturbed``, ``grad_norm`` (``||g||``),
    ``scaled_grad_norm`` (``||T g||``), ``eps_norm`` (``= rho``), ``kl``, ``kl_per_datum``.
    """

    def __init__(
        self,
        model: nn.Module,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.05,
        *,
        num_data: int,
        geometry: bool = False,
        kl_weight: float = 1.0,
        perturb_std: bool = False,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        layers = _require_layers(model, "FlatSGVB")
        check_num_data(num_data)
        check_nonneg("kl_weight", kl_weight)
        for name, flag in (("geometry", geometry), ("perturb_std", perturb_std)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        super().__init__(
            model.parameters(), base_optimizer, model=model, m=m, defaults={"rho": rho}, **base_kwargs
        )
        self.layers = layers
        self._rho_of = {mu: r for layer in layers for mu, r in layer.mean_std_pairs()}
        self._std_params = set(self._rho_of.values())
        self.num_data, self.kl_weight = int(num_data), float(kl_weight)
        self.geometry, self.perturb_std = geometry, perturb_std
        self.config = dict(rho=rho, num_data=num_data, geometry=geometry, kl_weight=kl_weight,
                           perturb_std=perturb_std, m=m, base_optimizer=getattr(base_optimizer, "__name__",
                           str(base_optimizer)), **base_kwargs)  # fmt: skip

    def _call(self, closure: Callable[..., Any], chunk: int | None) -> torch.Tensor:
        if not self.perturbed:
            with _noise_mode(self.layers, "record"):
                return super()._call(closure, chunk)
        with _noise_mode(self.layers, "replay"):
            loss = super()._call(closure, chunk)
        if any(layer._pos != len(layer._log) for layer in self.layers):
            raise RuntimeError(
                "FlatSGVB: the pass at the perturbed point ran the Bayesian layers fewer times than "
                "the pass at the mean; the closure must do the same forward both times"
            )
        return loss

    def _perturbation(self, pairs, grads):
        scaled: list[torch.Tensor | None] = []
        for (_, p), g in zip(pairs, grads):
            if p in self._std_params and not self.perturb_std:
                scaled.append(None)
            elif self.geometry and p in self._rho_of:
                sig = F.softplus(self._rho_of[p]).clamp_min(torch.finfo(p.dtype).tiny)
                scaled.append(p.abs() / sig * g)
            else:
                scaled.append(g)
        active = [s for s in scaled if s is not None]
        raw = [g for g, s in zip(grads, scaled) if s is not None]
        tnorm = chunk_norms(active)
        eps = [
            g.new_zeros(g.shape) if s is None else s * per_chunk(group["rho"] / (tnorm + NORM_GUARD), s)
            for (group, _), g, s in zip(pairs, grads, scaled)
        ]
        return eps, {"grad_norm": chunk_norms(raw), "scaled_grad_norm": tnorm, "eps_norm": chunk_norms(eps)}

    def _adjust_descent(self) -> None:
        with torch.enable_grad():
            kl = kl_divergence(self.model)
            if self.kl_weight > 0:
                params = [p for pair in self._rho_of.items() for p in pair]
                grads = torch.autograd.grad(kl * (self.kl_weight / self.num_data), params)
                for p, g in zip(params, grads):
                    p.grad = g if p.grad is None else p.grad.add_(g)
        self.last["kl"] = kl.detach()
        self.last["kl_per_datum"] = kl.detach() / self.num_data

    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One F-SGVB step (see the class docstring); returns the loss at ``mu``."""
        try:
            return super().step(closure)
        finally:
            for layer in self.layers:
                layer._log, layer._pos = [], 0
