"""The run identity (:mod:`experiments.run_identity`): fingerprints are byte-identical to those the
runner wrote before the module was split out of ``experiments/runner.py`` (existing run directories
are still recognised), the module is a leaf, and the old names still import, with a warning."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from experiments.config import resolve_config
from experiments.run_identity import fingerprint, hashed_default, run_settings, semantic_config

ROOT = Path(__file__).resolve().parents[1]


def _fixed() -> dict:
    return resolve_config(
        {
            "name": "fixed",
            "methods": [
                {"name": "sam", "optimizer": "sam", "hyperparameters": {"rho": 0.1}, "swag": {"rank": 3}}
            ],
            "train": {"lr": 0.05, "epochs": 3},
            "seeds": [0, 1],
        }
    )


def test_fingerprints_equal_those_computed_before_the_split():
    # computed by experiments.runner.fingerprint at 3490a84 (before run_identity existed)
    cfg = _fixed()
    assert fingerprint(cfg, training_only=False) == "319e646db97074aa"
    assert fingerprint(cfg, training_only=True) == "630e56695345ec4b"
    later = resolve_config(
        {
            "methods": [{"optimizer": "sgd", "mc_dropout": {"samples": 2}}],
            "train": {"min_lr": 0.01, "compile": "default"},
            "distributed": {"sync_batchnorm": True},
        }
    )
    assert fingerprint(later, training_only=False) == "2a7849a23ccdac74"
    assert fingerprint(later, training_only=True) == "c9ec5b1831a8eda0"


def test_keys_that_change_no_result_change_no_fingerprint():
    cfg = _fixed()
    moved = {**cfg, "out_dir": "elsewhere", "device": "cuda", "threads": 3, "progress": True, "name": "x"}
    assert fingerprint(moved, training_only=False) == fingerprint(cfg, training_only=False)
    re_evaluated = {**cfg, "evaluation": {**cfg["evaluation"], "sharpness": ["lambda_max"]}}
    assert fingerprint(re_evaluated, training_only=True) == fingerprint(cfg, training_only=True)
    assert fingerprint(re_evaluated, training_only=False) != fingerprint(cfg, training_only=False)
    assert "train.log_every" not in run_settings(cfg) and "train.min_lr" not in run_settings(cfg)
    assert "ensemble" not in semantic_config(cfg)["methods"][0]


def test_hashed_default_names_the_default_of_each_later_key():
    assert hashed_default("train.min_lr") == 0.0
    assert hashed_default("distributed.sync_batchnorm") is False
    assert hashed_default("methods.sam.ensemble") == {}
    assert hashed_default("methods.sam.swag.convention") == "paper"
    assert hashed_default("train.lr", None) is None
    with pytest.raises(KeyError):
        hashed_default("train.lr")


def _project_imports(rel: str) -> set[str]:
    names = set()
    for n in ast.walk(ast.parse((ROOT / rel).read_text())):
        if isinstance(n, ast.ImportFrom) and n.module:
            names.add(n.module)
        elif isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
    return {m for m in names if m.split(".")[0] in ("experiments", "landscape", "optimizers", "app")}


def test_run_identity_is_a_leaf():
    """It imports only the config resolution, which imports only the helper for moved names."""
    assert _project_imports("experiments/run_identity.py") == {"experiments.config"}
    assert _project_imports("experiments/config.py") == {"landscape.deprecation"}
    assert _project_imports("experiments/budget.py") == _project_imports("landscape/deprecation.py") == set()


@pytest.mark.parametrize(
    ("module", "name", "home"),
    [
        ("experiments.runner", "fingerprint", "experiments.run_identity"),
        ("experiments.runner", "semantic_config", "experiments.run_identity"),
        ("experiments.runner", "run_settings", "experiments.run_identity"),
        ("experiments.runner", "_LATER_KEYS", "experiments.run_identity"),
        ("experiments.table", "run_settings", "experiments.run_identity"),
        ("experiments.config", "apply_budget", "experiments.budget"),
        ("experiments.amp", "LossScaler", "optimizers.amp"),
    ],
)
def test_moved_names_still_import_with_a_deprecation_warning(module, name, home):
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{home}.{name}"):
        value = getattr(mod, name)
    assert value is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018
