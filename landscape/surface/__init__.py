"""Loss surfaces of real networks: ``L(theta + x d1 + y d2)`` on a grid over a whole data set.

* ``grid``: :func:`surface` (strategies, BatchNorm policy, resume);
* ``evaluators``: how grid points are evaluated (loop, linear first layer, vmap);
* ``result``: the :class:`Surface` result (files, plots, HTML/VTK export);
* ``directions``: random (filter-normalised), Hessian-eigenvector and trajectory-PCA directions;
* ``trajectory``: parameter snapshots during training and their projection onto a plane;
* ``cli``: ``python -m landscape surface``.
"""

from landscape.surface import directions, trajectory
from landscape.surface.evaluators import model_hash
from landscape.surface.grid import surface
from landscape.surface.result import Surface, load_surface

__all__ = ["Surface", "directions", "load_surface", "model_hash", "surface", "trajectory"]
