"""Posterior and flat-seeking Bayesian methods as optimizers.

* variational: ``mfvi`` (mean-field VI, Bayes by Backprop), ``bsam`` (Bayesian-SAM), ``vogn``
  (VOGN), ``ivon`` (IVON), ``sgvb`` (SGVB / SGVB-LRT layers) and ``flat_sgvb`` (F-SGVB, + geometry);
* sampling and ensembles: ``swag`` (SWAG / F-SWAG, BatchNorm recalibration), ``sgld`` (F-SGLD),
  ``mc_dropout`` (MC-Dropout / F-MC-Dropout), ``ensembles`` (deep / F-deep ensembles);
* ``laplace``: diagonal, Kronecker-factored (KFAC) and last-layer GGN Laplace with the linearised
  predictive;
* ``tracer``: G-TRACER.

The diagonal-Gaussian posterior API and Bayesian model averaging live in
:mod:`optimizers.posterior`.
"""

from optimizers.bayes.bsam import BayesianSAM
from optimizers.bayes.ensembles import DeepEnsemble, sam_factory, train_ensemble
from optimizers.bayes.flat_sgvb import FlatSGVB
from optimizers.bayes.ivon import IVON
from optimizers.bayes.laplace import DiagLaplace, KronLaplace, LastLayerLaplace
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
from optimizers.bayes.swag import SWAG, bn_update, f_swag
from optimizers.bayes.tracer import AdamTracer, SGDTracer
from optimizers.bayes.vogn import VOGN

__all__ = [
    "IVON",
    "MFVI",
    "SWAG",
    "VOGN",
    "AdamTracer",
    "BayesConv2d",
    "BayesLinear",
    "BayesianSAM",
    "DeepEnsemble",
    "DiagLaplace",
    "FlatSGLD",
    "FlatSGVB",
    "KronLaplace",
    "LastLayerLaplace",
    "SGDTracer",
    "bn_update",
    "convert_to_bayesian",
    "elbo_loss",
    "f_mc_dropout",
    "f_swag",
    "kl_divergence",
    "mc_dropout_closure",
    "mc_dropout_predict",
    "sam_factory",
    "sgvb_predict",
    "train_ensemble",
]
