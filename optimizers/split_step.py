"""Deprecated: the split step (``first_step`` / ``second_step``) moved to
:class:`optimizers.perturbation.PerturbationOptimizer`.

This module goes in the next release.
"""

from landscape.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "SplitStep": "optimizers.perturbation:PerturbationOptimizer",
    },
)
