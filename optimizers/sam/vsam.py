"""Variational SAM (Ujváry et al. 2022, Alg. 3 and eqs. 2, 36-42)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from optimizers.m_sharpness import chunk_norms, chunk_sums, per_chunk
from optimizers.perturbation import NORM_GUARD, PerturbationOptimizer
from optimizers.posterior import DiagonalGaussianPosterior, check_num_data, check_positive, resolve_generator

__all__ = ["VariationalSAM"]


class VariationalSAM(PerturbationOptimizer, DiagonalGaussianPosterior):
    r"""Variational SAM / VSAM: SAM inside a *learned* ellipsoid ``eps^T Sigma^{-1} eps <= p``.

    ``Sigma = diag(sigma^2)`` is learned together with the mean ``mu`` (the model's parameters) on
    the objective of paper eq. (42)::

        J(mu, sigma) = L(mu) + sqrt(p) sqrt(g^T Sigma g) + Tr Sigma/(2 N s0^2)
                       + log det Sigma^{-1}/(2 N) + ||mu||^2/(2 N s0^2)

    with ``s0 = prior_std`` and ``N = num_data``.  Per step (Alg. 3):

    1. ``g = grad L_B(mu)`` (first closure call);
    2. ``eps = sqrt(p) Sigma g / (sqrt(g^T Sigma g) + 1e-12)`` (eq. 2; ``eps^T Sigma^{-1} eps = p``);
    3. ``g_eps = grad L_B(mu + eps)`` (second call); the base optimizer steps ``mu`` with
       ``g_eps + kl_weight * mu / (N s0^2)`` (gradient of the last term of ``J``);
    4. ``sigma <- sigma - sigma_lr * dJ/dsigma`` with ``g`` held fixed (detached)::

           dJ/dsigma = sqrt(p) sigma g^2 / sqrt(g^T Sigma g) + kl_weight (sigma/(N s0^2) - 1/(N sigma))

       ``J`` is even in ``sigma``, so ``sigma`` is stored as ``|sigma|`` after the update (this does
       not change the iterates' ``Sigma``).

       Alg. 3 of the paper descends on ``Sigma`` instead; that reading is unstable from the small
       ``Sigma_0 = rho^2 / p``.  One step at ``sigma_lr = 0.01`` on a 4-8-3 MLP (``p = 67``) and 40
       points: the ``Sigma`` step gives a mean ``sigma`` of 1.82 for ``N = 40`` (300 times
       ``sigma_0 = 0.0061``) and a negative ``Sigma`` on 48 of 67 coordinates for ``N = 50,000``;
       the ``sigma`` step gives 0.0467 and 0.00576 (``docs/methods/optimizers.md``).

    ``p`` is the number of parameter elements with a gradient (all of them in ordinary use).
    ``sigma`` starts at ``rho / sqrt(p_total)`` so that ``||eps|| ~ rho`` initially (paper App. D:
    perturbation size ~0.05).  The seed observes ``Sigma`` growing until the first-order Taylor
    approximation breaks down: inspect it with :meth:`posterior_std` / ``self.last``.  The
    ``-1/(N sigma)`` term of ``dJ/dsigma`` dominates while ``sigma`` is small, so with a small
    ``num_data`` ``sigma`` grows by ``~sigma_lr/(N sigma)`` per step at first.

    ``sigma_lr`` is a rate on ``sigma`` itself, so safe values scale like ``sigma_0^2 = rho^2/p``: one
    step from ``sigma_0`` multiplies ``sigma`` by ``1 + sigma_lr p/(N rho^2)`` (2,919 for WRN-28-10 on
    CIFAR-10 at ``sigma_lr = 0.01``, which then diverges), and the data term, up to
    ``sigma_lr sqrt(p) |g_i|`` whatever ``sigma`` is, can overshoot zero. ``sigma_lr = 0.01 rho^2/p`` is
    gradient descent with rate 0.01 on ``sigma / sigma_0`` (``configs/vsam_cifar10_wrn.toml``).

    The posterior ``N(mu, Sigma)`` is exposed through the
    :class:`optimizers.posterior.DiagonalGaussianPosterior` API: :meth:`posterior_std`,
    :meth:`sample` (context manager, bit-exact restore) and :meth:`bayesian_model_average`.

    Args:
        rho: initial perturbation length, default 0.05 (paper App. D).
        num_data: ``N``, the number of training examples (required, > 0).
        prior_std: ``s0`` of the prior ``N(0, s0^2 I)``; default 1.0 (the seed gives no value).
        sigma_lr: learning rate of ``sigma`` (plain gradient descent), default 0.01 (paper App. D).
        kl_weight: multiplies the prior/KL terms of ``J`` (in both the ``mu`` and ``sigma``
            gradients); 0 drops them.
        seed, generator: randomness for :meth:`sample` (package convention).
        (``base_optimizer``, ``model``, ``m``, ``**base_kwargs`` as :class:`optimizers.SAM`.)

    ``self.last``: ``loss``, ``loss_perturbed``, ``grad_norm``, ``sigma_quadratic`` (``g^T Sigma g``),
    ``eps_norm``, ``eps_mahalanobis`` (``eps^T Sigma^{-1} eps = p``), and after the update
    ``sigma_mean``, ``sigma_min``, ``sigma_max``.
    """

    _nonnegative_hparams = ("lr", "rho", "sigma_lr", "kl_weight")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any = torch.optim.SGD,
        rho: float = 0.05,  # paper App. D: initial perturbation size ~0.05
        *,
        num_data: int,
        prior_std: float = 1.0,  # not given in the seed; standard-normal prior
        sigma_lr: float = 0.01,  # paper App. D: learning rate 0.01 on Sigma
        kl_weight: float = 1.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        m: int = 1,
        **base_kwargs: Any,
    ) -> None:
        check_num_data(num_data)
        check_positive("prior_std", prior_std)
        defaults = {
            "rho": rho,
            "num_data": num_data,
            "prior_std": float(prior_std),
            "sigma_lr": sigma_lr,
            "kl_weight": kl_weight,
        }
        super().__init__(params, base_optimizer, model=model, m=m, defaults=defaults, **base_kwargs)
        managed = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        p_total = sum(p.numel() for p in managed)
        for g in self.param_groups:
            for p in g["params"]:
                if p.requires_grad:
                    self.state[p]["sigma"] = torch.full_like(
                        p, g["rho"] / math.sqrt(max(p_total, 1)), memory_format=torch.preserve_format
                    )
        device = managed[0].device if managed else torch.device("cpu")
        self.generator, self.seed = resolve_generator(seed, generator, device)
        self._sigma_data_grad: dict[torch.Tensor, torch.Tensor] = {}
        self._chunks_seen = 0

    def _check_group(self, group: dict[str, Any], index: int, keys: Any = None) -> None:
        super()._check_group(group, index, keys)
        keys = group if keys is None else keys
        if "prior_std" in keys and "prior_std" in group:
            check_positive(f"prior_std (param group {index})", group["prior_std"])
        if "num_data" in keys and "num_data" in group:
            check_num_data(group["num_data"])

    # ---- posterior API ---------------------------------------------------------------------
    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``{param: sigma}`` (detached clones, same shape as the parameter)."""
        return {
            p: self.state[p]["sigma"].detach().abs().clone()
            for g in self.param_groups
            for p in g["params"]
            if "sigma" in self.state.get(p, {})
        }

    def _extra_state(self) -> dict[str, Any]:
        return {"rng_state": self.generator.get_state(), "seed": self.seed}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        if "rng_state" in extra:
            self.generator.set_state(extra["rng_state"])

    # ---- the method ------------------------------------------------------------------------
    def _begin_step(self) -> None:
        self._sigma_data_grad = {}
        self._chunks_seen = 0

    def _perturbation(self, pairs, grads):
        sig2 = [self.state[p]["sigma"].square() for _, p in pairs]
        sg = [s * g for s, g in zip(sig2, grads)]  # Sigma g, chunk by chunk
        p_total = sum(p.numel() for _, p in pairs)
        sqrt_p = math.sqrt(max(p_total, 1))
        quad = chunk_sums([g * v for g, v in zip(grads, sg)])
        factor = sqrt_p / (quad.sqrt() + NORM_GUARD)
        eps = [v * per_chunk(factor, v) for v in sg]
        # data part of dJ/dsigma, g detached, summed over chunks: sqrt(p) sigma g^2 / sqrt(g^T Sigma g)
        n = grads[0].shape[0] if grads else 1
        self._chunks_seen += n
        for (_, p), g in zip(pairs, grads):
            d = self.state[p]["sigma"] * g.square() * per_chunk(factor, g)
            d = d[0] if n == 1 else d.sum(0)
            if p in self._sigma_data_grad:
                self._sigma_data_grad[p].add_(d)
            else:
                self._sigma_data_grad[p] = d
        return eps, {
            "grad_norm": chunk_norms(grads),
            "sigma_quadratic": quad,
            "eps_norm": chunk_norms(eps),
            "eps_mahalanobis": chunk_sums([e * e / s for e, s in zip(eps, sig2)]),
        }

    def _adjust_descent(self) -> None:
        chunks = max(self._chunks_seen, 1)
        sig_all: list[torch.Tensor] = []
        for group in self.param_groups:
            prior_prec = 1.0 / (group["num_data"] * group["prior_std"] ** 2)  # 1/(N s0^2)
            kw = group["kl_weight"]
            for p in group["params"]:
                st = self.state.get(p, {})
                if "sigma" not in st:
                    continue
                if p.grad is not None and kw != 0:
                    p.grad.add_(p.detach(), alpha=kw * prior_prec)
                sigma = st["sigma"]
                grad_sigma = sigma * (kw * prior_prec) - (kw / group["num_data"]) / sigma
                if p in self._sigma_data_grad:
                    grad_sigma = grad_sigma + self._sigma_data_grad[p] / chunks
                sigma.sub_(grad_sigma, alpha=group["sigma_lr"]).abs_()
                sig_all.append(sigma.reshape(-1))
        self._sigma_data_grad = {}
        self._chunks_seen = 0
        if sig_all:
            flat = torch.cat(sig_all)
            self.last.update(sigma_mean=flat.mean(), sigma_min=flat.min(), sigma_max=flat.max())
