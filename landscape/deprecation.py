"""Public names that moved to another module, served from their new home for one more release.

A module whose names moved sets ``__getattr__ = moved_names(__name__, {old: "new.module"})`` (the
same name there) or ``{old: "new.module:new_name"}``.  Python calls a module's ``__getattr__`` only
for names the module no longer defines (PEP 562); the new home is imported only when an old name is
used, and each use warns with a ``DeprecationWarning`` that names it.  One helper for the whole
tree: ``landscape``, ``optimizers`` and ``experiments`` all move names this way.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["moved_names"]


def moved_names(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``names`` (old name -> ``"module"`` or ``"module:new_name"``)
    from their new home, with a ``DeprecationWarning`` naming it."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = names[name].partition(":")
        new = new or name
        warnings.warn(
            f"{module}.{name} moved to {where}.{new}; import it from there "
            "(the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), new)

    return __getattr__
