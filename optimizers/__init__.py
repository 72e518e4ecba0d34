"""optimizers: SAM-family and flat-seeking Bayesian optimizers as ``torch.optim.Optimizer``s.

Every optimizer is stepped the same way::

    loss = opt.step(closure)   # closure: zero_grad, forward, backward, return loss

or, for the SAM family and bSAM in loops that run the passes themselves, in halves
(``opt.first_step()`` / ``opt.second_step()``, :mod:`optimizers.perturbation`); mixed precision
through :class:`optimizers.amp.LossScaler`.

* :mod:`optimizers.sam`: SAM, ASAM, Fisher-SAM, Random/Mix-SAM, Variational SAM;
* :mod:`optimizers.bayes`: MFVI, Bayesian-SAM, G-TRACER, SWAG/F-SWAG, F-SGLD;
* :mod:`optimizers.perturbation`: the perturb -> closure -> restore -> base-step machinery;
* :mod:`optimizers.step_protocol`: the split step's call order and the non-finite gradient rule;
* :mod:`optimizers.m_sharpness`: the per-chunk gradients of m-sharpness (loop, vmap, direct);
* :mod:`optimizers.amp`: the dynamic loss scaler for two-pass optimizers;
* :mod:`optimizers.posterior`: the diagonal-Gaussian posterior API and Bayesian model averaging.
"""

from optimizers.amp import LossScaler, ScaleUnderflow, SkipStep
from optimizers.bayes import MFVI, SWAG, AdamTracer, BayesianSAM, FlatSGLD, SGDTracer, f_swag
from optimizers.bayes.ensembles import DeepEnsemble, train_ensemble
from optimizers.bayes.flat_sgvb import FlatSGVB
from optimizers.bayes.ivon import IVON
from optimizers.bayes.laplace import DiagLaplace, KronLaplace, LastLayerLaplace
from optimizers.bayes.mc_dropout import mc_dropout_predict
from optimizers.bayes.sgvb import convert_to_bayesian
from optimizers.bayes.vogn import VOGN
from optimizers.bn_state import bn_update_disabled
from optimizers.perturbation import make_closure
from optimizers.posterior import DiagonalGaussianPosterior, bayesian_model_average
from optimizers.sam import ASAM, SAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM

__all__ = [
    "ASAM",
    "MFVI",
    "SAM",
    "SWAG",
    "AdamTracer",
    "BayesianSAM",
    "DiagonalGaussianPosterior",
    "FisherSAM",
    "FlatSGLD",
    "MixSAM",
    "RandomSAM",
    "SGDTracer",
    "VariationalSAM",
    "bayesian_model_average",
    "bn_update_disabled",
    "f_swag",
    "make_closure",
]
__all__ += ["DeepEnsemble", "FlatSGVB", "convert_to_bayesian", "mc_dropout_predict", "train_ensemble"]
__all__ += ["IVON", "VOGN", "DiagLaplace", "KronLaplace", "LastLayerLaplace"]
__all__ += ["LossScaler", "ScaleUnderflow", "SkipStep"]
