"""Curvature of an :class:`~landscape.Objective`: matrix-free operators and their spectra.

* ``base``: :class:`CurvatureOperator`, the one base class of every operator (the one loop over
  batches and column chunks), and :func:`product_kernels`, the kernels every product runs with;
* ``hessian``, ``ggn``, ``fisher``: the Hessian (its engines: forward-over-reverse, double backward,
  finite differences; ``graph_split``: its cached graph as sub-graphs), generalised Gauss-Newton
  (with the closed-form Hessians of common losses with respect to the network output), empirical
  and Monte-Carlo Fisher operators (``output_space``: the ``J^T M J`` products they share);
* ``kfac``, ``kronecker``: KFAC and EKFAC (Kronecker-factored GGN / Fisher of ``Linear`` and ``Conv2d``
  layers) and the algebra of block-diagonal Kronecker matrices (damped inverses, log-determinant,
  trace, eigenvalues from the factors);
* ``memory``: ``max_memory=`` of every operator: blocks split into chunks of columns whose measured
  peak memory stays within a budget;
* ``compiled``, ``autocompile``: products as one ``torch.compile`` graph, and ``compile="auto"`` of
  the estimators: compile when the measured saving over the products left pays for the compile;
* ``linop``: what the spectral estimators accept (operators, dense matrices, objectives);
* ``eigen``, ``trace``, ``density``: Lanczos eigenvalues, trace/diagonal estimators with error bars,
  and stochastic Lanczos quadrature (``xtrace``: XTrace's state, rank-deficient sketches included);
* ``monitor``: :class:`CurvatureMonitor`, lambda_max (and the preconditioned sharpness of Adam)
  during training against the edge-of-stability threshold (``stability``: the thresholds and Adam's
  preconditioner).
"""

from landscape.curvature.base import CurvatureOperator, product_kernels
from landscape.curvature.compiled import CompiledOperator, compile_operator
from landscape.curvature.density import DensityResult, spectral_density
from landscape.curvature.eigen import EigenResult, eigenvalues, power_iteration
from landscape.curvature.fisher import EmpiricalFisherOperator, FisherOperator, empirical_fisher, fisher
from landscape.curvature.ggn import GGNOperator, ggn
from landscape.curvature.hessian import ENGINES, HessianOperator, HVPEngine, hessian, hvp
from landscape.curvature.kfac import EKFACOperator, KFACOperator, ekfac, kfac
from landscape.curvature.monitor import CurvatureMonitor, MonitorResult, stability_threshold
from landscape.curvature.output_space import OutputSpaceOperator
from landscape.curvature.trace import DiagonalResult, TraceResult, diagonal, trace

__all__ = [
    "CompiledOperator",
    "compile_operator",
    "ENGINES",
    "CurvatureMonitor",
    "CurvatureOperator",
    "MonitorResult",
    "DensityResult",
    "DiagonalResult",
    "EigenResult",
    "EKFACOperator",
    "EmpiricalFisherOperator",
    "FisherOperator",
    "GGNOperator",
    "HVPEngine",
    "HessianOperator",
    "KFACOperator",
    "OutputSpaceOperator",
    "TraceResult",
    "diagonal",
    "eigenvalues",
    "ekfac",
    "empirical_fisher",
    "fisher",
    "ggn",
    "hessian",
    "hvp",
    "kfac",
    "power_iteration",
    "product_kernels",
    "spectral_density",
    "stability_threshold",
    "trace",
]
