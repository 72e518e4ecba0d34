"""ShakeDrop regularisation (Yamada, Iwamura, Akiba & Kise 2019, "ShakeDrop regularization for
deep residual learning", IEEE Access), the residual-branch noise of the PyramidNet-272 runs in SAM
(Foret et al. 2021) and Fisher-SAM (Kim et al. 2022, Table 1).

A residual block computes ``x + F(x)``; ShakeDrop replaces ``F(x)`` by ``s * F(x)`` with, per
example (Yamada et al. 2019, Eq. 8),

    forward:   s = b + alpha - b * alpha,   b ~ Bernoulli(p),  alpha ~ U[-1, 1],
    backward:  ds = b + beta - b * beta,    beta ~ U[0, 1]     (the gradient uses another draw),

so a kept branch (``b = 1``) passes unchanged and a dropped one (``b = 0``) is scaled by ``alpha``
forward and ``beta`` backward. At evaluation the branch is multiplied by its expected forward
factor ``E[s] = p`` (Eq. 9): deterministic. ``p`` is the survival probability; for PyramidNet the
paper's linear-decay rule (Sec. 4.1) gives block ``l`` of ``L`` the value
``p_l = 1 - (l / L) (1 - p_L)`` with ``p_L = 0.5`` (:func:`linear_decay_survival`).

The distinct forward and backward factors are written as ``x * g + (x * (f - g)).detach()``:
value ``f x``, derivative ``g`` with respect to ``x``, no custom autograd function, so functional
transforms (``torch.func``) and double backward (Hessian-vector products) pass through it.
"""

from __future__ import annotations

import torch
from torch import nn


def linear_decay_survival(num_blocks: int, final: float = 0.5) -> list[float]:
    """Survival probabilities ``p_l = 1 - (l / L)(1 - final)`` for blocks ``l = 1..L`` (Yamada et
    al. 2019, Sec. 4.1; Huang et al. 2016's stochastic-depth rule)."""
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    if not 0.0 <= final <= 1.0:
        raise ValueError(f"final survival probability must be in [0, 1], got {final}")
    return [1.0 - (i / num_blocks) * (1.0 - final) for i in range(1, num_blocks + 1)]


class ShakeDrop(nn.Module):
    """Multiply a residual branch by ShakeDrop's random factor (training) or by ``p`` (eval).

    Args:
        p: survival probability of the branch (``b ~ Bernoulli(p)``).
        alpha_range, beta_range: the forward and backward ranges of the dropped branch's factor
            (the paper's ``[-1, 1]`` and ``[0, 1]``).
        generator: optional ``torch.Generator`` (on the input's device) for the draws; the global
            RNG otherwise, as ``nn.Dropout``.
    """

    def __init__(
        self,
        p: float,
        alpha_range: tuple[float, float] = (-1.0, 1.0),
        beta_range: tuple[float, float] = (0.0, 1.0),
        generator: torch.Generator | None = None,
    ):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"ShakeDrop survival probability p must be in [0, 1], got {p}")
        for name, (lo, hi) in (("alpha_range", alpha_range), ("beta_range", beta_range)):
            if not lo <= hi:
                raise ValueError(f"{name} must be (low, high) with low <= high, got {(lo, hi)}")
        self.p = float(p)
        self.alpha_range, self.beta_range = tuple(alpha_range), tuple(beta_range)
        self.generator = generator

    def _uniform(
        self, shape: tuple[int, ...], bounds: tuple[float, float], like: torch.Tensor
    ) -> torch.Tensor:
        u = torch.rand(shape, generator=self.generator, device=like.device, dtype=like.dtype)
        return bounds[0] + (bounds[1] - bounds[0]) * u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return self.p * x
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)  # one draw per example
        keep = torch.rand(shape, generator=self.generator, device=x.device) < self.p
        alpha = self._uniform(shape, self.alpha_range, x)
        beta = self._uniform(shape, self.beta_range, x)
        one = torch.ones((), dtype=x.dtype, device=x.device)
        forward_factor = torch.where(keep, one, alpha)  # b + alpha - b alpha, exactly 1 when kept
        backward_factor = torch.where(keep, one, beta)
        return x * backward_factor + (x * (forward_factor - backward_factor)).detach()

    def extra_repr(self) -> str:
        return f"p={self.p:.4f}, alpha={self.alpha_range}, beta={self.beta_range}"
