"""Small result containers shared by every analysis: value, error bar, configuration, cost.

Every result records the configuration that produced it (``config``), how much work it took
(``matvecs``/``evaluations`` and ``seconds``) and converts to a plain dict / JSON file and back.
Subclasses add their own fields; ``to_dict`` and ``load`` handle tensors and nested dataclasses.

Loading is strict, because a result file is input: the ``type`` must name a known result class,
every key must be one of its fields and every value must match the field's annotation (``float``
fields accept ints and the non-finite tokens ``NaN`` / ``Infinity``; tensor fields need a
rectangular array of numbers); anything else raises a ``ValueError`` naming the file, the field
and the problem. Non-finite floats round-trip as floats (see :mod:`landscape.io`); the strings
``"nan"`` / ``"inf"`` / ``"-inf"`` that older versions wrote for non-finite scalars are read
back as floats in ``float`` fields only.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch

from landscape.io import atomic_write_json, read_json, to_jsonable

R = TypeVar("R", bound="Result")

_REGISTRY: dict[str, type[Result]] = {}
_LEGACY_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass
class Result:
    """Base class: subclasses are dataclasses registered by name for ``load``."""

    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    kind: ClassVar[str] = "result"
    tensor_fields: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}
        d["type"] = type(self).__name__
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write the result as JSON, atomically (non-finite floats as ``NaN`` / ``Infinity``)."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """Rebuild a result from :meth:`to_dict` output, checking the type, keys and field types.

        ``d["type"]`` selects the class (it must be ``cls`` or a subclass); without it ``cls`` is
        used, except on the base class, which needs it. Raises ``ValueError`` naming the problem.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"a result must be a JSON object (dict), got {type(d).__name__}")
        d = dict(d)
        typ = d.pop("type", None)
        if typ is None:
            if cls is Result:
                raise ValueError(
                    "the result has no 'type' field naming its class (e.g. 'TraceResult'); "
                    "was it written by Result.save?"
                )
            target: type[Result] = cls
        else:
            target = _lookup_type(typ)
            if not issubclass(target, cls):
                raise ValueError(
                    f"the result is of type {typ}, which is not a {cls.__name__} (load it with load_result)"
                )
        return target._from_fields(_conform_fields(target, d))

    @classmethod
    def _from_fields(cls: type[R], kwargs: dict[str, Any]) -> R:
        """Construct from checked field values; subclasses with cross-field rules override this."""
        return cls(**kwargs)


_REGISTRY["Result"] = Result


def load_result(path: str | os.PathLike) -> Result:
    """Load any result written by ``Result.save``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, truncated, not JSON, has no/unknown ``type``, unknown keys
            or values of the wrong type; the message names the file and the problem.
    """
    d = read_json(path, what="result file (JSON written by Result.save)")
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a result file holds a JSON object, found a {type(d).__name__}")
    try:
        return Result.from_dict(d)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {exc}") from None


# -------------------------------------------------------------------------- checking loaded fields


def _lookup_type(typ: Any) -> type[Result]:
    if not isinstance(typ, str):
        raise ValueError(f"the result 'type' must be a class name (string), got {typ!r}")
    if typ not in _REGISTRY:
        importlib.import_module("landscape")  # registers every result class of the package
    if typ not in _REGISTRY:
        raise ValueError(f"unknown result type {typ!r}; known types: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[typ]


def _field_hints(target: type) -> dict[str, Any]:
    """Resolved annotations of ``target``'s fields; an annotation that cannot be resolved -> Any."""
    try:
        return typing.get_type_hints(target)
    except Exception:  # an annotation names something its module does not import
        hints: dict[str, Any] = {}
        for klass in reversed(target.__mro__):
            ns = vars(sys.modules.get(klass.__module__, object()))
            for name, ann in getattr(klass, "__annotations__", {}).items():
                try:
                    hints[name] = eval(ann, dict(ns)) if isinstance(ann, str) else ann  # noqa: S307
                except Exception:
                    hints[name] = Any
        return hints


def _conform_fields(target: type[Result], d: dict[str, Any]) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(target) if f.init}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for a {target.__name__}; its fields are {sorted(fields)}"
        )
    hints = _field_hints(target)
    out = {}
    for name, value in d.items():
        hint = torch.Tensor if name in target.tensor_fields and value is not None else hints.get(name, Any)
        out[name] = _conform(value, hint, f"{target.__name__}.{name}")
    return out


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _conform(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against (and converted to) the annotation ``hint``; ValueError if not."""
    if hint is Any or hint is object:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _conform(value, arg, where)
            except ValueError:
                continue
        raise ValueError(f"field {where}: expected {_hint_name(hint)}, got {_describe(value)}")
    bad = ValueError(f"field {where}: expected {_hint_name(hint)}, got {_describe(value)}")
    if hint is type(None):
        if value is None:
            return None
        raise bad
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise bad
    if hint is int:
        if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
            return int(value)
        raise bad
    if hint is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)
        ):
            return float(value)
        if isinstance(value, str) and value.strip().lower() in _LEGACY_FLOATS:
            return _LEGACY_FLOATS[value.strip().lower()]
        raise bad
    if hint is str:
        if isinstance(value, str):
            return value
        raise bad
    if hint is torch.Tensor:
        return _as_tensor(value, where)
    container = origin or hint
    if container in (list, tuple) and isinstance(container, type):
        if not isinstance(value, (list, tuple)):
            raise bad
        if container is tuple:
            return tuple(value)
        if not args:
            return list(value)
        return [_conform(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if container is dict:
        if not isinstance(value, Mapping):
            raise bad
        if not args:
            return dict(value)
        key_hint, val_hint = args
        return {
            _conform(k, key_hint, f"{where} key"): _conform(v, val_hint, f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if isinstance(hint, type) and issubclass(hint, Result):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            try:
                return hint.from_dict(value)
            except ValueError as exc:
                raise ValueError(f"field {where}: {exc}") from None
        raise bad
    return value  # annotations this checker does not model (callables, arrays, ...) pass through


def _as_tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64)
    msg = f"field {where}: expected a rectangular array of numbers"
    if isinstance(value, (bool, str, bytes)) or value is None:
        raise ValueError(f"{msg}, got {_describe(value)}")
    try:
        arr = np.array(value)
    except (ValueError, TypeError):
        raise ValueError(f"{msg}; the nested lists have different lengths") from None
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{msg}, got elements of type {arr.dtype} ({_describe(value)})")
    return torch.as_tensor(arr, dtype=torch.float64)


# ------------------------------------------------------------------------------------------ helpers


def normal_ci(value: float, stderr: float, level: float = 0.95) -> tuple[float, float]:
    """Two-sided normal confidence interval ``value +- z * stderr``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    return value - z * stderr, value + z * stderr


def is_finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
