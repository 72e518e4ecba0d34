"""The plane through two minima and the bend of a curve between them, with its loss surface.

Garipov, Izmailov, Podoprikhin, Vetrov & Wilson, "Loss surfaces, mode connectivity, and fast
ensembling of DNNs", NeurIPS 2018, Sec. 5 and Fig. 1: ``d1 = theta_b - theta_a`` and ``d2`` the
component of ``theta_c - theta_a`` orthogonal to ``d1`` (Gram-Schmidt); with origin ``theta_a`` the
three points sit at known coordinates and a Bezier curve or polygonal chain through them lies in the
plane. The loss is evaluated by :func:`landscape.surface.grid.surface`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.checks import check_int, check_nonnegative
from landscape.surface.curves import CURVES, Curve, curve_weights
from landscape.surface.directions import Direction
from landscape.surface.grid import surface
from landscape.surface.paths import Tensors, _check_pair, _end_state, _make_objective, _tracked_bn

__all__ = ["Plane", "curve_plane", "plane", "plane_directions"]


def _param_dict(x: Any, what: str) -> Tensors:
    if isinstance(x, nn.Module):
        return {n: p.detach() for n, p in x.named_parameters()}
    if isinstance(x, Mapping):
        return {n: torch.as_tensor(t).detach() for n, t in x.items()}
    raise TypeError(f"{what} must be an nn.Module or a dict name -> tensor, got {type(x).__name__}")


def plane_directions(
    theta_a: Any, theta_b: Any, theta_c: Any, *, normalize: bool = False
) -> tuple[Direction, Direction, dict[str, tuple[float, float]]]:
    """The plane through three points (Garipov et al. 2018, Sec. 5): ``d1 = theta_b - theta_a``,
    ``d2 = u - x_c d1`` with ``u = theta_c - theta_a`` and ``x_c = <u, d1> / <d1, d1>`` (Gram-Schmidt),
    so ``theta_a``, ``theta_b``, ``theta_c`` sit at ``(0, 0)``, ``(1, 0)``, ``(x_c, 1)``.
    ``normalize=True`` divides both by their norms (an orthonormal basis, coordinates in parameter
    distance: ``(0, 0)``, ``(|d1|, 0)``, ``(x_c |d1|, |d2|)``; the plots keep angles).

    Arguments are models or dicts name -> tensor over the same names; the directions have their
    dtype/device. Returns ``(d1, d2, {"a": ..., "b": ..., "bend": ...})``.
    """
    a, b, c = (
        _param_dict(x, w) for x, w in ((theta_a, "theta_a"), (theta_b, "theta_b"), (theta_c, "theta_c"))
    )
    if not (list(a) == list(b) and set(a) == set(c)):
        raise ValueError("the three points must have the same parameter names (one architecture)")
    bad = [n for n in a if not (a[n].shape == b[n].shape == c[n].shape)]
    if bad:
        raise ValueError(f"the three points have different shapes at {bad[:5]}")
    d1 = {n: b[n] - a[n] for n in a}
    u = {n: c[n] - a[n] for n in a}

    def dot(p: Tensors, q: Tensors) -> float:
        return float(sum((p[n].double() * q[n].double()).sum() for n in p))

    n1sq = dot(d1, d1)
    if n1sq == 0.0:
        raise ValueError("theta_a and theta_b are equal: the plane's first direction is zero")
    x_c = dot(u, d1) / n1sq
    d2 = {n: u[n] - d1[n] * x_c for n in a}
    n1, n2 = math.sqrt(n1sq), math.sqrt(dot(d2, d2))
    if n2 <= 1e-10 * max(math.sqrt(dot(u, u)), n1):
        raise ValueError(
            "the bend lies on the line through theta_a and theta_b (no component orthogonal to "
            "theta_b - theta_a): train the curve first (fit_curve with steps > 0)"
        )
    points = {"a": (0.0, 0.0), "b": (1.0, 0.0), "bend": (x_c, 1.0)}
    if normalize:
        d1 = {n: t / n1 for n, t in d1.items()}
        d2 = {n: t / n2 for n, t in d2.items()}
        points = {"a": (0.0, 0.0), "b": (n1, 0.0), "bend": (x_c * n1, n2)}
    cfg = {"kind": "plane", "normalize": normalize, "names": list(a)}
    return (
        Direction(d1, {**cfg, "axis": 0, "definition": "theta_b - theta_a"}),
        Direction(d2, {**cfg, "axis": 1, "definition": "theta_c - theta_a orthogonalised against d1"}),
        points,
    )


@dataclass
class Plane:
    """A loss surface on the plane through two end points and a bend, with their coordinates.

    ``surface``: the :class:`~landscape.surface.result.Surface` (its ``config["plane"]`` repeats
    ``points`` and ``curve``); ``points``: ``{"a", "b", "bend"} -> (x, y)``; ``directions``:
    ``[d1, d2]``; ``curve``: ``[T, 2]`` coordinates of the curve through them (or ``None``).
    """

    surface: Any
    points: dict
    directions: list
    curve: np.ndarray | None = None

    def plot(self, kind: str = "contour", *, ax: Any = None, **kwargs):
        """The surface's plot with the curve drawn and the three points marked; returns the Axes."""
        ax = self.surface.plot(kind, ax=ax, trajectory=self.curve, **kwargs)
        for name, (x, y) in self.points.items():
            ax.plot([x], [y], "ko", ms=5)
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4))
        return ax


def plane(
    model_a: nn.Module,
    model_b: nn.Module,
    bend: nn.Module | Mapping[str, torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Any,
    *,
    kind: str | None = None,
    coords: Sequence[Any] | None = None,
    grid: int | tuple[int, int] = 21,
    margin: float = 0.25,
    normalize: bool = False,
    bn_policy: str | None = None,
    n_curve: int = 51,
    mode: str = "eval",
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> Plane:
    """``L(theta_a + x d1 + y d2)`` on a grid of the plane through ``model_a``, ``model_b`` and the
    bend (:func:`plane_directions`), evaluated by ``landscape.surface`` with origin ``theta_a``.

    Args:
        bend: the third point (a model or dict name -> tensor, e.g. ``curve.theta_c``).
        kind: ``"bezier"`` / ``"polychain"``: also return the coordinates of that curve through the
            three points (``n_curve`` points; it lies in the plane).
        coords: ``[xs, ys]``; default ``grid`` points per axis spanning the three points plus
            ``margin`` times the span on every side.
        bn_policy: as for ``landscape.surface`` (default ``"recompute"`` on ``data`` when the model
            has BatchNorm, else the surface's default).
        normalize, mode, dtype, device, progress: see :func:`plane_directions` and ``Objective``.
    """
    _check_pair(model_a, model_b)
    obj = _make_objective(model_a, loss_fn, data, mode=mode, dtype=dtype, device=device, output_fn=None,
                          reduction="auto")  # fmt: skip
    pa, _ = _end_state(obj, model_a, "model_a")
    pb, _ = _end_state(obj, model_b, "model_b")
    pc = {n: obj.convert(t) for n, t in _param_dict(bend, "bend").items()}
    return _plane_on(
        obj, pa, pb, pc, kind=kind, coords=coords, grid=grid, margin=margin, normalize=normalize,
        bn_policy=bn_policy, n_curve=n_curve, progress=progress,
    )  # fmt: skip


def curve_plane(curve: Curve, *, data: Any = None, **kwargs: Any) -> Plane:
    """:func:`plane` through a trained curve's ends and bend with the curve's coordinates (``data``:
    default the training data; ``coords``, ``grid``, ``margin``, ``normalize``, ``bn_policy``,
    ``n_curve``, ``progress`` as for :func:`plane`). The objective's settings are the curve's."""
    if not isinstance(curve, Curve):
        raise TypeError(f"curve_plane takes a Curve from fit_curve, got {type(curve).__name__}")
    obj = curve.objective if data is None else curve.objective.with_data(data)
    now = {n: obj.convert(p.detach()) for n, p in curve.model.named_parameters()}
    if any(not torch.equal(now[n], curve.theta_a[n]) for n in curve.names):
        raise ValueError(
            "model_a changed since the curve was fitted, so the surface's origin would not be the "
            "curve's theta_a; fit the curve again (or restore model_a)"
        )
    return _plane_on(obj, curve.theta_a, curve.theta_b, curve.theta_c, kind=curve.kind, **kwargs)


def _plane_on(obj, pa, pb, pc, *, kind=None, coords=None, grid=21, margin=0.25, normalize=False,
              bn_policy=None, n_curve=51, progress=False) -> Plane:  # fmt: skip

    if kind is not None and kind not in CURVES:
        raise ValueError(f"kind must be None or one of {CURVES}, got {kind!r}")
    check_nonnegative("margin", margin)
    d1, d2, points = plane_directions(pa, pb, pc, normalize=normalize)
    curve_xy = None
    if kind is not None:
        check_int("n_curve", n_curve, minimum=2)
        pts = np.array([points["a"], points["bend"], points["b"]])
        curve_xy = np.array([np.array(curve_weights(kind, t)) @ pts for t in np.linspace(0, 1, n_curve)])
    if coords is None:
        g = (grid, grid) if isinstance(grid, int) else tuple(grid)
        if len(g) != 2:
            raise ValueError(f"grid must be an int or a pair of ints, got {grid!r}")
        xy = np.array(list(points.values()))
        coords = []
        for axis, n in enumerate(g):
            check_int(f"grid[{axis}]", n, minimum=2)
            lo, hi = xy[:, axis].min(), xy[:, axis].max()
            pad = margin * (hi - lo)
            coords.append(np.linspace(lo - pad, hi + pad, n))
    if bn_policy is None and _tracked_bn(obj.model):
        bn_policy = "recompute"
    s = surface(obj, directions=[d1, d2], coords=coords, bn_policy=bn_policy, progress=progress)
    s.config["plane"] = {
        "points": {k: list(v) for k, v in points.items()},
        "normalize": normalize,
        "curve_kind": kind,
        "curve": None if curve_xy is None else curve_xy.tolist(),
    }
    return Plane(surface=s, points=points, directions=[d1, d2], curve=curve_xy)
