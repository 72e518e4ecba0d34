"""Block-diagonal Kronecker-factored matrices and their algebra (the operators of
:mod:`landscape.curvature.kfac` and their inverses).

A layer with weight ``W`` (``[d_out, d_in]``; a ``Conv2d`` kernel flattened to
``[c_out, c_in/groups * k1 * k2]``) and, optionally, a bias ``b`` (``[d_out]``) is one block ``M`` of
``d_out x c`` entries: ``W``, ``[W, b]`` (weight and bias together, ``c = d_in + 1``: the bias is the
weight of an input column of ones) or ``b`` alone (``c = 1``).  With ``vec`` the row-major
flattening the parameter vector of the objective uses, a Kronecker block acts as

    ``(G kron A) vec(M) = vec(G M A)``   (``G``: ``d_out x d_out``, ``A``: ``c x c``, both symmetric)

(Martens & Grosse 2015, "Optimizing neural networks with Kronecker-factored approximate curvature",
eq. 1 and Sec. 3, written for row-major ``vec``; a bias alone has ``A = [1]``).  With the
eigendecompositions ``G = Q_G diag(l_G) Q_G^T``, ``A = Q_A diag(l_A) Q_A^T`` every function of the
block is diagonal in the Kronecker-factored eigenbasis ``Q_G kron Q_A``:

* eigenvalues: the products ``l_G,i l_A,j`` of all pairs (Van Loan 2000, "The ubiquitous Kronecker
  product", Sec. 2: the eigenvalues of a Kronecker product are the products of the factors');
* ``trace = tr(G) tr(A)``; ``log det(G kron A + lambda I) = sum_ij log(l_G,i l_A,j + lambda)``;
* exact damping ``(G kron A + lambda I)^-1 = (Q_G kron Q_A) diag(1 / (l_G l_A^T + lambda))
  (Q_G kron Q_A)^T``, applied as ``M -> Q_G [(Q_G^T M Q_A) / (l_G l_A^T + lambda)] Q_A^T``
  (George et al. 2018, "Fast approximate natural gradient descent in a Kronecker-factored
  eigenbasis", Sec. 3, eq. 8; curvlinops' ``KFACInverseLinearOperator(use_exact_damping=True)``).

EKFAC keeps the eigenbasis and replaces ``l_G l_A^T`` by a refitted diagonal ``D`` (same shape as
``M``), so the same eigenbasis form applies with ``D`` (George et al. 2018, eq. 10).  The factor-wise
damping of Martens & Grosse 2015, Sec. 6.3, ``(G + lambda_G I)^-1 kron (A + lambda_A I)^-1``, is the
factor form with the inverted damped factors; ``heuristic="pi"`` picks ``lambda_A = pi sqrt(lambda)``
and ``lambda_G = sqrt(lambda) / pi`` with ``pi = sqrt((tr A / c) / (tr G / d_out))`` (their eq. 13
with the trace norm), ``heuristic="factor"`` damps both factors by ``lambda`` (curvlinops' default,
``use_heuristic_damping=False, use_exact_damping=False``); a bias alone is ``(G + lambda I)^-1``
in both (as curvlinops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from landscape.curvature.base import CurvatureOperator

__all__ = ["HEURISTICS", "KroneckerBlock", "KroneckerOperator", "KroneckerInverse"]

HEURISTICS = ("exact", "pi", "factor")


@dataclass
class KroneckerBlock:
    """One diagonal block: the parameter entries it covers and how it acts on them.

    ``index``: the ``d_out * c`` positions in the flat parameter vector of the block ``M`` read
    row-major (``[d_out, c]``).  Either the factor form (``left``: ``d_out x d_out``, ``right``:
    ``c x c`` or ``None`` for the ``1 x 1`` identity; ``M -> left M right``) or the eigenbasis form
    (``q_left``, ``q_right`` or ``None``, ``diag`` ``[d_out, c]``;
    ``M -> Q_l [(Q_l^T M Q_r) * diag] Q_r^T``)."""

    name: str
    index: torch.Tensor
    d_out: int
    cols: int
    left: torch.Tensor | None = None
    right: torch.Tensor | None = None
    q_left: torch.Tensor | None = None
    q_right: torch.Tensor | None = None
    diag: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def eigenbasis(self) -> bool:
        return self.diag is not None

    def apply(self, M: torch.Tensor) -> torch.Tensor:
        """The block times ``M`` (``[k, d_out, c]``)."""
        if not self.eigenbasis:
            out = self.left @ M
            return out if self.right is None else out @ self.right
        R = self.q_left.T @ M
        if self.q_right is not None:
            R = R @ self.q_right
        R = R * self.diag
        R = self.q_left @ R
        return R if self.q_right is None else R @ self.q_right.T

    def dense(self) -> torch.Tensor:
        """The ``(d_out c) x (d_out c)`` matrix of the block (row-major ``vec``)."""
        if not self.eigenbasis:
            return self.left if self.right is None else torch.kron(self.left, self.right)
        Q = self.q_left if self.q_right is None else torch.kron(self.q_left, self.q_right)
        return (Q * self.diag.reshape(1, -1)) @ Q.T


class KroneckerOperator(CurvatureOperator):
    """A block-diagonal operator made of :class:`KroneckerBlock` s (one per layer, or per weight and
    bias).  The base's ``matmat`` (checks, memory budget, counting) calls :meth:`_matmat`, which
    applies the blocks; there is no loop over data (the factors were computed, and summed over
    ranks, once), so the products are not summed over ranks again."""

    name = "kronecker"
    PRODUCTS = {"kronecker": "_matmat"}
    _reduce_products = False  # the factors are summed over ranks already
    _blocks: list[KroneckerBlock]

    def _choose(self, k: int) -> str:
        return "kronecker"

    def blocks(self) -> list[KroneckerBlock]:
        """The diagonal blocks (computed on first use)."""
        return self._blocks

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(V)
        k = int(V.shape[1])
        for b in self.blocks():
            M = V[b.index].T.reshape(k, b.d_out, b.cols)
            out[b.index] = b.apply(M).reshape(k, -1).T
        return out

    def to_dense(self, chunk_size: int = 64) -> torch.Tensor:
        """The full ``p x p`` matrix, assembled from the blocks (Kronecker products), without products
        (``chunk_size`` is unused; kept for the signature of the base)."""
        p = self.shape[0]
        out = torch.zeros(p, p, dtype=self.dtype, device=self.device)
        for b in self.blocks():
            out[b.index[:, None], b.index[None, :]] = b.dense()
        return out


class KroneckerInverse(KroneckerOperator):
    """``(K + lambda I)^-1`` of a Kronecker-factored operator ``K`` (or its factor-wise damped
    approximation), built from ``K``'s blocks (module docstring); made by ``K.inverse(...)``."""

    name = "kronecker_inverse"

    def __init__(self, parent: KroneckerOperator, blocks: list[KroneckerBlock], settings: dict) -> None:
        super().__init__(parent.objective, parent._theta)
        self._blocks = blocks
        self._settings = {"of": parent.name, **settings}

    def _extra_config(self) -> dict[str, Any]:
        return dict(self._settings)


def check_damping(damping: Any, heuristic: str, min_damping: float) -> float:
    """Validate the arguments of ``inverse`` (a ValueError naming the fix)."""
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic must be one of {HEURISTICS}, got {heuristic!r}")
    if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not math.isfinite(damping):
        raise ValueError(f"damping must be a finite number >= 0, got {damping!r}")
    if damping < 0:
        raise ValueError(f"damping must be >= 0 (it is added to the eigenvalues), got {damping}")
    if not (isinstance(min_damping, (int, float)) and min_damping >= 0):
        raise ValueError(f"min_damping must be a number >= 0, got {min_damping!r}")
    return float(damping)


def inverse_block(
    b: KroneckerBlock,
    eig: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    damping: float,
    heuristic: str,
    min_damping: float,
) -> KroneckerBlock:
    """The block of ``(K + lambda I)^-1`` (``heuristic="exact"``) or of the factor-wise damped inverse
    (``"pi"``, ``"factor"``) from ``b``'s factor eigendecompositions ``eig = (l_G, Q_G, l_A, Q_A)``
    (``l_A``, ``Q_A`` ``None`` for a bias alone).  Eigenvalue pairs with ``l_G l_A + lambda <= 0``
    (no damping on a singular factor) raise a ValueError."""
    lg, qg, la, qa = eig
    common = dict(name=b.name, index=b.index, d_out=b.d_out, cols=b.cols)
    if heuristic == "exact":
        lam = lg[:, None] * (
            la[None, :] if la is not None else torch.ones(1, 1, dtype=lg.dtype, device=lg.device)
        )
        den = lam + damping
        _check_positive(den, b.name, damping)
        return KroneckerBlock(**common, q_left=qg, q_right=qa, diag=1.0 / den)
    if la is None:
        damp_a, damp_g = None, damping
    elif heuristic == "pi":
        mean_a, mean_g = float(la.sum()) / la.numel(), float(lg.sum()) / lg.numel()
        if mean_a >= 0.0 and mean_g > 0.0:
            pi = math.sqrt(mean_a / mean_g)
            root = math.sqrt(damping)
            damp_a, damp_g = max(pi * root, min_damping), max(root / pi, min_damping)
        else:  # a zero factor: the heuristic is undefined, plain factor damping (as curvlinops)
            damp_a, damp_g = damping, damping
    else:
        damp_a, damp_g = damping, damping
    _check_positive(lg + damp_g, b.name, damp_g)
    left = (qg / (lg + damp_g)) @ qg.T
    right = None
    if la is not None:
        _check_positive(la + damp_a, b.name, damp_a)
        right = (qa / (la + damp_a)) @ qa.T
    return KroneckerBlock(**common, left=left, right=right, extra={"damping_G": damp_g, "damping_A": damp_a})


def singular(den: torch.Tensor) -> bool:
    """True when some damped eigenvalue ``den`` is <= 0 or at rounding level: below
    ``numel * eps * max|den|`` (the eigenvalue error bound of a symmetric eigensolver, Golub & Van
    Loan, "Matrix computations", Sec. 8.1), where its log or reciprocal would be noise."""
    tol = den.numel() * torch.finfo(den.dtype).eps * float(den.abs().max())
    return not bool((den > tol).all())


def _check_positive(den: torch.Tensor, name: str, damping: float) -> None:
    if singular(den):
        raise ValueError(
            f"block {name!r}: an eigenvalue plus the damping {damping:g} is <= 0 or at rounding level, so "
            "the damped matrix is singular; pass damping > 0 (larger than minus the smallest eigenvalue)"
        )
