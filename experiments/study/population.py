"""A population of trained models and their sharpness measures (Jiang et al. 2020, "Fantastic
generalization measures and where to find them", Sec. 3-4: many models over a hyperparameter space,
each measure correlated with the generalisation gap).

A study config (TOML) names the hyperparameter ``space`` (one list of values per axis: ``model``,
``optimizer``, ``lr``, ``batch_size``, ``weight_decay``, ``width``, ``n_train``, ``seed``), how to
sample it (``grid``: the full product; ``random``: ``n_models`` distinct points; ``star``: ``bases``
random base points and, for each, every one-axis variation of it, so every axis has groups of
models that differ in that axis only, as the granulated tau needs), the training (``epochs``), the
sharpness ``measures`` (named ``(measure, options)`` rows of :func:`landscape.sharpness_report`,
computed on a fixed subset of the training set, shared by every model) and the data.

The models are trained with :func:`landscape.models.train` (not the grid runner of
:mod:`experiments.runner`, whose grids are full products of method x seed and whose evaluation is
the seed papers' table, not a per-model sharpness table). One JSON file per model
(``models/<id>.json``, written atomically) makes a population resumable: a model whose file
records the same configuration is not trained again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import tomllib
import torch
from torch import nn

from landscape.io import atomic_write_json, read_json

__all__ = [
    "AXES",
    "OPTIMIZERS",
    "build_optimizer",
    "load_study_config",
    "model_id",
    "plan_population",
    "resolve_study_config",
    "run_population",
    "train_and_measure",
]

#: Hyperparameter axes of a population, in table order.
AXES: tuple[str, ...] = ("model", "optimizer", "lr", "batch_size", "weight_decay", "width", "n_train", "seed")
#: Optimizers a population may use (``optimizer_options.<name>`` tables give their hyperparameters).
OPTIMIZERS: tuple[str, ...] = ("sgd", "sam", "asam", "bsam", "mfvi")
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
    "epochs": 10,
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
    "measures": [],
}


def _fail(msg: str) -> None:
    raise ValueError(msg)


def resolve_study_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in and every value checked; raises ValueError naming the key and the fix."""
    if not isinstance(raw, dict):
        raise TypeError(f"a study config is a table (dict), got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_DEFAULTS))
    if unknown:
        _fail(f"unknown study config key(s) {unknown}; known: {', '.join(sorted(_DEFAULTS))}")
    cfg = {**_DEFAULTS, **raw}
    space = {**_DEFAULTS["space"], **dict(raw.get("space", {}))}
    bad = sorted(set(space) - set(AXES))
    if bad:
        _fail(f"space: unknown axis/axes {bad}; axes are {', '.join(AXES)}")
    for axis, values in space.items():
        if not isinstance(values, list) or not values:
            _fail(f"space.{axis} must be a non-empty list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            _fail(f"space.{axis} lists a value twice: {values}")
    from landscape.models import available_models

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
    cfg["space"] = {a: list(space[a]) for a in AXES}
    if cfg["sampling"] not in _SAMPLING:
        _fail(f"sampling must be one of {', '.join(_SAMPLING)}, got {cfg['sampling']!r}")
    for key in ("n_models", "bases", "epochs", "sharpness_subset", "threads"):
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
    measures = []
    import landscape as ls

    for i, m in enumerate(cfg["measures"]):
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
    cfg["measures"] = measures
    for name, opts in cfg["optimizer_options"].items():
        if name not in OPTIMIZERS or not isinstance(opts, dict):
            _fail(f"optimizer_options.{name}: use a table per optimizer of {', '.join(OPTIMIZERS)}")
    return cfg


def load_study_config(path: str | Path) -> dict[str, Any]:
    """Read and check a study TOML file (:func:`resolve_study_config`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(
            f"study config {path} does not exist; pass a TOML file such as configs/study_digits.toml"
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"study config {path} is not valid TOML: {exc}") from None
    return resolve_study_config(raw)


def _normalise(point: dict[str, Any]) -> dict[str, Any]:
    p = dict(point)
    if p["model"] not in _WIDTH_MODELS:
        p["width"] = None  # not an axis of this model: identical models collapse into one
    return p


def model_id(point: dict[str, Any]) -> str:
    """A readable, unique file name for one hyperparameter point."""
    text = json.dumps([point[a] for a in AXES])
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{point['model']}-{point['optimizer']}-{digest}"


def plan_population(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The hyperparameter points of the population (each a dict over :data:`AXES`), deduplicated,
    in a fixed order determined by the config and ``sampling_seed``."""
    space = cfg["space"]
    rng = np.random.default_rng(cfg["sampling_seed"])
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


def _model(point: dict[str, Any], in_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    from landscape.models import model_factory

    if point["model"] == "mlp":
        w = point["width"]
        return model_factory(
            "mlp", seed=point["seed"], sizes=(in_shape[-1], w, w, num_classes), activation="relu"
        )
    return model_factory(point["model"], seed=point["seed"])


def build_optimizer(
    point: dict[str, Any], model: nn.Module, num_data: int, options: dict[str, dict[str, Any]]
) -> torch.optim.Optimizer:
    """The optimizer of ``point``: SGD (momentum 0.9 by default), SAM (Foret et al. 2021), ASAM (Kwon
    et al. 2021) with SGD inside, bSAM (Moellenhoff & Khan 2023) or MFVI (Blundell et al. 2015).

    ``weight_decay`` is SGD's decoupled-from-nothing L2 term for SGD/SAM/ASAM; for the Bayesian
    optimizers it is the prior: bSAM's ``prior_precision = weight_decay * num_data`` added to its
    configured value (the per-example precision ``delta = prior_precision / N`` of Alg. 1 equals the
    weight decay), MFVI's Adam weight decay. ``options[name]`` overrides the defaults; an
    ``lr_scale`` there multiplies the ``lr`` axis (bSAM and MFVI are Adam-like: their learning rates
    live on another scale).
    """
    import optimizers as O

    name = point["optimizer"]
    opts = dict(options.get(name, {}))
    lr = point["lr"] * float(opts.pop("lr_scale", 1.0))
    wd = float(point["weight_decay"])
    params = model.parameters()
    if name in ("sgd", "sam", "asam"):
        base = {"momentum": 0.9, **{k: v for k, v in opts.items() if k in ("momentum", "nesterov")}}
        extra = {k: v for k, v in opts.items() if k not in ("momentum", "nesterov")}
        if name == "sgd":
            if extra:
                _fail(
                    f"optimizer_options.sgd: unknown option(s) {sorted(extra)}; "
                    "use momentum, nesterov, lr_scale"
                )
            return torch.optim.SGD(params, lr=lr, weight_decay=wd, **base)
        cls = O.SAM if name == "sam" else O.ASAM
        return cls(params, torch.optim.SGD, model=model, lr=lr, weight_decay=wd, **base, **extra)
    if name == "bsam":
        prior = float(opts.pop("prior_precision", 1.0)) + wd * num_data
        if "betas" in opts:
            opts["betas"] = tuple(opts["betas"])
        return O.BayesianSAM(
            params, lr=lr, num_data=num_data, prior_precision=prior, seed=point["seed"], model=model, **opts
        )
    return O.MFVI(params, lr=lr, num_data=num_data, seed=point["seed"], weight_decay=wd, **opts)


def _error_and_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
            loss = float(nn.functional.cross_entropy(out, y))
            err = float((out.argmax(-1) != y).double().mean())
    finally:
        model.train(was)
    return err, loss


def _load_data(cfg: dict[str, Any], point_model: str) -> dict[str, torch.Tensor]:
    from landscape.data import load_dataset

    spec = cfg["data"]
    if point_model != "mlp" and spec == "digits":
        spec = "digits-image"
    kw = {"test_fraction": cfg["test_fraction"]} if spec.startswith("digits") else {}
    x, y = load_dataset(spec, "train", **kw)
    xt, yt = load_dataset(spec, "test", **kw)
    return {"x": x.float(), "y": y, "xt": xt.float(), "yt": yt}


def train_and_measure(
    point: dict[str, Any], cfg: dict[str, Any], *, progress: bool = False
) -> dict[str, Any]:
    """Train the model of ``point`` and measure it: train/test/OOD error and loss, the gaps and every
    configured sharpness measure on the first ``sharpness_subset`` training examples.

    The training set of a model is the first ``n_train`` examples of a fixed permutation (seeded by
    ``sampling_seed``), so the sharpness subset lies in every model's training set. The OOD set is the
    test set with Gaussian input noise of standard deviation ``ood_noise`` (a covariate shift).
    """
    import landscape as ls
    from landscape.models import train

    t0 = time.perf_counter()
    device = torch.device(cfg["device"])
    d = _load_data(cfg, point["model"])
    n_all = len(d["y"])
    if point["n_train"] > n_all:
        _fail(f"n_train={point['n_train']} exceeds the {n_all} training examples of {cfg['data']}")
    perm = torch.randperm(n_all, generator=torch.Generator().manual_seed(cfg["sampling_seed"]))
    idx = perm[: point["n_train"]]
    x, y = d["x"][idx].to(device), d["y"][idx].to(device)
    xt, yt = d["xt"].to(device), d["yt"].to(device)
    num_classes = int(max(int(d["y"].max()), int(d["yt"].max()))) + 1
    model = _model(point, tuple(x.shape[1:]), num_classes).to(device)
    opt = build_optimizer(point, model, len(y), cfg["optimizer_options"])
    hist = train(model, (x, y), opt, cfg["epochs"], batch_size=point["batch_size"], seed=point["seed"])
    row: dict[str, Any] = {"id": model_id(point), **point}
    row["train_error"], row["train_loss"] = _error_and_loss(model, x, y)
    row["test_error"], row["test_loss"] = _error_and_loss(model, xt, yt)
    row["gap_error"] = row["test_error"] - row["train_error"]
    row["gap_loss"] = row["test_loss"] - row["train_loss"]
    if cfg["ood_noise"] > 0:
        g = torch.Generator().manual_seed(cfg["sampling_seed"] + 1)
        noisy = d["xt"] + cfg["ood_noise"] * torch.randn(d["xt"].shape, generator=g)
        row["ood_error"], row["ood_loss"] = _error_and_loss(model, noisy.to(device), yt)
    row["final_epoch_loss"] = hist["epoch_loss"][-1] if hist["epoch_loss"] else math.nan
    sub = cfg["sharpness_subset"]
    dtype = torch.float64 if cfg["sharpness_dtype"] == "float64" else torch.float32
    obj = ls.Objective(model, nn.CrossEntropyLoss(), (x[:sub], y[:sub]), dtype=dtype, device=device)
    specs = [(m["measure"], m["options"]) for m in cfg["measures"]]
    report = ls.sharpness_report(obj, specs, progress=progress)
    measures: dict[str, Any] = {}
    for m, r in zip(cfg["measures"], report.rows):
        row[m["name"]] = r.value
        measures[m["name"]] = {
            "measure": r.measure,
            "value": r.value,
            "stderr": r.stderr,
            "seconds": r.seconds,
            "config": r.config,
        }
    row["seconds"] = time.perf_counter() - t0
    return {"row": row, "measures": measures, "history": hist["epoch_loss"]}


def _fingerprint(point: dict[str, Any], cfg: dict[str, Any]) -> str:
    keep = {
        k: v for k, v in cfg.items() if k not in ("space", "sampling", "n_models", "bases", "threads", "name")
    }
    text = json.dumps({"point": point, "cfg": keep}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_population(
    cfg: dict[str, Any], out_dir: str | Path, *, progress: bool = True, log: Any = None
) -> list[dict[str, Any]]:
    """Train and measure every model of :func:`plan_population` (skipping those whose
    ``models/<id>.json`` records the same configuration); returns the table rows in plan order.

    Writes ``study_config.json`` and one ``models/<id>.json`` per model (atomically)."""
    out = Path(out_dir)
    (out / "models").mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "study_config.json", cfg)
    torch.set_num_threads(cfg["threads"])
    points = plan_population(cfg)
    rows: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(points), desc="population", unit="model")
    try:
        for point in points:
            path = out / "models" / f"{model_id(point)}.json"
            fp = _fingerprint(point, cfg)
            done = None
            if path.is_file():
                try:
                    d = read_json(path, what="model result")
                    done = d if isinstance(d, dict) and d.get("fingerprint") == fp else None
                except ValueError:
                    done = None
            if done is None:
                res = train_and_measure(point, cfg)
                done = {"fingerprint": fp, "config": {"point": point, "study": cfg}, **res}
                atomic_write_json(path, done)
            elif log is not None:
                log(f"skipped {model_id(point)} (results exist)")
            rows.append(done["row"])
            if bar is not None:
                bar.update(1)
                bar.set_postfix(last=model_id(point))
    finally:
        if bar is not None:
            bar.close()
    return rows
