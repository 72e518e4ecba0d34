"""The runner's learning-rate schedules: ``train.schedule`` as a factor of the base rate per step.

``cosine`` (``0.5 (1 + cos(pi t / T))``, Loshchilov & Hutter 2017, annealed to zero or to
``train.min_lr``), ``step`` (times ``gamma`` at each milestone), ``swa`` (Izmailov et al. 2018),
``constant``, each after an optional linear warm-up; ``none`` leaves the rate to the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["FactorSchedule", "NoSchedule", "lr_factor"]


def lr_factor(step: int, steps_per_epoch: int, train_cfg: dict[str, Any]) -> float:
    """Multiplier of the base learning rate at optimizer step ``step`` (0-based).

    ``swa``: the schedule of Izmailov et al. 2018 (SWA) and Maddox et al. 2019 (SWAG): constant
    for the first half of ``swa_start`` epochs, linear to ``swa_lr / lr`` until 90 % of it, then
    constant (per epoch). Milestones below 1 are fractions of the run; epoch-valued settings are
    scaled by ``epoch_scale`` (set by the budget).
    """
    t = step / steps_per_epoch  # epochs done, fractional
    total = train_cfg["epochs"]
    scale = train_cfg.get("epoch_scale", 1.0)
    kind = train_cfg["schedule"]
    if kind == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * min(t, total) / total))
        if train_cfg.get("min_lr", 0.0) > 0:  # annealed to min_lr, not zero (CosineAnnealingLR's eta_min)
            floor = train_cfg["min_lr"] / train_cfg["lr"]
            f = floor + (1.0 - floor) * f
    elif kind == "step":
        ms = [m * total if m < 1 else m * scale for m in train_cfg["milestones"]]
        f = train_cfg["gamma"] ** sum(1 for m in ms if t >= m)
    elif kind == "swa":
        u = math.floor(t) / (train_cfg["swa_start"] * scale)
        ratio = train_cfg["swa_lr"] / train_cfg["lr"] if train_cfg["lr"] > 0 else 1.0
        f = 1.0 if u <= 0.5 else 1.0 - (1.0 - ratio) * (u - 0.5) / 0.4 if u <= 0.9 else ratio
    else:
        f = 1.0
    warm = train_cfg["warmup_epochs"] * scale * steps_per_epoch
    if warm > 0 and step < warm:
        f *= (step + 1) / warm
    return f


class NoSchedule:
    """``train.schedule = "none"``: no scheduler touches the learning rate."""

    def step(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        pass


class FactorSchedule:
    """``lr = base_lr * factor(step)`` per param group after every optimizer step: the arithmetic of
    ``torch.optim.lr_scheduler.LambdaLR`` (the same products, the same ``initial_lr`` in the groups,
    the same ``state_dict`` keys, so checkpoints written with ``LambdaLR`` load) without its per-step
    bookkeeping, which was 1.5 % of a small network's SGD step on a CPU (issue 25)."""

    def __init__(self, optimizer: torch.optim.Optimizer, factor: Callable[[int], float]) -> None:
        self.optimizer = optimizer
        self.lr_lambdas = [factor] * len(optimizer.param_groups)
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = 0
        self._set_lrs()

    def _set_lrs(self) -> None:
        t = self.last_epoch
        for group, base, factor in zip(self.optimizer.param_groups, self.base_lrs, self.lr_lambdas):
            group["lr"] = base * factor(t)

    def step(self) -> None:
        self.last_epoch += 1
        self._set_lrs()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {
            "base_lrs": list(self.base_lrs),
            "last_epoch": self.last_epoch,
            "_step_count": self.last_epoch + 1,
            "lr_lambdas": [None] * len(self.lr_lambdas),
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """As ``LambdaLR.load_state_dict``: the step and base rates (the group rates come with the
        optimizer's own state)."""
        self.base_lrs = list(sd["base_lrs"])
        self.last_epoch = int(sd["last_epoch"])
