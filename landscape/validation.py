"""Input checks of :class:`~landscape.Objective`: every bad input gets one clear error, early.

* :func:`check_arguments`, :func:`check_device`, :func:`check_model`: the plain arguments, the
  ``device=`` argument (unknown strings, CUDA/MPS that is not there) and the model (lazy modules
  whose parameters are not initialised yet).
* :func:`validate_first_batch`: after the data scan (``landscape.inputs.scan_data``: structure,
  devices, lengths, non-finite values, label ranges, one-shot sources), the model's forward and the
  loss are run once on the first batch, so that a mismatch between data, model and loss is
  reported at construction with a message naming the problem and the fix instead of a torch
  traceback later; it returns what it found out (:class:`FirstBatch`): whether the forward draws
  random numbers, writes to parameters/buffers in place, or runs BatchNorm on batch statistics.
* :func:`check_loss_finite`, :func:`check_gradient`, :func:`require_fixed`: NaN/inf losses,
  gradients, and curvature operators on data or forwards where their products would be meaningless.

The functions take values and return values (or raise); those that need the objective read it
through its public protocol (``docs/OBJECTIVE_API.md``) and set nothing on it: the
:class:`~landscape.Objective` stores what they return (this module does not import it).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parameter import is_lazy

from landscape.guard import forked_rng, rng_state
from landscape.inputs import (
    InputModeError,
    _describe,
    _map_inputs,
    _shape,
    data_issue_message,
    input_mode_hint,
    output_kind,
    pick_output,
    resolve_input_mode,
)

__all__ = [
    "check_arguments",
    "check_device",
    "check_model",
    "FirstBatch",
    "validate_first_batch",
    "require_fixed",
    "check_loss_finite",
    "check_gradient",
    "check_determinism",
]

INPUT_MODES = ("auto", "positional", "kwargs")  # how dict inputs reach the forward (landscape.inputs)
_CE = (nn.CrossEntropyLoss, nn.NLLLoss)
_CE_FN = (F.cross_entropy, F.nll_loss)
_ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCEWithLogitsLoss, nn.BCELoss)
_ELEMENTWISE_FN = (
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    F.huber_loss,
    F.binary_cross_entropy_with_logits,
    F.binary_cross_entropy,
)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}"


def loss_name(loss_fn: Any) -> str:
    if isinstance(loss_fn, nn.Module):
        return type(loss_fn).__name__
    return getattr(loss_fn, "__name__", type(loss_fn).__name__)


# --------------------------------------------------------------------------------------------
# device and model
# --------------------------------------------------------------------------------------------
def check_arguments(
    model: Any,
    loss_fn: Any,
    reduction: str,
    mode: str,
    dtype: Any,
    output_fn: Any,
    stochastic: Any,
    seed: Any,
    input_mode: Any,
) -> str:
    """The plain arguments of ``Objective``; returns the resolved ``reduction``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(outputs, targets) -> scalar tensor")
    if mode not in ("eval", "train"):
        raise ValueError(f"mode must be 'eval' or 'train', got {mode!r}")
    if reduction == "auto":
        reduction = getattr(loss_fn, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"reduction must be 'mean' or 'sum' (the loss must return a scalar), got {reduction!r}; "
            f"use a loss with reduction='mean' or 'sum' (e.g. nn.CrossEntropyLoss(reduction='mean'))"
        )
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating torch.dtype such as torch.float64, got {dtype!r}")
    if output_fn is not None and not callable(output_fn):
        raise TypeError(f"output_fn must be callable (e.g. lambda out: out[0]), got {output_fn!r}")
    if stochastic not in (None, "fixed"):
        raise ValueError(f"stochastic must be None or 'fixed', got {stochastic!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if input_mode not in INPUT_MODES:
        raise ValueError(f"input_mode must be one of {list(INPUT_MODES)}, got {input_mode!r}")
    return reduction


def check_device(device: Any) -> torch.device:
    """``torch.device(device)``, or a ValueError naming the valid forms / the missing backend."""
    if not isinstance(device, (str, torch.device, int)) or isinstance(device, bool):
        raise TypeError(
            f"device must be a string such as 'cpu' or 'cuda:0' or a torch.device, got {device!r}"
        )
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise ValueError(
            f"invalid device {device!r} ({_first_line(err)}); use 'cpu', 'cuda', 'cuda:0', 'mps' or a "
            "torch.device, or device=None to evaluate where the model is"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = "built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(
                f"device={device!r} but CUDA is not available (torch {torch.__version__}, {built}); "
                "use device='cpu' or device=None"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            n = torch.cuda.device_count()
            valid = "'cuda:0'" if n == 1 else f"'cuda:0' ... 'cuda:{n - 1}'"
            raise ValueError(f"device={device!r} but only {n} CUDA device(s) exist; use {valid}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r} but the MPS backend is not available here; use device='cpu'")
    return dev


def check_model(model: nn.Module) -> None:
    """Refuse lazy modules whose parameters/buffers are still uninitialised."""
    lazy = [n for n, p in model.named_parameters() if is_lazy(p)]
    lazy += [n for n, b in model.named_buffers() if is_lazy(b)]
    if lazy:
        raise ValueError(
            f"the model has uninitialised (lazy) parameters/buffers {lazy}: their shapes are not known "
            "yet. Run one forward pass first (e.g. model(example_inputs)) to initialise them, then "
            "build the Objective"
        )


# --------------------------------------------------------------------------------------------
# non-finite values; what curvature operators refuse
# --------------------------------------------------------------------------------------------


def require_fixed(obj: Any, issues: Mapping[int, str], what: str, per_example: bool = False) -> None:
    """Refuse a curvature operator on non-finite data (``issues``: batch -> what is not finite), or
    on a forward that is random (without ``stochastic="fixed"``) or, for per-example gradients,
    couples the examples of a batch (``obj.batch_coupled``: BatchNorm layers on batch statistics)."""
    for k, issue in issues.items():
        raise ValueError(data_issue_message(k, issue, "the data of"))
    if per_example and obj.batch_coupled:
        raise ValueError(
            f"BatchNorm layer(s) {obj.batch_coupled} run in train mode (batch statistics), which "
            f"couples the examples of a batch: per-example gradients ({what}) are not defined; use "
            "mode='eval' (running statistics)"
        )
    if obj.random_forward and (per_example or obj.stochastic != "fixed"):
        fix = (
            "use mode='eval' (per-example gradients of a random forward are not defined)"
            if per_example
            else "use mode='eval', or opt in to one fixed random mask with "
            "Objective(..., stochastic='fixed', seed=0)"
        )
        raise ValueError(
            f"the model's forward draws random numbers in mode={obj.mode!r} (dropout or other "
            f"randomness), so every {what} product would be random and eigenvalue/trace estimates "
            f"meaningless; {fix}"
        )


def check_loss_finite(
    value: torch.Tensor, k: int, full: Mapping[str, torch.Tensor] | None, issue: str | None
) -> None:
    """Refuse a non-finite loss of batch ``k`` naming why: its data (``issue``, found by the scan),
    the parameters ``full``, or an overflow."""
    if bool(torch.isfinite(value).all()):
        return
    if issue:
        raise ValueError(data_issue_message(k, issue))
    bad = [n for n, t in (full or {}).items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise ValueError(
            f"the loss on batch {k} is not finite ({float(value):g}): the parameters {bad} contain "
            "NaN/inf; evaluate at finite parameters"
        )
    raise ValueError(
        f"the loss on batch {k} is not finite ({float(value):g}); the data is finite, so the model or "
        "loss overflows there: check the model's parameters/scale, or use dtype=torch.float64"
    )


# --------------------------------------------------------------------------------------------
# the validation pass on the first batch
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _module_stack(model: nn.Module):
    """Record the chain of modules being executed: after an exception the last entry is the module
    whose forward raised, with the shapes of its tensor arguments."""
    names = {id(m): n for n, m in model.named_modules()}
    stack: list[tuple[str, nn.Module, list[list[int]]]] = []
    coupled: list[str] = []  # BatchNorm layers that ran in train mode (batch statistics)
    handles = []

    def pre(mod, args):
        stack.append((names.get(id(mod), ""), mod, [_shape(a) for a in args if isinstance(a, torch.Tensor)]))
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training:
            coupled.append(names.get(id(mod), ""))

    def post(mod, args, out):
        if stack:
            stack.pop()

    try:
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
    except Exception:  # noqa: BLE001 - e.g. scripted modules: diagnose without module names
        pass
    try:
        yield stack, coupled
    finally:
        for h in handles:
            h.remove()


def _forward_hint(
    mod: nn.Module, name: str, shapes: list[list[int]], err: BaseException, k: int
) -> str | None:
    shape = shapes[0] if shapes else None
    label = f"layer '{name}' ({type(mod).__name__})" if name else f"the model ({type(mod).__name__})"
    if isinstance(mod, nn.Linear) and shape and shape[-1] != mod.in_features:
        return (
            f"{label} expects {mod.in_features} input features (last dimension) but receives a tensor "
            f"of shape {shape} with {shape[-1]}: the data does not match the model (check the number "
            "of features, a missing flatten/reshape, or the layer's in_features)"
        )
    if isinstance(mod, nn.modules.conv._ConvNd) and shape and len(shape) > 1 and shape[1] != mod.in_channels:
        return (
            f"{label} expects {mod.in_channels} input channels (dimension 1) but receives a tensor of "
            f"shape {shape}: check the channel layout of the data (channels first, [B, C, ...])"
        )
    if isinstance(mod, nn.modules.batchnorm._BatchNorm) and "more than 1 value per channel" in str(err):
        return batch_of_one_message(name, k)
    if isinstance(mod, nn.Embedding):
        return (
            f"{label} has {mod.num_embeddings} entries; its input must hold integer indices in "
            f"[0, {mod.num_embeddings}) ({_first_line(err)})"
        )
    return None


def batch_of_one_message(bn_name: str, k: int) -> str:
    return (
        f"BatchNorm layer '{bn_name}' in train mode needs more than one value per channel, but batch "
        f"{k} holds a single example; use mode='eval', larger batches, or drop the batch of one "
        "(DataLoader(..., drop_last=True))"
    )


def _classification(loss_fn: Any) -> bool:
    """Cross-entropy / NLL (module, function or ``functools.partial`` of one): class-index targets.
    Other losses are not second-guessed (integer targets may mean anything to them)."""
    lf = getattr(loss_fn, "func", loss_fn)
    return isinstance(lf, _CE) or any(lf is f for f in _CE_FN)


def _check_targets(
    loss_fn: Any, labels: Sequence[tuple[int, int, int]], out: torch.Tensor, y: torch.Tensor
) -> None:
    """Label ranges (``labels``: batch, min, max of every batch's integer targets) and shapes that
    would silently broadcast or fail deep inside the loss."""
    lf, name = loss_fn, loss_name(loss_fn)
    if out.is_floating_point() and _classification(loss_fn) and out.ndim >= 2:
        C = int(out.shape[1])
        if not y.is_floating_point():
            want = [int(out.shape[0]), *out.shape[2:]]
            if _shape(y) != want:
                raise ValueError(
                    f"class-label targets for outputs of shape {_shape(out)} must have shape {want}, got "
                    f"{_shape(y)}: use y.view(-1) / y.squeeze(1) (one integer label per example)"
                )
            for k, lo, hi in labels:
                if lo < 0 or hi >= C:
                    bad = hi if hi >= C else lo
                    raise ValueError(
                        f"the targets of batch {k} contain class label {bad} but the model outputs {C} "
                        f"classes (outputs of shape {_shape(out)}); labels must lie in [0, {C}): check "
                        "the number of output units or the labels"
                    )
        elif y.ndim == out.ndim - 1:
            raise ValueError(
                f"{name} got floating targets of shape {_shape(y)} for outputs of shape {_shape(out)}: "
                "class labels must be an integer tensor (y.long()); floating targets must be class "
                f"probabilities of shape {_shape(out)}"
            )
    lf = getattr(lf, "func", lf)
    if (isinstance(lf, _ELEMENTWISE) or any(lf is f for f in _ELEMENTWISE_FN)) and _shape(out) != _shape(y):
        try:
            b = list(torch.broadcast_shapes(out.shape, y.shape))
            how = f"broadcast them to {b} and compare every output with every target"
        except RuntimeError:
            how = "fail on them"
        raise ValueError(
            f"the model's outputs have shape {_shape(out)} but the targets {_shape(y)}: {name} would {how}; "
            "give them the same shape (e.g. y.view_as(outputs) / y.unsqueeze(1), or "
            "output_fn=lambda out: out.squeeze(-1))"
        )


def _check_loss_value(loss_fn: Any, loss: Any, out: torch.Tensor) -> None:
    name = loss_name(loss_fn)
    if not isinstance(loss, torch.Tensor):
        raise TypeError(
            f"loss_fn returned a {type(loss).__name__}, not a tensor: compute the loss with torch "
            "operations (no .item()/numpy) so that it can be differentiated"
        )
    if loss.ndim != 0:
        per = "one value per example, e.g. reduction='none'" if loss.numel() > 1 else "not a 0-d scalar"
        raise ValueError(
            f"loss_fn ({name}) returned a tensor of shape {_shape(loss)} ({per}); it must return a "
            "scalar: use reduction='mean' (or 'sum'), or wrap it, e.g. "
            "loss_fn=lambda out, y: my_loss(out, y).mean()"
        )
    if out.requires_grad and not loss.requires_grad:
        raise ValueError(
            f"loss_fn ({name}) returns a value that does not depend differentiably on the model's "
            "outputs (detached, computed via .item()/numpy, or under torch.no_grad): gradients and "
            "curvature would be zero; compute it with differentiable torch operations"
        )


_TORCH_DIR = os.path.dirname(torch.__file__)


def _from_torch(err: BaseException) -> bool:
    """Whether ``err`` was raised inside torch (a mismatch torch detected) rather than by the
    caller's own code (an error of theirs that every evaluation will raise as they wrote it)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_TORCH_DIR)


class FirstBatch(NamedTuple):
    """What the validation pass found out about the forward (:func:`validate_first_batch`)."""

    random_forward: bool  # the forward (or the loss) draws random numbers
    mutated: set[str]  # parameters/buffers the forward writes to in place
    batch_coupled: list[str]  # BatchNorm layers that ran on batch statistics
    output_kind: str  # how the forward's return value becomes the loss's input (inputs.output_kind)


def validate_first_batch(
    obj: Any,
    forward: Callable[[dict, dict, Any], Any],
    inputs: Any,
    targets: torch.Tensor,
    labels: Sequence[tuple[int, int, int]],
) -> FirstBatch:
    """Run the model and the loss once on the first batch (on copies, in the objective's mode) and
    turn any mismatch into a clear error.  ``obj`` is read through its public protocol only
    (``convert``, ``point``, ``buffers``, ``evaluating``, ...); ``forward(params, buffers, inputs)``
    is its raw functional call (before the output rule); ``labels`` the scan's integer label
    ranges.  Returns what it found; sets nothing."""
    x = _map_inputs(inputs, obj.convert)
    y = obj.convert(targets)
    full = obj.point(None, copy=True)
    for n in obj.param_names:
        full[n] = full[n].detach().requires_grad_(True)
    bufs = obj.buffers()
    versions = {n: t._version for n, t in [*full.items(), *bufs.items()]}
    with obj.evaluating(), forked_rng(obj.device), torch.enable_grad():
        before = rng_state(obj.device)
        with _module_stack(obj.model) as (stack, coupled):
            try:
                raw = forward(full, bufs, x)
            except InputModeError as err:  # the inputs do not bind: the message names input_mode
                raise InputModeError(
                    f"the model's forward failed on the first batch (inputs {_describe(x)}): {err}"
                ) from err
            except Exception as err:  # noqa: BLE001 - any failure gets the data/model context
                name, mod, shapes = stack[-1] if stack else ("", obj.model, [])
                hint = _forward_hint(mod, name, shapes, err, 0)
                kind = TypeError if isinstance(err, TypeError) and hint is None else ValueError
                if hint is None:  # a forward(*args, **kwargs) that wanted keyword inputs?
                    as_kwargs = resolve_input_mode(obj.model, inputs, obj.input_mode)
                    mode_hint = input_mode_hint(obj.model, inputs, as_kwargs)
                    hint = mode_hint and f"{_first_line(err)}; {mode_hint}"
                where = f" in module '{name}' ({type(mod).__name__})" if name and hint is None else ""
                raise kind(
                    f"the model's forward failed on the first batch (inputs {_describe(x)}){where}: "
                    + (hint or f"{_first_line(err)}; check that the inputs match what the model expects")
                ) from err
        # tensors the forward writes to in place (BatchNorm statistics in train mode, a forward that
        # mutates a parameter): every later forward gets private clones of them
        mutated = {n for n, t in [*full.items(), *bufs.items()] if t._version != versions[n]}
        kind = output_kind(raw, obj.output_fn)
        found = FirstBatch(_rng_moved(before, obj.device), mutated, sorted(set(coupled)), kind)
        out = pick_output(raw, kind, obj.output_fn)
        _check_targets(obj.loss_fn, labels, out, y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                loss = obj.loss_fn(out, y)
            except Exception as err:  # noqa: BLE001
                if not _from_torch(err):
                    return found  # the loss's own error: every evaluation raises it as written
                kind = TypeError if isinstance(err, TypeError) else ValueError
                raise kind(
                    f"loss_fn ({loss_name(obj.loss_fn)}) failed on the first batch with outputs of shape "
                    f"{_shape(out)} ({out.dtype}) and targets of shape {_shape(y)} ({y.dtype}): "
                    f"{_first_line(err)}; check that the targets match the loss and the model's outputs"
                ) from err
        for w in caught:
            text = str(w.message)
            if "target size" in text or "broadcast" in text:
                raise ValueError(
                    f"loss_fn ({loss_name(obj.loss_fn)}) warns on the first batch: {text.strip()} -- the "
                    f"outputs {_shape(out)} and targets {_shape(y)} would be broadcast silently; give them "
                    "the same shape"
                )
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        _check_loss_value(obj.loss_fn, loss, out)
        found = found._replace(random_forward=_rng_moved(before, obj.device))  # the loss too
    _check_batch_of_one(obj, forward, x)
    return found


def _rng_moved(before: list[torch.Tensor], device: torch.device) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, rng_state(device)))


def _check_batch_of_one(obj: Any, forward: Callable[[dict, dict, Any], Any], x: Any) -> None:
    """In train mode, a batch of one example fails in BatchNorm layers that see one value per
    channel (e.g. ``BatchNorm1d`` after a ``Linear``): find out on one example of the first batch."""
    if obj.mode != "train" or 1 not in obj.batch_sizes or obj.batch_sizes[0] == 1:
        return
    bns = [n for n, m in obj.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    k = obj.batch_sizes.index(1)
    one = _map_inputs(x, lambda t: t[:1] if t.ndim > 0 else t)
    with obj.evaluating(), forked_rng(obj.device), torch.no_grad(), _module_stack(obj.model) as (stack, _):
        try:
            forward(obj.point(None, copy=True), obj.buffers(), one)
        except ValueError as err:
            if "more than 1 value per channel" not in str(err):
                raise
            name = stack[-1][0] if stack else bns[0]
            raise ValueError(batch_of_one_message(name, k)) from err


def check_gradient(
    names: Sequence[str], grads: Sequence[torch.Tensor | None], k: int, loss: torch.Tensor
) -> None:
    """Name the parameters whose gradient on batch ``k`` is not finite (the loss is)."""
    bad = [n for n, g in zip(names, grads) if g is not None and not bool(torch.isfinite(g).all())]
    if bad:
        raise ValueError(
            f"the gradient with respect to parameter(s) {bad} is not finite on batch {k} although the "
            f"loss is ({float(loss.detach()):g}): the model's backward produces NaN/inf there (e.g. "
            "sqrt, norm or pow at 0, log of 0, overflow in float32); check the model at this point or "
            "use dtype=torch.float64"
        )


def check_determinism(obj: Any, rtol: float = 1e-6) -> bool:
    """Evaluate every batch loss twice; warn (and return False) if the two passes disagree."""

    def one_pass():
        with obj.guard(), torch.no_grad():
            full = obj.point(None)
            return [
                (len(y), float(obj.batch_loss(full, obj.buffers(), x, y, w))) for x, y, w in obj.batches()
            ]

    a, b = one_pass(), one_pass()
    same = len(a) == len(b) and all(
        na == nb and abs(la - lb) <= rtol * max(abs(la), abs(lb), 1e-30) for (na, la), (nb, lb) in zip(a, b)
    )
    if not same:
        warnings.warn(
            "Objective: two passes over the data gave different losses; the objective is not a "
            "deterministic function of the parameters. Typical cause: dropout (mode='train'; pass "
            "stochastic='fixed') or another random forward (data that changes between passes is "
            "refused before this check). Curvature estimates will be noisy/inconsistent.",
            UserWarning,
            stacklevel=4,
        )
    return same
