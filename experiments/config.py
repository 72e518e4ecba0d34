"""Experiment configurations: TOML files, dotted ``key=value`` overrides, defaults and checks.

A configuration is a nested dict read with Python's :mod:`tomllib`, merged over :data:`DEFAULTS`
and checked: every key must be known (a misspelt key raises :class:`ConfigError` naming it and the
closest known key), every value must have the default's type (an int is accepted where a float is
expected) and every choice must be one of the allowed ones. Free-form tables (``model.kwargs``,
``data.kwargs``, ``methods[i].hyperparameters``, ``paper``, ...) are passed on unchecked. Every
float must be finite and fit float32 (``lr = 1e39`` is refused naming ``train.lr``; see FLOAT32_MAX).

Overrides are Hydra-style ``key=value`` strings: ``train.epochs=3``, ``seeds=[0,1]``,
``data.name=cifar10:/data/cifar10``, ``methods.sam.hyperparameters.rho=0.1`` (a method is addressed
by its ``name`` or its index). The value is parsed as a TOML value (``3`` an int, ``0.5`` a float,
``true`` a bool, ``[1, 2]`` a list, ``{a = 1}`` a table, ``"x"`` a string) and, when it is not
valid TOML, kept as the bare string.

``budget`` (a number in (0, 1]) shortens a run: epochs, step-schedule milestones, warm-up, the SWA
schedule's start, hyperparameters given in epochs (``burn_in = "150 epochs"``) and the
sizes of the training, test, OOD and corruption sets are multiplied by it (rounded up; at least one
epoch, one batch of training data and 100 test examples), so ``budget=0.05`` is a quick version of
a paper's protocol.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from landscape.deprecation import moved_names

__all__ = [
    "CHOICES",
    "DEFAULTS",
    "SLURM_DEFAULTS",
    "ConfigError",
    "apply_overrides",
    "check_slurm",
    "resolve_slurm",
    "load_config",
    "parse_override",
    "read_raw",
    "resolve_config",
    "set_key",
    "sweep_method",
]

#: the budget rule is :mod:`experiments.budget`'s: importable from here, with a warning, for one release
__getattr__ = moved_names(__name__, dict.fromkeys(("apply_budget", "data_limit"), "experiments.budget"))


class ConfigError(ValueError):
    """A bad configuration file, key or value; the message names the key and the fix."""


#: The ``[slurm]`` table (:mod:`experiments.cluster`): how ``run --slurm`` submits each run as one
#: task of a job array. It changes no result (never part of a run's fingerprint). ``time`` is the
#: time limit of one task in minutes (a run that needs longer is checkpointed and requeued before
#: it, ``signal_delay_s`` seconds ahead, at most ``max_requeues`` times); 0 / "" leave a setting to
#: the cluster's default; ``setup`` holds shell lines run before each task (``module load ...``),
#: ``sbatch`` further ``#SBATCH`` options (``{exclude = "node7", mail_type = "END"}``).
SLURM_DEFAULTS: dict[str, Any] = {
    "partition": "",
    "time": 60,
    "cpus_per_task": 0,
    "gpus_per_task": 0,
    "mem_gb": 0.0,
    "account": "",
    "qos": "",
    "constraint": "",
    "array_parallelism": 0,
    "signal_delay_s": 120,
    "max_requeues": 10,
    "setup": [],
    "sbatch": {},
}

#: Every known key with its default value (the default also fixes the type).
DEFAULTS: dict[str, Any] = {
    "name": "",
    "seeds": [0],
    "budget": 1.0,
    "device": "auto",
    "threads": 0,
    "precision": "float32",
    "out_dir": "runs",
    "progress": True,
    "data": {
        "name": "digits",
        "kwargs": {},
        "train_split": "train",
        "test_split": "test",
        "limit_train": 0,
        "limit_test": 0,
        "augmentation": "none",
        "crop_padding": 4,
        "crop_fill": "mean",
        "autoaugment": "none",  # AutoAugment policy after crop/flip (landscape.data.autoaugment)
        "cutout": 0,  # Cutout square side in pixels after AutoAugment; 0 = off
        "label_noise": 0.0,
        "label_noise_mode": "flip",
        "label_noise_seed": -1,
        "num_data_factor": 1.0,
        "allow_test_as_train": False,
    },
    "model": {
        "name": "mlp",
        "kwargs": {},
        "logits": "c",  # "c-1": the last class's logit fixed at 0 (experiments.logits)
        "checkpoint": "",  # initial weights (experiments.initial_weights); "" = the seeded init
        "checkpoint_strict": True,
        "checkpoint_sha256": "",  # filled in by the runner from the file; a given one is checked
    },
    "train": {
        "epochs": 10,
        "batch_size": 128,
        "lr": 0.1,
        "schedule": "cosine",
        "milestones": [],
        "gamma": 0.1,
        "warmup_epochs": 0.0,
        "swa_lr": 0.0,
        "swa_start": 0.0,
        "min_lr": 0.0,
        "divergence_factor": 10.0,  # a loss above 10x the initial one: diverged (experiments.divergence)
        "compile": "off",  # torch.compile of the training forward/backward (experiments.train)
        "label_smoothing": 0.0,
        "drop_last": False,
        "log_every": 0,  # optimizer diagnostics (opt.last) every N steps to steps.jsonl; 0 = off
        "optimizer_defaults": {},
    },
    "methods": [],
    "evaluation": {
        "metrics": ["accuracy", "nll", "ece", "brier", "auroc_misclassification"],
        "n_bins": 20,
        "batch_size": 1000,
        "every": 1,
        "bma_samples": 32,
        "ood": "",
        "ood_kwargs": {},
        "corruptions": "",
        "corruption_names": [],
        "severities": [1, 2, 3, 4, 5],
        "corruption_bma": False,
        "sharpness": ["lambda_max", "hessian_trace", "worst_case_adaptive"],
        "sharpness_subset": 512,
        "sharpness_options": {},
        "save_predictions": False,  # the test probabilities of each evaluation -> predictions.npz
    },
    "distributed": {"mode": "grid", "perturbation": "global", "backend": "auto", "sync_batchnorm": False},
    "sweep": {},
    "paper": {},
    "slurm": SLURM_DEFAULTS,
}

#: Keys whose value must be one of a fixed set.
CHOICES: dict[str, tuple[str, ...]] = {
    "precision": ("float32", "float64", "bf16", "fp16"),
    "data.augmentation": ("none", "flip", "crop_flip"),
    "data.label_noise_mode": ("flip", "uniform", "asymmetric"),
    "data.crop_fill": ("mean", "black"),
    "data.autoaugment": ("none", "cifar10", "imagenet", "svhn"),
    "model.logits": ("c", "c-1"),
    "train.schedule": ("cosine", "step", "constant", "swa", "none"),
    "train.compile": ("off", "default", "reduce-overhead", "max-autotune"),
    "distributed.mode": ("grid", "data_parallel"),
    "distributed.perturbation": ("global", "local"),
    "distributed.backend": ("auto", "gloo", "nccl"),
}

#: Tables whose content is passed on unchecked.
FREE_FORM = {
    "slurm.sbatch",
    "data.kwargs",
    "model.kwargs",
    "train.optimizer_defaults",
    "evaluation.ood_kwargs",
    "evaluation.sharpness_options",
    "sweep",
    "paper",
}

#: Keys of one entry of ``methods``.
METHOD_KEYS: dict[str, Any] = {
    "name": "",
    "optimizer": "",
    "hyperparameters": {},
    "swag": {},
    "epochs": 0,
    "schedule": "",
    "bayesian": {},
    "mc_dropout": {},
    "ensemble": {},
    "laplace": {},
}
#: ``convention`` says what ``scale`` means (``optimizers.SWAG``): ``"paper"`` multiplies the standard
#: deviation (Maddox et al. eq. 1), ``"code"`` the variance (their released sampler, whose scales the
#: flat-seeking BNN authors quote). ``collect_every``: one collection every that many optimizer steps
#: after ``start_epoch`` epochs (bSAM App. G.1: "collect a sample every k steps"); 0 = once per epoch
#: (Maddox et al.). ``evaluate``: the posteriors evaluated from the one run, ``"swag"`` (low rank plus
#: diagonal) and / or ``"swag_diag"`` (the diagonal part only), as the flat-seeking BNN authors
#: evaluate both from one training run; empty = the one posterior ``diag_only`` names.
SWAG_KEYS: dict[str, Any] = {
    "rank": 20, "start_epoch": 0, "diag_only": False, "samples": 30, "scale": 1.0, "convention": "paper",
    "collect_every": 0, "evaluate": [],
}  # fmt: skip
#: the posteriors ``swag.evaluate`` may name
SWAG_POSTERIORS = ("swag", "swag_diag")
#: Tables of a method, off when absent or empty (as ``swag``) and on with at least one key, the
#: others taking these defaults (``ensemble = { members = 5 }``): Bayesian layers
#: (``optimizers.convert_to_bayesian``: SGVB, SGVB-LRT with ``local_reparam``; the ELBO's KL
#: weighted by ``kl_weight``), the MC-Dropout predictive with ``samples`` passes, a deep ensemble
#: of ``members`` runs, a post-hoc Laplace posterior (:mod:`experiments.laplace_fit`: ``kind`` "kron"
#: or "diag", ``prior_precision`` a number > 0 or "optimize", ``predictive`` "glm" (with ``link``
#: "probit" or "mc") or "mc" (weight samples), ``samples`` draws for the MC predictives).
METHOD_TABLES: dict[str, dict[str, Any]] = {
    "bayesian": {"prior_std": 1.0, "init_std": 1e-3, "local_reparam": False, "kl_weight": 1.0},
    "mc_dropout": {"samples": 30},
    "ensemble": {"members": 5},
    "laplace": {
        "kind": "kron",
        "prior_precision": "optimize",
        "predictive": "glm",
        "link": "probit",
        "samples": 32,
    },
}
#: the values the ``laplace`` table's string keys take
LAPLACE_CHOICES = {"kind": ("kron", "diag"), "predictive": ("glm", "mc"), "link": ("probit", "mc")}
#: the ``laplace`` table's prior precisions fitted by the evidence: one number, or one per layer
LAPLACE_PRIOR_FITS = ("optimize", "optimize_layerwise")

_TYPE_NAMES = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a table",
}


# --------------------------------------------------------------------------------------- loading
def load_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read the TOML file ``path``, apply ``overrides`` (``key=value`` strings) and resolve it.

    Raises:
        FileNotFoundError: no such file.
        ConfigError: invalid TOML, an unknown key, a value of the wrong type or out of range.
    """
    path = Path(path)
    raw = read_raw(path)
    if not raw.get("name"):
        raw["name"] = path.stem
    raw = apply_overrides(raw, overrides)
    return resolve_config(raw)


def read_raw(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The TOML table of ``path`` with its ``extends`` chain applied, not yet resolved.

    ``extends = "other.toml"`` (relative to the file's folder) starts from that config's table: the
    file's own tables are merged into it key by key (``[train] epochs = 10`` changes only the
    epochs), every other value, lists included (``methods``, ``seeds``), replaces the parent's;
    ``name`` and ``paper`` are never inherited (a derived config is another experiment with its own
    paper numbers). Chains may be longer; a cycle is an error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"config file {path} does not exist"
            if not path.is_dir()
            else f"config {path} is a directory; give a .toml file"
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; a config is a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    parent_name = raw.pop("extends", None)
    if parent_name is None:
        return raw
    if not isinstance(parent_name, str) or not parent_name.strip():
        raise ConfigError(f'{path}: extends must name a config file (e.g. extends = "base.toml")')
    parent = (path.parent / Path(parent_name).expanduser()).resolve()
    chain = (*_chain, path.resolve())
    if parent in chain:
        cycle = " -> ".join(p.name for p in (*chain, parent))
        raise ConfigError(f"{path}: extends {parent_name!r} closes a cycle ({cycle})")
    if not parent.is_file():
        raise ConfigError(f"{path}: extends {parent_name!r}, but {parent} is not a file")
    base = read_raw(parent, chain)
    for key in ("name", "paper"):
        base.pop(key, None)
    return _overlay(base, raw)


def _overlay(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` merged in: tables key by key, anything else replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _overlay(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1"`` -> ``(["a", "b"], 1)``; the value is read as TOML, else kept as a string."""
    if not isinstance(text, str) or "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key=value (e.g. train.epochs=3)")
    key, _, value = text.partition("=")
    key = key.strip().lstrip("+")
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError(f"override {text!r}: the key {key!r} is empty or has an empty part")
    value = value.strip()
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return parts, parsed


def set_key(cfg: dict[str, Any], parts: Sequence[str], value: Any, text: str = "") -> None:
    """Set ``cfg[parts[0]][parts[1]]... = value`` in place; a list (``methods``) is indexed by a
    method name or an index; missing tables are created."""
    text = text or ".".join(parts)
    node: Any = cfg
    for i, part in enumerate(parts[:-1]):
        node = _child(node, part, list(parts[: i + 1]), text, create=True)
    last = parts[-1]
    if isinstance(node, list):
        node[_method_index(node, last, text)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"override {text!r}: {'.'.join(parts[:-1])} is not a table")


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every ``key=value`` override applied (tables created as needed)."""
    out = copy.deepcopy(dict(raw))
    for text in overrides:
        parts, value = parse_override(text)
        set_key(out, parts, value, text)
    return out


def _method_index(items: list, part: str, text: str) -> int:
    if part.lstrip("-").isdigit():
        i = int(part)
        if not -len(items) <= i < len(items):
            raise ConfigError(
                f"override {text!r}: index {i} out of range (the list has {len(items)} entries)"
            )
        return i
    names = [m.get("name") if isinstance(m, dict) else None for m in items]
    if part in names:
        return names.index(part)
    raise ConfigError(
        f"override {text!r}: no method named {part!r}; methods: {[n for n in names if n]} (or use an index)"
    )


def _child(node: Any, part: str, path: list[str], text: str, create: bool) -> Any:
    if isinstance(node, list):
        return node[_method_index(node, part, text)]
    if not isinstance(node, dict):
        raise ConfigError(f"override {text!r}: {'.'.join(path[:-1])} is not a table")
    if part not in node and create:
        node[part] = {}
    return node[part]


def sweep_method(key: str, methods: Sequence[Mapping[str, Any]]) -> str | None:
    """The name of the one method a sweep key addresses (``methods.sam.hyperparameters.rho`` ->
    ``"sam"``; ``methods.1.epochs`` -> the second method's name), or ``None`` for a key of the whole
    experiment (``data.label_noise``). A sweep over one method's key varies only that method: the
    other methods run once per value of the other sweep keys (:func:`experiments.runner.plan_runs`).

    Raises:
        ConfigError: ``key`` addresses a method the config does not define.
    """
    parts = key.split(".")
    if parts[0] != "methods" or len(parts) < 2:
        return None
    names = [str(m.get("name") or m.get("optimizer") or "") for m in methods]
    part = parts[1]
    if part.lstrip("-").isdigit() and -len(names) <= int(part) < len(names):
        return names[int(part)]
    if part in names:
        return part
    raise ConfigError(
        f"sweep key {key!r} addresses method {part!r}, which the config does not define; its methods "
        f"are {', '.join(map(repr, names)) or 'none'}: write methods.<one of those names>.<key> (e.g. "
        "methods.sam.hyperparameters.rho) or methods.<index>.<key>"
    )


# ------------------------------------------------------------------------------------- checking
def _close(key: str, known: Iterable[str]) -> str:
    match = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else f"; known keys: {', '.join(sorted(known))}"


def _check_type(where: str, value: Any, default: Any) -> Any:
    want = type(default)
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (want is bool) or not isinstance(value, want):
        raise ConfigError(
            f"config key {where} must be {_TYPE_NAMES.get(want, want.__name__)}, got {value!r} "
            f"({type(value).__name__})"
        )
    if want is float and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise ConfigError(f"config key {where} must be {_FINITE}, got {value!r}")
    return value


#: The largest float32: every float of a config, and of its optimizer arguments, must fit (a run may
#: train in float32, where ``lr = 1e39`` becomes infinite).
FLOAT32_MAX = 3.4028234663852886e38
_FINITE = "a finite number below 3.4e38 in magnitude (the float32 range)"


def _check_free_numbers(where: str, table: Mapping[str, Any]) -> None:
    """No NaN and no finite value beyond float32 in a table of optimizer arguments (lists included);
    infinity is checked against the constructor's default (:func:`experiments.methods.check_method`)."""
    for key, value in table.items():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, float) and (math.isnan(v) or (math.isfinite(v) and abs(v) > FLOAT32_MAX)):
                raise ConfigError(f"config key {where}.{key} must be {_FINITE}, got {value!r}")


def _merge(where: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in given:
        if key not in defaults:
            name = f"{where}.{key}" if where else key
            raise ConfigError(f"unknown config key {name!r}{_close(key, defaults)}")
    for key, default in defaults.items():
        name = f"{where}.{key}" if where else key
        if key not in given:
            out[key] = copy.deepcopy(default)
            continue
        value = given[key]
        if (
            name.endswith("slurm.sbatch")
            or name in FREE_FORM
            or key in ("methods", "hyperparameters")
            or (key in _TABLES and where)
        ):
            out[key] = copy.deepcopy(value)
            if key != "methods":
                _check_type(name, value, default)
        elif isinstance(default, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {name} must be a table ([{name}]), got {value!r}")
            out[key] = _merge(name, value, default)
        else:
            out[key] = _check_type(name, value, default)
        if name in CHOICES and out[key] not in CHOICES[name]:
            raise ConfigError(f"config key {name} must be one of {list(CHOICES[name])}, got {out[key]!r}")
    return out


_TABLES = ("swag", *METHOD_TABLES)


def _method_tables(i: int, m: dict[str, Any]) -> None:
    """Fill the :data:`METHOD_TABLES` a method turns on with their defaults and check them."""
    for key, defaults in METHOD_TABLES.items():
        if m[key] and key == "laplace":
            m[key] = _laplace_table(i, m[key])
        elif m[key]:
            m[key] = _merge(f"methods[{i}].{key}", m[key], defaults)
    b, d, e = m["bayesian"], m["mc_dropout"], m["ensemble"]
    if b and (b["prior_std"] <= 0 or b["init_std"] <= 0 or b["kl_weight"] < 0):
        raise ConfigError(
            f"methods[{i}].bayesian: prior_std and init_std must be > 0 and kl_weight >= 0, got {b}"
        )
    if d and d["samples"] < 1:
        raise ConfigError(f"methods[{i}].mc_dropout.samples must be >= 1, got {d['samples']}")
    if e and e["members"] < 1:
        raise ConfigError(f"methods[{i}].ensemble.members must be >= 1, got {e['members']}")
    on = [k for k in _TABLES if m[k]]
    if len(on) > 1:
        raise ConfigError(
            f"methods[{i}] combines {' and '.join(on)}; a method has at most one of swag, bayesian, "
            "mc_dropout, ensemble and laplace (use one [[methods]] entry per combination the runner supports)"
        )


def _laplace_table(i: int, given: dict[str, Any]) -> dict[str, Any]:
    """The ``laplace`` table with its defaults: ``prior_precision`` a number > 0, "optimize" or
    "optimize_layerwise", the string keys among :data:`LAPLACE_CHOICES`, ``samples`` >= 1."""
    where = f"methods[{i}].laplace"
    rest = {k: v for k, v in given.items() if k != "prior_precision"}
    defaults = {k: v for k, v in METHOD_TABLES["laplace"].items() if k != "prior_precision"}
    out = _merge(where, rest, defaults)
    prior = given.get("prior_precision", "optimize")
    number = isinstance(prior, (int, float)) and not isinstance(prior, bool)
    if prior not in LAPLACE_PRIOR_FITS and not (number and math.isfinite(prior) and 0 < prior <= FLOAT32_MAX):
        raise ConfigError(
            f'{where}.prior_precision must be a number > 0, "optimize" (the maximiser of the log '
            'marginal likelihood) or "optimize_layerwise" (one maximiser per layer), got '
            f"{prior!r}"
        )
    out["prior_precision"] = float(prior) if number else prior
    for key, choices in LAPLACE_CHOICES.items():
        if out[key] not in choices:
            raise ConfigError(f"{where}.{key} must be one of {list(choices)}, got {out[key]!r}")
    if out["samples"] < 1:
        raise ConfigError(f"{where}.samples must be >= 1, got {out['samples']}")
    return out


def _check_swag(i: int, s: dict[str, Any]) -> None:
    """``collect_every`` >= 0; ``evaluate`` distinct names of :data:`SWAG_POSTERIORS`, ``"swag"`` only
    with the deviations collected (``diag_only = false``)."""
    where = f"methods[{i}].swag"
    if s["collect_every"] < 0:
        raise ConfigError(
            f"{where}.collect_every must be >= 0 (optimizer steps between collections; 0 = once per "
            f"epoch), got {s['collect_every']}"
        )
    ev = s["evaluate"]
    bad = [v for v in ev if v not in SWAG_POSTERIORS]
    if bad or len(set(ev)) != len(ev):
        raise ConfigError(
            f"{where}.evaluate must list distinct posteriors among {list(SWAG_POSTERIORS)} (empty: the "
            f"one diag_only names), got {ev!r}"
        )
    if "swag" in ev and s["diag_only"]:
        raise ConfigError(
            f'{where}.evaluate names "swag" (low rank plus diagonal), but diag_only = true collects no '
            "deviations; set diag_only = false (swag_diag is still evaluated from the same run)"
        )


def _check_methods(methods: Any) -> list[dict[str, Any]]:
    if not isinstance(methods, list) or not methods:
        raise ConfigError(
            "the config names no methods: add at least one [[methods]] table with name, optimizer and "
            'hyperparameters (e.g. name = "sgd", optimizer = "sgd")'
        )
    out, seen = [], set()
    for i, m in enumerate(methods):
        if not isinstance(m, dict):
            raise ConfigError(
                f"methods[{i}] must be a table with name, optimizer, hyperparameters; got {m!r}"
            )
        m = _merge(f"methods[{i}]", m, METHOD_KEYS)
        if m["schedule"] and m["schedule"] not in CHOICES["train.schedule"]:
            raise ConfigError(
                f"methods[{i}].schedule must be one of {list(CHOICES['train.schedule'])} (or empty: "
                f"train.schedule), got {m['schedule']!r}"
            )
        if m["epochs"] < 0:
            raise ConfigError(f"methods[{i}].epochs must be >= 0 (0: train.epochs), got {m['epochs']}")
        if not m["optimizer"]:
            raise ConfigError(f'methods[{i}] has no optimizer; write optimizer = "sgd" (or sam, bsam, ...)')
        m["name"] = m["name"] or m["optimizer"]
        _check_free_numbers(f"methods.{m['name']}.hyperparameters", m["hyperparameters"])
        if m["name"] in seen:
            raise ConfigError(f"two methods are named {m['name']!r}; give each method a distinct name")
        seen.add(m["name"])
        if m["swag"]:
            m["swag"] = _merge(f"methods[{i}].swag", m["swag"], SWAG_KEYS)
            if m["swag"]["convention"] not in ("paper", "code"):
                raise ConfigError(
                    f"methods[{i}].swag.convention must be 'paper' (scale multiplies the standard "
                    f"deviation) or 'code' (scale multiplies the variance), got {m['swag']['convention']!r}"
                )
            _check_swag(i, m["swag"])
        _method_tables(i, m)
        out.append(m)
    return out


def _check_numbers(cfg: dict[str, Any]) -> None:
    seeds = cfg["seeds"]
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ConfigError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds has repeated entries: {seeds!r}")
    if cfg["threads"] < 0:
        raise ConfigError(f"threads must be >= 0 (0 = torch's default), got {cfg['threads']!r}")
    if not 0.0 < cfg["budget"] <= 1.0:
        raise ConfigError(f"budget must lie in (0, 1] (1 = the full protocol), got {cfg['budget']!r}")
    t, d, e = cfg["train"], cfg["data"], cfg["evaluation"]
    for where, value, lo in (
        ("train.epochs", t["epochs"], 1),
        ("train.batch_size", t["batch_size"], 1),
        ("train.log_every", t["log_every"], 0),
        ("evaluation.batch_size", e["batch_size"], 1),
        ("evaluation.n_bins", e["n_bins"], 1),
        ("evaluation.bma_samples", e["bma_samples"], 1),
        ("evaluation.every", e["every"], 0),
        ("evaluation.sharpness_subset", e["sharpness_subset"], 1),
        ("data.limit_train", d["limit_train"], 0),
        ("data.limit_test", d["limit_test"], 0),
        ("data.crop_padding", d["crop_padding"], 0),
        ("data.cutout", d["cutout"], 0),
    ):
        if value < lo:
            raise ConfigError(f"config key {where} must be >= {lo}, got {value!r}")
    if not 0.0 <= d["label_noise"] < 1.0:
        raise ConfigError(
            f"data.label_noise must lie in [0, 1) (a fraction of labels), got {d['label_noise']}"
        )
    if not 0.0 <= t["label_smoothing"] < 1.0:
        raise ConfigError(f"train.label_smoothing must lie in [0, 1), got {t['label_smoothing']}")
    if t["lr"] < 0 or t["warmup_epochs"] < 0 or t["gamma"] <= 0 or d["num_data_factor"] <= 0:
        raise ConfigError(
            "train.lr and train.warmup_epochs must be >= 0, train.gamma and data.num_data_factor > 0"
        )
    if any(isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0 for m in t["milestones"]):
        raise ConfigError(
            "train.milestones must list epochs (>= 1) or fractions of the run (< 1), all > 0; "
            f"got {t['milestones']!r}"
        )
    if not t["divergence_factor"] >= 0:  # NaN too
        raise ConfigError(f"train.divergence_factor must be >= 0 (0 = off), got {t['divergence_factor']}")
    if not 0 <= t["min_lr"] <= t["lr"]:
        raise ConfigError(f"train.min_lr must be in [0, train.lr = {t['lr']}], got {t['min_lr']}")
    if t["schedule"] == "swa" and not (t["swa_lr"] > 0 and t["swa_start"] > 0):
        raise ConfigError('train.schedule = "swa" needs train.swa_lr > 0 and train.swa_start > 0 (an epoch)')
    if t["schedule"] == "step" and not t["milestones"]:
        raise ConfigError('train.schedule = "step" needs train.milestones (epochs at which lr *= gamma)')
    if any(s not in (1, 2, 3, 4, 5) for s in e["severities"]):
        raise ConfigError(f"evaluation.severities must be among 1..5, got {e['severities']!r}")


def _check_model(m: dict[str, Any]) -> None:
    """``model.checkpoint_sha256``: empty or 64 hex digits, and only with a ``model.checkpoint``;
    the checkpoint's path with ``~`` expanded (the file itself is read by the runner)."""
    sha = m["checkpoint_sha256"]
    if sha and not (len(sha) == 64 and all(c in "0123456789abcdef" for c in sha.lower())):
        raise ConfigError(
            f"model.checkpoint_sha256 must be the 64 hex digits of the file's SHA-256 (or empty: the "
            f"runner fills it in), got {sha!r}"
        )
    if sha and not m["checkpoint"]:
        raise ConfigError("model.checkpoint_sha256 is set but model.checkpoint is empty; name the file")
    if m["checkpoint"]:
        m["checkpoint"] = str(Path(m["checkpoint"]).expanduser())
    m["checkpoint_sha256"] = sha.lower()


def _check_sweep(cfg: dict[str, Any]) -> None:
    """Every sweep key must name a config key (a method by its name or index) and every value must
    give a valid config."""
    for key, values in cfg["sweep"].items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.{key} must be a non-empty list of values, got {values!r}")
        if key.split(".")[0] in ("sweep", "seeds", "name", "out_dir") or key == "distributed.mode":
            raise ConfigError(f"sweep key {key!r} cannot be swept (seeds are swept by `seeds`)")
        sweep_method(key, cfg["methods"])
        for value in values:
            trial = copy.deepcopy(cfg)
            trial["sweep"] = {}
            try:
                set_key(trial, key.split("."), value, f"sweep.{key}")
                resolve_config(trial)
            except ConfigError as exc:
                raise ConfigError(f"sweep.{key} = {value!r}: {exc}") from None


def resolve_slurm(raw: Any, where: str = "slurm") -> dict[str, Any]:
    """A ``[slurm]`` table merged over :data:`SLURM_DEFAULTS` and checked (:func:`check_slurm`);
    for configs that are not run configs (a study's)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key {where} must be a table ([{where}]), got {raw!r}")
    table = _merge(where, raw, SLURM_DEFAULTS)
    check_slurm(table, where)
    return table


def check_slurm(table: dict[str, Any], where: str = "slurm") -> None:
    """The values of a merged ``[slurm]`` table (:data:`SLURM_DEFAULTS`): positive time, counts
    >= 0, shell lines as strings, ``sbatch`` options of plain values with names sbatch knows the
    shape of (letters, digits, ``-`` / ``_``)."""
    if table["time"] < 1:
        raise ConfigError(f"{where}.time must be >= 1 (minutes per task), got {table['time']!r}")
    for key in ("cpus_per_task", "gpus_per_task", "array_parallelism", "signal_delay_s", "max_requeues"):
        if table[key] < 0:
            raise ConfigError(f"{where}.{key} must be >= 0, got {table[key]!r}")
    if table["mem_gb"] < 0:
        raise ConfigError(
            f"{where}.mem_gb must be >= 0 (0: the partition's default), got {table['mem_gb']!r}"
        )
    if not all(isinstance(line, str) for line in table["setup"]):
        raise ConfigError(f"{where}.setup must be a list of shell lines (strings), got {table['setup']!r}")
    for key, value in table["sbatch"].items():
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key) or not isinstance(value, (str, int, bool)):
            raise ConfigError(
                f"{where}.sbatch.{key} = {value!r}: give sbatch options as name = value with a plain "
                'name and a string, integer or boolean value, e.g. {exclude = "node7", nice = 10}'
            )


def resolve_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``raw`` over :data:`DEFAULTS`, check every key and value; returns a new dict."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config is a TOML table, got {type(raw).__name__}")
    cfg = _merge("", raw, DEFAULTS)
    if not cfg["out_dir"].strip():  # Path("") would put the runs in the current directory
        raise ConfigError('config key out_dir is empty; give the directory the runs go to (default "runs")')
    cfg["out_dir"] = str(Path(cfg["out_dir"]).expanduser())  # "~/runs" from a TOML file or `sh`
    cfg["methods"] = _check_methods(cfg["methods"])
    _check_free_numbers("train.optimizer_defaults", cfg["train"]["optimizer_defaults"])
    _check_numbers(cfg)
    _check_model(cfg["model"])
    _check_sweep(cfg)
    check_slurm(cfg["slurm"])
    if not cfg["name"]:
        cfg["name"] = "experiment"
    return cfg
