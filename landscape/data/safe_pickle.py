"""A restricted unpickler for the CIFAR "python version" data files.

A pickle is a small program: ``pickle.load`` imports and calls whatever globals the file names,
so a crafted ``data_batch_1`` whose object defines ``__reduce__`` runs arbitrary code (for example
``os.system``) the moment it is read. The CIFAR-10 / CIFAR-100 files contain nothing but a dict of
bytes, lists of ints and uint8 numpy arrays, so :class:`RestrictedUnpickler` resolves exactly the
globals that format needs and refuses every other one *before* anything is called:

* builtin containers and scalars that pickles may name explicitly (``set``, ``frozenset``,
  ``bytes``, ``bytearray``, ``complex``), under their Python 3 (``builtins``) and Python 2
  (``__builtin__``) module names;
* ``_codecs.encode``, which protocol-2 pickles written by Python 3 use for ``bytes`` objects;
  only the latin-1 text-to-bytes conversion is admitted;
* numpy array reconstruction: ``numpy.ndarray``, ``numpy.dtype``, ``multiarray._reconstruct``
  and ``multiarray.scalar`` (protocols 0-4) and ``numeric._frombuffer`` (protocol 5), under both
  ``numpy.core`` (numpy < 2, the original CIFAR files) and ``numpy._core`` (numpy >= 2) names.

Globals are matched by exact ``(module, name)`` pairs, so dotted names (``numpy.ndarray.__reduce__``)
and look-alikes are refused as well.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ALLOWED_GLOBALS", "RefusedGlobalError", "RestrictedUnpickler", "safe_load_pickle"]


class RefusedGlobalError(ValueError):
    """A pickle named a global outside :data:`ALLOWED_GLOBALS` (it was neither imported nor called)."""


_LATIN1 = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "l1"}


def _latin1_encode(text: Any, encoding: str = "latin1", errors: str = "strict") -> bytes:
    """The one use of ``_codecs.encode`` in protocol-2 pickles: ``str`` -> ``bytes`` in latin-1."""
    if not isinstance(text, str) or not isinstance(encoding, str) or encoding.lower() not in _LATIN1:
        raise pickle.UnpicklingError(
            f"_codecs.encode is admitted only as a latin-1 str -> bytes conversion, got "
            f"{type(text).__name__} with encoding {encoding!r}"
        )
    return text.encode("latin-1", errors="strict")


def _numpy_attr(submodule: str, name: str) -> Callable[[], Any]:
    """Resolve ``numpy._core.<submodule>.<name>`` (numpy >= 2) or ``numpy.core...`` (numpy < 2)."""

    def resolve() -> Any:
        for package in ("numpy._core", "numpy.core"):
            try:
                module = importlib.import_module(f"{package}.{submodule}")
            except ImportError:
                continue
            if hasattr(module, name):
                return getattr(module, name)
        raise pickle.UnpicklingError(f"numpy has no {submodule}.{name}")

    return resolve


def _numpy_top(name: str) -> Callable[[], Any]:
    def resolve() -> Any:
        import numpy

        return getattr(numpy, name)

    return resolve


def _builtin(name: str) -> Callable[[], Any]:
    import builtins

    return lambda: getattr(builtins, name)


_BUILTINS = ("set", "frozenset", "bytes", "bytearray", "complex")

#: ``(module, name)`` -> resolver for every global a CIFAR pickle may name.
ALLOWED_GLOBALS: dict[tuple[str, str], Callable[[], Any]] = {
    **{(m, n): _builtin(n) for m in ("builtins", "__builtin__") for n in _BUILTINS},
    ("_codecs", "encode"): lambda: _latin1_encode,
    ("numpy", "ndarray"): _numpy_top("ndarray"),
    ("numpy", "dtype"): _numpy_top("dtype"),
    **{
        (f"{pkg}.multiarray", name): _numpy_attr("multiarray", name)
        for pkg in ("numpy.core", "numpy._core")
        for name in ("_reconstruct", "scalar")
    },
    **{
        (f"{pkg}.numeric", "_frombuffer"): _numpy_attr("numeric", "_frombuffer")
        for pkg in ("numpy.core", "numpy._core")
    },
}


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits only :data:`ALLOWED_GLOBALS`.

    ``source`` (the file name) and ``what`` (the data set) only shape the error message.
    """

    def __init__(self, file: Any, *, source: str = "<pickle>", what: str = "CIFAR", **kwargs: Any):
        super().__init__(file, **kwargs)
        self._source = source
        self._what = what

    def find_class(self, module: str, name: str) -> Any:
        resolver = ALLOWED_GLOBALS.get((module, name))
        if resolver is None:
            raise RefusedGlobalError(
                f"{self._source}: the {self._what} reader refuses to load {module}.{name}: "
                f"{self._what} files contain only arrays and lists; the file is corrupt or malicious"
            )
        return resolver()

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("persistent ids are not part of the format")


def safe_load_pickle(path: str | os.PathLike, *, what: str = "CIFAR", encoding: str = "bytes") -> Any:
    """Unpickle ``path`` with :class:`RestrictedUnpickler`.

    Raises:
        RefusedGlobalError (a ``ValueError``): the file names a global outside the allow-list.
        ValueError: the file is not a readable pickle (truncated, corrupt, not a pickle at all).
        FileNotFoundError / OSError: the file cannot be opened.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        try:
            return RestrictedUnpickler(fh, source=str(path), what=what, encoding=encoding).load()
        except RefusedGlobalError:
            raise
        except RecursionError:
            raise ValueError(
                f"{path}: the pickle nests too deeply; the file is corrupt or malicious"
            ) from None
        except Exception as exc:  # truncated or corrupt pickle: EOFError, UnpicklingError, ...
            raise ValueError(
                f"{path}: not a readable {what} python pickle ({type(exc).__name__}: {exc}); "
                "the file is truncated or corrupt, re-extract it from the official archive"
            ) from exc
