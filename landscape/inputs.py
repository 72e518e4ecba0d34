"""The data forms an :class:`~landscape.Objective` accepts: a batch is ``(inputs, targets)`` where
``inputs`` is a tensor, a tuple/list of tensors (positional arguments of ``forward``) or a dict of
tensors (keyword arguments).  Helpers to recognise, map and unpack them, to count correct
predictions of a classifier's output, to pass them to the forward (:func:`resolve_input_mode`,
:func:`call_forward`: a tensor as ``model(x)``, a tuple as ``model(*x)``, a dict as one argument
``model(d)`` or, ``input_mode="kwargs"`` or ``"auto"`` on a forward whose parameters its keys name,
as ``model(**d)``, HuggingFace style), to scan a data set once (:func:`scan_data`: structure,
devices, lengths, non-finite values, label ranges, one-shot sources; it returns a
:class:`DataScan` the Objective stores), to turn a forward's return value into the tensor the loss
takes (:func:`pick_output`: ``output_fn``, HuggingFace ``logits``) and to resolve a parameter
selection (:func:`select_params`, tied parameters under any name).  Pure functions: the Objective
keeps what they return."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from landscape._transforms import data_iter, transform_tensors

Inputs = torch.Tensor | tuple | dict


# --------------------------------------------------------------------------------------------
# small helpers on (possibly nested) inputs
# --------------------------------------------------------------------------------------------
def _is_inputs(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, Mapping):
        return len(x) > 0 and all(isinstance(v, torch.Tensor) for v in x.values())
    if isinstance(x, (tuple, list)):
        return len(x) > 0 and all(isinstance(v, torch.Tensor) for v in x)
    return False


def _is_single_batch(data: Any) -> bool:
    return (
        isinstance(data, (tuple, list))
        and len(data) == 2
        and isinstance(data[1], torch.Tensor)
        and _is_inputs(data[0])
    )


def _tensors(inputs: Inputs) -> list[torch.Tensor]:
    if isinstance(inputs, torch.Tensor):
        return [inputs]
    if isinstance(inputs, Mapping):
        return list(inputs.values())
    return list(inputs)


def _map_inputs(inputs: Inputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> Inputs:
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    if isinstance(inputs, Mapping):
        return {k: fn(v) for k, v in inputs.items()}
    return tuple(fn(v) for v in inputs)


def _as_args(inputs: Inputs) -> tuple:
    """Positional arguments of the forward call: a tuple of tensors is unpacked, anything else is one."""
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs)
    return (inputs,)


def _num_correct(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """Number of correct predictions for class labels or 0/1 targets, ``None`` if not classification."""
    if not torch.is_floating_point(y) and out.ndim == 2 and out.shape[1] > 1 and y.ndim == 1:
        return (out.argmax(dim=1) == y).sum().to(torch.float64)
    logits = out.reshape(-1) if out.ndim >= 1 and out.numel() == y.numel() else None
    if logits is not None and (out.ndim == 1 or out.shape[-1] == 1):
        yy = y.reshape(-1)
        if bool(((yy == 0) | (yy == 1)).all()):
            return ((logits > 0).to(yy.dtype) == yy).sum().to(torch.float64)
    return None


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _describe(inputs: Any) -> str:
    if isinstance(inputs, torch.Tensor):
        return f"of shape {_shape(inputs)}"
    if isinstance(inputs, Mapping):
        return "{" + ", ".join(f"{k!r}: {_shape(v)}" for k, v in inputs.items()) + "}"
    return "(" + ", ".join(str(_shape(v)) for v in inputs) + ")"


def output_error(out: Any) -> TypeError:
    """The model returned something the loss cannot take: say what, and how to pick the tensor."""
    if isinstance(out, Mapping):
        keys = list(out.keys())
        fix = f"output_fn=lambda out: out[{keys[0]!r}]" if keys else "output_fn=..."
        what = f"a {type(out).__name__} with keys {keys}"
    elif isinstance(out, (tuple, list)):
        fix = "output_fn=lambda out: out[0]"
        what = f"a {type(out).__name__} of {len(out)} elements"
    else:
        fix = "output_fn=lambda out: ..."
        what = f"a {type(out).__name__}"
    return TypeError(
        f"the model's forward returns {what}, not a tensor; tell the Objective which tensor the loss "
        f"takes with {fix} (outputs with a 'logits' attribute or key are used automatically)"
    )


def output_kind(out: Any, output_fn: Callable | None) -> str:
    """How the forward's return value becomes the loss's input: ``"tensor"``, ``"output_fn"``,
    ``"logits"`` (a key or attribute, as HuggingFace model outputs have)."""
    if output_fn is not None:
        return "output_fn"
    if isinstance(out, torch.Tensor):
        return "tensor"
    if isinstance(out, Mapping) and "logits" in out:
        return "logits"
    if isinstance(getattr(out, "logits", None), torch.Tensor):
        return "logits"
    raise output_error(out)


def pick_output(out: Any, kind: str, output_fn: Callable | None) -> torch.Tensor:
    """Apply the output rule ``kind`` (see :func:`output_kind`) to a forward's return value."""
    if kind == "output_fn":
        out = output_fn(out)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"output_fn must return a tensor, it returned a {type(out).__name__}")
    elif kind == "logits":
        out = out["logits"] if isinstance(out, Mapping) else out.logits
    if not isinstance(out, torch.Tensor):
        raise output_error(out)
    return out


# --------------------------------------------------------------------------------------------
# how inputs are passed to the forward (``input_mode``)
# --------------------------------------------------------------------------------------------
def _binds_as_keywords(model: nn.Module, keys: list[str]) -> bool:
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):  # builtins, some scripted modules: no signature
        return False
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {n for n, p in sig.parameters.items() if p.kind in kinds}
    if not all(isinstance(k, str) and k in named for k in keys):
        return False
    try:
        sig.bind(**dict.fromkeys(keys))
    except TypeError:
        return False
    return True


def resolve_input_mode(model: nn.Module, inputs: Any, input_mode: str) -> bool:
    """Whether dict inputs are passed as keyword arguments (``model(**inputs)``), decided on the first
    batch's ``inputs``: always for ``"kwargs"`` (a dict is required), never for ``"positional"``, and
    for ``"auto"`` when every key names a parameter of ``model.forward`` that can be given by keyword
    and the keys bind to its signature (``input_mode`` is checked by the constructor)."""
    is_dict = isinstance(inputs, Mapping)
    if input_mode == "kwargs" and not is_dict:
        raise TypeError(
            f"input_mode='kwargs' calls model(**inputs), but the first batch's inputs are a "
            f"{type(inputs).__name__}, not a dict of tensors; use input_mode='auto'"
        )
    if input_mode == "auto":
        return is_dict and _binds_as_keywords(model, list(inputs))
    return input_mode == "kwargs"


class InputModeError(TypeError):
    """Inputs that do not fit the forward in the way ``input_mode`` passes them; the message names
    the ``input_mode`` (or the form of the batches' inputs) that fits."""


def call_forward(model: nn.Module, params: dict, buffers: dict, inputs: Any, kwargs_inputs: bool) -> Any:
    """``functional_call`` of ``model`` on ``inputs`` (``kwargs_inputs``: a dict as ``model(**d)``).
    Inputs that do not bind to the forward's signature in the way ``input_mode`` passes them raise
    :class:`InputModeError` (a TypeError) naming the ``input_mode`` that fits (:func:`input_mode_hint`)."""
    as_kwargs = kwargs_inputs and isinstance(inputs, Mapping)
    try:
        if as_kwargs:
            return functional_call(model, (params, buffers), (), dict(inputs), tie_weights=False)
        return functional_call(model, (params, buffers), _as_args(inputs), tie_weights=False)
    except TypeError as err:
        hint = input_mode_hint(model, inputs, as_kwargs, binds_only=True)
        if hint is None:
            raise
        raise InputModeError(f"{hint} ({str(err).strip()})") from err


_P = inspect.Parameter


def input_mode_hint(model: nn.Module, inputs: Any, as_kwargs: bool, binds_only: bool = False) -> str | None:
    """Why ``inputs``, passed as ``input_mode`` passes them (``as_kwargs``: a dict as ``model(**d)``,
    else ``model(d)`` / ``model(x)`` / ``model(*x)``), do not suit ``model.forward``, naming the
    ``input_mode`` to use; None when nothing points at keyword inputs.  With ``binds_only`` only when
    the call does not bind to the forward's signature (the TypeError is the call's, not the
    forward's own); without it also, conditionally, when a forward that takes ``**kwargs`` (a
    ``forward(*args, **kwargs)`` wrapper, whose names ``"auto"`` cannot see) got positional inputs
    and failed."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):  # builtins, some scripted modules: no signature
        return None
    ps = list(sig.parameters.values())
    keywords = [p.name for p in ps if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)]
    required_kw = [p.name for p in ps if p.kind is _P.KEYWORD_ONLY and p.default is _P.empty]
    var_kw = any(p.kind is _P.VAR_KEYWORD for p in ps)
    is_dict = isinstance(inputs, Mapping)
    why = ""
    try:
        if as_kwargs:
            sig.bind(**dict(inputs))
        else:
            sig.bind(*_as_args(inputs))
    except TypeError as err:
        why = str(err)
    if not why and (binds_only or not var_kw or as_kwargs):
        return None
    shown = f"forward{sig}"
    if as_kwargs:
        return (
            f"input_mode passes the dict of inputs as model(**inputs), but its keys {list(inputs)} do not "
            f"fit {shown}; name the keys after the forward's parameters {keywords}, or pass "
            "Objective(..., input_mode='positional') to call model(inputs) with the dict as one argument"
        )
    if is_dict:
        try:
            sig.bind(**dict(inputs))
            fits = "pass"
        except TypeError:
            fits = f"name its keys after the forward's parameters {keywords} and pass"
        return (
            f"the dict of inputs was passed as one argument, model(inputs), to {shown}; if the forward "
            f"takes its keys {list(inputs)} as keyword arguments, {fits} "
            "Objective(..., input_mode='kwargs') to call model(**inputs)"
        )
    if not (required_kw or var_kw):
        return None  # a plain positional mismatch (wrong number of inputs): not about input_mode
    what = (
        "a tensor, passed as model(x)" if isinstance(inputs, torch.Tensor) else "a tuple, passed as model(*x)"
    )
    example = "{" + ", ".join(f"{n!r}: ..." for n in (keywords or ["name"])[:3]) + "}"
    named = f" {keywords}" if keywords else ""
    lead = f"{shown} takes its inputs as keyword arguments{named}" if why else f"{shown} failed"
    return (
        f"{lead} but the batches' inputs are {what}; if the forward reads keyword arguments, make "
        f"each batch's inputs a dict of tensors keyed by their names, e.g. ({example}, targets), and "
        "pass Objective(..., input_mode='kwargs') to call model(**inputs) (input_mode='auto' does so "
        "when the keys name parameters of the forward)"
    )


# --------------------------------------------------------------------------------------------
# the data scan
# --------------------------------------------------------------------------------------------
def one_shot_error(detail: str) -> TypeError:
    return TypeError(
        f"data is one-shot: {detail}. It can be iterated only once (a generator behind __iter__, a "
        "one-shot IterableDataset) or changes between passes, but every analysis iterates it many "
        "times; pass a list of batches (data = list(data)) or a DataLoader over a map-style Dataset"
    )


def _reiterable_by_contract(data: Any) -> bool:
    if isinstance(data, (list, tuple)):
        return True
    loader = torch.utils.data.DataLoader
    return isinstance(data, loader) and not isinstance(data.dataset, torch.utils.data.IterableDataset)


def _nonfinite(t: torch.Tensor) -> int:
    if not t.is_floating_point() and not t.is_complex():
        return 0
    return int((~torch.isfinite(t)).sum())


class DataScan(NamedTuple):
    """What one pass over the data found (:func:`scan_data`); the Objective stores it."""

    batch_sizes: list[int]
    issues: dict[int, str]  # batch -> what in its inputs/targets is not finite
    labels: list[tuple[int, int, int]]  # (batch, min, max) of integer targets
    first: tuple[Inputs, torch.Tensor]  # the first batch, for the validation pass


def scan_data(
    data: Any,
    device: torch.device | None,
    ignore_index: int = -100,
    record: Callable[[Any, torch.Tensor], None] | None = None,
) -> DataScan:
    """One pass over ``data``: structure, lengths, non-finite values and label ranges of every
    batch; with a ``device``, every tensor must lie on it.  ``record(inputs, targets)`` is called on
    every well-formed batch (the objective's fingerprint of the pass, ``landscape.data_fingerprint``)."""
    if isinstance(data, torch.Tensor) or not isinstance(data, Iterable):
        raise TypeError(
            "data must be one (inputs, targets) batch or a re-iterable of such batches "
            f"(list, DataLoader); got {type(data).__name__}"
        )
    if isinstance(data, Iterator):  # iter(data) would start a one-shot source's only pass
        raise one_shot_error(f"a {type(data).__name__} is its own iterator")
    sizes: list[int] = []
    issues: dict[int, str] = {}
    labels: list[tuple[int, int, int]] = []
    first = None
    for k, batch in enumerate(data_iter(data)):
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise TypeError(
                f"batch {k} is not an (inputs, targets) pair but {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else "")
                + "; each batch must be (inputs, targets)"
            )
        inputs, targets = batch
        if not _is_inputs(inputs) or not isinstance(targets, torch.Tensor):
            raise TypeError(
                f"batch {k}: inputs must be a tensor, tuple of tensors or dict of tensors and targets a "
                f"tensor; got {type(inputs).__name__} and {type(targets).__name__}"
            )
        if transform_tensors([*_tensors(inputs), targets]):
            raise TypeError(
                f"batch {k} holds tensors of a torch.func transform (batched by vmap or tracked by "
                "grad/jvp: data computed inside the transformed function). An Objective's data are "
                "constants: build the Objective outside the transform on plain tensors and transform "
                "obj.loss / obj.gradient in the parameters; for derivatives in the inputs use "
                "obj.call(obj.point(), obj.buffers(), inputs) inside the transform"
            )
        if targets.ndim == 0:
            raise ValueError(
                f"batch {k}: targets must have a batch dimension, got a 0-d tensor (a single example); "
                "give batches of examples, e.g. DataLoader(..., batch_size=32) (batch_size=None yields "
                "single examples) or a list of (inputs, targets) with inputs and targets batch-first"
            )
        if device is not None:
            for t in [*_tensors(inputs), targets]:
                if t.device != device:
                    raise ValueError(
                        f"batch {k} lies on device {t.device} but the model's parameters are on "
                        f"{device}; pass device='{t.device}' to Objective (evaluates with "
                        f"copies there) or move the model/data with .to('{t.device}')"
                    )
        n = int(targets.shape[0])
        lengths = [int(t.shape[0]) for t in _tensors(inputs) if t.ndim > 0]
        if lengths and n not in lengths:
            raise ValueError(
                f"batch {k}: the inputs hold {lengths[0]} examples (dim 0 of the inputs "
                f"{_describe(inputs)}) but the targets {n} (shape {_shape(targets)}); inputs and "
                "targets must have the same length along dimension 0 (batch-first)"
            )
        bad_x = sum(_nonfinite(t) for t in _tensors(inputs))
        bad_y = _nonfinite(targets)
        if bad_x or bad_y:
            where = [f"its inputs contain {bad_x} NaN/inf value(s)"] if bad_x else []
            where += [f"its targets contain {bad_y} NaN/inf value(s)"] if bad_y else []
            issues[k] = " and ".join(where)
        if not targets.is_floating_point() and not targets.is_complex() and targets.dtype != torch.bool:
            valid = targets[targets != ignore_index]
            if valid.numel():
                labels.append((k, int(valid.min()), int(valid.max())))
        sizes.append(n)
        if record is not None:
            record(inputs, targets)
        if first is None:
            first = (inputs, targets)
    if not sizes or sum(sizes) == 0:
        raise ValueError("data is empty: it holds no batches / no examples")
    if not _reiterable_by_contract(data) and next(data_iter(data), None) is None:
        raise one_shot_error(f"a second pass over the data yields no batch (the first gave {len(sizes)})")
    return DataScan(sizes, issues, labels, first)


def data_issue_message(k: int, issue: str, what: str = "the loss on") -> str:
    return (
        f"{what} batch {k} is not finite: {issue}; remove or repair those examples (e.g. filter them "
        "out, or torch.nan_to_num) before building the Objective"
    )


# --------------------------------------------------------------------------------------------
# parameter selection
# --------------------------------------------------------------------------------------------
def select_params(spec: Any, named: list[tuple[str, nn.Parameter]], aliases: Mapping[str, str]) -> list[str]:
    """Canonical names selected by ``spec`` (see ``Objective``); ``aliases`` maps every slot name of a
    tied parameter to its canonical name, so a tied parameter can be selected under either name."""
    all_names = [n for n, _ in named]
    every = list(dict.fromkeys([*all_names, *aliases]))

    def canon(names: Iterable[str]) -> list[str]:
        hit = {aliases.get(n, n) for n in names}
        return [n for n in all_names if n in hit]

    if spec is None:
        chosen = [n for n, p in named if p.requires_grad]
        what = "parameters requiring grad"
    elif isinstance(spec, nn.Module) or (
        isinstance(spec, (list, tuple)) and spec and all(isinstance(m, nn.Module) for m in spec)
    ):
        mods = [spec] if isinstance(spec, nn.Module) else list(spec)
        ids = {id(p) for m in mods for p in m.parameters()}
        chosen = [n for n, p in named if id(p) in ids]
        what = "the given module(s)"
    elif isinstance(spec, str) or (isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec)):
        wanted = [spec] if isinstance(spec, str) else list(spec)

        def hit(name: str, w: str) -> bool:
            return name == w or name.startswith(w + ".")

        unknown = [w for w in wanted if not any(hit(n, w) for n in every)]
        if unknown:
            raise ValueError(
                f"parameter selection {unknown} matches no parameter of the model; "
                f"available names: {all_names}"
            )
        chosen = canon(n for n in every if any(hit(n, w) for w in wanted))
        what = f"names {wanted}"
    elif callable(spec):
        chosen = canon(n for n in every if spec(n))
        what = "the callable"
    else:
        raise TypeError(
            "params must be None, a name or list of names, a module or list of modules, "
            f"or a callable name -> bool; got {type(spec).__name__}"
        )
    if not chosen:
        raise ValueError(f"the parameter selection ({what}) matches nothing; available names: {all_names}")
    return chosen
