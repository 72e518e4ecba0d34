"""Deprecated: the split step (``first_step`` / ``second_step``) moved to
:class:`optimizers.perturbation.PerturbationOptimizer`.

This module goes in the next release.
"""

from optimizers._deprecated import moved

__getattr__ = moved(
    __name__,
    {
        "SplitStep": "optimizers.perturbation:PerturbationOptimizer",
    },
)
