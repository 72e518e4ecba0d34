"""landscape: curvature, sharpness and loss surfaces of PyTorch models.

Public API::

    import landscape as ls
    obj = ls.Objective(model, loss_fn, data)                       # objective.py
    H = ls.hessian(obj); ls.ggn(obj); ls.empirical_fisher(obj)      # curvature/
    K = ls.kfac(obj); K.inverse(1e-3); K.logdet(); ls.ekfac(obj)    # curvature/kfac.py
    ls.eigenvalues(H, k=5); ls.trace(obj); ls.spectral_density(obj)  # curvature/
    ls.sharpness(obj, "worst_case", rho=0.05)                       # sharpness.py, _measures/
    ls.surface(obj, directions=[d1, d2], coords=[xs, ys])           # surface.py, directions.py
    ls.data.load_digits(); ls.models.model_factory("mlp")           # data.py, models.py
"""

import sys as _sys

from landscape import data, metrics, models
from landscape.curvature import (
    CurvatureMonitor,
    CurvatureOperator,
    DensityResult,
    DiagonalResult,
    EigenResult,
    TraceResult,
    diagonal,
    eigenvalues,
    ekfac,
    empirical_fisher,
    fisher,
    ggn,
    hessian,
    hvp,
    kfac,
    power_iteration,
    spectral_density,
    trace,
)
from landscape.objective import Objective
from landscape.results import Result, load_result
from landscape.sharpness import MEASURES, SharpnessResult, sharpness, sharpness_report
from landscape.surface import (
    PathResult,
    Surface,
    directions,
    evaluate_path,
    fit_curve,
    interpolate,
    load_surface,
    surface,
    trajectory,
)

__all__ = [
    "MEASURES",
    "CurvatureMonitor",
    "CurvatureOperator",
    "DensityResult",
    "DiagonalResult",
    "EigenResult",
    "Objective",
    "PathResult",
    "Result",
    "SharpnessResult",
    "Surface",
    "TraceResult",
    "data",
    "diagonal",
    "directions",
    "eigenvalues",
    "evaluate_path",
    "fit_curve",
    "interpolate",
    "ekfac",
    "empirical_fisher",
    "fisher",
    "ggn",
    "hessian",
    "hvp",
    "kfac",
    "load_result",
    "load_surface",
    "metrics",
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

# ``landscape.directions`` and ``landscape.trajectory`` live in ``landscape.surface``; these aliases
# keep ``import landscape.directions`` / ``from landscape.trajectory import ...`` working.
_sys.modules.setdefault("landscape.directions", directions)
_sys.modules.setdefault("landscape.trajectory", trajectory)
