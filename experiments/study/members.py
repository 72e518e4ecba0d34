"""Each member of a study population is one run of the experiment runner (:mod:`experiments.runner`).

:func:`runner_config` turns a hyperparameter point into a runner config: the data set
(``data.name``, ``data.limit_train = n_train``), the model (``mlp`` with two hidden layers of
``width`` units and ReLU, or a registered model by name), one method (the optimizer and its
hyperparameters), one seed, ``train.epochs`` (``epochs``, or ``stop.max_epochs`` under a stopping
rule, :mod:`experiments.study.stopping`) / ``lr`` / ``batch_size`` and the study's ``runner``
table (schedule, precision, ...; the learning rate is constant unless it says otherwise).
:func:`member_run` plans it with :func:`experiments.runner.plan_runs`, so every member has the
runner's resumable run directory (``config.toml``, ``environment.json``, logs, ``checkpoint.pt``,
``results.json``): :func:`train_member` is :func:`experiments.runner.run_one` (a finished run is not
trained again, an interrupted one resumes from its checkpoint) and :func:`load_member` reads the
trained weights back from the checkpoint.

Optimizer hyperparameters (``optimizer_options.<name>`` overrides the defaults; ``lr_scale``
multiplies the ``lr`` axis, for the Adam-like Bayesian optimizers whose learning rates live on
another scale): SGD, SAM (Foret et al. 2021) and ASAM (Kwon et al. 2021) use SGD with momentum 0.9
and ``weight_decay`` as its L2 term; bSAM (Moellenhoff & Khan 2023) takes the weight decay as its
prior, ``prior_precision = prior_precision + weight_decay * N`` (the per-example precision
``delta = prior_precision / N`` of their Alg. 1 is then the weight decay; ``prior_precision``
defaults to 1); MFVI (Blundell et al. 2015) passes it to its Adam as weight decay.

The training subset of ``n_train`` examples is the runner's (a fixed random subset, the same for
every seed and method); subsets of different sizes are nested, so the sharpness subset
(:func:`sharpness_subset`, the runner's subset of ``sharpness_subset`` examples) lies in every
member's training set, which is checked.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.amp import param_dtype
from experiments.config import ConfigError, resolve_config
from experiments.data import RunData, prepare_data
from experiments.logits import append_zero_logit
from experiments.parallel import DistContext
from experiments.runner import Run, plan_runs, run_one, validate
from experiments.study.config import model_id
from experiments.study.stopping import train_to_target
from landscape.data import load_dataset
from landscape.io import read_json
from landscape.models import model_factory

__all__ = [
    "RUNNER_DEFAULTS",
    "load_member",
    "member_run",
    "runner_config",
    "sharpness_subset",
    "train_member",
]

#: Runner settings of every member unless the study's ``runner`` table sets them: a constant learning
#: rate and no sharpness in the runner's own evaluation (the study measures its own list).
RUNNER_DEFAULTS: dict[str, Any] = {
    "precision": "float32",
    "train": {"schedule": "constant"},
    "evaluation": {"sharpness": []},
}
#: Hyperparameters the space sets; ``optimizer_options`` may not.
_FROM_SPACE = ("lr", "weight_decay", "num_data", "seed")


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = (
            _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
        )
    return out


def _data_spec(cfg: dict[str, Any], model: str) -> str:
    """The data set of a member: ``digits`` (flat 8x8 pixels) becomes ``digits-image`` for the
    convolutional models."""
    spec = cfg["data"]
    return "digits-image" if spec == "digits" and model != "mlp" else spec


def _data_kwargs(cfg: dict[str, Any], spec: str) -> dict[str, Any]:
    table = cfg["runner"].get("data", {})  # a bad runner table is reported by resolve_config
    kw = dict(table.get("kwargs", {})) if isinstance(table, dict) else {}
    if spec.startswith("digits"):
        kw.setdefault("test_fraction", cfg["test_fraction"])
    return kw


@functools.lru_cache(maxsize=8)
def _train_shape(spec: str, kwargs_json: str) -> tuple[int, tuple[int, ...], int]:
    """``(examples, input shape, classes)`` of a training split."""
    x, y = load_dataset(spec, "train", **json.loads(kwargs_json))
    return len(y), tuple(x.shape[1:]), int(y.max()) + 1


def _epochs(cfg: dict[str, Any]) -> int:
    """The run's ``train.epochs``: ``stop.max_epochs`` under a stopping rule, else ``epochs``."""
    stop = cfg.get("stop") or {}
    return int(stop["max_epochs"]) if stop else int(cfg["epochs"])


def runner_config(point: dict[str, Any], cfg: dict[str, Any], root: str | Path) -> dict[str, Any]:
    """The resolved experiment-runner config of one member (see the module docstring); its run
    directory is ``<root>/<model_id>/<optimizer>/seed<seed>``.

    Raises:
        ValueError: ``n_train`` exceeds the training split, or ``optimizer_options`` sets a value the
            space sets; :class:`experiments.config.ConfigError` (a ValueError) for a bad ``runner``
            table, naming the key.
    """
    name = point["optimizer"]
    opts = dict(cfg["optimizer_options"].get(name, {}))
    clash = sorted(set(opts) & set(_FROM_SPACE))
    if clash:
        raise ValueError(
            f"optimizer_options.{name}: {clash} are set by the space (lr, weight_decay, seed) or the "
            "runner (num_data); remove them (use lr_scale to rescale the lr axis)"
        )
    lr = point["lr"] * float(opts.pop("lr_scale", 1.0))
    wd = float(point["weight_decay"])
    spec = _data_spec(cfg, point["model"])
    kwargs = _data_kwargs(cfg, spec)
    n_all, in_shape, num_classes = _train_shape(spec, json.dumps(kwargs, sort_keys=True, default=str))
    if point["n_train"] > n_all:
        raise ValueError(
            f"n_train={point['n_train']} exceeds the {n_all} training examples of {spec!r}; "
            "lower space.n_train"
        )
    if name in ("sgd", "sam", "asam"):
        hyper = {"momentum": 0.9, **opts, "weight_decay": wd}
    elif name == "bsam":
        table = cfg["runner"].get("data", {})
        f = table.get("num_data_factor", 1.0) if isinstance(table, dict) else 1.0
        factor = float(f) if isinstance(f, (int, float)) else 1.0  # else resolve_config reports it
        prior = float(opts.pop("prior_precision", 1.0)) + wd * round(point["n_train"] * factor)
        hyper = {**opts, "prior_precision": prior}
    else:  # mfvi
        hyper = {**opts, "weight_decay": wd}
    model_kwargs: dict[str, Any] = {}
    if point["model"] == "mlp":
        w = point["width"]
        model_kwargs = {
            "sizes": [int(torch.tensor(in_shape).prod()), w, w, num_classes],
            "activation": "relu",
        }
    owned = {
        "name": model_id(point),
        "seeds": [point["seed"]],
        "out_dir": str(root),
        "device": cfg["device"],
        "threads": cfg["threads"],
        "progress": False,
        "data": {"name": spec, "kwargs": kwargs, "limit_train": point["n_train"]},
        "model": {"name": point["model"], "kwargs": model_kwargs},
        "train": {"epochs": _epochs(cfg), "lr": float(lr), "batch_size": point["batch_size"]},
        "methods": [{"name": name, "optimizer": name, "hyperparameters": hyper}],
    }
    raw = _merge(_merge(RUNNER_DEFAULTS, cfg["runner"]), owned)
    try:
        return resolve_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"study member {model_id(point)}: runner config: {exc}") from None


def member_run(point: dict[str, Any], cfg: dict[str, Any], root: str | Path) -> Run:
    """The runner's :class:`~experiments.runner.Run` of one member (checked with
    :func:`experiments.runner.validate`)."""
    runs = plan_runs(runner_config(point, cfg, root))
    if len(runs) != 1:  # a runner table with a sweep would give several
        raise ValueError(f"study member {model_id(point)} plans {len(runs)} runs; a member is one run")
    validate(runs)
    return runs[0]


def train_member(
    run: Run, *, device: torch.device, progress: bool = False, stop: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train (or resume, or skip when finished) the member's run with
    :func:`experiments.runner.run_one`, or with a stopping rule (the study's ``stop`` table) with
    :func:`experiments.study.stopping.train_to_target`; returns the runner's metrics row (with
    ``stop``, the record of the stopping rule, under one)."""
    if stop:
        return train_to_target(run, stop, device=device, progress=progress)
    return run_one(run, device=device, ctx=DistContext(), progress=progress)


def load_member(run: Run, *, device: torch.device) -> tuple[nn.Module, RunData, list[dict[str, Any]]]:
    """The trained model (weights from the run's ``checkpoint.pt``), the run's data
    (:func:`experiments.data.prepare_data` with the run's config and seed) and its per-epoch history.

    Raises:
        ValueError: the run is not finished (no ``results.json``) or its checkpoint is not the one
            its results were computed from.
    """
    res_path, ckpt = run.run_dir / "results.json", run.run_dir / "checkpoint.pt"
    if not res_path.is_file() or not ckpt.is_file():
        raise ValueError(f"run {run.run_dir} is not finished; train it first (train_member)")
    res = read_json(res_path, what="run results")
    blob = torch.load(ckpt, map_location="cpu", weights_only=True)
    if blob["counters"]["step"] != res["effective"]["steps"]:
        raise ValueError(
            f"{ckpt} holds step {blob['counters']['step']} but {res_path} step {res['effective']['steps']}; "
            f"delete {run.run_dir} to train the member again"
        )
    m = run.cfg["model"]
    model = model_factory(m["name"], seed=run.seed, **m["kwargs"])
    model = model.to(dtype=param_dtype(run.cfg["precision"]))
    model.load_state_dict(blob["model"])
    if m.get("logits", "c") == "c-1":  # the run's C-1-output likelihood
        append_zero_logit(model)
    model.to(device)
    return model, prepare_data(run.cfg, run.seed), list(blob["history"])


_SUBSETS: dict[str, torch.Tensor] = {}


def sharpness_subset(run: Run, data: RunData, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` training examples every member's sharpness is measured on: the runner's subset of
    ``k`` examples (``data.limit_train = k``), taken from ``data`` (the member's own training set,
    with its labels) after checking that it lies there."""
    small = copy.deepcopy(run.cfg)
    small["data"]["limit_train"] = k
    small["data"]["label_noise"] = 0.0
    key = json.dumps([small["data"], small["budget"], small["precision"]], sort_keys=True, default=str)
    if key not in _SUBSETS:
        _SUBSETS[key] = prepare_data(small, run.seed).train_indices
    idx, mine = _SUBSETS[key], data.train_indices
    pos = torch.searchsorted(mine, idx).clamp(max=len(mine) - 1)
    if len(idx) != k or not torch.equal(mine[pos], idx):
        raise ValueError(
            f"the sharpness subset of {k} examples is not part of run {run.run_dir}'s training set; "
            "lower sharpness_subset to at most the smallest n_train"
        )
    return data.x_train[pos], data.y_train[pos]
