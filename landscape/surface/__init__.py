"""Loss surfaces of real networks: ``L(theta + x d1 + y d2)`` on a grid over a whole data set.

* ``grid``: :func:`surface` (strategies, BatchNorm policy, resume);
* ``evaluators``: how grid points are evaluated (loop, linear first layer, vmap);
* ``budget``: ``batch_points="auto"``, chunks of points whose measured peak fits ``max_memory``;
* ``precision``: ``precision="bf16"|"tf32"`` evaluation and its recorded error against float32;
* ``result``: the :class:`Surface` result (files, plots, HTML/VTK export);
* ``directions``: random (filter-normalised), Hessian-eigenvector and trajectory-PCA directions;
* ``trajectory``: parameter snapshots during training and their projection onto a plane;
* ``paths``, ``curves``, ``planes``, ``path_result``: paths between two minima (linear
  interpolation with the barrier height, trained Bezier/polygonal curves, the plane through both
  ends and the bend);
* ``cli``: ``python -m landscape surface``.
"""

from landscape.surface import curves, directions, paths, planes, trajectory
from landscape.surface.curves import Curve, evaluate_path, fit_curve
from landscape.surface.evaluators import model_hash
from landscape.surface.grid import surface
from landscape.surface.path_result import PathResult
from landscape.surface.paths import interpolate, recompute_bn
from landscape.surface.planes import Plane, curve_plane, plane, plane_directions
from landscape.surface.result import Surface, load_surface

__all__ = [
    "Curve",
    "PathResult",
    "Plane",
    "Surface",
    "curve_plane",
    "curves",
    "directions",
    "evaluate_path",
    "fit_curve",
    "interpolate",
    "load_surface",
    "model_hash",
    "paths",
    "plane",
    "plane_directions",
    "planes",
    "recompute_bn",
    "surface",
    "trajectory",
]
