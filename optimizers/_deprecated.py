"""Names that moved, served for one more release with a ``DeprecationWarning``.

A module whose public names moved sets ``__getattr__ = moved(__name__, {old: "new.module:new"})``;
Python calls it only for names the module no longer defines.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["moved"]


def moved(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (old name -> ``"module:name"``; ``"module"``: the
    same name there) from their new home, with a ``DeprecationWarning``."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = names[name].partition(":")
        warnings.warn(
            f"{module}.{name} is deprecated and goes in the next release; use {where}.{new or name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), new or name)

    return __getattr__
