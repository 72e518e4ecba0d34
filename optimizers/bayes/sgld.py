"""F-SGLD: SGLD (Welling & Teh 2011) whose gradient is SAM's (Nguyen et al. 2023, "Flat seeking
Bayesian neural networks", Sec. 3-4 and the authors' code).

Two modes, selected by ``schedule`` and ``noise`` (equations and sources in
``docs/methods/optimizers.md``):

* **official** (the default when no ``lr`` is given) -- what the authors' F-SGLD code runs
  (flat_bnn, ``sgld/train_sgld.py`` and ``sam.py``): SAM-SGD with momentum 0.9 and weight decay,
  learning rate ``lr(e) = min(0.2, 0.2 / (0.1 + e)^0.55)`` set at the start of epoch ``e``, and
  after each base step the noise ``5e-4 * 38.0348 / (13928.7 + t)^0.9 * z`` (``t`` the step
  count, ``z ~ N(0, I)``): about ``3.5e-6`` per coordinate at ``t = 0`` and ``4.7e-7`` after 300
  CIFAR epochs (``t = 117,300``), independent of the learning rate and of ``N``;
* **SGLD baseline** (``schedule="polynomial"``) -- the authors' plain SGLD row: the step size
  ``lr_t = 10 / (1000 + t)^0.9`` of Welling & Teh's polynomial decay at step ``t`` and noise of
  standard deviation ``0.1 * lr_t`` after each base step (0.01995 and 1.995e-3 at ``t = 0``);
  with ``rho = 0`` this is the SGLD row of the flat-seeking paper's tables;
* **Langevin** (the default when ``lr`` is given) -- the Langevin-correct sampler::

      w <- w - lr * (grad L(w + eps) + lambda w / N) + sqrt(2 lr T / N) z,   z ~ N(0, I)

  i.e. Langevin dynamics with step ``lr / N`` on ``U = N L + lambda ||w||^2 / 2`` whose stationary
  law is ``exp(-U / T)`` (``T = 1`` the posterior, ``T < 1`` a cold posterior); no momentum.

At ``lr = 0.2`` and ``N = 50,000`` the Langevin noise ``sqrt(2 * 0.2 / 50,000) = 2.8e-3`` is about
800 times the official one.  ``rho = 0`` gives plain SGLD in either mode.
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

__all__ = ["FlatSGLD", "official_lr", "official_noise_std", "polynomial_lr"]

# authors' code (flat_bnn): sgld/train_sgld.py ``schedule`` and sam.py ``SAM.get_noise``
OFFICIAL_PEAK_LR = 0.2
OFFICIAL_LR_POWER = 0.55
OFFICIAL_NOISE = (5e-4, 38.0348, 13928.7, 0.9)  # factor, a, b, power (WideResNet28x10 constants)
OFFICIAL_MOMENTUM = 0.9  # train_sgld.py --momentum default
OFFICIAL_WEIGHT_DECAY = 1e-4  # train_sgld.py --wd default
# the authors' SGLD baseline: lr_t = a / (b + t)^gamma per step, noise std = factor * lr_t
SGLD_DECAY = (10.0, 1000.0, 0.9)
SGLD_NOISE_FACTOR = 0.1


def official_lr(epoch: float, peak: float = OFFICIAL_PEAK_LR) -> float:
    """Learning rate of epoch ``epoch`` in the authors' F-SGLD code: ``peak * min(1, (0.1 + e)^-0.55)``.

    With the default ``peak = 0.2`` this is ``min(0.2, 0.2 / (0.1 + e)^0.55)``: 0.2 at ``e = 0``
    (capped), 0.18979 at ``e = 1``, 0.05606 at ``e = 10``.
    """
    check_nonneg("epoch", epoch)
    return peak * min(1.0, (0.1 + epoch) ** -OFFICIAL_LR_POWER)


def polynomial_lr(step: float, decay: tuple[float, float, float] = SGLD_DECAY) -> float:
    """Step size ``a / (b + t)^gamma`` at step ``t`` (Welling & Teh 2011, Sec. 3), ``decay = (a, b,
    gamma)``; the default is the flat-seeking authors' SGLD baseline: 0.019952 at ``t = 0``,
    0.010692 at ``t = 1000``."""
    check_nonneg("step", step)
    a, b, gamma = decay
    return a / (b + step) ** gamma


def official_noise_std(step: float) -> float:
    """Per-coordinate noise standard deviation at step ``t`` in the authors' F-SGLD code.

    ``5e-4 * 38.0348 / (13928.7 + t)^0.9``: 3.54e-6 at ``t = 0``, 4.7e-7 at ``t = 117,300``
    (300 epochs of 391 CIFAR batches).
    """
    check_nonneg("step", step)
    factor, a, b, power = OFFICIAL_NOISE
    return factor * a / (b + step) ** power


class FlatSGLD(SAM):
    """F-SGLD: SAM gradient + Langevin-type noise (Nguyen et al. 2023; Welling & Teh 2011).

    ``FlatSGLD(params, lr=None, num_data=None, rho=0.05, temperature=1.0, prior_precision=None, *,
    schedule=None, noise=None, momentum=None, weight_decay=None, start_epoch=1,
    steps_per_epoch=None, burn_in=0, collect_every=1, max_samples=30, seed=None, generator=None,
    model=None, m=1)``.  The two modes are described in the module docstring.

    Args:
        lr: ``None`` selects the official schedule with its peak 0.2; a number is the constant
            step of the Langevin mode (or the peak of ``schedule="official"`` if that is asked
            for explicitly).
        num_data: ``N``; needed by ``noise="langevin"`` and by ``prior_precision``.
        rho: SAM radius, default 0.05 (authors' CIFAR-10 setting; 0.1 for CIFAR-100).
        temperature: ``T``; multiplies the noise variance in both modes (1 leaves the official
            noise as it is).
        prior_precision: ``lambda``, the prior/weight-decay term ``lambda w / N``.  Default: 1.0 in
            the Langevin mode; in the official mode the weight decay ``1e-4`` of the authors'
            script (``weight_decay=``, equivalently ``lambda = 1e-4 N``).
        schedule: ``"official"`` (``lr(e)`` above, updated at each epoch), ``"polynomial"``
            (:func:`polynomial_lr` of the step count with ``lr_decay``, the SGLD baseline; no
            ``lr``) or ``"constant"``.  Default: ``"official"`` without ``lr``, ``"constant"``
            with it.
        noise: ``"official"`` (``official_noise_std(t)``), ``"proportional"``
            (``noise_factor * lr_t``) or ``"langevin"`` (``sqrt(2 lr T / N)``).  Default:
            ``"official"`` with the official schedule, ``"proportional"`` with the polynomial one,
            ``"langevin"`` otherwise.
        lr_decay: ``(a, b, gamma)`` of the polynomial schedule; default ``(10, 1000, 0.9)``.
        noise_factor: the proportional noise's factor; default 0.1.
        momentum: SGD momentum; default 0.9 with the official or proportional noise (the
            authors' script), 0 with the Langevin noise (which is calibrated for plain SGD).
        weight_decay: SGD weight decay, an alternative to ``prior_precision`` (not both).
        start_epoch: the epoch whose learning rate the first step uses.  Default 1: the authors'
            loop performs no update in epoch 0, so its first step uses ``lr(1)``.
        steps_per_epoch: if given, epochs advance automatically; otherwise call
            :meth:`on_epoch_end` after every epoch.
        burn_in, collect_every, max_samples: after ``burn_in`` steps every ``collect_every``-th
            iterate is stored (at most ``max_samples``, newest kept) for
            :meth:`bayesian_model_average`.  (The authors collect one model per epoch from epoch
            161 of 300 and keep all.)

    The noise is drawn after the SAM/SGD step, parameter by parameter in ``param_groups`` order,
    only for parameters that received a gradient.  ``self.last`` adds ``noise_std``, ``lr``,
    ``epoch`` and ``n_samples`` to SAM's entries; ``self.config`` records the mode.
    """

    def __init__(
        self,
        params: Any,
        lr: float | None = None,
        num_data: int | None = None,
        rho: float = 0.05,  # authors' CIFAR-10 setting
        temperature: float = 1.0,
        prior_precision: float | None = None,
        *,
        schedule: str | None = None,
        noise: str | None = None,
        lr_decay: tuple[float, float, float] = SGLD_DECAY,
        noise_factor: float = SGLD_NOISE_FACTOR,
        momentum: float | None = None,
        weight_decay: float | None = None,
        start_epoch: int = 1,
        steps_per_epoch: int | None = None,
        burn_in: int = 0,
        collect_every: int = 1,
        max_samples: int = 30,  # paper: 30 posterior samples
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        m: int = 1,
    ) -> None:
        schedule = schedule if schedule is not None else ("official" if lr is None else "constant")
        if schedule not in ("official", "polynomial", "constant"):
            raise ValueError(f"schedule must be 'official', 'polynomial' or 'constant', got {schedule!r}")
        default_noise = {"official": "official", "polynomial": "proportional"}.get(schedule, "langevin")
        noise = noise if noise is not None else default_noise
        if noise not in ("official", "proportional", "langevin"):
            raise ValueError(f"noise must be 'official', 'proportional' or 'langevin', got {noise!r}")
        if lr is None and schedule == "constant":
            raise ValueError("schedule='constant' needs lr=; pass a step size (e.g. lr=0.1)")
        if lr is not None and schedule == "polynomial":
            raise ValueError(
                "schedule='polynomial' sets the step size from lr_decay=(a, b, gamma) as a / (b + t)^gamma; "
                "do not also pass lr="
            )
        if len(lr_decay) != 3 or any(not isinstance(v, (int, float)) or v <= 0 for v in lr_decay):
            raise ValueError(f"lr_decay must be three positive numbers (a, b, gamma), got {lr_decay!r}")
        lr_decay = tuple(float(v) for v in lr_decay)
        check_nonneg("noise_factor", noise_factor)
        peak = (
            (lr_decay[0] / lr_decay[1] ** lr_decay[2] if schedule == "polynomial" else OFFICIAL_PEAK_LR)
            if lr is None
            else lr
        )
        check_positive("lr", peak)
        if num_data is not None:
            check_num_data(num_data)
        check_nonneg("temperature", temperature)
        if noise == "langevin" and num_data is None:
            raise ValueError("noise='langevin' needs num_data= (the noise is sqrt(2 lr T / N))")
        if prior_precision is not None and weight_decay is not None:
            raise ValueError("pass prior_precision (lambda, decay lambda/N) or weight_decay, not both")
        if weight_decay is None and prior_precision is None:
            if noise in ("official", "proportional"):
                weight_decay = OFFICIAL_WEIGHT_DECAY
            else:
                prior_precision = 1.0
        if prior_precision is not None:
            check_nonneg("prior_precision", prior_precision)
            if num_data is None:
                raise ValueError("prior_precision needs num_data= (the decay is lambda / N)")
        if weight_decay is not None:
            check_nonneg("weight_decay", weight_decay)
        if momentum is None:
            momentum = 0.0 if noise == "langevin" else OFFICIAL_MOMENTUM
        check_nonneg("momentum", momentum)
        for name, v, lo in (
            ("start_epoch", start_epoch, 0),
            ("burn_in", burn_in, 0),
            ("collect_every", collect_every, 1),
            ("max_samples", max_samples, 1),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
        if steps_per_epoch is not None:
            check_positive("steps_per_epoch", steps_per_epoch, integer=True)
        first_lr = official_lr(start_epoch, peak) if schedule == "official" else peak
        super().__init__(params, torch.optim.SGD, rho, model=model, m=m, lr=first_lr, momentum=momentum)
        for g in self.param_groups:  # a group's own lr is its peak under the official schedule
            g.setdefault("peak_lr", peak if g["lr"] == first_lr else g["lr"])
        self.num_data = num_data
        self.temperature = float(temperature)
        self.prior_precision = None if prior_precision is None else float(prior_precision)
        self.decay = float(weight_decay) if weight_decay is not None else self.prior_precision / num_data
        self.schedule, self.noise = schedule, noise
        self.lr_decay, self.noise_factor = lr_decay, float(noise_factor)
        self.epoch, self.steps_per_epoch = start_epoch, steps_per_epoch
        self.burn_in, self.collect_every = burn_in, collect_every
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.samples: deque[list[torch.Tensor]] = deque(maxlen=max_samples)
        self.n_steps = 0
        self.config = dict(
            schedule=schedule, noise=noise, peak_lr=peak, momentum=momentum, decay=self.decay,
            lr_decay=lr_decay if schedule == "polynomial" else None,
            noise_factor=self.noise_factor if noise == "proportional" else None,
            num_data=num_data, rho=rho, temperature=self.temperature, start_epoch=start_epoch,
            steps_per_epoch=steps_per_epoch, burn_in=burn_in, collect_every=collect_every,
            max_samples=max_samples, seed=self.seed,
        )  # fmt: skip
        self._set_epoch(start_epoch)

    # ---- schedule ---------------------------------------------------------------------------
    def _set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.schedule == "official":
            for g in self.param_groups:
                g["lr"] = official_lr(epoch, g.get("peak_lr", self.config["peak_lr"]))

    def on_epoch_end(self) -> None:
        """Advance to the next epoch (the official schedule sets its learning rate)."""
        if self.steps_per_epoch is not None:
            raise RuntimeError(
                "FlatSGLD was built with steps_per_epoch=, so epochs advance automatically; do not "
                "also call on_epoch_end()"
            )
        self._set_epoch(self.epoch + 1)

    def noise_std(self, group: dict[str, Any]) -> float:
        """Noise standard deviation of the next step for ``group`` (before the temperature)."""
        if self.noise == "official":
            return official_noise_std(self.n_steps)
        if self.noise == "proportional":
            return self.noise_factor * group["lr"]
        return math.sqrt(2.0 * group["lr"] / self.num_data)

    # ---- the step ---------------------------------------------------------------------------
    def _adjust_descent(self) -> None:
        if self.decay:
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.add_(p.detach(), alpha=self.decay)

    def _extra_state(self) -> dict[str, Any]:
        """The generator, counters and the stored iterates (a resumed run averages all of them)."""
        samples = [[t.clone() for t in s] for s in self.samples]
        return {"rng_state": self.generator.get_state(), "n_steps": self.n_steps, "epoch": self.epoch,
                "samples": samples}  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        extra = state_dict.get("extra", {}) if isinstance(state_dict, dict) else {}
        for s in extra.get("samples", []) if isinstance(extra, dict) else []:
            if len(s) != len(params) or any(t.shape != p.shape for t, p in zip(s, params)):
                raise ValueError(
                    "FlatSGLD.load_state_dict: the stored samples do not match the parameters' "
                    "shapes; load a state_dict saved by a FlatSGLD over the same model"
                )
        super().load_state_dict(state_dict)

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        if "rng_state" in extra:
            self.generator.set_state(extra["rng_state"])
        self.n_steps = extra.get("n_steps", 0)
        self.epoch = extra.get("epoch", self.epoch)
        params = [p for g in self.param_groups for p in g["params"]]
        stored = extra.get("samples", [])
        self.samples.clear()
        for s in stored:
            self.samples.append([t.to(device=p.device, dtype=p.dtype).clone() for t, p in zip(s, params)])

    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor:  # type: ignore[override]
        if self.schedule == "polynomial":
            for g in self.param_groups:
                g["lr"] = polynomial_lr(self.n_steps, self.lr_decay)
        stds = [self.noise_std(g) * math.sqrt(self.temperature) for g in self.param_groups]
        lrs = [g["lr"] for g in self.param_groups]
        loss = super().step(closure)
        for g, std in zip(self.param_groups, stds):
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
        self.last["lr"] = lrs[0] if len(lrs) == 1 else lrs
        self.last["epoch"] = self.epoch
        self.last["n_samples"] = len(self.samples)
        if self.steps_per_epoch is not None and self.n_steps % self.steps_per_epoch == 0:
            self._set_epoch(self.epoch + 1)
        return loss

    def bayesian_model_average(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        """Average predictive probabilities over the stored iterates (eval mode, model restored)."""
        params = [p for g in self.param_groups for p in g["params"]]
        flats = [torch.cat([t.reshape(-1) for t in s]) for s in self.samples]
        return _ensemble_average(model, inputs, (lambda f=f: _weights_set_to(params, f) for f in flats))
