"""TOML text of resolved configurations, written by ``tomli-w`` (``tomllib`` only reads TOML).

Configurations hold strings, booleans, integers, floats (``nan`` / ``inf`` / ``-inf`` included,
which ``tomli-w`` writes as TOML's special floats), lists, tables and lists of tables
(``[[methods]]``).  :func:`dumps` output read back with ``tomllib.loads`` gives the same dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomli_w

__all__ = ["dumps"]


def _plain(v: Any) -> Any:
    """Keys as strings (as this module always wrote them), tuples as lists, all levels."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML text (``tomli_w.dumps``: top-level values first, then tables and arrays of
    tables).  Raises ``TypeError`` for a value TOML cannot hold (``None``, an object)."""
    return tomli_w.dumps(_plain(data))
