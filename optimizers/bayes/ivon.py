"""IVON: improved variational online Newton (Shen et al. 2024, "Variational learning is effective for
large deep networks", Alg. 1).

Mean-field Gaussian variational learning with an Adam-like cost: one gradient per weight sample, a
Hessian estimate from the reparameterisation trick and a precision update that stays positive.  The
update and where it differs from the paper and the authors' ``ivon-opt`` package are in
``docs/methods/optimizers.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from landscape.checks import check_range
from optimizers.posterior import (
    DiagonalGaussianPosterior,
    check_closure_loss,
    check_nonneg,
    check_positive,
    resolve_generator,
)
from optimizers.state import GeneratorStateMixin

__all__ = ["IVON"]


def _check_betas(name: str, betas: Any) -> None:
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"{name} must be two numbers (beta1, beta2) in [0, 1), got {betas!r}")
    for j, b in enumerate(betas):
        check_range(f"{name}[{j}]", b, 0.0, 1.0, high_open=True)


class IVON(DiagonalGaussianPosterior, GeneratorStateMixin, torch.optim.Optimizer):
    r"""IVON: posterior ``q = N(m, diag(sigma^2))``, ``sigma = 1 / sqrt(lambda (h + delta))``.

    The model's parameters hold the mean ``m``; per parameter the optimizer keeps the gradient
    momentum ``g = 0`` and the Hessian estimate ``h = h0`` (``hess_init``).  With ``lambda`` = ``ess``
    (the effective sample size, normally the training-set size ``N``) and ``delta`` =
    ``weight_decay``, one step of Alg. 1 of Shen et al. (2024) is::

        sigma = 1 / sqrt(lambda (h + delta))
        for k = 1..K (mc_samples):
            theta_k = m + sigma * z_k,  z_k ~ N(0, I)          # written into the parameters
            ghat_k = grad of the closure's loss at theta_k
            hhat_k = ghat_k * (theta_k - m) / sigma^2          # reparameterisation-trick Hessian
        ghat, hhat = means over k
        g <- beta1 g + (1 - beta1) ghat
        h <- beta2 h + (1 - beta2) hhat + (1 - beta2)^2 (h - hhat)^2 / (2 (h + delta))
        gbar = g / (1 - beta1^t)                               # debias=False: gbar = g
        m <- m - alpha (gbar + delta m) / (h + delta)          # elementwise clipped to +-clip_radius

    with ``alpha = lr (h0 + delta)`` (``rescale_lr=True``, the optional rescaling of Alg. 1, so that
    ``lr`` is the step size of the first steps) or ``alpha = lr``.  The ``(h - hhat)^2`` term keeps
    ``h + delta > 0`` (Shen et al. 2024, Sec. 3; Lin et al. 2020, "Handling the positive-definite
    constraint in the Bayesian learning rule").

    The closure is the usual one (zero the grads, forward, ``backward``, ``return loss``, the loss
    being the mini-batch *mean*); the optimizer samples the weights around it, so unlike with
    ``ivon-opt`` the closure needs no ``sampled_params`` block.  Noise is drawn with
    ``self.generator``, sample by sample, parameter by parameter in ``param_groups`` order,
    ``torch.randn(p.shape, generator, dtype=p.dtype, device=p.device)``.  After the step ``p.grad``
    holds ``ghat``.  Prediction: :meth:`posterior_std`, :meth:`sample`, :meth:`bayesian_model_average`
    (or the mean network).

    Args:
        params: parameters or param groups (``lr``, ``betas``, ``weight_decay``, ``hess_init``,
            ``clip_radius`` may be set per group).
        lr: learning rate alpha.
        ess: ``lambda``, the effective sample size (the training-set size ``N``; larger values give
            a narrower posterior).
        hess_init: ``h0``, default 1.0 (``ivon-opt``; the paper's experiments use 0.01 to 0.5).
        betas: ``(beta1, beta2)``, default ``(0.9, 0.99999)`` (paper).
        weight_decay: ``delta``, default 1e-4 (prior precision ``lambda delta``).
        mc_samples: ``K``, default 1 (paper).
        clip_radius: elementwise clip of the preconditioned step; default ``inf`` (no clipping).
        debias: divide the momentum by ``1 - beta1^t``; default ``True``.
        rescale_lr: ``alpha = lr (h0 + delta)``; default ``True``.
        seed, generator: randomness (see :func:`optimizers.posterior.resolve_generator`).

    ``self.last``: ``loss`` (mean over samples), ``grad_norm`` (``||ghat||``), ``noise_norm`` (mean
    over samples of ``||theta_k - m||``), ``hess_min/hess_mean/hess_max`` (after the update),
    ``posterior_std_mean``.
    """

    _group_keys = ("lr", "betas", "weight_decay", "hess_init", "clip_radius")

    def __init__(
        self,
        params: Any,
        lr: float,
        ess: float,
        hess_init: float = 1.0,  # ivon-opt default
        betas: tuple[float, float] = (0.9, 0.99999),  # paper
        weight_decay: float = 1e-4,  # ivon-opt default
        mc_samples: int = 1,
        clip_radius: float = math.inf,
        debias: bool = True,
        rescale_lr: bool = True,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        check_nonneg("lr", lr)
        check_positive("ess (the effective sample size, normally the training-set size N)", ess)
        check_positive("hess_init", hess_init)
        _check_betas("betas", betas)
        check_nonneg("weight_decay", weight_decay)
        check_positive("mc_samples", mc_samples, integer=True)
        check_positive("clip_radius", clip_radius, allow_inf=True)
        defaults = dict(
            lr=lr, betas=tuple(betas), weight_decay=weight_decay, hess_init=hess_init, clip_radius=clip_radius
        )
        super().__init__(params, defaults)
        self.ess = float(ess)
        self.mc_samples = int(mc_samples)
        self.debias = bool(debias)
        self.rescale_lr = bool(rescale_lr)
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.config = dict(
            lr=lr,
            ess=ess,
            hess_init=hess_init,
            betas=tuple(betas),
            weight_decay=weight_decay,
            mc_samples=mc_samples,
            clip_radius=clip_radius,
            debias=debias,
            rescale_lr=rescale_lr,
            seed=self.seed,
        )
        self.last: dict[str, Any] = {}

    # ----------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; its hyperparameters (given or defaulted) are checked like the constructor's."""
        super().add_param_group(param_group)
        group, i = self.param_groups[-1], len(self.param_groups) - 1
        check_nonneg(f"lr (param group {i})", group["lr"])
        check_nonneg(f"weight_decay (param group {i})", group["weight_decay"])
        check_positive(f"hess_init (param group {i})", group["hess_init"])
        check_positive(f"clip_radius (param group {i})", group["clip_radius"], allow_inf=True)
        _check_betas(f"betas (param group {i})", group["betas"])

    def _params(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _h(self, group: dict[str, Any], p: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        if "hess" not in st:
            st["hess"] = torch.full_like(p, group["hess_init"], memory_format=torch.preserve_format)
            st["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] = 0
        return st["hess"]

    def hessian(self) -> dict[torch.Tensor, torch.Tensor]:
        """The Hessian estimate ``h`` of every parameter (``hess_init`` before the first step)."""
        return {p: self._h(g, p).detach().clone() for g, p in self._params()}

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``1 / sqrt(ess (h + weight_decay))`` for every parameter."""
        return {
            p: torch.rsqrt(self.ess * (self._h(g, p).detach() + g["weight_decay"])) for g, p in self._params()
        }

    # ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One IVON step (``mc_samples`` closure calls).  Returns the mean loss over the samples."""
        if closure is None or not callable(closure):
            raise ValueError(
                "IVON.step needs a closure that zeroes grads, runs forward and backward and returns the "
                "loss; the optimizer itself sets the parameters to the weight samples around it"
            )
        pairs = self._params()
        params = [p for _, p in pairs]
        h_list = [self._h(g, p) for g, p in pairs]
        std_map = self.posterior_std()
        stds = [std_map[p] for p in params]
        g_acc: list[torch.Tensor | None] = [None] * len(params)
        h_acc: list[torch.Tensor | None] = [None] * len(params)
        losses, noise_norm = [], 0.0
        for _ in range(self.mc_samples):
            saved = [p.detach().clone() for p in params]
            zs = []
            try:
                sq = params[0].new_zeros(()) if params else torch.zeros(())
                for p, std in zip(params, stds):
                    z = torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)
                    zs.append(z)
                    e = std * z
                    sq = sq + e.square().sum()
                    p.add_(e)
                noise_norm = noise_norm + sq.sqrt()  # 0-d tensor: no host read per step
                for p in params:
                    p.grad = None
                with torch.enable_grad():
                    loss = closure()
                losses.append(check_closure_loss(loss, "IVON").detach())
            finally:
                for p, old in zip(params, saved):
                    p.copy_(old)
            for j, (p, z, std) in enumerate(zip(params, zs, stds)):
                if p.grad is None:
                    continue
                g = p.grad.detach().clone()
                hh = g * z / std  # g (theta - m) / sigma^2 with theta - m = sigma z
                g_acc[j] = g if g_acc[j] is None else g_acc[j] + g
                h_acc[j] = hh if h_acc[j] is None else h_acc[j] + hh
        K = self.mc_samples
        g_sq = params[0].new_zeros(()) if params else torch.zeros(())
        for j, ((group, p), h) in enumerate(zip(pairs, h_list)):
            if g_acc[j] is None:
                continue
            st = self.state[p]
            beta1, beta2 = group["betas"]
            wd = group["weight_decay"]
            ghat, hhat = g_acc[j] / K, h_acc[j] / K
            g_sq = g_sq + ghat.square().sum()
            st["step"] += 1
            st["momentum"].mul_(beta1).add_(ghat, alpha=1.0 - beta1)
            correction = (h - hhat).square().div_(h + wd).mul_(0.5 * (1.0 - beta2) ** 2)
            h.mul_(beta2).add_(hhat, alpha=1.0 - beta2).add_(correction)
            gbar = st["momentum"] / (1.0 - beta1 ** st["step"]) if self.debias else st["momentum"]
            alpha = group["lr"] * (group["hess_init"] + wd) if self.rescale_lr else group["lr"]
            direction = (gbar + wd * p) / (h + wd)
            if math.isfinite(group["clip_radius"]):
                direction.clamp_(-group["clip_radius"], group["clip_radius"])
            p.sub_(alpha * direction)
            p.grad = ghat
        loss, self.last = self._step_summary(
            losses, "hess", h_list, grad_norm=g_sq.sqrt(), noise_norm=noise_norm / K
        )
        return loss

    # ----------------------------------------------------------------------------------------
