"""Normalisation layers of the model zoo: ``norm="batch" | "group" | "frn" | "none"``.

* ``"batch"``: ``nn.BatchNorm2d`` (Ioffe & Szegedy 2015);
* ``"group"``: ``nn.GroupNorm`` (Wu & He 2018) with :func:`group_count` groups: the largest
  divisor of the channel count that is at most 32 (the paper's default G = 32) and leaves at least
  4 channels per group (16 channels -> 4 groups, 64 -> 16, >= 128 -> 32);
* ``"frn"``: :class:`FilterResponseNorm2d`, Filter Response Normalisation with its Thresholded
  Linear Unit (Singh & Krishnan 2020), batch-independent;
* ``"none"``: identity.

All but ``"none"`` carry a per-channel scale and shift (2C parameters); FRN adds the TLU threshold
tau (3C parameters).
"""

from __future__ import annotations

import torch
from torch import nn

NORMS = ("batch", "group", "frn", "none")


def group_count(channels: int, max_groups: int = 32, min_per_group: int = 4) -> int:
    """Number of GroupNorm groups for ``channels`` (see the module docstring)."""
    best = 1
    for g in range(1, max_groups + 1):
        if channels % g == 0 and channels // g >= min_per_group:
            best = g
    return best


class FilterResponseNorm2d(nn.Module):
    """Filter Response Normalisation + TLU (Singh & Krishnan 2020, Eqs. 1-3), per example and
    channel over the spatial positions of ``x`` ``[N, C, H, W]``:

        nu2 = mean_{h,w} x^2,   x_hat = x / sqrt(nu2 + eps),   y = gamma x_hat + beta,
        z = max(y, tau)  (the TLU; ``tlu=False`` returns y).

    No mean is subtracted and no batch statistics are used, so train and eval modes compute the
    same function. ``gamma`` starts at 1, ``beta`` and ``tau`` at 0; ``eps = 1e-6`` as in the paper.
    """

    def __init__(self, num_features: int, eps: float = 1e-6, tlu: bool = True):
        super().__init__()
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.num_features, self.eps, self.tlu = num_features, float(eps), bool(tlu)
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.tau = nn.Parameter(torch.zeros(num_features)) if tlu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(
                f"FilterResponseNorm2d({self.num_features}) expects [N, {self.num_features}, H, W], "
                f"got shape {tuple(x.shape)}"
            )
        nu2 = x.pow(2).mean(dim=(2, 3), keepdim=True)
        y = x * torch.rsqrt(nu2 + self.eps)
        y = self.weight.view(1, -1, 1, 1) * y + self.bias.view(1, -1, 1, 1)
        return torch.maximum(y, self.tau.view(1, -1, 1, 1)) if self.tau is not None else y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, tlu={self.tlu}"


def check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {NORMS}")
    return norm


def make_norm(norm: str, channels: int) -> nn.Module:
    """The normalisation layer ``norm`` for ``channels`` feature maps (``[N, C, H, W]``)."""
    check_norm(norm)
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(group_count(channels), channels)
    if norm == "frn":
        return FilterResponseNorm2d(channels)
    return nn.Identity()


def make_norm1d(norm: str, features: int) -> nn.Module:
    """The normalisation layer ``norm`` for ``[N, features]`` activations (MLP hidden layers).

    FRN is refused: with one value per channel (no spatial extent) ``x / sqrt(x^2 + eps)`` is
    about ``sign(x)`` (Singh & Krishnan 2020, Sec. 3.1), which destroys the activation.
    """
    check_norm(norm)
    if norm == "batch":
        return nn.BatchNorm1d(features)
    if norm == "group":
        return nn.GroupNorm(group_count(features), features)
    if norm == "frn":
        raise ValueError(
            "norm='frn' needs feature maps with spatial extent (it normalises over H x W); for "
            "fully connected layers use norm='batch', 'group' or 'none'"
        )
    return nn.Identity()
