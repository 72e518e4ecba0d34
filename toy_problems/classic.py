"""Classic 2-D optimisation test functions for the optimizer playground.

Formulas from Surjanovic & Bingham's *Virtual Library of Simulation Experiments* (Rosenbrock,
Beale, Rastrigin) and Himmelblau (1972, *Applied Nonlinear Programming*). The known minima are
listed to full float64 precision: the closed-form ones exactly, Himmelblau's three irrational ones
refined by Newton's method from the literature's 6-digit values.
"""

from __future__ import annotations

import math

import torch

from toy_problems.base import Minimum, ToyProblem, hessian, register

__all__ = ["Rosenbrock", "Beale", "Himmelblau", "Rastrigin", "Saddle", "IllConditionedQuadratic"]


def _refine(prob: ToyProblem, start, iters: int = 50) -> torch.Tensor:
    """Newton's method on ``prob.loss`` from ``start`` (used only to polish known minima)."""
    t = torch.as_tensor(start, dtype=torch.float64)
    for _ in range(iters):
        tt = t.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(prob.loss(tt), tt)
        step = torch.linalg.solve(hessian(prob, t), g)
        t = t - step
        if float(step.norm()) < 1e-15:
            break
    return t


class Rosenbrock(ToyProblem):
    """``(a - x)^2 + b (y - x^2)^2``; global minimum ``(a, a^2)`` with value 0."""

    name = "rosenbrock"
    axis_labels = ("x", "y")

    def __init__(self, a: float = 1.0, b: float = 100.0, dtype=torch.float64, device="cpu") -> None:
        super().__init__(dtype, device)
        if b <= 0:
            raise ValueError(f"rosenbrock needs b > 0, got {b}")
        self.a, self.b = float(a), float(b)

    def params(self):
        return {"a": self.a, "b": self.b}

    @property
    def bounds(self):
        return ((-2.0, 2.0), (-1.0, 3.0))

    @property
    def minima(self):
        return [Minimum((self.a, self.a**2), 0.0, "global")]

    def _loss(self, t):
        x, y = t[..., 0], t[..., 1]
        return (self.a - x) ** 2 + self.b * (y - x * x) ** 2


class Beale(ToyProblem):
    """``(1.5 - x + xy)^2 + (2.25 - x + xy^2)^2 + (2.625 - x + xy^3)^2``; minimum ``(3, 0.5)``, value 0."""

    name = "beale"
    axis_labels = ("x", "y")

    @property
    def bounds(self):
        return ((-4.5, 4.5), (-4.5, 4.5))

    @property
    def minima(self):
        return [Minimum((3.0, 0.5), 0.0, "global")]

    def _loss(self, t):
        x, y = t[..., 0], t[..., 1]
        return (1.5 - x + x * y) ** 2 + (2.25 - x + x * y**2) ** 2 + (2.625 - x + x * y**3) ** 2


class Himmelblau(ToyProblem):
    """``(x^2 + y - 11)^2 + (x + y^2 - 7)^2``; four global minima with value 0."""

    name = "himmelblau"
    axis_labels = ("x", "y")
    _APPROX = ((3.0, 2.0), (-2.805118, 3.131312), (-3.779310, -3.283186), (3.584428, -1.848126))

    def __init__(self, dtype=torch.float64, device="cpu") -> None:
        super().__init__(dtype, device)
        self._minima = None

    @property
    def bounds(self):
        return ((-5.0, 5.0), (-5.0, 5.0))

    @property
    def minima(self):
        if self._minima is None:
            pts = [(3.0, 2.0)] + [tuple(_refine(self, p).tolist()) for p in self._APPROX[1:]]
            self._minima = [Minimum(p, 0.0, f"global {i + 1}") for i, p in enumerate(pts)]
        return self._minima

    def _loss(self, t):
        x, y = t[..., 0], t[..., 1]
        return (x * x + y - 11) ** 2 + (x + y * y - 7) ** 2


class Rastrigin(ToyProblem):
    """``2A + sum_i (x_i^2 - A cos(2 pi x_i))``; global minimum at the origin, value 0, and a local
    minimum near every integer lattice point."""

    name = "rastrigin"
    axis_labels = ("x", "y")

    def __init__(self, A: float = 10.0, dtype=torch.float64, device="cpu") -> None:
        super().__init__(dtype, device)
        if A < 0:
            raise ValueError(f"rastrigin needs A >= 0, got {A}")
        self.A = float(A)

    def params(self):
        return {"A": self.A}

    @property
    def bounds(self):
        return ((-5.12, 5.12), (-5.12, 5.12))

    @property
    def minima(self):
        return [Minimum((0.0, 0.0), 0.0, "global")]

    def _loss(self, t):
        return 2 * self.A + (t * t - self.A * torch.cos(2 * math.pi * t)).sum(-1)


class Saddle(ToyProblem):
    """``x^2/2 + y^4/4 - y^2/2``: a strict saddle at the origin (Hessian ``diag(1, -1)``) between
    two minima ``(0, +-1)`` with value ``-1/4``; bounded below, so optimizers can escape it."""

    name = "saddle"
    axis_labels = ("x", "y")

    @property
    def bounds(self):
        return ((-2.0, 2.0), (-2.0, 2.0))

    @property
    def minima(self):
        return [Minimum((0.0, 1.0), -0.25, "upper"), Minimum((0.0, -1.0), -0.25, "lower")]

    @property
    def saddle_points(self):
        return [Minimum((0.0, 0.0), 0.0, "saddle")]

    def _loss(self, t):
        x, y = t[..., 0], t[..., 1]
        return 0.5 * x * x + 0.25 * y**4 - 0.5 * y * y


class IllConditionedQuadratic(ToyProblem):
    """``theta^T A theta / 2`` with ``A = R(angle) diag(1, condition_number) R(angle)^T``; minimum 0
    at the origin. ``angle`` (radians) rotates the valley off the axes (diagonal preconditioners such
    as Adam or ASAM then no longer undo the conditioning)."""

    name = "ill_conditioned_quadratic"
    axis_labels = ("x", "y")

    def __init__(
        self, condition_number: float = 100.0, angle: float = 0.0, dtype=torch.float64, device="cpu"
    ) -> None:
        super().__init__(dtype, device)
        if not condition_number >= 1:
            raise ValueError(f"condition_number must be >= 1, got {condition_number}")
        self.condition_number, self.angle = float(condition_number), float(angle)
        c, s = math.cos(angle), math.sin(angle)
        r = torch.tensor([[c, -s], [s, c]], dtype=dtype, device=self.device)
        self.A = (
            r @ torch.diag(torch.tensor([1.0, self.condition_number], dtype=dtype, device=self.device)) @ r.T
        )

    def params(self):
        return {"condition_number": self.condition_number, "angle": self.angle}

    @property
    def bounds(self):
        return ((-2.0, 2.0), (-2.0, 2.0))

    @property
    def minima(self):
        return [Minimum((0.0, 0.0), 0.0, "global")]

    def _loss(self, t):
        A = self.A.to(dtype=t.dtype, device=t.device)
        return 0.5 * torch.einsum("...i,ij,...j->...", t, A, t)


for _cls in (Rosenbrock, Beale, Himmelblau, Rastrigin, Saddle, IllConditionedQuadratic):
    register(_cls.name, _cls)
