"""RandomSAM and MixSAM (Ujváry et al. 2022: Alg. 1, eq. 7, Table 1, Sec. 5).

``RandomSAM`` is MFVI with a fixed isotropic posterior ``Sigma = rho^2/p I`` (only the mean is
learned): one gradient at a Gaussian perturbation of the weights per step.  ``MixSAM`` mixes the
SAM direction with Gaussian noise (the paper's future-work interpolation between SAM and RandomSAM).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from optimizers.m_sharpness import chunk_norms, chunk_sums, per_chunk
from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer
from optimizers.posterior import resolve_generator

__all__ = ["RandomSAM", "MixSAM"]


class _NoiseMixin:
    """Generator handling (package convention: ``seed`` / ``generator``) with state_dict support."""

    def _init_generator(self, seed: int | None, generator: torch.Generator | None) -> None:
        device = next((p.device for g in self.param_groups for p in g["params"]), torch.device("cpu"))
        self.generator, self.seed = resolve_generator(seed, generator, device)

    def _randn(self, p: torch.Tensor) -> torch.Tensor:
        return torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)

    def _randn_chunks(self, pairs: list, n: int) -> list[torch.Tensor]:
        """``z`` stacked ``[n, *p.shape]`` per parameter, drawn chunk by chunk, parameter by parameter
        (the loop's order)."""
        draws = [[self._randn(p) for _, p in pairs] for _ in range(n)]
        return [torch.stack(col) for col in zip(*draws)]

    def _extra_state(self) -> dict[str, Any]:
        return {"rng_state": self.generator.get_state(), "seed": self.seed}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        if "rng_state" in extra:
            self.generator.set_state(extra["rng_state"])


class RandomSAM(_NoiseMixin, PerturbationOptimizer):
    r"""Random SAM / RSAM: the descent gradient is taken at a random Gaussian perturbation.

    Seed Alg. 1 and eq. (7): ``eps = (rho / sqrt(p)) z``, ``z ~ N(0, I)`` drawn once per step (with
    the optimizer's generator), ``p`` the number of parameter elements; the base optimizer steps at
    ``w`` with ``grad L(w + eps) + 2 alpha w``.  One closure call per step (cost ~ 1x the base).

    Correspondences (paper Table 1): with ``alpha = 1/(N sigma0^2)`` this is MFVI with the posterior
    covariance fixed at ``rho^2/p I`` (only the mean learned; eq. 7 with one sample).  With
    ``alpha = 0`` (no KL/L2 penalty) it is the gradient form of variational optimisation (VO,
    Staines & Barber) and of evolution strategies with a fixed search distribution.

    Args:
        rho: expected perturbation length (``E||eps||^2 = rho^2``); default 0.05 (paper Sec. 5: same
            radius as SAM; their reported per-weight std ``rho/sqrt(p)`` is 5e-5 for a WRN).
        alpha: L2/KL penalty coefficient (eq. 7), default 0.
        seed, generator: randomness (``generator`` wins; see ``optimizers.posterior.resolve_generator``).
        model: accepted for a uniform API; the single pass updates BatchNorm statistics normally.
        m: m sub-batches, each with its own ``z`` (closure ``closure(k)``); mean of the gradients.
        (``base_optimizer``, ``**base_kwargs`` as :class:`optimizers.SAM`.)

    ``self.last``: ``loss`` (= ``loss_perturbed``, the only loss computed), ``sigma`` (``rho/sqrt(p)``),
    ``eps_norm``.  Returns the loss at ``w + eps``.  The generator state is part of ``state_dict()``.
    """

    passes = 1
    _nonnegative_hparams = ("lr", "rho", "alpha")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.05,  # paper Sec. 5 / Table 1: Sigma = rho^2/p I with SAM's rho
        *,
        alpha: float = 0.0,  # paper eq. (7) penalty 2*alpha*w; 0 = VO / ES
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(
            params, base_optimizer, model=model, m=m, defaults={"rho": rho, "alpha": alpha}, **base_kwargs
        )
        self._init_generator(seed, generator)

    def _perturbation(self, pairs, grads):  # one-pass: grads is None, one chunk
        p_total = sum(p.numel() for _, p in pairs)
        scale = 1.0 / math.sqrt(max(p_total, 1))
        eps = [self._randn(p).mul_(group["rho"] * scale).unsqueeze(0) for group, p in pairs]
        return eps, {
            "eps_norm": chunk_norms(eps),
            "sigma": torch.tensor(pairs[0][0]["rho"] * scale if pairs else 0.0),
        }

    def _adjust_descent(self) -> None:
        for group in self.param_groups:
            if group["alpha"] == 0:
                continue
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.add_(p.detach(), alpha=2.0 * group["alpha"])


class MixSAM(_NoiseMixin, PerturbationOptimizer):
    r"""MixSAM: SAM's worst-case direction mixed with Gaussian noise, on the sphere ``||eps|| = rho``.

    ``u = sqrt(p) g/||g|| + kappa z`` (``z ~ N(0, I)``; both terms have length ~ ``sqrt(p)``),
    ``eps = (rho/sqrt(p)) * sqrt(p) u/||u|| = rho u / ||u||`` (``+1e-12`` guards), ``p`` the number of
    parameter elements with a gradient.  ``kappa = 0`` is SAM, ``kappa -> inf`` a random direction
    of length ``rho``.  Two closure calls per step.  Seed: future-work section ("adding random
    noise to the SAM perturbation").

    Args:
        rho: default 0.05 (as SAM).
        kappa: noise weight, default 1 (equal weight of the two unit-scale terms).
        seed, generator, model, m, base_optimizer, **base_kwargs: as :class:`RandomSAM` / :class:`SAM`.

    ``self.last``: ``loss``, ``loss_perturbed``, ``grad_norm``, ``eps_norm`` (= ``rho``),
    ``cos_eps_grad`` (cosine between ``eps`` and ``g``).
    """

    _nonnegative_hparams = ("lr", "rho", "kappa")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.05,  # as SAM (Foret et al. 2021)
        kappa: float = 1.0,  # weight of the SAM part (Ujváry et al. 2022, Sec. 5)
        *,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        super().__init__(
            params, base_optimizer, model=model, m=m, defaults={"rho": rho, "kappa": kappa}, **base_kwargs
        )
        self._init_generator(seed, generator)

    def _perturbation(self, pairs, grads):
        p_total = sum(p.numel() for _, p in pairs)
        gnorm = chunk_norms(grads)
        a = math.sqrt(max(p_total, 1)) / (gnorm + NORM_GUARD)
        z = self._randn_chunks(pairs, grads[0].shape[0] if grads else 1)
        u = [g * per_chunk(a, g) + zi.mul_(group["kappa"]) for (group, _), g, zi in zip(pairs, grads, z)]
        inv = 1.0 / (chunk_norms(u) + NORM_GUARD)
        eps = [v * per_chunk(group["rho"] * inv, v) for (group, _), v in zip(pairs, u)]
        eps_norm = chunk_norms(eps)
        dot = chunk_sums([e * g for e, g in zip(eps, grads)])
        return eps, {
            "grad_norm": gnorm,
            "eps_norm": eps_norm,
            "cos_eps_grad": dot / (eps_norm * gnorm + NORM_GUARD),
        }
