"""``Objective``: a model, a loss and a data set seen as a function of (a subset of) the parameters.

The whole-dataset loss over batches ``B_1..B_K`` of ``N`` examples is

.. math::  L(\\theta) = \\sum_k w_k \\, \\ell(f(X_k; \\theta), y_k), \\qquad
           w_k = |B_k| / N \\ \\text{(mean-reduced } \\ell) \\quad \\text{or} \\quad w_k = 1 \\ \\text{(sum)},

so every quantity derived from it (loss, gradient, Hessian, ...) is independent of how the data is
batched (PyHessian weights batches the same way; hessian-eigenthings' equal weights are biased for
uneven batches).  Evaluation always goes through :func:`torch.func.functional_call` with parameter
and buffer *copies*, so the caller's model is never written to; :meth:`Objective.guard` additionally
snapshots and restores parameters, buffers, ``.grad``, train/eval flags and parameter identity
bit-exactly.  Tied parameters (one module used under two names, an embedding tied to the output
layer) are one parameter under their ``named_parameters()`` name; the functional call fills every
slot that holds them (``landscape.guard.tensor_slots``), so the Hessian of a tied model is the one
with respect to the shared tensor.  Bad inputs are caught at construction: the data scan
(``landscape.inputs.scan_data``) and the validation pass on the first batch
(``landscape.validation``) return what they found, and the constructor stores it: every attribute
of an Objective is assigned in this module.  Other modules use its public protocol, documented in
``docs/OBJECTIVE_API.md``, never its private members (``tests/test_objective_protocol.py``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from landscape import _objective_func as OF
from landscape import validation as V
from landscape._transforms import data_iter, outside_transforms
from landscape.data_fingerprint import DataFingerprint
from landscape.guard import forked_rng, model_guard, tensor_slots
from landscape.inputs import (
    Inputs,
    _is_single_batch,
    _map_inputs,
    _num_correct,
    call_forward,
    one_shot_error,
    pick_output,
    resolve_input_mode,
    scan_data,
    select_params,
)

__all__ = ["Objective"]

_END = object()  # the end of a pass over the data
ParamSelection = None | str | Sequence[str] | nn.Module | Sequence[nn.Module] | Callable[[str], bool]


# --------------------------------------------------------------------------------------------
# Objective
# --------------------------------------------------------------------------------------------
class Objective:
    """Model + loss + data as a function of the selected parameters.

    Args:
        model: any ``nn.Module``; it is never modified (evaluation uses ``functional_call``).
        loss_fn: ``loss_fn(outputs, targets) -> scalar``, mean- or sum-reduced.
        data: one ``(inputs, targets)`` batch or a re-iterable of batches (list, DataLoader);
            ``inputs`` is a tensor, a tuple of tensors (positional arguments) or a dict of tensors
            (see ``input_mode``).  Inputs and targets are batch-first.  Every pass must yield the
            same examples in the same order (``landscape.data_fingerprint``): shuffle=False, no augmentation.
        params: ``None`` (all parameters that require grad), a name or list of names (a name may
            also be a module prefix such as ``"fc1"``, or another name of a tied parameter), a module
            or list of modules of ``model``, or a callable ``name -> bool``.
        reduction: ``"auto"`` (``loss_fn.reduction`` if present, else ``"mean"``), ``"mean"`` or ``"sum"``.
        mode: ``"eval"`` (default) or ``"train"``: the mode the model is put in during evaluations
            (restored afterwards; BatchNorm statistics are updated in copies only).
        dtype, device: evaluate with parameter/buffer copies converted to these (``None``: the
            model's own).  With ``device=None`` data on another device than the model is an error.
        check_determinism: evaluate the loss twice at construction and warn if the passes disagree.
        progress: show a tqdm bar over batches in long evaluations.
        output_fn: turns the forward's return value into the tensor the loss takes (e.g.
            ``lambda out: out[0]`` for a model returning a tuple).  ``None``: a tensor is used as is,
            and an output with a ``logits`` key or attribute (HuggingFace) gives its ``logits``.
        stochastic: ``None`` or ``"fixed"``.  A forward that draws random numbers (dropout in
            ``mode="train"``, MC dropout) makes every curvature product random, so the curvature
            operators refuse it; ``"fixed"`` re-seeds a fork of the global RNG with ``seed`` before
            every forward, making the objective a deterministic function (one fixed dropout mask per
            batch shape) whose products are reproducible.  The caller's RNG is not advanced.
        seed: the seed of ``stochastic="fixed"``.
        input_mode: how dict inputs are passed: ``"positional"`` as one argument ``model(d)``,
            ``"kwargs"`` as ``model(**d)`` (HuggingFace style), ``"auto"`` (default) as keywords when
            every key names a parameter of ``model.forward``, else as one argument
            (``docs/OBJECTIVE_API.md``).  Tensors and tuples are passed positionally.
            ``loss``/``gradient`` are differentiable in the parameters passed (``torch.func``).

    Raises:
        TypeError: at construction, for inputs of the wrong kind, with a message naming the fix.
        ValueError: at construction, for bad values (see ``landscape.validation``; the model and
            loss are run once on the first batch), with a message naming the fix.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        data: Any,
        *,
        params: ParamSelection = None,
        reduction: str = "auto",
        mode: str = "eval",
        dtype: torch.dtype | None = None,
        device: str | torch.device | None = None,
        check_determinism: bool = False,
        progress: bool = False,
        output_fn: Callable[[Any], torch.Tensor] | None = None,
        stochastic: str | None = None,
        seed: int = 0,
        input_mode: str = "auto",
    ) -> None:
        reduction = V.check_arguments(
            model, loss_fn, reduction, mode, dtype, output_fn, stochastic, seed, input_mode
        )
        V.check_model(model)
        self.model = model
        self.loss_fn = loss_fn
        self.reduction = reduction
        self.mode = mode
        self.progress = progress
        self.output_fn = output_fn
        self.stochastic = stochastic
        self.seed = seed
        self.input_mode = input_mode
        self._param_spec = params

        named = list(model.named_parameters())
        # the module tree is fixed from here on (used by the mode switch and the guard)
        self._modules = list(model.modules())
        self._all_param_objs = [p for _, p in named]
        if not named:
            raise ValueError("the model has no parameters")
        # every (module, attribute) slot holding a parameter/buffer, named -> canonical name
        pslots, bslots = tensor_slots(model, "parameters"), tensor_slots(model, "buffers")
        canon = {id(p): n for n, p in named}
        self._param_alias = {
            n: canon[id(p)] for n, p in model.named_parameters(remove_duplicate=False) if n != canon[id(p)]
        }
        self._pslots = pslots if any(s != c for s, c in pslots.items()) else None
        self._bslots = bslots if any(s != c for s, c in bslots.items()) else None
        model_devices = {p.device for _, p in named}
        if device is None and len(model_devices) > 1:
            raise ValueError(
                f"the model's parameters lie on several devices {sorted(map(str, model_devices))}; "
                "pass device=... to evaluate with copies on one device"
            )
        self._explicit_device = device is not None
        self.device = V.check_device(device) if device is not None else named[0][1].device
        self.dtype = dtype if dtype is not None else named[0][1].dtype
        self.param_names = select_params(params, named, self._param_alias)
        shapes = dict(named)
        self.param_shapes = [shapes[n].shape for n in self.param_names]
        self.param_numels = [int(math.prod(s)) for s in self.param_shapes]
        self.num_params = int(sum(self.param_numels))

        self.data = [tuple(data)] if _is_single_batch(data) else data
        self.fingerprint = DataFingerprint()  # recorded by the scan, checked by every pass of batches()
        # built inside a transform, the scan and the validation pass still run eagerly on plain
        # tensors: what they keep must not be a wrapped tensor of a level that ends with the call
        with outside_transforms():
            scan = scan_data(
                self.data,
                None if self._explicit_device else self.device,
                getattr(loss_fn, "ignore_index", -100),
                self.fingerprint.record,
            )
            self.batch_sizes: list[int] = scan.batch_sizes
            self.local_num_examples = sum(scan.batch_sizes)
            self._data_issues = scan.issues  # batch -> what is not finite, reported when evaluated
            # N, over every data-parallel rank (all_reduce is the identity on one process)
            count = torch.tensor([self.local_num_examples], dtype=torch.int64)
            self.num_examples = int(self.all_reduce(count).item())
            self._kwargs_inputs = resolve_input_mode(model, scan.first[0], input_mode)
            found = V.validate_first_batch(self, self._forward, *scan.first, scan.labels)
        self.random_forward = found.random_forward
        self.batch_coupled = found.batch_coupled
        self._mutated = found.mutated
        self._output_kind = found.output_kind
        if check_determinism:
            self.check_determinism()

    @property
    def fixed_rng(self) -> bool:
        """True when every forward re-seeds a forked RNG (``stochastic="fixed"`` on a random forward)."""
        return self.stochastic == "fixed" and self.random_forward

    def _weight(self, size: int) -> float:
        return size / self.num_examples if self.reduction == "mean" else 1.0

    def convert(self, t: torch.Tensor, cast: bool = True) -> torch.Tensor:
        """``t`` on the objective's device (and, if floating and ``cast``, its dtype)."""
        if cast and t.is_floating_point():
            return t.to(device=self.device, dtype=self.dtype)
        return t.to(device=self.device)

    def batches(self) -> Iterator[tuple[Inputs, torch.Tensor, float]]:
        """Yield ``(inputs, targets, weight)`` on the objective's device/dtype (float targets cast).

        Raises TypeError at the end of a pass with another number of examples than the scan, and
        ``DataChangedError`` at a batch that differs from it (one-shot, shuffled or changing data).
        Inside a ``torch.func`` transform the data is still read outside it (the yielded tensors are
        plain constants of the transformed function)."""
        it = self.data
        if self.progress:
            from tqdm.auto import tqdm  # here: an optional dependency, only for progress=True

            it = tqdm(it, total=len(self.batch_sizes), desc="batches", leave=False)
        seen, k = 0, 0
        # the data is constant: iterating it (a DataLoader draws a seed per pass), fingerprinting and
        # converting it run outside any torch.func transform (landscape._transforms), plain eager
        it = data_iter(it)  # the caller's RNG kept (the loader's base seed is drawn from a fork)
        while True:
            with outside_transforms():
                batch = next(it, _END)
                if batch is _END:
                    break
                inputs, targets = batch
                self.fingerprint.check(k, inputs, targets, self.data)
                n = int(targets.shape[0])
                out = (_map_inputs(inputs, self.convert), self.convert(targets), self._weight(n))
            seen, k = seen + n, k + 1
            yield out
        if seen != self.local_num_examples:
            raise one_shot_error(
                f"this pass over the data saw {seen} examples but the Objective was built on "
                f"{self.local_num_examples}"
            )

    # ------------------------------------------------------------------ parameters
    def _all_current(self, copy: bool = False) -> dict[str, torch.Tensor]:
        """All parameters (selected and frozen), detached, on dtype/device; they alias the model's
        tensors where no conversion was needed unless ``copy``."""
        out = {}
        for n, p in self.model.named_parameters():
            d = p.detach()
            t = self.convert(d)
            out[n] = t.clone() if copy and t is d else t  # .to() returns self when nothing changes
        return out

    def all_params(self) -> dict[str, torch.Tensor]:
        """Copies of all parameters (selected and frozen) in the objective's dtype/device."""
        return {n: t.clone() for n, t in self._all_current().items()}

    def params(self) -> dict[str, torch.Tensor]:
        """Detached copies of the selected parameters (objective dtype/device)."""
        cur = self._all_current()
        return {n: cur[n].clone() for n in self.param_names}

    def buffers(self) -> dict[str, torch.Tensor]:
        """Copies of the model's buffers (floating ones converted to the objective dtype)."""
        return {n: self.convert(b.detach()).clone() for n, b in self.model.named_buffers()}

    def flat_params(self) -> torch.Tensor:
        """The selected parameters as one flat ``[p]`` vector (a copy)."""
        return self.flatten(self.params())

    def flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Concatenate a dict ``name -> tensor`` over ``param_names`` into a ``[p]`` vector."""
        missing = [n for n in self.param_names if n not in tensors]
        if missing:
            raise ValueError(f"flatten: missing entries {missing}; expected names {self.param_names}")
        return torch.cat([tensors[n].reshape(-1) for n in self.param_names])

    def unflatten(self, vec: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a ``[p]`` vector (or ``[p, k]`` block, giving ``[*shape, k]``) into a dict of views."""
        if not isinstance(vec, torch.Tensor):
            raise TypeError(f"expected a tensor of shape [{self.num_params}], got {type(vec).__name__}")
        if vec.ndim not in (1, 2) or vec.shape[0] != self.num_params:
            raise ValueError(
                f"vector has shape {tuple(vec.shape)} but the objective has {self.num_params} selected "
                f"parameters: expected [{self.num_params}] (or [{self.num_params}, k])"
            )
        out, offset = {}, 0
        extra = tuple(vec.shape[1:])
        for n, shape, numel in zip(self.param_names, self.param_shapes, self.param_numels):
            out[n] = vec[offset : offset + numel].reshape(*shape, *extra)
            offset += numel
        return out

    def point(self, params: Any = None, copy: bool = False) -> dict[str, torch.Tensor]:
        """The point: the full parameter dict (selected and frozen), current values overridden by
        ``params`` (dict subset or flat vector); with ``copy`` no entry aliases the model's tensors."""
        full = self._all_current(copy)
        if params is None:
            return full
        if isinstance(params, torch.Tensor):
            if params.ndim != 1:
                raise ValueError(
                    f"a flat parameter vector must be 1-D of size {self.num_params}, got shape "
                    f"{tuple(params.shape)}"
                )
            params = self.unflatten(params)
        if not isinstance(params, Mapping):
            raise TypeError("params must be None, a dict name -> tensor or a flat [p] tensor")
        unknown = [n for n in params if self._param_alias.get(n, n) not in full]
        if unknown:
            raise ValueError(f"unknown parameter names {unknown}; available names: {list(full)}")
        for n, t in params.items():
            n = self._param_alias.get(n, n)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"parameter {n!r} must be a tensor, got {type(t).__name__}")
            if tuple(t.shape) != tuple(full[n].shape):
                raise ValueError(
                    f"parameter {n!r} has shape {tuple(t.shape)}, expected {tuple(full[n].shape)}"
                )
            full[n] = (
                t if (t.dtype == self.dtype and t.device == self.device) else t.to(self.device, self.dtype)
            )
        return full

    # ------------------------------------------------------------------ evaluation
    def _forward(self, full_params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], inputs):
        """The raw ``functional_call`` (before the output rule): every parameter/buffer slot filled
        exactly once (tied slots with their canonical tensor; torch's ``tie_weights`` would restore a
        module registered under two names with the copy), nothing of the model's own tensors touched."""
        ps = full_params if self._pslots is None else {s: full_params[c] for s, c in self._pslots.items()}
        bs = buffers if self._bslots is None else {s: buffers[c] for s, c in self._bslots.items()}
        return call_forward(self.model, dict(ps), dict(bs), inputs, self._kwargs_inputs)

    def call(self, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], inputs: Inputs):
        """Outputs for explicit parameter and buffer dicts (canonical names; every parameter and
        buffer must be given, e.g. ``obj.point(...)`` and ``obj.buffers()``): the functional call every
        evaluation of the objective uses (tied slots, ``output_fn``, ``stochastic="fixed"``'s
        re-seeded RNG), for operators and evaluators that manage their own copies."""
        if self._mutated:  # written to in place by the forward: clones (torch.func refuses captures)
            params = {n: t.clone() if n in self._mutated else t for n, t in params.items()}
            buffers = {n: t.clone() if n in self._mutated else t for n, t in buffers.items()}
        if self.fixed_rng:
            with forked_rng(self.device, self.seed):
                return pick_output(self._forward(params, buffers, inputs), self._output_kind, self.output_fn)
        return pick_output(self._forward(params, buffers, inputs), self._output_kind, self.output_fn)

    def forward(self, params: Any = None, inputs: Inputs | None = None) -> torch.Tensor:
        """Model outputs at ``params`` (missing names: copies of the current values) on ``inputs``."""
        if inputs is None:
            raise ValueError("forward needs inputs (a tensor, tuple or dict of tensors)")
        with self.evaluating():
            full = self.point(params, copy=True)
            return self.call(full, self.buffers(), _map_inputs(inputs, self.convert))

    def batch_loss(self, full_params, buffers, inputs, targets, weight):
        """One batch's weighted loss ``w_k l(f(X_k), y_k)`` from explicit parameter/buffer dicts."""
        return weight * self.loss_fn(self.call(full_params, buffers, inputs), targets)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over data-parallel ranks (identity here; a subclass that distributes the data, such as
        ``landscape.distributed.DistributedObjective``, overrides it)."""
        return t

    def require_fixed(self, what: str, per_example: bool = False) -> None:
        """Refuse to build curvature operators on non-finite data or a random forward."""
        V.require_fixed(self, self._data_issues, what, per_example)

    def _differentiable(self, what: str) -> None:
        if type(self).all_reduce is not Objective.all_reduce:  # a sum across ranks detaches
            raise OF.not_differentiable(type(self).__name__, what)

    def loss(self, params: Any = None) -> torch.Tensor:
        """Whole-dataset loss ``sum_k w_k loss_fn(f(X_k), y_k)`` (a 0-d tensor).  No graph is kept,
        except under ``torch.func`` transforms or for parameters that require grad: then it is a
        differentiable function of ``params`` (``docs/OBJECTIVE_API.md``)."""
        if OF.tracked(params):
            self._differentiable("loss")
            return OF.loss(self, params, self._data_issues)
        with torch.no_grad():
            return self.all_reduce(OF.loss(self, params, self._data_issues))

    def loss_and_gradient(self, params: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole-dataset loss and its gradient ``[p]`` w.r.t. the selected parameters (differentiable
        in ``params`` as :meth:`loss` is)."""
        if OF.tracked(params):
            self._differentiable("gradient")
            return OF.loss_and_gradient(self, params, self._data_issues)
        with self.guard():
            full = self.point(params)
            leaves = {n: full[n].detach().requires_grad_(True) for n in self.param_names}
            full.update(leaves)
            bufs = self.buffers()
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            grad = torch.zeros(self.num_params, dtype=self.dtype, device=self.device)
            names = self.param_names
            for k, (x, y, w) in enumerate(self.batches()):
                with torch.enable_grad():
                    lk = self.batch_loss(full, bufs, x, y, w)
                V.check_loss_finite(lk, k, full, self._data_issues.get(k))
                gs = torch.autograd.grad(lk, [leaves[n] for n in names], allow_unused=True)
                V.check_gradient(names, gs, k, lk)
                grad += torch.cat(
                    [
                        (g if g is not None else torch.zeros_like(leaves[n])).reshape(-1)
                        for n, g in zip(names, gs)
                    ]
                )
                total = total + lk.detach()
            return self.all_reduce(total), self.all_reduce(grad)

    def gradient(self, params: Any = None) -> torch.Tensor:
        """Gradient ``[p]`` of the whole-dataset loss w.r.t. the selected parameters."""
        return self.loss_and_gradient(params)[1]

    def evaluate(self, params: Any = None) -> dict[str, float | None]:
        """``dict(loss=..., accuracy=...)``; accuracy for class-label or 0/1 targets, else ``None``."""
        OF.refuse_transform("evaluate", "it returns Python floats; use obj.loss(params)")
        with self.guard(), torch.no_grad():
            full, bufs = self.point(params), self.buffers()
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            correct = torch.zeros((), dtype=torch.float64, device=self.device)
            classify = True
            for k, (x, y, w) in enumerate(self.batches()):
                out = self.call(full, bufs, x)
                lk = w * self.loss_fn(out, y)
                V.check_loss_finite(lk, k, full, self._data_issues.get(k))
                total = total + lk
                c = _num_correct(out, y) if classify else None
                if c is None:
                    classify = False
                else:
                    correct = correct + c
            # always the same collectives on every rank (see landscape.distributed)
            total = self.all_reduce(total)
            stats = self.all_reduce(
                torch.stack(
                    [correct, torch.tensor(0.0 if classify else 1.0, device=self.device, dtype=torch.float64)]
                )
            )
            acc = float(stats[0]) / self.num_examples if float(stats[1]) == 0.0 else None
            return {"loss": float(total), "accuracy": acc}

    def check_determinism(self, rtol: float = 1e-6) -> bool:
        """Evaluate every batch loss twice; warn (and return False) if the two passes disagree."""
        return V.check_determinism(self, rtol)

    # ------------------------------------------------------------------ variants
    def settings(self) -> dict[str, Any]:
        """The keyword arguments this objective was built with (``check_determinism`` off): with the
        model, the loss and data they build an equal objective (see :meth:`like`)."""
        return dict(
            params=self._param_spec,
            reduction=self.reduction,
            mode=self.mode,
            dtype=self.dtype,
            device=self.device if self._explicit_device else None,
            check_determinism=False,
            progress=self.progress,
            output_fn=self.output_fn,
            stochastic=self.stochastic,
            seed=self.seed,
            input_mode=self.input_mode,
        )

    def subset(self, params: ParamSelection) -> Objective:
        """Same model/data/settings, another parameter selection."""
        return self.like(self.data, params)

    def with_data(self, data: Any) -> Objective:
        """Same model/settings/selection, other data."""
        return self.like(data, list(self.param_names))

    def like(self, data: Any, params: ParamSelection) -> Objective:
        """A plain :class:`Objective` with this one's model, loss and :meth:`settings` on ``data`` and
        the parameter selection ``params`` (a subclass that needs its own kind overrides it)."""
        return Objective(self.model, self.loss_fn, data, **{**self.settings(), "params": params})

    def config(self) -> dict[str, Any]:
        """JSON-friendly description recorded in results."""
        output = self._output_kind
        if output == "output_fn":
            output = "output_fn:" + getattr(self.output_fn, "__name__", type(self.output_fn).__name__)
        return {
            "model": type(self.model).__name__,
            "loss": V.loss_name(self.loss_fn),
            "num_params": self.num_params,
            "param_names": list(self.param_names),
            "num_examples": self.num_examples,
            "num_batches": len(self.batch_sizes),
            "batch_sizes": list(self.batch_sizes) if len(self.batch_sizes) <= 64 else "many",
            "reduction": self.reduction,
            "mode": self.mode,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            "output": output,
            "random_forward": self.random_forward,
            "stochastic": self.stochastic,
            "seed": self.seed if self.stochastic == "fixed" else None,
            "input_mode": "kwargs" if self._kwargs_inputs else "positional",
        }

    def __repr__(self) -> str:
        return (
            f"Objective({type(self.model).__name__}, p={self.num_params}, N={self.num_examples}, "
            f"batches={len(self.batch_sizes)}, reduction={self.reduction!r}, mode={self.mode!r}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    # ------------------------------------------------------------------ model safety
    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Put every module in the objective's mode; restore every module's own flag afterwards
        (also those the forward itself switched, e.g. MC dropout's ``self.drop.train()``)."""
        want = self.mode == "train"
        flags = [m.training for m in self._modules]
        try:
            for m, f in zip(self._modules, flags):
                if f != want:
                    m.training = want
            yield
        finally:
            for m, f in zip(self._modules, flags):
                if m.training != f:
                    m.training = f

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Snapshot parameters, buffers, ``.grad``, ``requires_grad``, modes and the tensor objects in
        every module slot; restore bit-exactly, also when the body raises
        (:func:`landscape.guard.model_guard`); the model is additionally put into the objective's
        mode for the duration of the block."""
        with model_guard(self.model, self._all_param_objs, self._modules), self.evaluating():
            yield
