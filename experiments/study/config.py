"""The study config and the population it samples (Jiang et al. 2020, "Fantastic generalization
measures and where to find them", Sec. 3-4: many models over a hyperparameter space).

A study config (TOML) names the hyperparameter ``space`` (one list of values per axis: ``model``,
``optimizer``, ``lr``, ``batch_size``, ``weight_decay``, ``width``, ``n_train``, ``seed``), how to
sample it (``grid``: the full product; ``random``: ``n_models`` distinct points; ``star``: ``bases``
random base points and, for each, every one-axis variation of it, so every axis has groups of models
that differ in that axis only, as the granulated tau needs), how many ``populations`` to sample
(population ``i`` is sampled with ``sampling_seed + i``; members two populations share are trained
once), the training (``epochs``, or a ``stop`` table: train until the full training-set
cross-entropy is at most ``stop.train_loss``, at most ``stop.max_epochs`` epochs, as Jiang et al.
2020 do, :mod:`experiments.study.stopping`; ``optimizer_options`` and a ``runner`` table of further
experiment-runner settings shared by every member), the sharpness ``measures`` (named ``(measure,
options)`` rows of :func:`landscape.sharpness_report`, computed on a fixed subset of the training
set, shared by every model) and the data. Each point becomes one run of the experiment runner
(:mod:`experiments.study.members`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tomllib

import landscape as ls
from experiments.config import parse_override, resolve_slurm, set_key
from landscape.models import available_models

__all__ = [
    "AXES",
    "OPTIMIZERS",
    "RUNNER_OWNED",
    "load_study_config",
    "model_id",
    "plan_population",
    "resolve_study_config",
]

#: Hyperparameter axes of a population, in table order.
AXES: tuple[str, ...] = ("model", "optimizer", "lr", "batch_size", "weight_decay", "width", "n_train", "seed")
#: Optimizers a population may use (``optimizer_options.<name>`` tables give their hyperparameters).
OPTIMIZERS: tuple[str, ...] = ("sgd", "sam", "asam", "bsam", "mfvi")
#: Runner config keys the study sets from a member's point and its own keys: a ``runner`` table may
#: not set them.
RUNNER_OWNED: tuple[str, ...] = (
    "name",
    "seeds",
    "budget",
    "out_dir",
    "device",
    "threads",
    "progress",
    "methods",
    "sweep",
    "model",
    "data.name",
    "data.limit_train",
    "train.epochs",
    "train.lr",
    "train.batch_size",
)
#: Models with a width: ``mlp`` (hidden width of its two hidden layers); others ignore ``width``.
_WIDTH_MODELS = ("mlp",)
_SAMPLING = ("grid", "random", "star")

_DEFAULTS: dict[str, Any] = {
    "name": "study",
    "data": "digits",
    "test_fraction": 0.2,
    "ood_noise": 1.0,
    "sampling": "star",
    "n_models": 32,
    "bases": 3,
    "sampling_seed": 0,
    "populations": 1,
    "epochs": 10,
    "stop": {},
    "sharpness_subset": 256,
    "sharpness_dtype": "float64",
    "threads": 1,
    "device": "cpu",
    "space": {
        "model": ["mlp"],
        "optimizer": ["sgd"],
        "lr": [0.05],
        "batch_size": [64],
        "weight_decay": [0.0],
        "width": [64],
        "n_train": [1000],
        "seed": [0],
    },
    "optimizer_options": {},
    "runner": {},
    "measures": [],
    "slurm": {},  # how `study run --slurm` submits the members (experiments.config.SLURM_DEFAULTS)
}


def _fail(msg: str) -> None:
    raise ValueError(msg)


def _check_space(space: dict[str, Any]) -> None:
    bad = sorted(set(space) - set(AXES))
    if bad:
        _fail(f"space: unknown axis/axes {bad}; axes are {', '.join(AXES)}")
    for axis, values in space.items():
        if not isinstance(values, list) or not values:
            _fail(f"space.{axis} must be a non-empty list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            _fail(f"space.{axis} lists a value twice: {values}")
    for name in space["model"]:
        if name not in available_models():
            _fail(f"space.model: unknown model {name!r}; available: {', '.join(available_models())}")
    for name in space["optimizer"]:
        if name not in OPTIMIZERS:
            _fail(f"space.optimizer: unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    for axis in ("lr", "weight_decay"):
        if any(not isinstance(v, (int, float)) or v < 0 or (axis == "lr" and v == 0) for v in space[axis]):
            _fail(
                f"space.{axis} must hold {'positive' if axis == 'lr' else 'non-negative'} numbers, "
                f"got {space[axis]}"
            )
    for axis in ("batch_size", "width", "n_train", "seed"):
        if any(
            not isinstance(v, int) or isinstance(v, bool) or v < (0 if axis == "seed" else 1)
            for v in space[axis]
        ):
            _fail(f"space.{axis} must hold positive integers, got {space[axis]}")


def _check_measures(raw: list[Any]) -> list[dict[str, Any]]:
    measures = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or "measure" not in m:
            _fail(f"measures[{i}] must be a table with 'measure' (and 'name', 'options'), got {m!r}")
        if m["measure"] not in ls.MEASURES:
            _fail(f"measures[{i}]: unknown measure {m['measure']!r}; available: {', '.join(ls.MEASURES)}")
        measures.append(
            {
                "name": m.get("name", m["measure"]),
                "measure": m["measure"],
                "options": dict(m.get("options", {})),
            }
        )
    if not measures:
        _fail("measures is empty: add [[measures]] tables (measure = 'lambda_max', ...)")
    names = [m["name"] for m in measures]
    if len(set(names)) != len(names):
        _fail(f"measures: the column names must be distinct, got {names}")
    return measures


def _check_stop(raw: dict[str, Any]) -> dict[str, Any]:
    stop = raw.get("stop", {})
    if not isinstance(stop, dict):
        _fail(f"stop must be a table (train_loss, max_epochs), got {stop!r}")
    if not stop:
        return {}
    bad = sorted(set(stop) - {"train_loss", "max_epochs"})
    if bad or set(stop) != {"train_loss", "max_epochs"}:
        _fail(
            "stop: give exactly train_loss and max_epochs (e.g. stop = { train_loss = 0.1, "
            f"max_epochs = 60 }}), got keys {sorted(stop)}"
        )
    t, e = stop["train_loss"], stop["max_epochs"]
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not (0 < t < math.inf):
        _fail(f"stop.train_loss must be a positive number (a cross-entropy), got {t!r}")
    if not isinstance(e, int) or isinstance(e, bool) or e < 1:
        _fail(f"stop.max_epochs must be a positive integer, got {e!r}")
    if "epochs" in raw:
        _fail(
            "epochs and stop are both set: with a stop table members train up to stop.max_epochs; "
            "remove epochs"
        )
    return {"train_loss": float(t), "max_epochs": e}


def _check_runner(runner: Any) -> None:
    if not isinstance(runner, dict):
        _fail(f"runner must be a table of experiment-runner settings (e.g. [runner.train]), got {runner!r}")

    def keys(d: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for k, v in d.items():
            out.append(prefix + k)
            if isinstance(v, dict):
                out += keys(v, prefix + k + ".")
        return out

    owned = sorted(set(keys(runner)) & set(RUNNER_OWNED))
    if owned:
        _fail(
            f"runner: {owned} are set by the study from each member's point (space, epochs, data, "
            "device, threads); remove them from the runner table"
        )


def resolve_study_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in and every value checked; raises ValueError naming the key and the fix.

    The ``runner`` table is checked against the experiment runner's config when the members are
    planned (:func:`experiments.study.members.member_runs`)."""
    if not isinstance(raw, dict):
        raise TypeError(f"a study config is a table (dict), got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_DEFAULTS))
    if unknown:
        _fail(f"unknown study config key(s) {unknown}; known: {', '.join(sorted(_DEFAULTS))}")
    cfg = {**_DEFAULTS, **raw}
    space = {**_DEFAULTS["space"], **dict(raw.get("space", {}))}
    _check_space(space)
    cfg["space"] = {a: list(space[a]) for a in AXES}
    if cfg["sampling"] not in _SAMPLING:
        _fail(f"sampling must be one of {', '.join(_SAMPLING)}, got {cfg['sampling']!r}")
    for key in ("n_models", "bases", "epochs", "sharpness_subset", "threads", "populations"):
        v = cfg[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            _fail(f"{key} must be a positive integer, got {v!r}")
    if min(cfg["space"]["n_train"]) < cfg["sharpness_subset"]:
        _fail(
            f"sharpness_subset={cfg['sharpness_subset']} exceeds the smallest n_train "
            f"{min(cfg['space']['n_train'])}: the sharpness subset must lie in every training set"
        )
    if cfg["sharpness_dtype"] not in ("float32", "float64"):
        _fail(f"sharpness_dtype must be float32 or float64, got {cfg['sharpness_dtype']!r}")
    if not isinstance(cfg["ood_noise"], (int, float)) or cfg["ood_noise"] < 0:
        _fail(f"ood_noise must be a non-negative number (0: no OOD set), got {cfg['ood_noise']!r}")
    cfg["stop"] = _check_stop(raw)
    if cfg["stop"]:
        cfg["epochs"] = cfg["stop"]["max_epochs"]  # the runner's train.epochs: at most that many
    cfg["measures"] = _check_measures(cfg["measures"])
    for name, opts in cfg["optimizer_options"].items():
        if name not in OPTIMIZERS or not isinstance(opts, dict):
            _fail(f"optimizer_options.{name}: use a table per optimizer of {', '.join(OPTIMIZERS)}")
    _check_runner(cfg["runner"])
    cfg["slurm"] = resolve_slurm(cfg["slurm"])
    return cfg


def load_study_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read and check a study TOML file (:func:`resolve_study_config`); ``overrides`` are
    ``slurm.KEY=VALUE`` settings of its ``[slurm]`` table (the only ones a study takes)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"study config {path} does not exist; pass a TOML file such as configs/study_digits.toml"
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"study config {path} is not valid TOML: {exc}") from None
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] != "slurm" or len(keys) < 2:
            _fail(
                f"override {text!r}: a study run takes only slurm.KEY=VALUE settings (its other keys "
                "are the study config's) — put it in the config file"
            )
        set_key(raw, keys, value, text)
    return resolve_study_config(raw)


def _normalise(point: dict[str, Any]) -> dict[str, Any]:
    p = dict(point)
    if p["model"] not in _WIDTH_MODELS:
        p["width"] = None  # not an axis of this model: identical models collapse into one
    return p


def model_id(point: dict[str, Any]) -> str:
    """A readable, unique name for one hyperparameter point (its file and run directory name)."""
    text = json.dumps([point[a] for a in AXES])
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{point['model']}-{point['optimizer']}-{digest}"


def plan_population(cfg: dict[str, Any], population: int = 0) -> list[dict[str, Any]]:
    """The hyperparameter points of population ``population`` (each a dict over :data:`AXES`),
    deduplicated, in a fixed order determined by the config and its sampling seed
    ``sampling_seed + population``."""
    if not 0 <= population < cfg.get("populations", 1):
        _fail(
            f"population {population} does not exist: the config has "
            f"populations = {cfg.get('populations', 1)}"
        )
    space = cfg["space"]
    rng = np.random.default_rng(cfg["sampling_seed"] + population)
    pick = lambda: {a: space[a][int(rng.integers(len(space[a])))] for a in AXES}  # noqa: E731
    if cfg["sampling"] == "grid":
        points = [dict(zip(AXES, c)) for c in itertools.product(*(space[a] for a in AXES))]
    elif cfg["sampling"] == "random":
        total = math.prod(len({repr(v) for v in space[a]}) for a in AXES)
        if cfg["n_models"] > total:
            _fail(f"n_models={cfg['n_models']} exceeds the {total} points of the space; lower it")
        points, seen = [], set()
        while len(points) < cfg["n_models"]:
            p = _normalise(pick())
            key = json.dumps([p[a] for a in AXES])
            if key not in seen:
                seen.add(key)
                points.append(p)
    else:  # star: base points and their one-axis variations
        points = []
        for _ in range(cfg["bases"]):
            base = pick()
            points.append(base)
            for a in AXES:
                points += [{**base, a: v} for v in space[a] if v != base[a]]
    out, seen = [], set()
    for p in map(_normalise, points):
        key = json.dumps([p[a] for a in AXES])
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out
