"""Deprecated: the m losses of a vectorised pass moved to :mod:`optimizers.m_sharpness`.

This module goes in the next release.
"""

from landscape.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "chunk_losses": "optimizers.m_sharpness",
        "flat_cross_entropy": "optimizers.m_sharpness",
    },
)
