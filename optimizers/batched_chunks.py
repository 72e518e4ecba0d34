"""Deprecated: the m-sharpness engines moved to :mod:`optimizers.m_sharpness`.

This module goes in the next release.
"""

import warnings

import optimizers.closure as _closure
import optimizers.m_sharpness as _new

_MOVED = {
    "ChunkClosure": "ChunkClosure",
    "NotVectorisable": "NotVectorisable",
    "ChunkVectoriser": "ChunkEngine",
    "chunk_norms": "chunk_norms",
}


def __getattr__(name: str):
    if name in _MOVED:
        warnings.warn(
            f"optimizers.batched_chunks.{name} is deprecated; use optimizers.m_sharpness.{_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_closure if name == "ChunkClosure" else _new, _MOVED[name])
    raise AttributeError(f"module 'optimizers.batched_chunks' has no attribute {name!r}")
