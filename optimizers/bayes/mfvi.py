"""Mean-field variational inference with the reparameterisation trick (Bayes by backprop).

Ujváry et al. 2022, "Rethinking SAM as variational inference", Alg. 2 (Mean Field Variational
Inference); Blundell et al. (2015), "Weight uncertainty in neural networks", eqs. 3-4.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from optimizers.posterior import (
    DiagonalGaussianPosterior,
    check_closure_loss,
    check_nonneg,
    check_num_data,
    check_positive,
    resolve_generator,
)
from optimizers.state import check_state_dict, check_tensor_shapes, tag_state_dict

__all__ = ["MFVI"]


def _inv_softplus(x: float) -> float:
    # softplus(r) = log(1 + e^r) = x  <=>  r = log(e^x - 1); expm1 keeps it accurate for small x
    return math.log(math.expm1(x)) if x < 30 else x


class MFVI(DiagonalGaussianPosterior, torch.optim.Optimizer):
    r"""Bayes by backprop: learn ``q(w) = N(mu, diag(sigma^2))`` with a ``N(0, prior_std^2 I)`` prior.

    The model's parameters hold the posterior mean ``mu``; ``sigma = softplus(r)`` (or ``exp(r)``
    with ``parameterization="exp"``) lives in the optimizer.  One closure call per step
    (spec ``optimizers.md``, MFVI; seed Alg. 2):

    1. ``z ~ N(0, I)`` (drawn with ``self.generator``, parameter by parameter in ``param_groups``
       order), ``theta = mu + sigma * z`` written into the parameters in place;
    2. ``g = closure()``'s gradient at ``theta``; the parameters are restored to ``mu`` bit-exactly;
    3. ``grad_mu = g + kl_weight * mu / (N prior_std^2)``,
       ``grad_sigma = g * z + kl_weight * (sigma / prior_std^2 - 1 / sigma) / N``
       (the KL gradient divided by ``N = num_data`` because the closure's loss is a *mean* over the
       batch), and ``grad_r = grad_sigma * dsigma/dr`` (``sigmoid(r)`` for softplus, ``sigma`` for exp);
    4. the base optimizer (any ``torch.optim`` class, default Adam) steps on ``mu`` and ``r``.

    ``kl_weight=0`` drops the KL term: this is *variational optimisation* (Staines & Barber 2012),
    the gradient form of *evolution strategies* with a learned search distribution (seed, Table 1).
    With ``kl_weight=0`` and ``std_lr=0`` (``sigma`` frozen) the step is RandomSAM's
    (:class:`optimizers.RandomSAM`, seed Alg. 1) with an anisotropic, fixed noise scale.

    Parameter groups: ``self.param_groups`` *is* the base optimizer's list; it holds, for each of
    your groups, a ``role="mean"`` group (the parameters) followed by a ``role="std"`` group (the
    ``r`` tensors, learning rate ``std_lr`` if given).  LR schedulers therefore scale both.

    Defaults: ``prior_std=1.0`` (standard normal prior, Blundell et al. 2015 Sec. 3.3 use scale
    mixtures around 1); ``init_std=1e-3`` (small initial variance so that training starts close
    to the deterministic network, as in Blundell et al.'s ``rho`` initialisation and the paper's
    "initialise Sigma small").

    ``self.last`` holds, after each step (0-d tensors on the parameters' device, read with
    ``float()`` only when needed: the step reads nothing back from the device): ``loss``, ``kl``
    (``KL(q||p)`` summed over all parameters, float64), ``kl_per_datum`` (``kl / N``),
    ``std_min/mean/max``, ``noise_norm`` (``||sigma * z||``, float64), ``seed`` (an int).
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        num_data: int,
        prior_std: float = 1.0,
        init_std: float = 1e-3,
        base_optimizer: type[torch.optim.Optimizer] = torch.optim.Adam,
        kl_weight: float = 1.0,
        parameterization: str = "softplus",
        std_lr: float | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **base_kwargs: Any,
    ) -> None:
        check_nonneg("lr", lr)
        check_num_data(num_data)
        check_positive("prior_std", prior_std)
        check_positive("init_std", init_std)
        check_nonneg("kl_weight", kl_weight)
        if std_lr is not None:
            check_nonneg("std_lr", std_lr)
        if parameterization not in ("softplus", "exp"):
            raise ValueError(f"parameterization must be 'softplus' or 'exp', got {parameterization!r}")
        if not (isinstance(base_optimizer, type) and issubclass(base_optimizer, torch.optim.Optimizer)):
            raise TypeError("base_optimizer must be a torch.optim.Optimizer class, e.g. torch.optim.Adam")
        defaults = dict(lr=lr, **base_kwargs)
        super().__init__(params, defaults)
        for i, group in enumerate(self.param_groups):  # per-group learning rates obey the same rule
            check_nonneg(f"lr (param group {i})", group["lr"])
        self.num_data = num_data
        self.prior_std = float(prior_std)
        self.kl_weight = float(kl_weight)
        self.parameterization = parameterization
        self.init_std = float(init_std)
        r0 = _inv_softplus(init_std) if parameterization == "softplus" else math.log(init_std)
        # raw std tensors r, one per parameter: sigma = softplus(r) or exp(r)
        self._raw: dict[torch.Tensor, torch.Tensor] = {}
        base_groups = []
        for group in self.param_groups:
            raws = []
            for p in group["params"]:
                r = torch.full_like(p, r0, memory_format=torch.preserve_format).detach().requires_grad_(True)
                self._raw[p] = r
                raws.append(r)
            mean_group = {k: v for k, v in group.items()}
            mean_group["role"] = "mean"
            std_group = {k: v for k, v in group.items() if k != "params"}
            std_group.update(params=raws, role="std")
            if std_lr is not None:
                std_group["lr"] = std_lr
            base_groups += [mean_group, std_group]
        first = next(iter(self._raw), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.base_optimizer = base_optimizer(base_groups, **defaults)
        self._mean_groups = self.param_groups
        self.param_groups = self.base_optimizer.param_groups
        self.config = dict(
            lr=lr,
            num_data=num_data,
            prior_std=prior_std,
            init_std=init_std,
            base_optimizer=base_optimizer.__name__,
            kl_weight=kl_weight,
            parameterization=parameterization,
            std_lr=std_lr,
            seed=self.seed,
            **base_kwargs,
        )
        self.last: dict[str, Any] = {}

    # ----------------------------------------------------------------------------------------
    def _means(self) -> list[torch.Tensor]:
        return list(self._raw)

    def _std_from_raw(self, r: torch.Tensor) -> torch.Tensor:
        return F.softplus(r) if self.parameterization == "softplus" else torch.exp(r)

    def _dstd_draw(self, r: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(r) if self.parameterization == "softplus" else torch.exp(r)

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``sigma`` for every parameter (detached)."""
        return {p: self._std_from_raw(r.detach()) for p, r in self._raw.items()}

    def kl_divergence(self) -> float:
        """``KL(N(mu, sigma^2) || N(0, prior_std^2))`` summed over all parameters (closed form)."""
        return float(self._kl())

    def _kl(self) -> torch.Tensor:
        """:meth:`kl_divergence` as a 0-d float64 tensor on the parameters' device (no host read)."""
        s0 = self.prior_std
        terms = []
        for p, r in self._raw.items():
            sig = self._std_from_raw(r.detach())
            mu = p.detach()
            kl = torch.log(s0 / sig) + (sig**2 + mu**2) / (2 * s0**2) - 0.5
            terms.append(kl.sum().to(torch.float64))
        if not terms:
            return torch.zeros((), dtype=torch.float64)
        return torch.stack(terms).sum()

    # ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One Bayes-by-backprop step; the closure is called once, at ``theta = mu + sigma z``."""
        if closure is None:
            raise ValueError(
                "MFVI.step needs a closure that zeroes grads, runs forward+backward and returns the loss"
            )
        means = self._means()
        saved, zs, stds = [], {}, {}
        for p in means:
            r = self._raw[p]
            sig = self._std_from_raw(r)
            z = torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)
            zs[p], stds[p] = z, sig
            saved.append(p.detach().clone())
        try:
            for p in means:
                p.add_(stds[p] * zs[p])
            with torch.enable_grad():
                loss = check_closure_loss(closure(), "MFVI")
        finally:
            for p, old in zip(means, saved):
                p.copy_(old)
        n, s0sq, kw = self.num_data, self.prior_std**2, self.kl_weight
        noise_sq = []
        for p in means:
            r, z, sig = self._raw[p], zs[p], stds[p]
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grad_mu = g + kw * p / (n * s0sq)
            grad_sigma = g * z + kw * (sig / s0sq - 1.0 / sig) / n
            p.grad = grad_mu.detach()
            r.grad = (grad_sigma * self._dstd_draw(r)).detach()
            noise_sq.append(((sig * z) ** 2).sum().to(torch.float64))
        self.base_optimizer.step()
        all_std = (
            torch.cat([s.reshape(-1) for s in self.posterior_std().values()]) if means else torch.zeros(1)
        )
        kl = self._kl()
        self.last = dict(  # 0-d tensors on the parameters' device: read (float()) only when needed
            loss=loss.detach(),
            kl=kl,
            kl_per_datum=kl / n,
            std_min=all_std.min(),
            std_mean=all_std.mean(),
            std_max=all_std.max(),
            noise_norm=torch.stack(noise_sq).sum().sqrt()
            if noise_sq
            else torch.zeros((), dtype=torch.float64),
            seed=self.seed,
        )
        return loss

    # ----------------------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        sd = {
            "base": self.base_optimizer.state_dict(),
            "raw_std": [r.detach().clone() for r in self._raw.values()],
            "generator": self.generator.get_state(),
        }
        return tag_state_dict(sd, self, self._mean_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = check_state_dict(state_dict, self, self._mean_groups, required=("base", "raw_std"))
        raws = state_dict["raw_std"]
        check_tensor_shapes("raw_std", raws, list(self._raw), "MFVI")
        self.base_optimizer.load_state_dict(state_dict["base"])
        self.param_groups = self.base_optimizer.param_groups
        with torch.no_grad():
            for r, saved in zip(self._raw.values(), raws):
                r.copy_(saved)
        if "generator" in state_dict:
            self.generator.set_state(state_dict["generator"])
