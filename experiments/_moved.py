"""Names that moved to another module stay importable from the old one, with a
``DeprecationWarning``, for one release: ``__getattr__ = moved_names(__name__, {name: new module})``
in the old module (PEP 562). The new module is imported only when an old name is used."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_names(module: str, moved: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that returns ``moved[name].name`` with a warning naming the new home."""

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} moved to {moved[name]}.{name}; import it from there "
            "(the old name goes in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(moved[name]), name)

    return __getattr__
