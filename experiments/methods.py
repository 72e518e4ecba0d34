"""Optimizers by name: the ``optimizer`` of a ``[[methods]]`` entry and its hyperparameters.

A name is looked up in :data:`ALIASES` (``sgd``, ``sam``, ``bsam``, ...), then as a class or
function of :mod:`optimizers` or :mod:`torch.optim` (``"SAM"``, ``"RMSprop"``). Arguments the run
knows are filled in when the constructor takes them: ``model`` (BatchNorm handling of the SAM
family), ``num_data`` / ``ess`` (the training-set size times ``data.num_data_factor``), ``seed`` and
``steps_per_epoch``. A hyperparameter set to ``"default"`` is left to the constructor's default
(``train.lr`` and ``train.optimizer_defaults`` are then not passed either); one written in epochs
(``burn_in = "150 epochs"``, ``collect_every = "1 epoch"``) becomes a number of steps.
``base_optimizer = "sgd"`` (a name) becomes the ``torch.optim`` class. ``train.lr`` is the learning
rate unless the method gives its own; ``train.optimizer_defaults`` (e.g. momentum, weight decay) are
passed to every optimizer that accepts them. A hyperparameter the optimizer does not accept is an
error naming the accepted ones.

With a ``swag`` table, the optimizer is wrapped in :class:`optimizers.SWAG`, which collects the
weights once per epoch from ``start_epoch`` on (Maddox et al. 2019, Alg. 1), or every
``collect_every`` optimizer steps after it (bSAM App. G.1, MNIST: "collect a sample every k
steps"); a SAM inside gives F-SWAG (Nguyen et al. 2023). The other tables of a method
(:data:`experiments.config.METHOD_TABLES`):

* ``bayesian``: the model's ``nn.Linear`` / ``nn.Conv2d`` layers become mean-field Gaussian layers
  (:func:`optimizers.convert_to_bayesian`); with any optimizer the loss is the negative ELBO per
  datum (SGVB, Blundell et al. 2015; SGVB-LRT with ``local_reparam = true``, Kingma et al. 2015);
  ``optimizer = "fsgvb"`` is F-SGVB (Nguyen et al. 2023, eqs. 6-7), which adds the KL itself and
  gets ``kl_weight`` from this table;
* ``mc_dropout``: the model average is the MC-Dropout predictive (Gal & Ghahramani 2016, eq. 8)
  of a model with dropout (``model.kwargs.dropout``); ``optimizer = "sam"`` gives F-MC-Dropout;
* ``ensemble``: ``members`` independent runs averaged (Lakshminarayanan et al. 2017), see
  :mod:`experiments.members`; ``optimizer = "sam"`` gives F-Deep-Ensembles.

An optimizer with its own closure contract (VOGN's per-example losses, FlatSGVB's Bayesian layers)
is described by :func:`experiments.closures.contract_of`; :func:`check_run` refuses combinations
the contract rules out, naming the fix.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import optimizers as opt_pkg
from experiments.closures import contract_of
from experiments.config import ConfigError
from optimizers import SWAG, FlatSGLD
from optimizers.perturbation import PerturbationOptimizer
from optimizers.posterior import DiagonalGaussianPosterior

__all__ = [
    "ALIASES",
    "available_methods",
    "build_optimizer",
    "check_method",
    "check_run",
    "resolve_optimizer",
]

#: Short names of the optimizers a config may use.
ALIASES: dict[str, str] = {
    "sgd": "torch.optim.SGD",
    "adam": "torch.optim.Adam",
    "adamw": "torch.optim.AdamW",
    "sam": "SAM",
    "asam": "ASAM",
    "fsam": "FisherSAM",
    "fisher_sam": "FisherSAM",
    "rsam": "RandomSAM",
    "random_sam": "RandomSAM",
    "mixsam": "MixSAM",
    "vsam": "VariationalSAM",
    "variational_sam": "VariationalSAM",
    "bsam": "BayesianSAM",
    "mfvi": "MFVI",
    "ivon": "IVON",
    "gtracer": "SGDTracer",
    "sgd_tracer": "SGDTracer",
    "adam_tracer": "AdamTracer",
    "fsgld": "FlatSGLD",
    "flat_sgld": "FlatSGLD",
    "f_swag": "f_swag",
    "vogn": "VOGN",
    "fsgvb": "FlatSGVB",
    "flat_sgvb": "FlatSGVB",
    "f_sgvb": "FlatSGVB",
    "sgvb": "sgvb",
    "mc_dropout": "mc_dropout",
    "f_mc_dropout": "f_mc_dropout",
    "deep_ensemble": "DeepEnsemble",
    "ensemble": "DeepEnsemble",
}

_INJECTED = ("params", "model", "num_data", "ess", "seed", "generator", "steps_per_epoch")
#: Names that are not optimizers of a method, with the way to write them in a config.
_UNSUPPORTED = {
    "DeepEnsemble": 'a deep ensemble is a table of a method: optimizer = "sgd" (or "sam": F-Deep-Ensembles) '
    "with ensemble = { members = 5 }",
    "SWAG": "use a swag table on a method instead",
    "sgvb": 'SGVB is any optimizer with a bayesian table: optimizer = "adam" with bayesian = '
    "{ kl_weight = 1.0 } (keys prior_std, init_std, local_reparam, kl_weight); F-SGVB is "
    'optimizer = "fsgvb"',
    "mc_dropout": 'MC-Dropout is a table of a method: optimizer = "sgd" (or "sam": F-MC-Dropout) with '
    "mc_dropout = { samples = 30 } and a model with dropout (model.kwargs.dropout = 0.1)",
}


def available_methods() -> list[str]:
    return sorted(k for k, v in ALIASES.items() if v not in _UNSUPPORTED)


def resolve_optimizer(name: str) -> Callable[..., Any]:
    """The constructor a config's optimizer ``name`` refers to (see module docstring)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"optimizer must be a name such as 'sgd' or 'sam', got {name!r}")
    target = ALIASES.get(name.lower(), name)
    if target in _UNSUPPORTED:
        raise ConfigError(
            f"optimizer {name!r} is not supported by the experiment runner: {_UNSUPPORTED[target]}"
        )
    if target.startswith("torch.optim."):
        return getattr(torch.optim, target.rsplit(".", 1)[1])
    for where in (opt_pkg, opt_pkg.bayes, torch.optim):  # bayes: builders such as f_mc_dropout
        obj = getattr(where, target, None)
        if callable(obj) and (not isinstance(obj, type) or issubclass(obj, torch.optim.Optimizer)):
            return obj
    raise ConfigError(
        f"unknown optimizer {name!r}; available: {', '.join(available_methods())} (or a class name of "
        "optimizers / torch.optim)"
    )


def _base_class(value: Any) -> Any:
    if isinstance(value, str):
        cls = resolve_optimizer(value)
        if not (isinstance(cls, type) and cls.__module__.startswith("torch.optim")):
            raise ConfigError(
                f"base_optimizer must name a torch.optim optimizer (sgd, adam, ...), got {value!r}"
            )
        return cls
    return value


def _accepted(fn: Callable[..., Any], hyper: dict[str, Any]) -> tuple[set[str], bool]:
    """Names ``fn`` accepts (its own and, through ``**kwargs``, its base optimizer's) and whether
    any name is accepted (a ``**kwargs`` we cannot resolve)."""
    sig = inspect.signature(fn)
    names = {n for n, p in sig.parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    var_kw = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD), None)
    if var_kw is None:
        return names, False
    base = None
    if "base_optimizer" in sig.parameters:
        base = _base_class(hyper.get("base_optimizer", sig.parameters["base_optimizer"].default))
    elif var_kw.startswith("sgd"):
        base = torch.optim.SGD
    elif var_kw.startswith("adam"):
        base = torch.optim.Adam
    if not isinstance(base, type):
        return names, True
    base_names = {
        n for n, p in inspect.signature(base).parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD
    }
    if isinstance(fn, type) and issubclass(fn, PerturbationOptimizer):
        base_names.add("batched_m")  # the SAM family's machinery (optimizers.perturbation), via **kwargs
    return names | base_names, False


_EPOCHS = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*epochs?\s*$")


def _in_steps(key: str, value: Any, steps_per_epoch: int, scale: float) -> Any:
    """A hyperparameter written in epochs (``"150 epochs"``, ``"1 epoch"``) as a number of optimizer
    steps (times the budget's epoch scale); anything else unchanged."""
    if not isinstance(value, str):
        return value
    match = _EPOCHS.match(value)
    if not match:
        return value
    epochs = float(match.group(1))
    return 0 if epochs == 0 else max(1, int(round(epochs * scale * steps_per_epoch)))


def _signatures(fn: Callable[..., Any], hyper: dict[str, Any]) -> list[inspect.Signature]:
    """The signature of ``fn`` and of its base optimizer (through ``**kwargs``, as :func:`_accepted`
    resolves it)."""
    sig = inspect.signature(fn)
    var_kw = next((p.name for p in sig.parameters.values() if p.kind == p.VAR_KEYWORD), "")
    base: Any = None
    if var_kw and "base_optimizer" in sig.parameters:
        try:
            base = _base_class(hyper.get("base_optimizer", sig.parameters["base_optimizer"].default))
        except ConfigError:  # reported by the constructor call
            base = None
    elif var_kw.startswith(("sgd", "adam")):
        base = torch.optim.SGD if var_kw.startswith("sgd") else torch.optim.Adam
    return [sig, inspect.signature(base)] if isinstance(base, type) else [sig]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "number": ("a number", _is_number),
    "str": ("a string", lambda v: isinstance(v, str)),
}


def _kind(default: Any, annotation: Any) -> tuple[str, Callable[[Any], bool]] | None:
    """What a value must be, judged by the default of the argument, else by its annotation
    (``float``, ``int | None``, ...); ``None``: no rule."""
    if isinstance(default, bool):
        return _KINDS["bool"]
    if _is_number(default):
        return _KINDS["number"]
    if isinstance(default, str):
        return _KINDS["str"]
    if isinstance(default, (tuple, list)) and default and all(_is_number(d) for d in default):
        n = len(default)
        return (
            f"a list of {n} numbers",
            lambda v: isinstance(v, (list, tuple)) and len(v) == n and all(_is_number(x) for x in v),
        )
    if default is None or default is inspect.Parameter.empty:
        name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        name = re.sub(r"\|None$|^None\|", "", re.sub(r"\s", "", name))
        return {"bool": _KINDS["bool"], "int": _KINDS["number"], "float": _KINDS["number"]}.get(name)
    return None


def _check_values(method: dict[str, Any], fn: Callable[..., Any], values: dict[str, tuple[Any, str]]) -> None:
    """Each ``argument: (value, config key)`` against the type of the constructor's default or
    annotation (a number where the default is a number, ...); infinity only where the default is
    infinite. Raises :class:`ConfigError` naming the config key, the value and the expected type."""
    params: dict[str, inspect.Parameter] = {}
    for sig in _signatures(fn, {k: v for k, (v, _) in values.items()}):
        for n, p in sig.parameters.items():
            params.setdefault(n, p)
    for name, (value, key) in values.items():
        p = params.get(name)
        rule = None if p is None else _kind(p.default, p.annotation)
        if rule is None or (isinstance(value, str) and (value == "default" or _EPOCHS.match(value))):
            continue
        want, ok = rule
        default = p.default
        of = (
            f"(the default of {name} in {method['optimizer']!r} is {default!r})"
            if default is not p.empty and default is not None
            else f"({method['optimizer']!r} declares {name}: {p.annotation})"
        )
        if not ok(value):
            hint = ""
            if isinstance(value, str) and want == "a number":
                try:
                    hint = f"; write it without quotes: {key}={float(value)!r}"
                except ValueError:
                    pass
            raise ConfigError(f"{key} must be {want} {of}, got {value!r} ({type(value).__name__}){hint}")
        items = value if isinstance(value, (list, tuple)) else [value]
        infinite = any(isinstance(x, float) and math.isinf(x) for x in items)
        if infinite and not (isinstance(default, float) and math.isinf(default)):
            raise ConfigError(f"{key} must be a finite number {of}, got {value!r}")


def check_method(method: dict[str, Any]) -> tuple[Callable[..., Any], set[str], bool]:
    """Resolve ``method["optimizer"]`` and check its hyperparameter names; returns ``(constructor,
    accepted names, accepts anything)``. Raises :class:`ConfigError`."""
    fn = resolve_optimizer(method["optimizer"])
    hyper = dict(method["hyperparameters"])
    accepted, anything = _accepted(fn, hyper)
    if contract_of(fn).adds_kl and "kl_weight" in hyper:
        raise ConfigError(
            f"method {method['name']!r}: set the KL weight of {method['optimizer']!r} in the method's "
            f"bayesian table (bayesian = {{ kl_weight = {hyper['kl_weight']!r} }}), not in hyperparameters"
        )
    bad = [k for k in hyper if k in _INJECTED or (not anything and k not in accepted)]
    if bad:
        shown = sorted(accepted - set(_INJECTED))
        raise ConfigError(
            f"method {method['name']!r}: optimizer {method['optimizer']!r} does not accept {bad}; it takes "
            f"{shown} (model, num_data and seed are filled in by the runner)"
        )
    where = f"methods.{method['name']}.hyperparameters"
    _check_values(method, fn, {k: (v, f"{where}.{k}") for k, v in hyper.items()})
    return fn, accepted, anything


def _own_posterior(fn: Any) -> bool:
    """Whether the optimizer learns a posterior of its own (a Gaussian, SWAG, F-SGLD's samples)."""
    return isinstance(fn, type) and issubclass(fn, (DiagonalGaussianPosterior, FlatSGLD, SWAG))


def check_run(cfg: dict[str, Any]) -> Any:
    """Check the method of a one-method config against its optimizer's closure contract and the
    run's settings; returns the :class:`experiments.closures.Contract`. Raises :class:`ConfigError`
    naming the problem and the fix (checks that need the model or the process group are in the
    trainer)."""
    method = cfg["methods"][0]
    fn, _, _ = check_method(method)
    contract = contract_of(fn)
    who = f"method {method['name']!r} ({method['optimizer']})"
    if contract.closure == "per_example_losses" and cfg["precision"] == "fp16":
        raise ConfigError(
            f"{who} differentiates per-example losses inside its step, so fp16 loss scaling cannot be "
            'applied; use precision = "bf16", "float32" or "float64"'
        )
    if contract.needs_bayesian_layers and not method["bayesian"]:
        raise ConfigError(
            f"{who} trains Bayesian layers: add a bayesian table to the method, e.g. bayesian = "
            "{ kl_weight = 1.0 } (the other keys default to prior_std = 1.0, init_std = 0.001, "
            "local_reparam = false)"
        )
    for table in ("bayesian", "mc_dropout"):
        if method[table] and _own_posterior(fn):
            raise ConfigError(
                f"{who} learns a posterior of its own, which the {table} table would replace; drop the "
                f'{table} table, or use a point optimizer (optimizer = "sgd", "adam", "sam")'
            )
    if method["ensemble"] and _own_posterior(fn):
        raise ConfigError(
            f"{who}: an ensemble of posterior methods (e.g. MultiSWAG) is not supported; the members "
            'of an ensemble are trained with a point optimizer (optimizer = "sgd", "adam", "sam")'
        )
    return contract


def build_optimizer(
    method: dict[str, Any],
    model: nn.Module,
    *,
    train_cfg: dict[str, Any],
    num_data: int,
    seed: int,
    steps_per_epoch: int,
) -> tuple[Any, dict[str, Any]]:
    """Construct the optimizer of ``method`` for ``model``; returns ``(optimizer, arguments used)``.

    Raises:
        ConfigError: unknown optimizer, a hyperparameter it does not accept, or a constructor that
            rejects a value (the message names the method).
    """
    fn, accepted, anything = check_method(method)
    hyper = dict(method["hyperparameters"])
    kwargs: dict[str, Any] = {}
    for k, v in train_cfg["optimizer_defaults"].items():
        if anything or k in accepted:
            kwargs[k] = v
    if "lr" in accepted or anything:
        kwargs["lr"] = train_cfg["lr"]
    scale = train_cfg.get("epoch_scale", 1.0)
    kwargs.update({k: _in_steps(k, v, steps_per_epoch, scale) for k, v in hyper.items()})
    # "default": leave the argument to the constructor (no train.lr / optimizer_defaults either)
    kwargs = {k: v for k, v in kwargs.items() if not (isinstance(v, str) and v == "default")}
    if "base_optimizer" in kwargs:
        kwargs["base_optimizer"] = _base_class(kwargs["base_optimizer"])
    extra: dict[str, Any] = {}
    if "model" in accepted:
        extra["model"] = model
    if "num_data" in accepted:
        extra["num_data"] = int(num_data)
    if "ess" in accepted:
        extra["ess"] = float(num_data)
    if "seed" in accepted:
        extra["seed"] = int(seed)
    if "steps_per_epoch" in accepted:
        extra["steps_per_epoch"] = int(steps_per_epoch)
    if method["bayesian"] and "kl_weight" in accepted:
        extra["kl_weight"] = float(method["bayesian"]["kl_weight"])
    # FlatSGVB-like constructors take the model itself first, the others its parameters
    first = next(iter(inspect.signature(fn).parameters), None)
    target = extra.pop("model", model) if first == "model" else model.parameters()
    source = {k: f"train.optimizer_defaults.{k}" for k in train_cfg["optimizer_defaults"]}
    source["lr"] = "train.lr"
    source.update({k: f"methods.{method['name']}.hyperparameters.{k}" for k in hyper})
    _check_values(method, fn, {k: (v, source[k]) for k, v in kwargs.items() if k in source})
    try:
        opt = fn(target, **kwargs, **extra)
    except (TypeError, ValueError) as exc:
        # name the config keys: those of the arguments the message names, else of every argument
        named = [k for k in kwargs if re.search(rf"\b{re.escape(k)}\b", str(exc))] or list(kwargs)
        keys = ", ".join(f"{source.get(k, k)} = {kwargs[k]!r}" for k in named)
        raise ConfigError(
            f"method {method['name']!r} ({method['optimizer']}): {exc}" + (f" (from {keys})" if keys else "")
        ) from None
    if method["swag"]:
        s = method["swag"]
        opt = opt_pkg.SWAG(
            opt,
            rank=s["rank"],
            collect_every=s.get("collect_every", 0) or steps_per_epoch,  # 0: once per epoch
            start_step=s["start_epoch"] * steps_per_epoch,
            diag_only=s["diag_only"],
            seed=int(seed),
            convention=s["convention"],
        )
    used = {k: (v.__name__ if isinstance(v, type) else v) for k, v in kwargs.items()}
    used.update({k: v for k, v in extra.items() if k != "model"})
    # fail here rather than at the first step: the runner builds closures from the contract
    inner = inner_optimizer(opt)
    if not isinstance(inner, torch.optim.Optimizer):
        raise ConfigError(
            f"method {method['name']!r}: {method['optimizer']!r} built a {type(inner).__name__}, not a "
            "torch.optim.Optimizer; name an optimizer (sgd, sam, bsam, vogn, fsgvb, ...)"
        )
    prefer_foreach(inner)
    return opt, used


def prefer_foreach(opt: Any) -> None:
    """``foreach=True`` for the ``torch.optim`` optimizers inside ``opt`` (itself, its
    ``base_optimizer``) that left it to PyTorch (``foreach=None``) and are not ``fused``.

    PyTorch picks the one-tensor-at-a-time loop on the CPU; the ``_foreach_*`` ops compute the same
    update (bit for bit: the same kernels per tensor, ``tests/test_runner_foreach.py``) with one
    Python call per parameter group instead of a few per tensor, which is what a small network's
    step is made of (issue 25: the runner's SGD epoch against a minimal loop)."""
    seen: set[int] = set()
    while isinstance(opt, torch.optim.Optimizer) and id(opt) not in seen:
        seen.add(id(opt))
        if type(opt).__module__.startswith("torch.optim"):
            for group in opt.param_groups:
                if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                    if not group.get("differentiable"):
                        group["foreach"] = True
        opt = getattr(opt, "base_optimizer", None)


def inner_optimizer(opt: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` whose param groups carry the learning rate (unwraps SWAG)."""
    return opt.optimizer if isinstance(opt, opt_pkg.SWAG) else opt
