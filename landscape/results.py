"""Small result containers shared by every analysis: value, error bar, configuration, cost.

Every result records the configuration that produced it (``config``), how much work it took
(``matvecs``/``evaluations`` and ``seconds``) and converts to a plain dict / JSON file and back.
Subclasses add their own fields; ``to_dict`` and ``load`` handle tensors and nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from landscape.io import atomic_write_json, to_jsonable

R = TypeVar("R", bound="Result")

_REGISTRY: dict[str, type[Result]] = {}


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
        """Write the result as JSON, atomically."""
        atomic_write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any]) -> R:
        d = dict(d)
        typ = d.pop("type", cls.__name__)
        target = _REGISTRY.get(typ, cls)
        names = {f.name for f in dataclasses.fields(target)}
        kwargs = {k: v for k, v in d.items() if k in names}
        for name in target.tensor_fields:
            if kwargs.get(name) is not None:
                kwargs[name] = torch.as_tensor(kwargs[name], dtype=torch.float64)
        return target(**kwargs)


def load_result(path: str | os.PathLike) -> Result:
    """Load any result written by ``Result.save``."""
    with open(path, encoding="utf-8") as fh:
        return Result.from_dict(json.load(fh))


def normal_ci(value: float, stderr: float, level: float = 0.95) -> tuple[float, float]:
    """Two-sided normal confidence interval ``value +- z * stderr``."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    return value - z * stderr, value + z * stderr


def is_finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
