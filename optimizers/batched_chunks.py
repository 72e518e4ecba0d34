"""Deprecated: the m-sharpness engines moved to :mod:`optimizers.m_sharpness` (and
:mod:`optimizers.closure`).

This module goes in the next release.
"""

from optimizers._deprecated import moved

__getattr__ = moved(
    __name__,
    {
        "ChunkClosure": "optimizers.closure",
        "NotVectorisable": "optimizers.m_sharpness",
        "ChunkVectoriser": "optimizers.m_sharpness:ChunkEngine",
        "chunk_norms": "optimizers.m_sharpness",
    },
)
