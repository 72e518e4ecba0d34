"""Posterior and flat-seeking Bayesian methods as optimizers.

``mfvi`` (mean-field VI, Bayes by Backprop), ``bsam`` (Bayesian-SAM), ``tracer`` (G-TRACER),
``swag`` (SWAG / F-SWAG) and ``sgld`` (F-SGLD); the diagonal-Gaussian posterior API and Bayesian
model averaging live in :mod:`optimizers.posterior`.
"""

from optimizers.bayes.bsam import BayesianSAM
from optimizers.bayes.ivon import IVON
from optimizers.bayes.laplace import DiagLaplace, LastLayerLaplace
from optimizers.bayes.mfvi import MFVI
from optimizers.bayes.sgld import FlatSGLD
from optimizers.bayes.swag import SWAG, f_swag
from optimizers.bayes.tracer import AdamTracer, SGDTracer
from optimizers.bayes.vogn import VOGN

__all__ = ["MFVI", "SWAG", "AdamTracer", "BayesianSAM", "FlatSGLD", "SGDTracer", "f_swag"]
__all__ += ["IVON", "VOGN", "DiagLaplace", "LastLayerLaplace"]
