"""Flat-seeking Bayesian methods (seed ``flat_seeking_bnn.txt``): F-SWAG, F-SWAG-Diag, F-SGLD.

The "F-" version of a posterior method replaces its gradient by the SAM gradient
``grad L(w + rho g/||g||)`` (seed Sec. 3-4, ``specs/optimizers.md``).  Here:

* :class:`SWAG` wraps *any* optimizer (plain SGD gives SWAG, :class:`optimizers.SAM` gives
  F-SWAG) and collects, every ``collect_every`` steps after ``start_step``, the running mean
  ``theta_bar``, the running second moment ``theta2_bar`` (diagonal) and the last ``rank``
  deviations ``theta_i - theta_bar_i`` (Maddox et al. 2019, "A simple baseline for Bayesian
  uncertainty in deep learning", Alg. 1).  Sampling (Maddox et al. eq. 1 and Sec. 4.2):

      SWAG-Diag:  theta = theta_bar + scale * Sigma_diag^{1/2} z
      SWAG:       theta = theta_bar + scale * (Sigma_diag^{1/2} z1 / sqrt(2) + D z2 / sqrt(2 (K - 1)))

  with ``Sigma_diag = max(theta2_bar - theta_bar^2, var_clamp)`` and ``D`` the ``p x K`` deviation
  matrix.  :func:`f_swag` builds ``SWAG(SAM(...))`` (reference settings: ``rho = 0.05`` CIFAR-10,
  rank 20, 30 posterior samples).
* :class:`FlatSGLD` is SGLD (Welling & Teh 2011) whose gradient is SAM's: with the mean loss ``L``,
  ``N = num_data`` and prior precision ``lambda``::

      w <- w - lr * (grad L(w + eps) + lambda w / N) + sqrt(2 lr T / N) z,   z ~ N(0, I)

  i.e. Langevin dynamics with step ``lr / N`` on the energy ``U = N L + lambda ||w||^2 / 2``
  (noise ``sqrt(2 (lr/N) T)``), whose stationary law is ``exp(-U / T)``: ``T = 1`` is the Bayesian
  posterior, ``T < 1`` a cold posterior.  ``rho = 0`` gives plain SGLD.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from optimizers._posterior import (
    check_nonneg,
    check_num_data,
    check_positive,
    probabilities,
    resolve_generator,
)
from optimizers.sam import SAM

__all__ = ["SWAG", "f_swag", "FlatSGLD"]


def _forward(model: nn.Module, inputs: Any) -> torch.Tensor:
    out = model(inputs)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model(inputs) must return a logits tensor, got {type(out).__name__}")
    return out


@contextlib.contextmanager
def _weights_set_to(params: list[torch.Tensor], flat: torch.Tensor) -> Iterator[None]:
    """Temporarily write a flat vector into ``params``; restore the old values bit-exactly."""
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        yield
    finally:
        with torch.no_grad():
            for p, old in zip(params, saved):
                p.copy_(old)


def _ensemble_average(
    model: nn.Module, inputs: Any, weight_sets: Iterator[Callable[[], Any]]
) -> torch.Tensor:
    was_training = {m: m.training for m in model.modules()}
    total, count = None, 0
    try:
        model.eval()
        with torch.no_grad():
            for ctx in weight_sets:
                with ctx():
                    probs = probabilities(_forward(model, inputs))
                total = probs.clone() if total is None else total + probs
                count += 1
    finally:
        for m, mode in was_training.items():
            m.training = mode
    if total is None:
        raise ValueError("no ensemble members: collect some weights first")
    return total / count


class SWAG:
    """SWAG / SWAG-Diag moment collector around any optimizer (Maddox et al. 2019, Alg. 1).

    ``SWAG(optimizer, rank=20, collect_every=1, start_step=0, diag_only=False, var_clamp=1e-30)``.
    ``step(closure)`` steps the wrapped optimizer and, on every ``collect_every``-th step after
    ``start_step`` steps, calls :meth:`collect` (which you may also call yourself, e.g. once per
    epoch as in the paper).  Statistics are kept as flat float vectors over all parameters of the
    optimizer's param groups, in order.

    Attributes after collection: ``n_collected``, :attr:`mean`, :attr:`sq_mean`, :attr:`variance`,
    :attr:`deviations` (``p x K`` matrix, oldest column first).  ``self.last`` mirrors the wrapped
    optimizer's ``last`` plus ``n_collected``.  Defaults: rank 20 (Maddox et al. Sec. 4; seed's
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
        samples: int = 30,  # seed reference setting: 30 posterior samples
        generator: torch.Generator | None = None,
        scale: float = 1.0,
    ) -> torch.Tensor:
        """Average predictive probabilities over ``samples`` SWAG draws (BatchNorm: eval mode)."""
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        self._require()
        return _ensemble_average(
            model, inputs, (lambda: self.sample(generator, scale) for _ in range(samples))
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "n_steps": self.n_steps,
            "n_collected": self.n_collected,
            "mean": self._mean,
            "sq_mean": self._sq_mean,
            "devs": list(self._devs),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(sd["optimizer"])
        self.n_steps, self.n_collected = sd["n_steps"], sd["n_collected"]
        self._mean, self._sq_mean = sd["mean"], sd["sq_mean"]
        self._devs = deque(sd["devs"], maxlen=max(self.rank, 1))


def f_swag(
    params: Any,
    base_optimizer: Any = torch.optim.SGD,
    rho: float = 0.05,  # seed reference setting (CIFAR-10; 0.1 for CIFAR-100)
    *,
    rank: int = 20,
    collect_every: int = 1,
    start_step: int = 0,
    diag_only: bool = False,
    seed: int | None = None,
    model: nn.Module | None = None,
    **base_kwargs: Any,
) -> SWAG:
    """F-SWAG (``diag_only=False``) / F-SWAG-Diag: SWAG moments of SAM-trained weights (seed Sec. 4)."""
    sam = SAM(params, base_optimizer, rho, model=model, **base_kwargs)
    return SWAG(
        sam, rank=rank, collect_every=collect_every, start_step=start_step, diag_only=diag_only, seed=seed
    )


class FlatSGLD(SAM):
    """F-SGLD: SAM gradient + Langevin noise (seed ``flat_seeking_bnn.txt``; Welling & Teh 2011).

    ``FlatSGLD(params, lr, num_data, rho=0.05, temperature=1.0, prior_precision=1.0,
    burn_in=0, collect_every=1, max_samples=30, seed=None, generator=None, model=None, m=1)``.
    Update in the module docstring.  The noise ``z`` is drawn after the SAM/SGD step, parameter by
    parameter in ``param_groups`` order, only for parameters that received a gradient.  After
    ``burn_in`` steps, every ``collect_every``-th iterate is stored (at most ``max_samples``, the
    newest kept) for :meth:`bayesian_model_average`.  ``self.last`` adds ``noise_std`` and
    ``n_samples`` to SAM's entries.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        num_data: int,
        rho: float = 0.05,  # seed reference setting (CIFAR-10)
        temperature: float = 1.0,
        prior_precision: float = 1.0,
        *,
        burn_in: int = 0,
        collect_every: int = 1,
        max_samples: int = 30,  # seed: 30 posterior samples
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        m: int = 1,
    ) -> None:
        check_num_data(num_data)
        check_nonneg("temperature", temperature)
        check_nonneg("prior_precision", prior_precision)
        check_positive("lr", lr)
        for name, v, lo in (
            ("burn_in", burn_in, 0),
            ("collect_every", collect_every, 1),
            ("max_samples", max_samples, 1),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        super().__init__(params, torch.optim.SGD, rho, model=model, m=m, lr=lr)
        self.num_data = num_data
        self.temperature = float(temperature)
        self.prior_precision = float(prior_precision)
        self.burn_in, self.collect_every = burn_in, collect_every
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.samples: deque[list[torch.Tensor]] = deque(maxlen=max_samples)
        self.n_steps = 0

    def _adjust_descent(self) -> None:
        if self.prior_precision:
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.add_(p.detach(), alpha=self.prior_precision / self.num_data)

    def _extra_state(self) -> dict[str, Any]:
        return {"rng_state": self.generator.get_state(), "n_steps": self.n_steps}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        if "rng_state" in extra:
            self.generator.set_state(extra["rng_state"])
        self.n_steps = extra.get("n_steps", 0)

    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor:  # type: ignore[override]
        loss = super().step(closure)
        stds = []
        for g in self.param_groups:
            std = math.sqrt(2.0 * g["lr"] * self.temperature / self.num_data)
            stds.append(std)
            for p in g["params"]:
                if p.grad is not None:
                    p.add_(
                        torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device),
                        alpha=std,
                    )
        self.n_steps += 1
        if self.n_steps > self.burn_in and (self.n_steps - self.burn_in) % self.collect_every == 0:
            self.samples.append([p.detach().clone() for g in self.param_groups for p in g["params"]])
        self.last["noise_std"] = stds[0] if len(stds) == 1 else stds
        self.last["n_samples"] = len(self.samples)
        return loss

    def bayesian_model_average(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        """Average predictive probabilities over the stored iterates (eval mode, model restored)."""
        params = [p for g in self.param_groups for p in g["params"]]
        flats = [torch.cat([t.reshape(-1) for t in s]) for s in self.samples]
        return _ensemble_average(model, inputs, (lambda f=f: _weights_set_to(params, f) for f in flats))
