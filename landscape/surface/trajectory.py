"""Training trajectories: record weights every ``k`` steps (or project them on the fly) and project
them onto the plane of a loss surface, reporting how far each point lies off the plane.

Use with :func:`landscape.models.train` (``callback=recorder``) or call ``recorder(step, model)``
from any training loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.checks import check_positive
from landscape.surface.directions import _trajectory_matrix, named_parameters_of

__all__ = ["TrajectoryRecorder", "Projection", "project"]


def _flat(named: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    return torch.cat([named[n].detach().to(device="cpu", dtype=torch.float64).reshape(-1) for n in names])


def _direction_matrix(directions: Sequence[Mapping[str, torch.Tensor]], names, shapes) -> torch.Tensor:
    """``[p, k]`` float64 matrix of the directions over ``names`` (absent names count as zero)."""
    cols = []
    for i, d in enumerate(directions):
        extra = [n for n in d if n not in names]
        if extra:
            raise ValueError(f"direction {i} has entries {extra} that the trajectory does not record")
        parts = []
        for n, shp in zip(names, shapes):
            if n in d:
                t = d[n]
                if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                    raise TypeError(f"direction {i}: {n!r} must be a floating tensor, got {t!r:.60}")
                if tuple(t.shape) != tuple(shp):
                    raise ValueError(
                        f"direction {i}: {n!r} has shape {tuple(t.shape)}, expected {tuple(shp)}"
                    )
                if not bool(torch.isfinite(t).all()):
                    raise ValueError(f"direction {i}: {n!r} contains NaN or inf; pass finite directions")
                parts.append(t.detach().to(device="cpu", dtype=torch.float64).reshape(-1))
            else:
                parts.append(torch.zeros(int(np.prod(shp)) if len(shp) else 1, dtype=torch.float64))
        cols.append(torch.cat(parts))
    return torch.stack(cols, dim=1)


class TrajectoryRecorder:
    """Training callback storing the weights every ``every`` steps, or projecting them on the fly.

    Args:
        every: record at steps ``every, 2*every, ...`` (the callback's ``step`` counts from 1);
            call :meth:`record` yourself for the initial point.
        names: parameter names to record (default: all parameters that require grad).
        directions, origin: if given, every recorded point is also projected
            (:func:`project`) and its coordinates/residual kept in ``coords``/``residuals``.
        store: keep the full weight vectors (needed for PCA directions); ``False`` with
            ``directions`` keeps only the 2-D path (constant memory per point).

    Attributes: ``steps``, ``losses``, ``weights`` (``[T, p]`` float64 tensor or None), ``names``,
    ``shapes``, ``coords`` (``[T, k]``), ``residuals`` (``[T]``).
    """

    def __init__(
        self,
        every: int = 1,
        *,
        names: Sequence[str] | None = None,
        directions: Sequence[Mapping[str, torch.Tensor]] | None = None,
        origin: nn.Module | Mapping[str, torch.Tensor] | None = None,
        store: bool = True,
    ):
        check_positive("every", every, integer=True)
        if not store and directions is None:
            raise ValueError("store=False keeps nothing unless directions are given to project on the fly")
        if (directions is None) != (origin is None):
            raise ValueError("give both directions and origin to project on the fly, or neither")
        self.every = every
        self.store = store
        self.names: list[str] | None = list(names) if names is not None else None
        self.shapes: list[torch.Size] = []
        self.steps: list[int] = []
        self.losses: list[float | None] = []
        self._weights: list[torch.Tensor] = []
        self._coords: list[torch.Tensor] = []
        self._residuals: list[float] = []
        self._directions = directions
        self._origin = origin
        self._D: torch.Tensor | None = None
        self._o: torch.Tensor | None = None

    def _init(self, model: nn.Module) -> None:
        named = dict(model.named_parameters())
        if self.names is None:
            self.names = [n for n, p in named.items() if p.requires_grad]
        missing = [n for n in self.names if n not in named]
        if missing:
            raise ValueError(f"the model has no parameters {missing}")
        self.shapes = [named[n].shape for n in self.names]
        if self._directions is not None:
            self._D = _direction_matrix(self._directions, self.names, self.shapes)
            origin = self._origin
            o = dict(origin.named_parameters()) if isinstance(origin, nn.Module) else origin
            self._o = _flat(o, self.names)

    def record(self, model: nn.Module, step: int = 0, loss: float | None = None) -> None:
        """Record the current weights of ``model`` (as step ``step``)."""
        if not self.shapes:
            self._init(model)
        named = dict(model.named_parameters())
        w = _flat(named, self.names)
        self.steps.append(int(step))
        self.losses.append(None if loss is None else float(loss))
        if self.store:
            self._weights.append(w)
        if self._D is not None:
            c, r = _lstsq(self._D, (w - self._o)[:, None])
            self._coords.append(c[:, 0])
            self._residuals.append(float(r[0]))

    def __call__(self, step: int, model: nn.Module, loss: float | None = None) -> None:
        if step % self.every == 0:
            self.record(model, step, loss)

    @property
    def weights(self) -> torch.Tensor | None:
        return torch.stack(self._weights) if self._weights else None

    @property
    def coords(self) -> np.ndarray | None:
        return torch.stack(self._coords).numpy() if self._coords else None

    @property
    def residuals(self) -> np.ndarray | None:
        return np.asarray(self._residuals) if self._coords else None

    def __len__(self) -> int:
        return len(self.steps)

    def as_dicts(self) -> list[dict[str, torch.Tensor]]:
        """The stored points as dicts name -> tensor (float64, CPU)."""
        if self.weights is None:
            return []
        out = []
        for row in self.weights:
            d, off = {}, 0
            for n, shp in zip(self.names, self.shapes):
                k = int(np.prod(shp)) if len(shp) else 1
                d[n] = row[off : off + k].reshape(shp)
                off += k
            out.append(d)
        return out


@dataclass
class Projection:
    """Coordinates of trajectory points in the plane of the directions, plus what is left over.

    ``coords[t]`` minimises ``||theta_t - origin - D c||`` (least squares; equal to plain dot
    products when the directions are orthonormal); ``residual_norm[t]`` is that minimum, and
    ``relative_residual[t]`` it divided by ``||theta_t - origin||``.
    """

    coords: np.ndarray
    residual_norm: np.ndarray
    relative_residual: np.ndarray
    steps: list[int] = field(default_factory=list)
    losses: list[float | None] = field(default_factory=list)

    @property
    def max_residual(self) -> float:
        return float(np.max(self.residual_norm)) if len(self.residual_norm) else 0.0


def _lstsq(D: torch.Tensor, M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares coefficients ``C`` (``[k, T]``) of ``M ~ D C`` and residual norms ``[T]``."""
    Q, R = torch.linalg.qr(D)
    if bool((R.diagonal().abs() <= 1e-12 * R.diagonal().abs().max().clamp_min(1e-300)).any()):
        raise ValueError("the directions are linearly dependent (or zero); cannot project onto their span")
    C = torch.linalg.solve_triangular(R, Q.T @ M, upper=True)
    res = torch.linalg.vector_norm(M - D @ C, dim=0)
    return C, res


def project(
    trajectory: Any,
    directions: Sequence[Mapping[str, torch.Tensor]],
    origin: nn.Module | Mapping[str, torch.Tensor],
) -> Projection:
    """Project a trajectory onto ``origin + span(directions)`` (Li et al. 2018, Sec. 7).

    Args:
        trajectory: a :class:`TrajectoryRecorder` with stored weights, or a list of models /
            dicts name -> tensor.
        directions: the surface's directions (dicts name -> tensor); names the trajectory records
            but a direction lacks count as zero there.
        origin: the surface's centre (model or dict).

    Returns:
        :class:`Projection` with ``coords [T, k]`` and the residual norms (how far each point lies
        off the plane; zero for a trajectory inside it).
    """

    mat, names, shapes = _trajectory_matrix(trajectory)
    D = _direction_matrix(directions, names, shapes)
    o = named_parameters_of(origin)
    missing = [n for n in names if n not in o]
    if missing:
        raise ValueError(f"origin lacks parameters {missing}")
    diff = (mat - _flat(o, names)[None, :]).T  # [p, T]
    C, res = _lstsq(D, diff)
    norms = torch.linalg.vector_norm(diff, dim=0)
    rel = torch.where(norms > 0, res / norms.clamp_min(1e-300), torch.zeros_like(res))
    steps = list(getattr(trajectory, "steps", range(mat.shape[0])))
    losses = list(getattr(trajectory, "losses", [None] * mat.shape[0]))
    return Projection(C.T.numpy(), res.numpy(), rel.numpy(), steps, losses)
