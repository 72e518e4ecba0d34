"""A small TOML writer for resolved configurations (``tomllib`` only reads TOML).

Handles what configurations contain: strings, booleans, integers, floats (``nan``/``inf``
included), lists, tables and lists of tables (``[[methods]]``). :func:`dumps` output read back
with ``tomllib.loads`` gives the same dict.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["dumps"]

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_key(str(k))} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write a {type(v).__name__} ({v!r}) as a TOML value")


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _table(lines: list[str], prefix: str, table: Mapping[str, Any]) -> None:
    plain = [(k, v) for k, v in table.items() if not isinstance(v, Mapping) and not _is_table_list(v)]
    subs = [(k, v) for k, v in table.items() if isinstance(v, Mapping)]
    lists = [(k, v) for k, v in table.items() if _is_table_list(v)]
    for k, v in plain:
        lines.append(f"{_key(str(k))} = {_value(v)}")
    for k, v in subs:
        name = f"{prefix}.{_key(str(k))}" if prefix else _key(str(k))
        lines.extend(["", f"[{name}]"])
        _table(lines, name, v)
    for k, items in lists:
        name = f"{prefix}.{_key(str(k))}" if prefix else _key(str(k))
        for item in items:
            lines.extend(["", f"[[{name}]]"])
            # nested tables of an array entry are written inline, which keeps them unambiguous
            for ik, iv in item.items():
                lines.append(f"{_key(str(ik))} = {_value(iv)}")


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as TOML text (top-level scalars first, then tables, then arrays of tables)."""
    lines: list[str] = []
    _table(lines, "", data)
    return "\n".join(lines).lstrip("\n") + "\n"
