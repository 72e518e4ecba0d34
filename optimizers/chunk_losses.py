"""Deprecated: the m losses of a vectorised pass moved to :mod:`optimizers.m_sharpness`.

This module goes in the next release.
"""

import warnings

import optimizers.m_sharpness as _new

_MOVED = {"chunk_losses": "chunk_losses", "flat_cross_entropy": "flat_cross_entropy"}


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(
            f"optimizers.chunk_losses.{name} is deprecated; use optimizers.m_sharpness.{_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_new, _MOVED[name])
    raise AttributeError(f"module 'optimizers.chunk_losses' has no attribute {name!r}")
