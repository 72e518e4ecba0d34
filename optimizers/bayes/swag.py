"""SWAG and F-SWAG (Maddox et al. 2019; the flat-seeking BNN paper, Sec. 3-4).

:class:`SWAG` wraps *any* optimizer (plain SGD gives SWAG, :class:`optimizers.SAM` gives
F-SWAG) and collects, every ``collect_every`` steps after ``start_step``, the running mean
``theta_bar``, the running second moment ``theta2_bar`` (diagonal) and the last ``rank``
deviations ``theta_i - theta_bar_i`` (Maddox et al. 2019, "A simple baseline for Bayesian
uncertainty in deep learning", Alg. 1).  Sampling (Maddox et al. eq. 1 and Sec. 4.2):

    SWAG-Diag:  theta = theta_bar + scale * Sigma_diag^{1/2} z
    SWAG:       theta = theta_bar + scale * (Sigma_diag^{1/2} z1 / sqrt(2) + D z2 / sqrt(2 (K - 1)))

with ``Sigma_diag = max(theta2_bar - theta_bar^2, var_clamp)`` and ``D`` the ``p x K`` deviation
matrix.  :func:`f_swag` builds ``SWAG(SAM(...))`` (reference settings: ``rho = 0.05`` CIFAR-10,
rank 20, 30 posterior samples).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from optimizers.posterior import (
    _ensemble_average,
    _weights_set_to,
    check_nonneg,
    check_positive,
    resolve_generator,
)
from optimizers.sam.sam import SAM
from optimizers.state import check_state_dict, tag_state_dict

__all__ = ["SWAG", "f_swag"]


class SWAG:
    """SWAG / SWAG-Diag moment collector around any optimizer (Maddox et al. 2019, Alg. 1).

    ``SWAG(optimizer, rank=20, collect_every=1, start_step=0, diag_only=False, var_clamp=1e-30)``.
    ``step(closure)`` steps the wrapped optimizer and, on every ``collect_every``-th step after
    ``start_step`` steps, calls :meth:`collect` (which you may also call yourself, e.g. once per
    epoch as in the paper).  Statistics are kept as flat float vectors over all parameters of the
    optimizer's param groups, in order.

    Attributes after collection: ``n_collected``, :attr:`mean`, :attr:`sq_mean`, :attr:`variance`,
    :attr:`deviations` (``p x K`` matrix, oldest column first).  ``self.last`` mirrors the wrapped
    optimizer's ``last`` plus ``n_collected``.  Defaults: rank 20 (Maddox et al. Sec. 4; the paper's
    reference setting), sample ``scale`` 1 (the paper uses 0.5 for some experiments).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rank: int = 20,  # Maddox et al. 2019; seed reference setting
        collect_every: int = 1,
        start_step: int = 0,
        diag_only: bool = False,
        var_clamp: float = 1e-30,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer instance, got {type(optimizer).__name__}"
            )
        for name, v, lo in (
            ("rank", rank, 0),
            ("collect_every", collect_every, 1),
            ("start_step", start_step, 0),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if not diag_only and rank < 2:
            raise ValueError(
                "full SWAG needs rank >= 2 (the deviation term divides by K - 1); use diag_only=True"
            )
        check_nonneg("var_clamp", var_clamp)
        self.optimizer = optimizer
        self.rank = rank
        self.collect_every = collect_every
        self.start_step = start_step
        self.diag_only = diag_only
        self.var_clamp = var_clamp
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        dev = self.params[0].device if self.params else None
        self.generator, self.seed = resolve_generator(seed, generator, dev)
        self.n_steps = 0
        self.n_collected = 0
        self._mean: torch.Tensor | None = None
        self._sq_mean: torch.Tensor | None = None
        self._devs: deque[torch.Tensor] = deque(maxlen=max(rank, 1))
        self.last: dict[str, Any] = {}
        self.config = dict(rank=rank, collect_every=collect_every, start_step=start_step, diag_only=diag_only,
                           seed=self.seed, optimizer=type(optimizer).__name__)  # fmt: skip

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def step(self, closure: Callable[..., Any] | None = None) -> Any:
        loss = self.optimizer.step(closure)
        self.n_steps += 1
        if self.n_steps > self.start_step and (self.n_steps - self.start_step) % self.collect_every == 0:
            self.collect()
        self.last = dict(getattr(self.optimizer, "last", {}))
        self.last["n_collected"] = self.n_collected
        return loss

    @torch.no_grad()
    def collect(self) -> None:
        """Add the current weights to the running moments (Maddox et al. 2019, Alg. 1)."""
        w = self._flat().clone()
        n = self.n_collected
        if self._mean is None:
            self._mean, self._sq_mean = w.clone(), w.square()
        else:
            self._mean.mul_(n / (n + 1)).add_(w / (n + 1))
            self._sq_mean.mul_(n / (n + 1)).add_(w.square() / (n + 1))
        self.n_collected = n + 1
        if self.rank > 0:
            self._devs.append(w - self._mean)

    def _require(self) -> None:
        if self._mean is None:
            raise RuntimeError("SWAG has not collected any weights yet: run some steps (or call collect())")

    @property
    def mean(self) -> torch.Tensor:
        self._require()
        return self._mean.clone()

    @property
    def sq_mean(self) -> torch.Tensor:
        self._require()
        return self._sq_mean.clone()

    @property
    def variance(self) -> torch.Tensor:
        """``max(theta2_bar - theta_bar^2, var_clamp)`` (diagonal covariance)."""
        self._require()
        return torch.clamp(self._sq_mean - self._mean.square(), min=self.var_clamp)

    @property
    def deviations(self) -> torch.Tensor:
        """``p x K`` matrix of the last ``K <= rank`` deviations ``theta_i - theta_bar_i``."""
        self._require()
        if not self._devs:
            return self._mean.new_zeros(self._mean.numel(), 0)
        return torch.stack(list(self._devs), dim=1)

    def sample_weights(
        self, generator: torch.Generator | None = None, scale: float = 1.0, diag_only: bool | None = None
    ) -> torch.Tensor:
        """A flat weight vector drawn from the SWAG posterior (formula in the module docstring).

        Draws ``z1`` (``p`` values) then, for full SWAG, ``z2`` (``K`` values) from the generator.
        """
        check_nonneg("scale", scale)
        self._require()
        gen = generator if generator is not None else self.generator
        diag = self.diag_only if diag_only is None else diag_only
        mean = self._mean
        z1 = torch.randn(mean.shape, generator=gen, dtype=mean.dtype, device=mean.device)
        sd = self.variance.sqrt()
        k = len(self._devs)
        if diag or k < 2:
            return mean + scale * sd * z1
        z2 = torch.randn((k,), generator=gen, dtype=mean.dtype, device=mean.device)
        return mean + scale * (sd * z1 / math.sqrt(2.0) + self.deviations @ z2 / math.sqrt(2.0 * (k - 1)))

    def sample(
        self, generator: torch.Generator | None = None, scale: float = 1.0, diag_only: bool | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager: parameters set to a SWAG sample; restored bit-exactly on exit."""
        return _weights_set_to(self.params, self.sample_weights(generator, scale, diag_only))

    def swa(self) -> contextlib.AbstractContextManager[None]:
        """Context manager: parameters set to the SWA mean ``theta_bar``."""
        return _weights_set_to(self.params, self.mean)

    def bayesian_model_average(
        self,
        model: nn.Module,
        inputs: Any,
        samples: int = 30,  # paper reference setting: 30 posterior samples
        generator: torch.Generator | None = None,
        scale: float = 1.0,
    ) -> torch.Tensor:
        """Average predictive probabilities over ``samples`` SWAG draws (BatchNorm: eval mode)."""
        check_positive("samples", samples, integer=True)
        self._require()
        return _ensemble_average(
            model, inputs, (lambda: self.sample(generator, scale) for _ in range(samples))
        )

    def state_dict(self) -> dict[str, Any]:
        sd = {
            "optimizer": self.optimizer.state_dict(),
            "optimizer_wrapped": type(self.optimizer).__name__,
            "n_steps": self.n_steps,
            "n_collected": self.n_collected,
            "mean": self._mean,
            "sq_mean": self._sq_mean,
            "devs": list(self._devs),
        }
        return tag_state_dict(sd, self, self.optimizer.param_groups)

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        keys = ("optimizer", "n_steps", "n_collected", "mean", "sq_mean", "devs")
        sd = check_state_dict(sd, self, self.optimizer.param_groups, required=keys)
        wrapped = sd.get("optimizer_wrapped")
        if wrapped is not None and wrapped != type(self.optimizer).__name__:
            raise ValueError(
                f"SWAG.load_state_dict: the state dict wraps a {wrapped}, this SWAG wraps a "
                f"{type(self.optimizer).__name__}"
            )
        p = sum(q.numel() for q in self.params)
        for key in ("mean", "sq_mean"):
            t = sd[key]
            if t is not None and (not isinstance(t, torch.Tensor) or t.numel() != p):
                got = t.numel() if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"SWAG.load_state_dict: {key!r} has {got} entries, the parameters have {p}; it was "
                    "saved for another model"
                )
        if any(not isinstance(d, torch.Tensor) or d.numel() != p for d in sd["devs"]):
            raise ValueError(f"SWAG.load_state_dict: 'devs' must be tensors of {p} entries (another model?)")
        self.optimizer.load_state_dict(sd["optimizer"])
        self.n_steps, self.n_collected = sd["n_steps"], sd["n_collected"]
        self._mean, self._sq_mean = sd["mean"], sd["sq_mean"]
        self._devs = deque(sd["devs"], maxlen=max(self.rank, 1))


def f_swag(
    params: Any,
    base_optimizer: Any = torch.optim.SGD,
    rho: float = 0.05,  # paper reference setting (CIFAR-10; 0.1 for CIFAR-100)
    *,
    rank: int = 20,
    collect_every: int = 1,
    start_step: int = 0,
    diag_only: bool = False,
    seed: int | None = None,
    model: nn.Module | None = None,
    **base_kwargs: Any,
) -> SWAG:
    """F-SWAG (``diag_only=False``) / F-SWAG-Diag: SWAG moments of SAM-trained weights (paper Sec. 4)."""
    sam = SAM(params, base_optimizer, rho, model=model, **base_kwargs)
    return SWAG(
        sam, rank=rank, collect_every=collect_every, start_step=start_step, diag_only=diag_only, seed=seed
    )
