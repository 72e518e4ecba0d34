"""The SAM family: two-pass perturb-then-descend optimizers over an injected base optimizer.

``sam`` (SAM, ASAM), ``fisher_sam`` (Fisher-SAM), ``random_sam`` (Random-SAM, Mix-SAM) and
``vsam`` (Variational SAM); the shared machinery lives in :mod:`optimizers.perturbation`.
"""

from optimizers.sam.fisher_sam import FisherSAM
from optimizers.sam.random_sam import MixSAM, RandomSAM
from optimizers.sam.sam import ASAM, SAM
from optimizers.sam.vsam import VariationalSAM

__all__ = ["ASAM", "SAM", "FisherSAM", "MixSAM", "RandomSAM", "VariationalSAM"]
