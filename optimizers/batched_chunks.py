"""Deprecated: the m-sharpness engines moved to :mod:`optimizers.m_sharpness` (and
:mod:`optimizers.closure`).

This module goes in the next release.
"""

from landscape.deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "ChunkClosure": "optimizers.closure",
        "NotVectorisable": "optimizers.m_sharpness",
        "ChunkVectoriser": "optimizers.m_sharpness:ChunkEngine",
        "chunk_norms": "optimizers.m_sharpness",
    },
)
