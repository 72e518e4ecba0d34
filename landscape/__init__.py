"""landscape: curvature, sharpness and loss surfaces of PyTorch models.

Public API::

    import landscape as ls
    obj = ls.Objective(model, loss_fn, data)                       # objective.py
    H = ls.hessian(obj); ls.ggn(obj); ls.empirical_fisher(obj)      # operators.py, hvp.py
    ls.eigenvalues(H, k=5); ls.trace(obj); ls.spectral_density(obj)  # eigen.py, trace.py, density.py
    ls.sharpness(obj, "worst_case", rho=0.05)                       # sharpness.py, _measures/
    ls.surface(obj, directions=[d1, d2], coords=[xs, ys])           # surface.py, directions.py
    ls.data.load_digits(); ls.models.model_factory("mlp")           # data.py, models.py
"""

from landscape import data, directions, models, trajectory
from landscape.density import DensityResult, spectral_density
from landscape.eigen import EigenResult, eigenvalues, power_iteration
from landscape.hvp import hvp
from landscape.objective import Objective
from landscape.operators import CurvatureOperator, empirical_fisher, fisher, ggn, hessian
from landscape.results import Result, load_result
from landscape.sharpness import MEASURES, SharpnessResult, sharpness, sharpness_report
from landscape.surface import Surface, load_surface, surface
from landscape.trace import DiagonalResult, TraceResult, diagonal, trace

__all__ = [
    "MEASURES",
    "CurvatureOperator",
    "DensityResult",
    "DiagonalResult",
    "EigenResult",
    "Objective",
    "Result",
    "SharpnessResult",
    "Surface",
    "TraceResult",
    "data",
    "diagonal",
    "directions",
    "eigenvalues",
    "empirical_fisher",
    "fisher",
    "ggn",
    "hessian",
    "hvp",
    "load_result",
    "load_surface",
    "models",
    "power_iteration",
    "sharpness",
    "sharpness_report",
    "spectral_density",
    "surface",
    "trace",
    "trajectory",
]

__version__ = "0.1.0"
