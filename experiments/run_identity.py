"""Which run is this: a run's configuration -> its result-relevant settings -> its fingerprint.

One leaf module (it imports only :func:`experiments.config.resolve_config`) that the runner, the
run-directory check, the tables, the study, the cost estimate and the dashboard import:

* :func:`semantic_config`: the configuration without the keys added after run directories were
  first fingerprinted while they sit at their defaults (:data:`_LATER_KEYS`, :data:`_LATER_METHOD_KEYS`,
  :data:`_LATER_SWAG_KEYS`) and without ``train.log_every`` (what is logged changes no result);
* :func:`fingerprint`: 16 hex digits of the SHA-256 of :func:`semantic_config` as sorted JSON,
  without the keys that change no result (``progress``, ``out_dir``, ``device``, ``threads``,
  ``paper``, ``name``); ``training_only=True`` also leaves out ``evaluation`` (the checkpoint's
  fingerprint: a run re-evaluated with other measures resumes from the same training). A finished
  run's ``results.json`` records it, and a run whose fingerprint matches is not redone;
* :func:`run_settings`: the same keys as dotted names (``train.lr``,
  ``methods.sam.hyperparameters.rho``), without ``seeds``: tables group runs by them and a run
  directory refuses another configuration by them (:mod:`experiments.run_check`);
* :func:`hashed_default`: the value a key that the hash leaves out at its default stands for.

Adding a key to the runner's configuration changes every fingerprint unless the key is listed here
with its default: add it to :data:`_LATER_KEYS` (or the method / SWAG tables) in the same change.
The fingerprints are compared byte for byte with those of existing run directories
(``tests/test_run_identity.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from experiments.config import resolve_config

__all__ = ["fingerprint", "hashed_default", "run_settings", "semantic_config"]

#: top-level keys that change no result: never hashed, never compared
_NOT_SEMANTIC = ("progress", "out_dir", "device", "threads", "paper", "name", "slurm")
#: left out of the training fingerprint (the checkpoint's): a re-evaluation resumes the training
_EVAL_ONLY = ("evaluation",)

#: Keys added after run directories were first fingerprinted: left out of the hash while at their
#: default, so the runs of older configurations keep their fingerprints (and are not redone).
_LATER_METHOD_KEYS = ("bayesian", "mc_dropout", "ensemble", "laplace")
_LATER_KEYS = {
    "data": {"allow_test_as_train": False, "autoaugment": "none", "cutout": 0},
    "distributed": {"sync_batchnorm": False},
    "train": {"min_lr": 0.0, "divergence_factor": 10.0, "compile": "off"},
    "model": {"logits": "c", "checkpoint": "", "checkpoint_strict": True, "checkpoint_sha256": ""},
    "evaluation": {"save_predictions": False},
}
#: keys of ``train`` that change no result (what is logged): never part of the hashed config
_TRAIN_NOT_SEMANTIC = ("log_every",)
_LATER_SWAG_KEYS: dict[str, Any] = {"convention": "paper", "collect_every": 0, "evaluate": []}

_NO_DEFAULT = object()


def _without_defaults(table: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if not (k in defaults and v == defaults[k])}


def _semantic_method(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if not (k in _LATER_METHOD_KEYS and v == {})}
    if isinstance(out.get("swag"), dict) and out["swag"]:
        out["swag"] = _without_defaults(out["swag"], _LATER_SWAG_KEYS)
    return out


def semantic_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` without the keys of :data:`_LATER_KEYS` / :data:`_LATER_METHOD_KEYS` at their defaults
    (the form that is hashed)."""
    out = dict(cfg)
    for table, defaults in _LATER_KEYS.items():
        if isinstance(out.get(table), dict):
            out[table] = _without_defaults(out[table], defaults)
    if isinstance(out.get("train"), dict):
        out["train"] = {k: v for k, v in out["train"].items() if k not in _TRAIN_NOT_SEMANTIC}
    if isinstance(out.get("methods"), list):
        out["methods"] = [_semantic_method(m) if isinstance(m, dict) else m for m in out["methods"]]
    return out


def fingerprint(cfg: dict[str, Any], *, training_only: bool) -> str:
    """16 hex digits identifying the run of the resolved config ``cfg`` (see the module docstring);
    ``training_only``: leave out ``evaluation`` (the fingerprint a checkpoint records)."""
    skip = _NOT_SEMANTIC + (_EVAL_ONLY if training_only else ())
    keep = {k: v for k, v in semantic_config(cfg).items() if k not in skip}
    text = json.dumps(keep, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif prefix:
        out[prefix] = node


def run_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    """The result-relevant settings of a run's config as dotted keys (``train.lr``,
    ``methods.sam.hyperparameters.rho``, ...): the resolved config (as read when it no longer
    resolves), :func:`semantic_config`, without the non-semantic keys and ``seeds``. Lists are one
    value; empty tables are left out. Tables group runs by it (:mod:`experiments.table`) and a run
    directory refuses another run's configuration by it (:mod:`experiments.run_check`)."""
    try:
        cfg = resolve_config(cfg)
    except (ValueError, TypeError, KeyError):
        cfg = dict(cfg)  # an older or foreign config: compared as written
    keep = {k: v for k, v in semantic_config(cfg).items() if k not in (*_NOT_SEMANTIC, "seeds")}
    methods = keep.pop("methods", None)
    out: dict[str, Any] = {}
    _flatten(keep, "", out)
    if isinstance(methods, list):
        names = [m.get("name") if isinstance(m, dict) else None for m in methods]
        unique = len(set(names)) == len(names) and None not in names
        for i, m in enumerate(methods):
            _flatten(m, f"methods.{names[i] if unique else i}", out)
    elif methods is not None:
        out["methods"] = methods
    return out


def hashed_default(key: str, missing: Any = _NO_DEFAULT) -> Any:
    """The value a dotted :func:`run_settings` key stands for when absent because the hash leaves it
    out at its default (``train.min_lr`` -> ``0.0``, ``methods.sam.ensemble`` -> ``{}``); ``missing``
    for any other key (``KeyError`` if not given)."""
    parts = key.split(".")
    if len(parts) == 2 and parts[1] in _LATER_KEYS.get(parts[0], {}):
        return _LATER_KEYS[parts[0]][parts[1]]
    if len(parts) == 3 and parts[0] == "methods" and parts[2] in _LATER_METHOD_KEYS:
        return {}
    if len(parts) == 4 and parts[0] == "methods" and parts[2] == "swag" and parts[3] in _LATER_SWAG_KEYS:
        return _LATER_SWAG_KEYS[parts[3]]
    if missing is _NO_DEFAULT:
        raise KeyError(f"{key!r} is not a key the run fingerprint leaves out at its default")
    return missing
