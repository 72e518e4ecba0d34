"""The small protocol every toy problem follows, and the registry the CLI and dashboard list.

A toy problem is an exact, differentiable PyTorch function of a low-dimensional parameter
(``dim`` = 2 for every problem except the two-moons network), batched over leading dimensions so a
whole plotting grid evaluates in one call::

    prob.loss(theta)        # theta [..., dim] -> loss [...], float64 by default, differentiable
    prob.bounds             # ((x_lo, x_hi), (y_lo, y_hi)) for plotting
    prob.minima             # list of Minimum(theta, value, label) known for the problem
    prob.in_domain(theta)   # bool tensor [...]: where the loss is defined
    prob.domain_check(theta)  # raises ValueError naming the valid region and the fix

Problem-specific extras live on the subclasses (``GaussianMixture.fisher``,
``LogisticRegression.exact_posterior`` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Minimum", "ToyProblem", "register", "names", "get", "gradient", "hessian"]

DEFAULT_DTYPE = torch.float64


@dataclass(frozen=True)
class Minimum:
    """A known minimiser: ``theta`` (list of floats), ``value`` (loss there) and a short label."""

    theta: tuple[float, ...]
    value: float
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class ToyProblem:
    """Base class: subclasses implement ``_loss(theta)`` on already-validated float tensors."""

    name: str = "toy"
    dim: int = 2
    axis_labels: tuple[str, str] = ("theta_1", "theta_2")
    #: human-readable description of the valid region (used in error messages)
    domain: str = "all of R^2"

    def __init__(self, dtype: torch.dtype = DEFAULT_DTYPE, device: torch.device | str = "cpu") -> None:
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.dtype = dtype
        self.device = torch.device(device)

    # ----------------------------------------------------------------------------- protocol
    @property
    def bounds(self) -> tuple[tuple[float, float], tuple[float, float]]:
        raise NotImplementedError

    @property
    def minima(self) -> list[Minimum]:
        return []

    def params(self) -> dict[str, Any]:
        """The constructor parameters (recorded by figures and results)."""
        return {}

    def in_domain(self, theta: torch.Tensor) -> torch.Tensor:
        """Boolean tensor ``[...]``: True where the loss is defined."""
        theta = self._as_tensor(theta)
        return torch.ones(theta.shape[:-1], dtype=torch.bool, device=theta.device)

    def domain_check(self, theta: torch.Tensor) -> None:
        """Raise ``ValueError`` if any point lies outside the valid region."""
        theta = self._as_tensor(theta)
        ok = self.in_domain(theta)
        if not bool(ok.all()):
            bad = theta[~ok][0].detach().cpu().tolist()
            raise ValueError(
                f"{self.name}: theta={bad} lies outside the valid region ({self.domain}); "
                f"{int((~ok).sum())} of {ok.numel()} points are invalid. Move the start point / plotting "
                f"bounds inside the region (see prob.bounds)."
            )

    def loss(self, theta: torch.Tensor, *, check: bool = True) -> torch.Tensor:
        """Loss at ``theta [..., dim]`` -> ``[...]`` (differentiable; ``check`` validates the domain)."""
        theta = self._as_tensor(theta)
        if check:
            self.domain_check(theta)
        return self._loss(theta)

    __call__ = loss

    def _loss(self, theta: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----------------------------------------------------------------------------- helpers
    def _as_tensor(self, theta: Any) -> torch.Tensor:
        if not isinstance(theta, torch.Tensor):
            theta = torch.as_tensor(theta, dtype=self.dtype, device=self.device)
        elif theta.dtype != self.dtype:
            theta = theta.to(self.dtype)  # the problem's dtype (float64 by default) wins; differentiable
        if theta.dim() == 0 or theta.shape[-1] != self.dim:
            raise ValueError(
                f"{self.name}: theta must have shape [..., {self.dim}], got {tuple(theta.shape)}; "
                f"stack the coordinates in the last dimension (torch.stack([x, y], -1))."
            )
        return theta

    def grid(self, resolution: int = 200, bounds=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(xs [n], ys [n], theta [n, n, 2])`` on ``bounds`` (default ``self.bounds``); ``theta[i, j] =
        (xs[j], ys[i])`` so ``loss(theta)`` is ready for ``contour(xs, ys, Z)``."""
        if self.dim != 2:
            raise ValueError(f"{self.name}: grid() needs a 2-D problem, this one has dim={self.dim}")
        if resolution < 2:
            raise ValueError(f"resolution must be >= 2, got {resolution}")
        (x0, x1), (y0, y1) = bounds if bounds is not None else self.bounds
        xs = torch.linspace(x0, x1, resolution, dtype=self.dtype, device=self.device)
        ys = torch.linspace(y0, y1, resolution, dtype=self.dtype, device=self.device)
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        return xs, ys, torch.stack([xx, yy], -1)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


def gradient(prob: ToyProblem, theta: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Exact gradient of ``prob.loss`` at ``theta [..., dim]`` by autograd (batched)."""
    theta = prob._as_tensor(theta).detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(prob.loss(theta, check=check).sum(), theta)
    return g


def hessian(prob: ToyProblem, theta: torch.Tensor, *, check: bool = True) -> torch.Tensor:
    """Exact Hessian ``[dim, dim]`` of ``prob.loss`` at one point by double backward."""
    theta = prob._as_tensor(theta).detach().reshape(prob.dim).clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(prob.loss(theta, check=check), theta, create_graph=True)
        rows = [torch.autograd.grad(g[i], theta, retain_graph=True)[0] for i in range(prob.dim)]
    return torch.stack(rows).detach()


# --------------------------------------------------------------------------------- registry
_REGISTRY: dict[str, Callable[..., ToyProblem]] = {}


def register(name: str, factory: Callable[..., ToyProblem]) -> None:
    """Register ``factory(**params) -> ToyProblem`` under ``name``."""
    if name in _REGISTRY:
        raise ValueError(f"toy problem {name!r} is already registered")
    _REGISTRY[name] = factory


def names() -> list[str]:
    """Registered problem names, in registration order."""
    return list(_REGISTRY)


def get(name: str, **params: Any) -> ToyProblem:
    """Instantiate the problem ``name`` with its parameters (e.g. ``get("ill_conditioned_quadratic",
    condition_number=100)``)."""
    if not isinstance(name, str):
        raise TypeError(f"problem name must be a str, got {type(name).__name__}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown toy problem {name!r}; available: {', '.join(names())}")
    try:
        return _REGISTRY[name](**params)
    except TypeError as exc:
        raise TypeError(f"bad parameters for toy problem {name!r}: {exc}") from exc
