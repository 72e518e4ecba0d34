"""Problems with closed-form sharpness for the measure tests: quadratics, logistic regression, a small MLP."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import brentq
from torch import nn

from landscape.objective import Objective
from tests.references import (
    make_classification_data,
    make_mlp,
    split_batches,
)

F64 = torch.float64


# --------------------------------------------------------------------------------------------
# problems
# --------------------------------------------------------------------------------------------
class Quadratic(nn.Module):
    """``L(w) = 1/2 w^T A w + b^T w`` (the "outputs" are the loss repeated over the batch)."""

    def __init__(self, A: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("A", A.clone())
        self.register_buffer("b", b.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (0.5 * self.w @ self.A @ self.w + self.b @ self.w).expand(x.shape[0])


class DiagQuadratic(nn.Module):
    """``L(w) = 1/2 sum_i d_i w_i^2 + b^T w`` (cheap for large p)."""

    def __init__(self, d: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())
        self.register_buffer("d", d.clone())
        self.register_buffer("b", b.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (0.5 * (self.d * self.w**2).sum() + self.b @ self.w).expand(x.shape[0])


def mean_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.mean()


def quad(A, b, w) -> Objective:
    data = (torch.zeros(3, 1, dtype=F64), torch.zeros(3, dtype=F64))
    return Objective(Quadratic(A, b, w), mean_loss, data)


def qvalue(A, b, w) -> float:
    return float(0.5 * w @ A @ w + b @ w)


def spd(p: int, seed: int, cond: float = 10.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=F64))
    return q @ torch.diag(torch.logspace(0, math.log10(cond), p, dtype=F64)) @ q.T


def rand(p: int, seed: int) -> torch.Tensor:
    return torch.randn(p, generator=torch.Generator().manual_seed(seed), dtype=F64)


def trust_region_max(M: torch.Tensor, g: torch.Tensor, rho: float) -> float:
    """``max_{||u|| <= rho} g^T u + 1/2 u^T M u`` for symmetric ``M`` (easy case): the maximiser is
    ``u = (lam I - M)^{-1} g`` with ``lam > lambda_max(M)`` and ``||u|| = rho`` (secular equation)."""
    evals, evecs = torch.linalg.eigh(M)
    gh = (evecs.T @ g).numpy()
    ev = evals.numpy()

    def norm_minus_rho(lam):
        return np.linalg.norm(gh / (lam - ev)) - rho

    lo = ev.max() + 1e-12
    hi = ev.max() + np.linalg.norm(gh) / rho + 1.0
    lam = brentq(norm_minus_rho, lo + 1e-14, hi, xtol=1e-15, rtol=1e-15)
    u = evecs.numpy() @ (gh / (lam - ev))
    return float(g.numpy() @ u + 0.5 * u @ M.numpy() @ u)


def logistic_problem(n: int = 30, d: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=F64)
    y = (
        x @ torch.tensor([1.5, -1.0][:d] + [0.5] * (d - 2), dtype=F64)
        + 0.5 * torch.randn(n, generator=g, dtype=F64)
        > 0
    )
    model = nn.Linear(d, 1, bias=False).to(F64)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.8, -0.3] + [0.1] * (d - 2)], dtype=F64))
    y = y.to(F64)

    class Flat(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = model

        def forward(self, x):
            return self.lin(x).squeeze(-1)

    net = Flat()
    obj = Objective(net, nn.BCEWithLogitsLoss(), [(x[:17], y[:17]), (x[17:], y[17:])])

    def loss_at(W: torch.Tensor) -> torch.Tensor:  # W [..., d] -> loss [...]
        z = W @ x.T
        return nn.functional.binary_cross_entropy_with_logits(z, y.expand_as(z), reduction="none").mean(-1)

    return obj, net, loss_at


def mlp_problem(activation: str = "tanh", n: int = 24, seed: int = 0):
    model = make_mlp((4, 6, 3), activation, seed=seed)
    x, y = make_classification_data(n, 4, 3, seed=seed)
    batches = split_batches(x, y, [10, n - 10])
    return model, batches, Objective(model, nn.CrossEntropyLoss(), batches)


def _ref_loss(model, batches):
    from tests.references import total_loss_fn

    return total_loss_fn(model, nn.CrossEntropyLoss(), batches)
