"""Deprecated: the split step (first_step / second_step) moved to :mod:`optimizers.perturbation`.

This module goes in the next release.
"""

import warnings

import optimizers.perturbation as _new

_MOVED = {"SplitStep": "PerturbationOptimizer"}


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(
            f"optimizers.split_step.{name} is deprecated; use optimizers.perturbation.{_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_new, _MOVED[name])
    raise AttributeError(f"module 'optimizers.split_step' has no attribute {name!r}")
