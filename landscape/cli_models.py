"""Models and checkpoints for the command lines: ``--model`` (a registered name or
``module:function``), ``--model-arg KEY=VALUE`` / JSON, ``--state-dict`` read with
``torch.load(weights_only=True)``, and a key/shape check that names the keys that do not fit and the
``--model``/``--model-arg`` the file does fit (MLP sizes are inferred from the file).

Errors are :class:`landscape.cli_common.CliError` (one ``error:`` line on the command line).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import inspect
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from landscape.cli_common import CliError, UsageError, check_path, note, one_line
from landscape.models import available_models, model_factory


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--model-arg``, ``--model-kwargs``, ``--state-dict`` (same for every command)."""

    parser.add_argument(
        "--model",
        required=True,
        help=f"a registered name ({', '.join(available_models())}) or module:function returning an nn.Module",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=None,
        metavar="KEY=VALUE|JSON",
        help="a model constructor argument, repeatable: --model-arg sizes=64,32,10 --model-arg "
        "activation=relu, or a JSON object '{\"sizes\": [64, 32, 10]}' (values parsed as JSON)",
    )
    parser.add_argument("--model-kwargs", default=None, help="JSON object of constructor arguments")
    parser.add_argument(
        "--state-dict",
        default=None,
        metavar="PATH",
        help="weights saved with torch.save(model.state_dict(), PATH) (loaded with weights_only=True); "
        "for --model mlp without sizes, the sizes are inferred from the file",
    )


def _model_value(key: str, text: str) -> Any:
    text = text.strip()
    if not text:
        raise UsageError(f"model argument {key}= has no value", f"write {key}=VALUE")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if "," in text:
        return [_model_value(key, part) for part in text.split(",")]
    return {"none": None, "true": True, "false": False}.get(text.lower(), text)


def parse_model_args(items: Sequence[str] | None, kwargs_json: str | None = None) -> dict[str, Any]:
    """``--model-arg KEY=VALUE`` (repeatable; ``1,2,3`` is a list) or JSON objects -> kwargs."""
    out: dict[str, Any] = {}
    example = "--model-arg sizes=64,32,10 or --model-arg '{\"sizes\": [64, 32, 10]}'"
    sources = ([("--model-kwargs", kwargs_json)] if kwargs_json is not None else []) + [
        ("--model-arg", t) for t in items or []
    ]
    for option, text in sources:
        t = text.strip()
        if t.startswith("{") or option == "--model-kwargs":
            try:
                obj = json.loads(t)
            except json.JSONDecodeError as exc:
                raise UsageError(
                    f"{option} {text!r} is not valid JSON ({exc.msg})", f"write {example}"
                ) from None
            if not isinstance(obj, dict):
                raise UsageError(f"{option} {text!r} is not a JSON object", f"write {example}")
            pairs = list(obj.items())
        else:
            key, eq, value = t.partition("=")
            if not eq or not key.strip().isidentifier():
                raise UsageError(f"{option} {text!r} is not KEY=VALUE", f"write {example}")
            pairs = [(key.strip(), _model_value(key, value))]
        for key, value in pairs:
            if key in out:
                raise UsageError(f"model argument {key!r} is given twice", "give each argument once")
            out[key] = value
    return out


def build_model(spec: str, kwargs: Mapping[str, Any]) -> nn.Module:
    """A model from a registered name or ``module:function``, called with ``kwargs``."""

    kwargs = dict(kwargs)
    signature = ""
    if ":" in spec:
        mod_name, _, fn_name = spec.partition(":")
        if not mod_name or not fn_name:
            raise UsageError(
                f"--model {spec!r} is not module:function", "write e.g. --model mypkg.models:make_net"
            )
        try:
            module = importlib.import_module(mod_name)
        except ImportError as exc:
            raise CliError(
                f"--model {spec}: cannot import module {mod_name!r} ({exc})",
                "check the module path and that it is importable from here (PYTHONPATH)",
            ) from None
        factory = getattr(module, fn_name, None)
        if not callable(factory):
            raise CliError(
                f"--model {spec}: module {mod_name!r} has no callable {fn_name!r}",
                "name a function or class in that module that returns an nn.Module",
            )
        with contextlib.suppress(TypeError, ValueError):
            signature = f"{fn_name}{inspect.signature(factory)}"

        def make() -> Any:
            return factory(**kwargs)
    elif spec in available_models():

        def make() -> Any:
            return model_factory(spec, **kwargs)
    else:
        close = difflib.get_close_matches(spec, available_models(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"unknown model {spec!r}",
            f"{hint}use a registered name ({', '.join(available_models())}) or module:function",
        )
    try:
        model = make()
    except TypeError as exc:  # argument values of the command line: a bad command line (exit 2)
        raise UsageError(
            f"--model {spec} does not take the model arguments {kwargs} ({exc})",
            f"pass only arguments its constructor accepts{': ' + signature if signature else ''}",
        ) from None
    except ValueError as exc:
        raise UsageError(f"--model {spec} with {kwargs}: {exc}", "fix the --model-arg values") from None
    if not isinstance(model, nn.Module):
        raise CliError(
            f"--model {spec} returned a {type(model).__name__}, not an nn.Module",
            "point --model at a function or class that returns a torch.nn.Module",
        )
    return model


_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")


def load_state_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state dict with ``torch.load(weights_only=True)`` (also ``{"state_dict": ...}`` and
    ``{"model_state_dict": ...}`` checkpoints); anything else is refused with the fix."""
    import pickle

    p = Path(path)
    save_hint = "save the weights with torch.save(model.state_dict(), PATH)"
    check_path(path, "--state-dict", read=True, missing_fix=f"check the path; {save_hint}")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "unsupported global" in str(exc).lower():  # a pickled class: weights_only refuses it
            raise CliError(
                f"--state-dict {path} holds pickled Python objects (a whole nn.Module?), which are not "
                "loaded because unpickling can run arbitrary code",
                save_hint,
            ) from None
        with open(p, "rb") as fh:  # not a pickle torch can read: show what the file starts with
            head = fh.read(16)
        raise CliError(
            f"--state-dict {path} is not a PyTorch file (it starts with {head!r})", save_hint
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, KeyError, EOFError, ...
        raise CliError(
            f"--state-dict {path} is corrupt or not a PyTorch file "
            f"({type(exc).__name__}: {one_line(exc, 200)})",
            f"the file may be truncated; {save_hint}",
        ) from None

    def is_state(d: Any) -> bool:
        return (
            isinstance(d, dict)
            and bool(d)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items())
        )

    if is_state(obj):
        return obj
    if isinstance(obj, dict):
        for key in _WRAPPER_KEYS:
            if is_state(obj.get(key)):
                note(f"using the {key!r} entry of {path}")
                return obj[key]
        bad = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)][:3]
        what = "an empty dict" if not obj else f"a dict whose entries {bad} are not tensors"
    else:
        what = f"a {type(obj).__name__}"
    raise CliError(f"--state-dict {path} holds {what}, not a state dict", save_hint)


def mlp_sizes(state: Mapping[str, torch.Tensor]) -> tuple[list[int], bool] | None:
    """``(sizes, bias)`` when ``state`` is exactly the state dict of a :class:`landscape.models.MLP`
    (``Flatten, Linear, act, Linear, ...``: keys ``1.weight``, ``3.weight``, ...), else ``None``."""
    weights = []
    n = 0
    while f"{2 * n + 1}.weight" in state:
        weights.append(state[f"{2 * n + 1}.weight"])
        n += 1
    if not weights or any(w.ndim != 2 for w in weights):
        return None
    bias = "1.bias" in state
    expected = {f"{2 * i + 1}.weight" for i in range(n)} | (
        {f"{2 * i + 1}.bias" for i in range(n)} if bias else set()
    )
    if set(state) != expected:
        return None
    sizes = [int(weights[0].shape[1])] + [int(w.shape[0]) for w in weights]
    for i, w in enumerate(weights):
        if int(w.shape[1]) != sizes[i] or (
            bias and tuple(state[f"{2 * i + 1}.bias"].shape) != (sizes[i + 1],)
        ):
            return None
    return sizes, bias


def _mismatch(model: nn.Module, state: Mapping[str, torch.Tensor]) -> list[str]:
    own = model.state_dict()
    few = lambda keys: ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")  # noqa: E731
    wrong = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    parts = []
    if wrong:
        parts.append(f"shapes differ (file vs model) for {few(wrong)}")
    if missing:
        parts.append(f"missing from the file: {few(missing)}")
    if unexpected:
        parts.append(f"not in the model: {few(unexpected)}")
    return parts


def _mlp_args(sizes: Sequence[int], bias: bool) -> str:
    return f"--model-arg sizes={','.join(map(str, sizes))}" + ("" if bias else " --model-arg bias=false")


def suggest_model(state: Mapping[str, torch.Tensor]) -> str:
    """How to build a model the state dict fits: MLP sizes, or a registered model's defaults."""

    found = mlp_sizes(state)
    if found is not None:
        return f"the file holds an MLP {'-'.join(map(str, found[0]))}: pass --model mlp {_mlp_args(*found)}"
    fits = []
    for name in available_models():
        try:
            with torch.random.fork_rng(devices=[]):
                candidate = model_factory(name, device="meta")  # shapes only: allocates nothing
        except Exception:  # noqa: BLE001,S112 - a registered model that needs arguments: skip it
            continue
        if not _mismatch(candidate, state):
            fits.append(name)
    if fits:
        return f"the file fits --model {' or --model '.join(fits)} (default arguments)"
    return "pass the --model and --model-arg the weights were saved from"


def load_model(
    spec: str,
    kwargs: Mapping[str, Any],
    state_dict: str | os.PathLike | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Build ``spec(**kwargs)`` and load ``state_dict`` into it (strict keys and shapes).

    For ``--model mlp`` without ``sizes``, the sizes (and ``bias``) are read from the file and
    reported with :func:`note`. Returns the model and the arguments used.
    """
    kwargs = dict(kwargs)
    state = load_state_file(state_dict) if state_dict is not None else None
    if state is not None and all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
        note(f"stripped the 'module.' prefix (DataParallel) from the keys of {state_dict}")
    if state is not None and spec == "mlp" and "sizes" not in kwargs:
        found = mlp_sizes(state)
        if found is not None:
            kwargs["sizes"] = found[0]
            if not found[1]:
                kwargs.setdefault("bias", False)
            note(
                f"inferred {_mlp_args(*found)} from {state_dict} (the activation is not stored in "
                f"it: {kwargs.get('activation', 'tanh')}; pass --model-arg activation=NAME if it differs)"
            )
    model = build_model(spec, kwargs)
    if state is not None:
        parts = _mismatch(model, state)
        if parts:
            args = f" {_describe_args(kwargs)}" if kwargs else ""
            raise CliError(
                f"--state-dict {state_dict} does not fit --model {spec}{args}: {'; '.join(parts)}",
                suggest_model(state),
            )
        model.load_state_dict(state)
    return model, kwargs


def _describe_args(kwargs: Mapping[str, Any]) -> str:
    def text(v: Any) -> str:
        if isinstance(v, (list, tuple)) and all(isinstance(e, (int, float, str)) for e in v):
            return ",".join(map(str, v))
        return json.dumps(v, separators=(",", ":"))

    return " ".join(f"--model-arg {k}={text(v)}" for k, v in kwargs.items())
