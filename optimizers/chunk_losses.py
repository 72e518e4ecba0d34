"""Deprecated: the m losses of a vectorised pass moved to :mod:`optimizers.m_sharpness`.

This module goes in the next release.
"""

from optimizers._deprecated import moved

__getattr__ = moved(
    __name__,
    {
        "chunk_losses": "optimizers.m_sharpness",
        "flat_cross_entropy": "optimizers.m_sharpness",
    },
)
