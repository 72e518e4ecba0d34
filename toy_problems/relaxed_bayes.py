"""The relaxed-Bayes objective of bSAM (Moellenhoff & Khan 2023, "SAM as an optimal relaxation of
Bayes", ICLR, Sec. 2 and App. F.3): expected loss, SAM's max-loss and the Fenchel biconjugate.

For a Gaussian ``q = N(m, S)`` with expectation parameters ``mu = (m, S + m m^T)`` the paper's
``f(mu) = E_q[-loss]`` (eq. 7) has the biconjugate (eq. 8-10)::

    f**(mu) = sup_{lambda in Omega} <mu, lambda> - f*(lambda),
    f*(lambda) = sup_theta <T(theta), lambda> + loss(theta)          (Theorem, eq. 10)

with ``T(theta) = (theta, theta theta^T)`` and ``Omega`` the natural parameters (second one negative
definite). Written with ``lambda = (S'^-1 m', -S'^-1 / 2)`` this is eq. 9: an expectation of a
quadratic minus SAM's max-loss in proximal form. Here the supremum over ``theta`` runs over a finite
grid ``theta_1..theta_K`` (the paper's App. B remark: restrict the admissible ``theta`` to a region of
interest). Then ``-f**`` is a linear program, solved exactly by HiGHS (``scipy.optimize.linprog``)::

    -f**(mu) = max_w  sum_k w_k loss(theta_k)
               s.t.   w >= 0, sum_k w_k = 1, sum_k w_k theta_k = m,
                      sum_k w_k theta_k theta_k^T  <=  S + m m^T      (1-D: "<="; see below)

whose dual is the ``sup`` over ``Omega`` (the multiplier of the second-moment constraint is the
second natural parameter, ``<= 0`` because the constraint is an inequality), and whose dual solution
is ``grad f**(mu)``: what the Bayesian learning rule (eq. 34) needs. ``-f**`` upper-bounds the
expected loss ``E_q[loss]`` (a Gaussian is one of the feasible ``w`` in the limit of a fine grid) and
equals ``loss(m)`` at ``S = 0``.

In more than one dimension the matrix inequality would make this a semidefinite program; for a
*convex* loss (logistic regression, App. F.3) the maximum is always attained with equality (spreading
the mass further raises the expectation of a convex function), so the LP with equality constraints
is used and the caller is told so (``convex_loss=True`` is required).

Public functions: :class:`BumpLoss1D` (the 1-D example of Fig. 1/2), :func:`gaussian_expectation_1d`,
:func:`max_loss_1d`, :func:`relaxed_expected_loss` (``-f**`` and its gradient),
:func:`gaussian_vi_fixed_point` (the Bayes objective eq. 2 with a full-covariance Gaussian) and
:func:`relaxed_bayes_fixed_point` (the relaxed objective eq. 11 by the Bayesian learning rule eq. 34
with step 1, i.e. the DC algorithm of Sec. 2.2, which decreases the objective at every step).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "BumpLoss1D",
    "gaussian_expectation_1d",
    "max_loss_1d",
    "RelaxedValue",
    "relaxed_expected_loss",
    "GaussianFit",
    "gaussian_vi_fixed_point",
    "relaxed_bayes_fixed_point",
    "gaussian_kl",
]


# ------------------------------------------------------------------------------------------------
# 1-D example loss (Fig. 1 and 2)
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BumpLoss1D:
    """``loss(theta) = slope * (sqrt(1 + theta^2) - 1) - sum_j depth_j exp(-(theta - c_j)^2 / (2 w_j^2))``.

    A smooth, bounded-below, coercive loss with Lipschitz gradient (the assumptions of the paper's
    Theorem, eq. 10) and three minima: two sharp ones (A, C) and a wide one (B) between them, as in
    Fig. 1(b). The paper does not publish its function (nor does its public code,
    github.com/team-approx-bayes/bayesian-sam); these values are ours, chosen so that A and C are
    deeper than B while a Gaussian of standard deviation ~1 prefers B.

    ``expected(m, s)`` is ``E_{N(m, s^2)}[loss]``: each bump in closed form
    (``depth * w / sqrt(w^2 + s^2) * exp(-(m - c)^2 / (2 (w^2 + s^2)))``), the envelope by
    Gauss-Hermite quadrature (smooth, 80 nodes).
    """

    slope: float = 0.5
    centers: tuple[float, ...] = (-2.5, 0.0, 2.5)
    widths: tuple[float, ...] = (0.2, 1.0, 0.2)
    depths: tuple[float, ...] = (1.0, 0.8, 1.0)
    names: tuple[str, ...] = ("A", "B", "C")

    def __post_init__(self) -> None:
        n = len(self.centers)
        if not (len(self.widths) == len(self.depths) == len(self.names) == n):
            raise ValueError("centers, widths, depths and names must have the same length")
        if min(self.widths, default=1.0) <= 0 or self.slope < 0:
            raise ValueError("widths must be > 0 and slope >= 0")

    def __call__(self, theta) -> np.ndarray:
        t = np.asarray(theta, dtype=np.float64)
        out = self.slope * (np.sqrt(1.0 + t * t) - 1.0)
        for c, w, d in zip(self.centers, self.widths, self.depths):
            out = out - d * np.exp(-((t - c) ** 2) / (2 * w * w))
        return out

    def expected(self, m, s) -> np.ndarray:
        """``E_{theta ~ N(m, s^2)} loss(theta)`` (broadcast over ``m`` and ``s >= 0``)."""
        m, s = np.broadcast_arrays(np.asarray(m, dtype=np.float64), np.asarray(s, dtype=np.float64))
        env = gaussian_expectation_1d(lambda t: self.slope * (np.sqrt(1.0 + t * t) - 1.0), m, s, 80)
        for c, w, d in zip(self.centers, self.widths, self.depths):
            v = w * w + s * s
            env = env - d * w / np.sqrt(v) * np.exp(-((m - c) ** 2) / (2 * v))
        return env

    def params(self) -> dict:
        return {
            "formula": "slope*(sqrt(1+t^2)-1) - sum_j depth_j*exp(-(t-c_j)^2/(2 w_j^2))",
            "slope": self.slope,
            "centers": list(self.centers),
            "widths": list(self.widths),
            "depths": list(self.depths),
            "names": list(self.names),
        }


def gaussian_expectation_1d(fn: Callable[[np.ndarray], np.ndarray], m, s, n_nodes: int = 80) -> np.ndarray:
    """``E_{theta ~ N(m, s^2)} fn(theta)`` by ``n_nodes``-point Gauss-Hermite quadrature
    (probabilists' nodes, ``numpy.polynomial.hermite_e.hermegauss``), broadcast over ``m``, ``s``."""
    if n_nodes < 1:
        raise ValueError(f"n_nodes must be >= 1, got {n_nodes}")
    m, s = np.broadcast_arrays(np.asarray(m, dtype=np.float64), np.asarray(s, dtype=np.float64))
    if np.any(s < 0):
        raise ValueError("standard deviations s must be >= 0")
    x, w = np.polynomial.hermite_e.hermegauss(n_nodes)
    w = w / math.sqrt(2 * math.pi)
    return (fn(m[..., None] + s[..., None] * x) * w).sum(-1)


def max_loss_1d(loss: Callable[[np.ndarray], np.ndarray], m, rho: float, n_inner: int = 401) -> np.ndarray:
    """SAM's max-loss ``max_{|eps| <= rho} loss(m + eps)`` (the paper's eq. 1 without the regulariser)
    in 1-D: the maximum over ``n_inner`` equally spaced points of ``[m - rho, m + rho]`` (both ends
    included, so a loss whose maximum on the ball is at its boundary, e.g. any convex one, is exact)."""
    if not rho >= 0:
        raise ValueError(f"rho must be >= 0, got {rho}")
    if n_inner < 2:
        raise ValueError(f"n_inner must be >= 2, got {n_inner}")
    m = np.asarray(m, dtype=np.float64)
    eps = np.linspace(-rho, rho, n_inner)
    return loss(m[..., None] + eps).max(-1)


# ------------------------------------------------------------------------------------------------
# the biconjugate by linear programming on a grid
# ------------------------------------------------------------------------------------------------
@dataclass
class RelaxedValue:
    """``-f**(mu)`` and its gradient with respect to ``mu = (m, S + m m^T)``.

    ``value``: ``-f**``; ``grad_mean [d]`` and ``grad_second [d, d]`` (symmetric): the gradient of
    ``-f**`` with respect to the first and second expectation parameter, i.e. ``-lambda*`` with
    ``lambda* = (lambda_1, Lambda_2)`` the maximiser in eq. 8; ``weights [K]``: the maximising
    distribution on the grid (a few atoms)."""

    value: float
    grad_mean: np.ndarray
    grad_second: np.ndarray
    weights: np.ndarray


def _second_moment_rows(theta: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
    d = theta.shape[1]
    pairs = [(i, j) for i in range(d) for j in range(i, d)]
    return np.stack([theta[:, i] * theta[:, j] for i, j in pairs]), pairs


def relaxed_expected_loss(
    theta: np.ndarray, loss_values: np.ndarray, mean, cov, *, convex_loss: bool = False
) -> RelaxedValue:
    """``-f**(mu)`` for ``q = N(mean, cov)`` with the supremum of eq. 10 over the grid points ``theta
    [K, d]`` (``loss_values [K]`` the loss there); see the module docstring for the LP.

    In 1-D the second-moment constraint is the inequality of the paper's ``Omega`` (exact eq. 9 on the
    grid). In ``d > 1`` it is an equality, valid for a convex loss only: pass ``convex_loss=True``.
    Raises ``ValueError`` when ``(mean, cov)`` is not a mixture of grid points (grid too small)."""
    from scipy.optimize import linprog

    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim == 1:
        theta = theta[:, None]
    lv = np.asarray(loss_values, dtype=np.float64).reshape(-1)
    if theta.ndim != 2 or theta.shape[0] != lv.shape[0]:
        raise ValueError(f"theta must be [K, d] and loss_values [K], got {theta.shape} and {lv.shape}")
    d = theta.shape[1]
    mean = np.asarray(mean, dtype=np.float64).reshape(d)
    cov = np.asarray(cov, dtype=np.float64).reshape(d, d)
    if d > 1 and not convex_loss:
        raise ValueError(
            "in more than one dimension the biconjugate is computed with equality moment constraints, "
            "which is exact only for a convex loss; pass convex_loss=True if the loss is convex"
        )
    second = cov + np.outer(mean, mean)
    rows, pairs = _second_moment_rows(theta)
    b2 = np.array([second[i, j] for i, j in pairs])
    A_first = np.vstack([np.ones(theta.shape[0]), theta.T])
    b_first = np.concatenate([[1.0], mean])
    # rescale the loss for the solver's tolerances, then undo
    scale = max(float(np.abs(lv).max()), 1.0)
    if d == 1:
        res = linprog(
            -lv / scale, A_ub=rows, b_ub=b2, A_eq=A_first, b_eq=b_first, bounds=(0, None), method="highs"
        )
    else:
        res = linprog(
            -lv / scale,
            A_eq=np.vstack([A_first, rows]),
            b_eq=np.concatenate([b_first, b2]),
            bounds=(0, None),
            method="highs",
        )
    if res.status != 0:
        raise ValueError(
            f"no distribution on the grid has mean {mean.tolist()} and covariance {cov.tolist()} "
            f"({res.message}); widen or refine the grid"
        )
    # marginals: d(min of -lv/scale . w)/d b;  -f** = -scale * min  =>  grad(-f**) = -scale * marginals
    eq = -scale * np.asarray(res.eqlin.marginals)
    sec = -scale * np.asarray(res.ineqlin.marginals) if d == 1 else eq[1 + d :]
    G = np.zeros((d, d))
    for (i, j), g in zip(pairs, sec):
        if i == j:
            G[i, i] = g
        else:  # one constraint for the symmetric pair: d/d mu_ij in the matrix inner product is g / 2
            G[i, j] = G[j, i] = g / 2
    return RelaxedValue(value=-scale * float(res.fun), grad_mean=eq[1 : 1 + d], grad_second=G, weights=res.x)


# ------------------------------------------------------------------------------------------------
# Gaussian posteriors: the Bayes objective (eq. 2) and its relaxation (eq. 11)
# ------------------------------------------------------------------------------------------------
def gaussian_kl(mean, cov, prior_mean, prior_cov) -> float:
    """``KL(N(mean, cov) || N(prior_mean, prior_cov))`` in closed form."""
    mean, prior_mean = np.asarray(mean, float), np.asarray(prior_mean, float)
    cov, prior_cov = np.asarray(cov, float), np.asarray(prior_cov, float)
    d = mean.shape[0]
    P = np.linalg.inv(prior_cov)
    dm = prior_mean - mean
    return 0.5 * float(
        np.trace(P @ cov) + dm @ P @ dm - d + np.linalg.slogdet(prior_cov)[1] - np.linalg.slogdet(cov)[1]
    )


@dataclass
class GaussianFit:
    """A Gaussian ``N(mean, cov)`` found by a fixed-point iteration, the objective it minimises at the
    end (``objective``: expected or relaxed loss + KL to the prior; ``-objective`` is the matching
    lower bound of the log evidence), and the objective after every iteration (``history``)."""

    mean: np.ndarray
    cov: np.ndarray
    objective: float
    iterations: int
    converged: bool
    history: list[float] = field(default_factory=list)


def gaussian_vi_fixed_point(
    expected_grad_hess: Callable[[np.ndarray, np.ndarray], tuple[float, np.ndarray, np.ndarray]],
    prior_cov: np.ndarray,
    init_mean: np.ndarray,
    init_cov: np.ndarray,
    *,
    max_iter: int = 200,
    tol: float = 1e-10,
    damping: float = 1.0,
) -> GaussianFit:
    """Full-covariance Gaussian minimising ``E_q[loss] + KL(q || N(0, prior_cov))`` (the paper's eq. 2)
    by the Bayesian learning rule (eq. 34 with ``f`` instead of ``f**``; Khan & Rue 2021): the
    natural-gradient fixed point ``S^-1 = P0 + E_q[hess]``, ``S^-1 m = E_q[hess] m - E_q[grad]``.

    ``expected_grad_hess(mean, cov) -> (E_q[loss], E_q[grad] [d], E_q[hess] [d, d])``."""
    P0 = np.linalg.inv(prior_cov)
    m, S = np.array(init_mean, float), np.array(init_cov, float)
    lam1, Lam = np.linalg.solve(S, m), np.linalg.inv(S)
    hist: list[float] = []
    converged = False
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        e, g, H = expected_grad_hess(m, S)
        hist.append(e + gaussian_kl(m, S, np.zeros_like(m), prior_cov))
        new_Lam = P0 + H
        new_lam1 = H @ m - g
        lam1 = (1 - damping) * lam1 + damping * new_lam1
        Lam = (1 - damping) * Lam + damping * new_Lam
        S_new = np.linalg.inv(Lam)
        m_new = S_new @ lam1
        step = max(np.abs(m_new - m).max(), np.abs(S_new - S).max())
        m, S = m_new, S_new
        if step < tol:
            converged = True
            break
    e, _, _ = expected_grad_hess(m, S)
    obj = e + gaussian_kl(m, S, np.zeros_like(m), prior_cov)
    return GaussianFit(m, S, obj, it, converged, hist + [obj])


def relaxed_bayes_fixed_point(
    theta: np.ndarray,
    loss_values: np.ndarray,
    prior_cov: np.ndarray,
    init_mean: np.ndarray,
    init_cov: np.ndarray,
    *,
    max_iter: int = 100,
    tol: float = 1e-9,
) -> GaussianFit:
    """Full-covariance Gaussian minimising the relaxed-Bayes objective ``-f**(mu) + KL(q || N(0,
    prior_cov))`` (eq. 11) for a convex loss given on the grid ``theta [K, d]``.

    The Bayesian learning rule of App. F.3 (eq. 34) with step 1, ``lambda_q <- lambda_0 +
    grad f**(mu_q)``, the gradient from :func:`relaxed_expected_loss`'s LP dual (the paper obtains it
    by CVXPY from tangent planes, eq. 32-33). With step 1 this is the DC algorithm for the
    difference-of-convex form of Sec. 2.2 (Tao & An 1997), whose objective does not increase from one
    iteration to the next (``history`` records the relaxed objective after each). Stops when
    the natural parameters stop changing (``tol``) or after ``max_iter`` iterations."""
    P0 = np.linalg.inv(prior_cov)
    d = P0.shape[0]
    m, S = np.array(init_mean, float), np.array(init_cov, float)
    hist: list[float] = []
    converged = False
    it = 0
    prev = None
    for it in range(1, max_iter + 1):  # noqa: B007 (the count is returned)
        r = relaxed_expected_loss(theta, loss_values, m, S, convex_loss=True)
        hist.append(r.value + gaussian_kl(m, S, np.zeros(d), prior_cov))
        # lambda_q = lambda_0 + grad f** = lambda_0 - grad(-f**):  -S^-1/2 = -P0/2 - G2,  S^-1 m = -g1
        Lam = P0 + 2 * r.grad_second
        evals = np.linalg.eigvalsh(Lam)
        if evals.min() <= 0:
            raise ValueError(
                f"the relaxed update gave a precision with eigenvalue {evals.min():.3g} <= 0: the grid "
                "does not cover the posterior's neighbourhood; widen it"
            )
        lam = np.concatenate([-r.grad_mean, Lam.reshape(-1)])
        S = np.linalg.inv(Lam)
        m = S @ (-r.grad_mean)
        if prev is not None and np.abs(lam - prev).max() < tol:
            converged = True
            break
        prev = lam
    r = relaxed_expected_loss(theta, loss_values, m, S, convex_loss=True)
    obj = r.value + gaussian_kl(m, S, np.zeros(d), prior_cov)
    return GaussianFit(m, S, obj, it, converged, hist + [obj])
