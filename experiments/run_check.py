"""What a run directory already holds must belong to the run about to use it.

Before a run writes anything, :func:`check_run_dir` compares its configuration with the one the
directory records, in ``config.toml`` (written when a run starts) and ``results.json`` (written when
it ends), in every key that can change a result (:func:`experiments.run_identity.run_settings`: everything
but ``progress``, ``out_dir``, ``device``, ``threads``, ``paper``, ``name`` and the seed, which the
directory's path holds), evaluation keys included. Any difference is refused (``ValueError`` naming
each differing key as a dotted path with both values, and the fix: another ``out_dir``, or delete
the run directory): a run is never resumed, re-evaluated or overwritten under another configuration,
so a directory's files always come from one configuration. Only a ``config.toml`` beside no product
of the run (no checkpoint, log, metrics or results, in the directory or a member's) is replaced
without complaint: it records an attempt that stopped before its first epoch (e.g. refused data),
and nothing of it can be mixed. (The checkpoint's own check,
:func:`experiments.checkpoint.check_checkpoint`, covers the training keys and the data; it is what
remains if ``config.toml`` is deleted.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tomllib

from experiments.run_identity import fingerprint, hashed_default, run_settings

__all__ = ["check_run_dir", "config_differences"]

_MAX_SHOWN = 8
_ABSENT = "(absent)"


def _settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """:func:`experiments.run_identity.run_settings` of ``cfg``, as plain JSON values."""
    return json.loads(json.dumps(run_settings(cfg), default=str))


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``[(dotted key, old value, new value)]`` over the result-relevant keys (sorted; a key only
    one side has shows ``"(absent)"`` on the other)."""
    a, b = _settings(old), _settings(new)
    same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731 - NaN == NaN
    return [
        (k, a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in sorted(set(a) | set(b))
        if k not in a or k not in b or not same(a[k], b[k])
    ]


def _show(key: str, v: Any) -> str:
    """``v`` as JSON; an absent key that the hash leaves out at its default shows that default."""
    if v != _ABSENT:
        return json.dumps(v, ensure_ascii=False)
    default = hashed_default(key, _ABSENT)
    return _ABSENT if default is _ABSENT else json.dumps(default)


_PRODUCTS = ("checkpoint.pt", "results.json", "metrics.json", "log.jsonl", "log.csv")


def _has_products(run_dir: Path) -> bool:
    dirs = [run_dir, *(d for d in run_dir.glob("member*") if d.is_dir())]
    return any((d / f).exists() for d in dirs for f in _PRODUCTS)


def _refuse(run_dir: Path, source: str, diffs: list[tuple[str, Any, Any]]) -> ValueError:
    shown = "; ".join(f"{k} = {_show(k, o)} there, {_show(k, n)} now" for k, o, n in diffs[:_MAX_SHOWN])
    more = f"; and {len(diffs) - _MAX_SHOWN} more" if len(diffs) > _MAX_SHOWN else ""
    return ValueError(
        f"run directory {run_dir} belongs to a run with another configuration (its {source}: {shown}{more}) "
        "— use another out_dir, or delete the run directory to start afresh"
    )


def check_run_dir(run: Any) -> None:
    """Raise ``ValueError`` if ``run.run_dir``'s ``config.toml`` or ``results.json`` records another
    configuration than ``run.cfg`` (see the module docstring)."""
    run_dir = Path(run.run_dir)
    toml = run_dir / "config.toml"
    if toml.is_file() and _has_products(run_dir):
        try:
            old = tomllib.loads(toml.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(
                f"{toml} is not the readable configuration of a run ({type(exc).__name__}: {exc}) — "
                "use another out_dir, or delete the run directory to start afresh"
            ) from None
        diffs = config_differences(old, run.cfg)
        if diffs:
            raise _refuse(run_dir, "config.toml", diffs)
    results = run_dir / "results.json"
    if results.is_file():
        try:
            d = json.loads(results.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # unreadable: not a finished run (the runner redoes it, as before)
        if not isinstance(d, dict) or d.get("fingerprint") == fingerprint(run.cfg, training_only=False):
            return
        if isinstance(d.get("config"), dict):
            diffs = config_differences(d["config"], run.cfg)
            if diffs:
                raise _refuse(run_dir, "results.json", diffs)
