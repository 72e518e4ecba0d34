"""F-SGLD: SGLD (Welling & Teh 2011) whose gradient is SAM's (the flat-seeking BNN paper, Sec. 3-4).

:class:`FlatSGLD` is SGLD (Welling & Teh 2011) whose gradient is SAM's: with the mean loss ``L``,
``N = num_data`` and prior precision ``lambda``::

    w <- w - lr * (grad L(w + eps) + lambda w / N) + sqrt(2 lr T / N) z,   z ~ N(0, I)

i.e. Langevin dynamics with step ``lr / N`` on the energy ``U = N L + lambda ||w||^2 / 2``
(noise ``sqrt(2 (lr/N) T)``), whose stationary law is ``exp(-U / T)``: ``T = 1`` is the Bayesian
posterior, ``T < 1`` a cold posterior.  ``rho = 0`` gives plain SGLD.
"""

from __future__ import annotations

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
    check_num_data,
    check_positive,
    resolve_generator,
)
from optimizers.sam.sam import SAM

__all__ = ["FlatSGLD"]


class FlatSGLD(SAM):
    """F-SGLD: SAM gradient + Langevin noise (Nguyen et al. 2023, "Flat seeking Bayesian neural
    networks"; Welling & Teh 2011).

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
        rho: float = 0.05,  # paper reference setting (CIFAR-10)
        temperature: float = 1.0,
        prior_precision: float = 1.0,
        *,
        burn_in: int = 0,
        collect_every: int = 1,
        max_samples: int = 30,  # paper: 30 posterior samples
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
