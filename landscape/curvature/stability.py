"""Stability thresholds of optimizers on a quadratic, and Adam's preconditioner.

Why: full-batch gradient descent with step size ``eta`` on a quadratic diverges along any direction
of curvature above ``2 / eta``; on neural networks the sharpness first rises ("progressive
sharpening") and then hovers at ``2 / eta`` while the loss keeps decreasing non-monotonically, the
*edge of stability* (Cohen, Kaur, Li, Kolter & Talwalkar, "Gradient descent on neural networks
typically occurs at the edge of stability", ICLR 2021, Sec. 3).  The thresholds are the largest
curvature ``a`` for which the optimizer is stable on ``a x^2 / 2`` (:func:`stability_threshold`):

* gradient descent: ``2 / lr``;
* heavy-ball momentum ``beta`` in PyTorch's form ``b <- beta b + (1 - dampening) g``,
  ``x <- x - lr b``: ``(2 + 2 beta) / ((1 - dampening) lr)``;
* Nesterov momentum: ``(2 + 2 beta) / ((1 + 2 beta) lr)``
  (Cohen et al. 2021 state both, without dampening, in their appendix on momentum; they are the
  roots at -1 of the characteristic polynomials, and the tests confirm them on ``torch.optim.SGD``);
* Adam: the preconditioned sharpness ``lambda_max(P^{-1} H)`` against ``(2 + 2 beta1) / ((1 - beta1) lr)``
  (``38 / lr`` for ``beta1 = 0.9``), with the preconditioner *including both bias corrections*,
  ``P = (1 - beta1^t) diag(sqrt(v_t / (1 - beta2^t)) + eps)``, so that Adam's step is exactly
  ``x <- x - lr P^{-1} m_t`` with the EMA momentum ``m_t`` (Cohen, Ghorbani, Krishnan, Agarwal,
  Medapati, Badura, Suo, Cardoze, Nado, Dahl & Gilmer, "Adaptive gradient methods at the edge of
  stability", 2022, Sec. 2 and 3).  ``v_t`` is ``exp_avg_sq`` (``max_exp_avg_sq`` with
  ``amsgrad``) and ``t`` the optimizer's ``step`` after the last update: the preconditioner the
  next step would use if ``v`` were frozen.  ``P^{-1} H`` is similar to the symmetric
  ``P^{-1/2} H P^{-1/2}``, whose top eigenvalue Lanczos computes.

Used by :class:`landscape.curvature.monitor.CurvatureMonitor` (and importable from there).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["ADAM", "Preconditioned", "adam_preconditioner", "stability_threshold"]

ADAM = (torch.optim.Adam, torch.optim.AdamW)


# --------------------------------------------------------------------------------------------
# stability thresholds
# --------------------------------------------------------------------------------------------
def _common(groups: list[dict[str, Any]], key: str, default: float = 0.0) -> float | None:
    """The value of ``key`` shared by all ``groups`` (as a float), or None if they differ."""
    values = {float(g.get(key, default)) for g in groups}
    return values.pop() if len(values) == 1 else None


def stability_threshold(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor] | None = None
) -> dict[str, Any]:
    """The curvature above which ``optimizer`` is unstable on a quadratic (see the module docstring)
    for ``torch.optim.SGD`` (plain, heavy ball, Nesterov), ``Adam`` and ``AdamW``, over the groups
    holding ``params`` (default: all groups).

    Returns ``{"value", "applies_to", "rule", "lr"}``: ``applies_to`` is ``"lambda_max"`` or
    ``"precond_lambda_max"``; ``value`` is None for other optimizers and for groups that disagree
    on the hyperparameters the threshold depends on (``rule`` says why).
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    ids = None if params is None else {id(p) for p in params}
    groups = [g for g in optimizer.param_groups if ids is None or any(id(q) in ids for q in g["params"])]
    if not groups:
        raise ValueError("none of the given parameters is in the optimizer's parameter groups")
    lr = _common(groups, "lr", math.nan)
    out: dict[str, Any] = {"value": None, "applies_to": None, "rule": "", "lr": lr}
    if isinstance(optimizer, torch.optim.SGD):
        mom, damp = _common(groups, "momentum"), _common(groups, "dampening")
        nest = {bool(g.get("nesterov", False)) for g in groups}
        if lr is None or mom is None or damp is None or len(nest) != 1:
            out["rule"] = "SGD parameter groups differ in lr/momentum/dampening/nesterov: no single threshold"
            return out
        out["applies_to"] = "lambda_max"
        if mom == 0.0:
            out.update(value=2.0 / lr, rule="2/lr (gradient descent)")
        elif nest.pop():
            out.update(value=(2 + 2 * mom) / ((1 + 2 * mom) * lr), rule="(2+2m)/((1+2m) lr) (Nesterov)")
        else:
            out.update(value=(2 + 2 * mom) / ((1 - damp) * lr), rule="(2+2m)/((1-d) lr) (heavy ball)")
        return out
    if isinstance(optimizer, ADAM):
        betas = {tuple(float(b) for b in g["betas"]) for g in groups}
        if lr is None or len(betas) != 1:
            out["rule"] = "Adam parameter groups differ in lr/betas: no single threshold"
            return out
        b1 = betas.pop()[0]
        out.update(
            value=(2 + 2 * b1) / ((1 - b1) * lr),
            applies_to="precond_lambda_max",
            rule="(2+2 beta1)/((1-beta1) lr) for lambda_max(P^-1 H) (Adam, Cohen et al. 2022)",
        )
        return out
    out["rule"] = f"no known threshold for {type(optimizer).__name__}"
    return out


# --------------------------------------------------------------------------------------------
# Adam preconditioner
# --------------------------------------------------------------------------------------------
def adam_preconditioner(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> torch.Tensor | None:
    """The diagonal of ``P = (1 - beta1^t) (sqrt(v_t / (1 - beta2^t)) + eps)`` (Cohen et al. 2022)
    over ``params`` (flattened, float64, CPU), or None before the optimizer's first step."""
    if not isinstance(optimizer, ADAM):
        raise TypeError(
            f"the preconditioned sharpness needs torch.optim.Adam/AdamW, got {type(optimizer).__name__}"
        )
    group_of = {id(q): g for g in optimizer.param_groups for q in g["params"]}
    if any(id(p) not in group_of for p in params):
        raise ValueError("a parameter is not in the optimizer's parameter groups; pass the optimised ones")
    parts = []
    for p in params:
        g = group_of[id(p)]
        st = optimizer.state.get(p, {})
        key = "max_exp_avg_sq" if g.get("amsgrad", False) else "exp_avg_sq"
        if key not in st or "step" not in st:
            return None
        t = float(st["step"])
        b1, b2 = (float(b) for b in g["betas"])
        v = st[key].detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        parts.append((1 - b1**t) * (torch.sqrt(v / (1 - b2**t)) + float(g["eps"])))
    return torch.cat(parts)


class Preconditioned:
    """The symmetric ``D H D`` with ``D = P^{-1/2}``: same eigenvalues as ``P^{-1} H``."""

    def __init__(self, H: Any, pdiag: torch.Tensor) -> None:
        self.H = H
        self.d = pdiag.rsqrt().to(device=H.device)
        self.shape, self.dtype, self.device = H.shape, torch.float64, H.device

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        DV = self.d[:, None] * V.to(dtype=torch.float64)
        return self.d[:, None] * self.H.matmat(DV.to(self.H.dtype)).to(torch.float64)
