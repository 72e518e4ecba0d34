"""Posterior and flat-seeking Bayesian methods as optimizers.

``mfvi`` (mean-field VI, Bayes by Backprop), ``bsam`` (Bayesian-SAM), ``tracer`` (G-TRACER),
``swag`` (SWAG / F-SWAG) and ``sgld`` (F-SGLD); the diagonal-Gaussian posterior API and Bayesian
model averaging live in :mod:`optimizers.posterior`.
"""

from optimizers.bayes.bsam import BayesianSAM
from optimizers.bayes.ensembles import DeepEnsemble, sam_factory, train_ensemble
from optimizers.bayes.flat_sgvb import FlatSGVB
from optimizers.bayes.ivon import IVON
from optimizers.bayes.laplace import DiagLaplace, LastLayerLaplace
from optimizers.bayes.mc_dropout import f_mc_dropout, mc_dropout_closure, mc_dropout_predict
from optimizers.bayes.mfvi import MFVI
from optimizers.bayes.sgld import FlatSGLD
from optimizers.bayes.sgvb import (
    BayesConv2d,
    BayesLinear,
    convert_to_bayesian,
    elbo_loss,
    kl_divergence,
    sgvb_predict,
)
from optimizers.bayes.swag import SWAG, f_swag
from optimizers.bayes.tracer import AdamTracer, SGDTracer
from optimizers.bayes.vogn import VOGN

__all__ = ["MFVI", "SWAG", "AdamTracer", "BayesianSAM", "FlatSGLD", "SGDTracer", "f_swag"]
__all__ += ["BayesConv2d", "BayesLinear", "DeepEnsemble", "FlatSGVB", "convert_to_bayesian", "elbo_loss"]
__all__ += ["f_mc_dropout", "kl_divergence", "mc_dropout_closure", "mc_dropout_predict", "sam_factory"]
__all__ += ["sgvb_predict", "train_ensemble"]
__all__ += ["IVON", "VOGN", "DiagLaplace", "LastLayerLaplace"]
