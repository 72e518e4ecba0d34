"""landscape: curvature, sharpness and loss surfaces of PyTorch models.

Public API (each section is filled by the module that owns it)::

    import landscape as ls
    obj = ls.Objective(model, loss_fn, data)
    ls.eigenvalues(ls.hessian(obj), k=5); ls.trace(obj); ls.spectral_density(obj)
    ls.sharpness(obj, "worst_case", rho=0.05)
    ls.surface(obj, directions=[d1, d2], coords=[xs, ys])
"""

# --- surfaces, directions, data, models ---
from landscape import data, directions, models, trajectory  # noqa: F401

# --- eigenvalues / trace / density (curvature core) ---
from landscape.density import DensityResult, spectral_density  # noqa: F401
from landscape.eigen import EigenResult, eigenvalues, power_iteration  # noqa: F401

# --- objective / operators (curvature core) ---
from landscape.hvp import hvp  # noqa: F401
from landscape.objective import Objective  # noqa: F401
from landscape.operators import (  # noqa: F401
    CurvatureOperator,
    empirical_fisher,
    fisher,
    ggn,
    hessian,
)
from landscape.results import Result, load_result  # noqa: F401

# --- sharpness ---
from landscape.sharpness import MEASURES, SharpnessResult, sharpness, sharpness_report  # noqa: F401
from landscape.surface import Surface, load_surface, surface  # noqa: F401
from landscape.trace import DiagonalResult, TraceResult, diagonal, trace  # noqa: F401

__version__ = "0.1.0"
