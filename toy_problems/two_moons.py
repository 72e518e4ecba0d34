"""Two moons with a small MLP (bSAM paper App. F.2, Fig. 6).

``make_moons`` is our own generator with the same geometry as scikit-learn's: the outer moon
``(cos t, sin t)`` (label 0) and the inner moon ``(1 - cos t, 1/2 - sin t)`` (label 1) for ``t``
evenly spaced in ``[0, pi]``, plus isotropic Gaussian noise, shuffled; fixed seed.

Network (paper App. F.2): MLP 2 -> [32] x 4 -> 1 with ELU activations, float64. The problem's
parameter is the flattened weight vector (``dim`` = 3,297), so ``loss(theta [..., P])`` is the mean
binary cross-entropy over the 100 points, batched by ``torch.func.vmap``; ``bounds`` is undefined
(it is not a 2-D problem; plots show predictive maps over ``x_bounds`` instead).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from toy_problems.base import ToyProblem, register

__all__ = ["make_moons", "TwoMoons", "mlp"]


def make_moons(
    n_samples: int = 100, noise: float = 0.1, seed: int = 0, dtype=torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(X [n, 2], y [n])``: two interleaving half circles (outer label 0, inner label 1)."""
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2, got {n_samples}")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    g = torch.Generator().manual_seed(seed)
    n_out = n_samples // 2
    n_in = n_samples - n_out
    t_out = torch.linspace(0, math.pi, n_out, dtype=torch.float64)
    t_in = torch.linspace(0, math.pi, n_in, dtype=torch.float64)
    outer = torch.stack([t_out.cos(), t_out.sin()], -1)
    inner = torch.stack([1 - t_in.cos(), 0.5 - t_in.sin()], -1)
    X = torch.cat([outer, inner])
    y = torch.cat([torch.zeros(n_out), torch.ones(n_in)]).double()
    perm = torch.randperm(n_samples, generator=g)
    X, y = X[perm], y[perm]
    X = X + noise * torch.randn(X.shape, generator=g, dtype=torch.float64)
    return X.to(dtype), y.to(dtype)


def mlp(width: int = 32, depth: int = 4, seed: int = 0, dtype=torch.float64) -> nn.Sequential:
    """MLP 2 -> [width] x depth -> 1 with ELU (bSAM paper App. F.2), PyTorch default init, seeded."""
    g = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    d_in = 2
    for _ in range(depth):
        layers += [nn.Linear(d_in, width), nn.ELU()]
        d_in = width
    layers.append(nn.Linear(d_in, 1))
    model = nn.Sequential(*layers).to(dtype)
    with torch.no_grad():
        for mod in model:
            if isinstance(mod, nn.Linear):
                bound = 1 / math.sqrt(mod.in_features)  # PyTorch's default (kaiming_uniform(a=sqrt 5))
                mod.weight.uniform_(-bound, bound, generator=g)
                mod.bias.uniform_(-bound, bound, generator=g)
    return model


class TwoMoons(ToyProblem):
    """Binary classification of ``make_moons(n_samples, noise)`` with an ELU MLP (see module doc)."""

    name = "two_moons"
    axis_labels = ("x_1", "x_2")

    def __init__(
        self,
        n_samples: int = 100,
        noise: float = 0.1,
        seed: int = 0,
        width: int = 32,
        depth: int = 4,
        dtype=torch.float64,
        device="cpu",
    ) -> None:
        super().__init__(dtype, device)
        self.n_samples, self.noise, self.seed = int(n_samples), float(noise), int(seed)
        self.width, self.depth = int(width), int(depth)
        X, y = make_moons(self.n_samples, self.noise, self.seed, dtype)
        self._X, self._y = X.to(self.device), y.to(self.device)
        self._template = self.make_model(seed=0)
        self._names = [n for n, _ in self._template.named_parameters()]
        self._shapes = [p.shape for _, p in self._template.named_parameters()]
        self.dim = sum(p.numel() for p in self._template.parameters())

    def params(self):
        return {
            "n_samples": self.n_samples,
            "noise": self.noise,
            "seed": self.seed,
            "width": self.width,
            "depth": self.depth,
        }

    @property
    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._X.clone(), self._y.clone()

    @property
    def num_data(self) -> int:
        return self.n_samples

    @property
    def bounds(self):
        raise ValueError("two_moons is not a 2-D parameter problem; use x_bounds for predictive maps")

    @property
    def x_bounds(self):
        return ((-1.75, 2.75), (-1.25, 1.75))

    def make_model(self, seed: int = 0) -> nn.Sequential:
        return mlp(self.width, self.depth, seed, self.dtype).to(self.device)

    def _unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        out, i = {}, 0
        for n, s in zip(self._names, self._shapes):
            k = math.prod(s)
            out[n] = theta[i : i + k].reshape(s)
            i += k
        return out

    def _loss(self, theta):
        from torch.func import functional_call, vmap

        X, y = self._X.to(theta), self._y.to(theta)

        def one(t):
            logits = functional_call(self._template, self._unflatten(t), (X,)).squeeze(-1)
            return (F.softplus(logits) - y * logits).mean()  # binary cross-entropy with logits

        flat = theta.reshape(-1, self.dim)
        return vmap(one)(flat).reshape(theta.shape[:-1])


register("two_moons", TwoMoons)
