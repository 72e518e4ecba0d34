"""optimizers: SAM-family and flat-seeking Bayesian optimizers as ``torch.optim.Optimizer``s.

Every optimizer is stepped the same way::

    loss = opt.step(closure)   # closure: zero_grad, forward, backward, return loss
"""

# --- SAM family (two-pass perturb-then-descend) ---
from ._perturb import bn_update_disabled, make_closure  # noqa: E402,F401
from .fisher_sam import FisherSAM  # noqa: E402,F401
from .random_sam import MixSAM, RandomSAM  # noqa: E402,F401
from .sam import ASAM, SAM  # noqa: E402,F401
from .vsam import VariationalSAM  # noqa: E402,F401

# --- Bayesian / second-order (MFVI, bSAM, G-TRACER, flat-seeking) ---
# isort: split
from ._posterior import DiagonalGaussianPosterior, bayesian_model_average  # noqa: E402,F401
from .bsam import BayesianSAM  # noqa: E402,F401
from .flat_bayes import SWAG, FlatSGLD, f_swag  # noqa: E402,F401
from .mfvi import MFVI  # noqa: E402,F401
from .tracer import AdamTracer, SGDTracer  # noqa: E402,F401
