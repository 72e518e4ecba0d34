"""``Objective``: a model, a loss and a data set seen as a function of (a subset of) the parameters.

The whole-dataset loss over batches ``B_1..B_K`` of ``N`` examples is

.. math::  L(\\theta) = \\sum_k w_k \\, \\ell(f(X_k; \\theta), y_k), \\qquad
           w_k = |B_k| / N \\ \\text{(mean-reduced } \\ell) \\quad \\text{or} \\quad w_k = 1 \\ \\text{(sum)},

so every quantity derived from it (loss, gradient, Hessian, ...) is independent of how the data is
batched (PyHessian weights batches the same way; hessian-eigenthings' equal weights are biased for
uneven batches).  Evaluation always goes through :func:`torch.func.functional_call` with parameter
and buffer *copies*, so the caller's model is never written to; :meth:`Objective.guard` additionally
snapshots and restores parameters, buffers, ``.grad`` and train/eval flags bit-exactly.

The contract (other modules rely on it) is documented in ``docs/OBJECTIVE_API.md``.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from landscape.guard import model_guard
from landscape.inputs import (
    Inputs,
    _as_args,
    _is_inputs,
    _is_single_batch,
    _map_inputs,
    _num_correct,
    _tensors,
)

__all__ = ["Objective"]

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
            (passed as one argument).
        params: ``None`` (all parameters that require grad), a name or list of names (a name may
            also be a module prefix such as ``"fc1"``), a module or list of modules of ``model``,
            or a callable ``name -> bool``.
        reduction: ``"auto"`` (``loss_fn.reduction`` if present, else ``"mean"``), ``"mean"`` or ``"sum"``.
        mode: ``"eval"`` (default) or ``"train"``: the mode the model is put in during evaluations
            (restored afterwards; BatchNorm statistics are updated in copies only).
        dtype, device: evaluate with parameter/buffer copies converted to these (``None``: the
            model's own).  With ``device=None`` data on another device than the model is an error.
        check_determinism: evaluate the loss twice at construction and warn if the passes disagree.
        progress: show a tqdm bar over batches in long evaluations.
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
    ) -> None:
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
                "use a loss with reduction='mean' or 'sum'"
            )
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating torch.dtype such as torch.float64, got {dtype!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.reduction = reduction
        self.mode = mode
        self.progress = progress
        self._param_spec = params
        self._check_determinism = check_determinism

        named = list(model.named_parameters())
        # the module tree is fixed from here on (used by the mode switch and the guard)
        self._modules = list(model.modules())
        self._all_param_objs = [p for _, p in named]
        if not named:
            raise ValueError("the model has no parameters")
        model_devices = {p.device for _, p in named}
        if device is None and len(model_devices) > 1:
            raise ValueError(
                f"the model's parameters lie on several devices {sorted(map(str, model_devices))}; "
                "pass device=... to evaluate with copies on one device"
            )
        self._explicit_device = device is not None
        self.device = torch.device(device) if device is not None else named[0][1].device
        self.dtype = dtype if dtype is not None else named[0][1].dtype
        self.param_names = self._select(params, named)
        shapes = dict(named)
        self.param_shapes = [shapes[n].shape for n in self.param_names]
        self._numels = [int(math.prod(s)) for s in self.param_shapes]
        self.num_params = int(sum(self._numels))

        self._data = [tuple(data)] if _is_single_batch(data) else data
        self._scan()
        if check_determinism:
            self.check_determinism()

    # ------------------------------------------------------------------ selection and data
    def _select(self, spec: ParamSelection, named: list[tuple[str, nn.Parameter]]) -> list[str]:
        all_names = [n for n, _ in named]
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
        elif isinstance(spec, str) or (
            isinstance(spec, (list, tuple)) and all(isinstance(s, str) for s in spec)
        ):
            wanted = [spec] if isinstance(spec, str) else list(spec)

            def hit(name: str, w: str) -> bool:
                return name == w or name.startswith(w + ".")

            unknown = [w for w in wanted if not any(hit(n, w) for n in all_names)]
            if unknown:
                raise ValueError(
                    f"parameter selection {unknown} matches no parameter of the model; "
                    f"available names: {all_names}"
                )
            chosen = [n for n in all_names if any(hit(n, w) for w in wanted)]
            what = f"names {wanted}"
        elif callable(spec):
            chosen = [n for n in all_names if spec(n)]
            what = "the callable"
        else:
            raise TypeError(
                "params must be None, a name or list of names, a module or list of modules, "
                f"or a callable name -> bool; got {type(spec).__name__}"
            )
        if not chosen:
            raise ValueError(
                f"the parameter selection ({what}) matches nothing; available names: {all_names}"
            )
        return chosen

    def _scan(self) -> None:
        """One pass over the data: batch sizes, type and device checks."""
        if isinstance(self._data, torch.Tensor) or not isinstance(self._data, Iterable):
            raise TypeError(
                "data must be one (inputs, targets) batch or a re-iterable of such batches "
                f"(list, DataLoader); got {type(self._data).__name__}"
            )
        if iter(self._data) is self._data:
            raise TypeError(
                "data is a one-shot iterator/generator and cannot be iterated twice; "
                "pass a list of batches or a DataLoader instead (e.g. list(...))"
            )
        sizes = []
        for k, batch in enumerate(self._data):
            if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
                raise TypeError(f"batch {k} is not an (inputs, targets) pair but {type(batch).__name__}")
            inputs, targets = batch
            if not _is_inputs(inputs) or not isinstance(targets, torch.Tensor):
                raise TypeError(
                    f"batch {k}: inputs must be a tensor, tuple of tensors or dict of tensors and "
                    "targets a tensor"
                )
            if targets.ndim == 0:
                raise ValueError(f"batch {k}: targets must have a batch dimension, got a 0-d tensor")
            if not self._explicit_device:
                for t in [*_tensors(inputs), targets]:
                    if t.device != self.device:
                        raise ValueError(
                            f"batch {k} lies on device {t.device} but the model's parameters are on "
                            f"{self.device}; pass device='{t.device}' to Objective (evaluates with "
                            f"copies there) or move the model/data with .to('{t.device}')"
                        )
            sizes.append(int(targets.shape[0]))
        if not sizes or sum(sizes) == 0:
            raise ValueError("data is empty: it holds no batches / no examples")
        self.batch_sizes = sizes
        self._local_num_examples = sum(sizes)

    @property
    def num_examples(self) -> int:
        """N, the number of examples the total loss is averaged over (global under distribution)."""
        return self._local_num_examples

    def _weight(self, size: int) -> float:
        return size / self.num_examples if self.reduction == "mean" else 1.0

    def _convert(self, t: torch.Tensor, cast: bool = True) -> torch.Tensor:
        if cast and t.is_floating_point():
            return t.to(device=self.device, dtype=self.dtype)
        return t.to(device=self.device)

    def batches(self) -> Iterator[tuple[Inputs, torch.Tensor, float]]:
        """Yield ``(inputs, targets, weight)`` on the objective's device/dtype (float targets cast)."""
        it = self._data
        if self.progress:
            from tqdm.auto import tqdm

            it = tqdm(it, total=len(self.batch_sizes), desc="batches", leave=False)
        for inputs, targets in it:
            yield (
                _map_inputs(inputs, self._convert),
                self._convert(targets),
                self._weight(int(targets.shape[0])),
            )

    # ------------------------------------------------------------------ parameters
    def _all_current(self) -> dict[str, torch.Tensor]:
        """All parameters (selected and frozen), detached, on dtype/device (may alias the model's)."""
        return {n: self._convert(p.detach()) for n, p in self.model.named_parameters()}

    def all_params(self) -> dict[str, torch.Tensor]:
        """Copies of all parameters (selected and frozen) in the objective's dtype/device."""
        return {n: t.clone() for n, t in self._all_current().items()}

    def params(self) -> dict[str, torch.Tensor]:
        """Detached copies of the selected parameters (objective dtype/device)."""
        cur = self._all_current()
        return {n: cur[n].clone() for n in self.param_names}

    def buffers(self) -> dict[str, torch.Tensor]:
        """Copies of the model's buffers (floating ones converted to the objective dtype)."""
        return {n: self._convert(b.detach()).clone() for n, b in self.model.named_buffers()}

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
        for n, shape, numel in zip(self.param_names, self.param_shapes, self._numels):
            out[n] = vec[offset : offset + numel].reshape(*shape, *extra)
            offset += numel
        return out

    def _merge(self, params: Any = None) -> dict[str, torch.Tensor]:
        """Full parameter dict: current values, overridden by ``params`` (dict subset or flat vector)."""
        full = self._all_current()
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
        unknown = [n for n in params if n not in full]
        if unknown:
            raise ValueError(f"unknown parameter names {unknown}; available names: {list(full)}")
        for n, t in params.items():
            if tuple(t.shape) != tuple(full[n].shape):
                raise ValueError(
                    f"parameter {n!r} has shape {tuple(t.shape)}, expected {tuple(full[n].shape)}"
                )
            full[n] = (
                t if (t.dtype == self.dtype and t.device == self.device) else t.to(self.device, self.dtype)
            )
        return full

    # ------------------------------------------------------------------ evaluation
    def _call(self, full_params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], inputs):
        return functional_call(self.model, (dict(full_params), dict(buffers)), _as_args(inputs))

    def forward(self, params: Any = None, inputs: Inputs | None = None) -> torch.Tensor:
        """Model outputs at ``params`` (missing names: current values) on ``inputs`` (converted)."""
        if inputs is None:
            raise ValueError("forward needs inputs (a tensor, tuple or dict of tensors)")
        with self._evaluating():
            return self._call(self._merge(params), self.buffers(), _map_inputs(inputs, self._convert))

    def _batch_loss(self, full_params, buffers, inputs, targets, weight):
        return weight * self.loss_fn(self._call(full_params, buffers, inputs), targets)

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over data-parallel ranks (identity here; see ``landscape.distributed``)."""
        return t

    @staticmethod
    def _check_finite(value: torch.Tensor, k: int) -> None:
        if not bool(torch.isfinite(value).all()):
            raise ValueError(
                f"the loss on batch {k} is not finite ({float(value):g}); check the inputs/targets of "
                "that batch, the model's parameters, or use dtype=torch.float64"
            )

    def loss(self, params: Any = None) -> torch.Tensor:
        """Whole-dataset loss ``sum_k w_k loss_fn(f(X_k), y_k)`` (a 0-d tensor, no graph kept)."""
        with self.guard(), torch.no_grad():
            full, bufs = self._merge(params), self.buffers()
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            for k, (x, y, w) in enumerate(self.batches()):
                lk = self._batch_loss(full, bufs, x, y, w)
                self._check_finite(lk, k)
                total = total + lk
            return self._all_reduce(total)

    def loss_and_gradient(self, params: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Whole-dataset loss and its gradient ``[p]`` w.r.t. the selected parameters."""
        with self.guard():
            full = self._merge(params)
            leaves = {n: full[n].detach().requires_grad_(True) for n in self.param_names}
            full.update(leaves)
            bufs = self.buffers()
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            grad = torch.zeros(self.num_params, dtype=self.dtype, device=self.device)
            names = self.param_names
            for k, (x, y, w) in enumerate(self.batches()):
                with torch.enable_grad():
                    lk = self._batch_loss(full, bufs, x, y, w)
                self._check_finite(lk, k)
                gs = torch.autograd.grad(lk, [leaves[n] for n in names], allow_unused=True)
                grad += torch.cat(
                    [
                        (g if g is not None else torch.zeros_like(leaves[n])).reshape(-1)
                        for n, g in zip(names, gs)
                    ]
                )
                total = total + lk.detach()
            return self._all_reduce(total), self._all_reduce(grad)

    def gradient(self, params: Any = None) -> torch.Tensor:
        """Gradient ``[p]`` of the whole-dataset loss w.r.t. the selected parameters."""
        return self.loss_and_gradient(params)[1]

    def evaluate(self, params: Any = None) -> dict[str, float | None]:
        """``dict(loss=..., accuracy=...)``; accuracy for class-label or 0/1 targets, else ``None``."""
        with self.guard(), torch.no_grad():
            full, bufs = self._merge(params), self.buffers()
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            correct = torch.zeros((), dtype=torch.float64, device=self.device)
            classify = True
            for k, (x, y, w) in enumerate(self.batches()):
                out = self._call(full, bufs, x)
                lk = w * self.loss_fn(out, y)
                self._check_finite(lk, k)
                total = total + lk
                c = _num_correct(out, y) if classify else None
                if c is None:
                    classify = False
                else:
                    correct = correct + c
            # always the same collectives on every rank (see landscape.distributed)
            total = self._all_reduce(total)
            stats = self._all_reduce(
                torch.stack(
                    [correct, torch.tensor(0.0 if classify else 1.0, device=self.device, dtype=torch.float64)]
                )
            )
            acc = float(stats[0]) / self.num_examples if float(stats[1]) == 0.0 else None
            return {"loss": float(total), "accuracy": acc}

    def check_determinism(self, rtol: float = 1e-6) -> bool:
        """Evaluate every batch loss twice; warn (and return False) if the two passes disagree."""

        def one_pass():
            with self.guard(), torch.no_grad():
                full = self._merge(None)
                return [
                    (len(y), float(self._batch_loss(full, self.buffers(), x, y, w)))
                    for x, y, w in self.batches()
                ]

        a, b = one_pass(), one_pass()
        same = len(a) == len(b) and all(
            na == nb and abs(la - lb) <= rtol * max(abs(la), abs(lb), 1e-30)
            for (na, la), (nb, lb) in zip(a, b)
        )
        if not same:
            warnings.warn(
                "Objective: two passes over the data gave different losses; the objective is not a "
                "deterministic function of the parameters. Typical causes: data augmentation, dropout "
                "(mode='train'), or a shuffling DataLoader (use shuffle=False). Curvature estimates "
                "will be noisy/inconsistent.",
                UserWarning,
                stacklevel=3,
            )
        return same

    # ------------------------------------------------------------------ variants
    def _kwargs(self) -> dict[str, Any]:
        return dict(
            params=self._param_spec,
            reduction=self.reduction,
            mode=self.mode,
            dtype=self.dtype,
            device=self.device if self._explicit_device else None,
            check_determinism=False,
            progress=self.progress,
        )

    def subset(self, params: ParamSelection) -> Objective:
        """Same model/data/settings, another parameter selection."""
        kw = self._kwargs()
        kw["params"] = params
        return type(self)._rebuild(self, self._data, kw)

    def with_data(self, data: Any) -> Objective:
        """Same model/settings/selection, other data."""
        kw = self._kwargs()
        kw["params"] = list(self.param_names)
        return type(self)._rebuild(self, data, kw)

    def _rebuild(self, data: Any, kw: dict[str, Any]) -> Objective:
        return Objective(self.model, self.loss_fn, data, **kw)

    def config(self) -> dict[str, Any]:
        """JSON-friendly description recorded in results."""
        return {
            "model": type(self.model).__name__,
            "loss": type(self.loss_fn).__name__
            if isinstance(self.loss_fn, nn.Module)
            else getattr(self.loss_fn, "__name__", type(self.loss_fn).__name__),
            "num_params": self.num_params,
            "param_names": list(self.param_names),
            "num_examples": self.num_examples,
            "num_batches": len(self.batch_sizes),
            "batch_sizes": list(self.batch_sizes) if len(self.batch_sizes) <= 64 else "many",
            "reduction": self.reduction,
            "mode": self.mode,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
        }

    def __repr__(self) -> str:
        return (
            f"Objective({type(self.model).__name__}, p={self.num_params}, N={self.num_examples}, "
            f"batches={len(self.batch_sizes)}, reduction={self.reduction!r}, mode={self.mode!r}, "
            f"dtype={self.dtype}, device={self.device})"
        )

    # ------------------------------------------------------------------ model safety
    @contextlib.contextmanager
    def _evaluating(self) -> Iterator[None]:
        """Put every module in the objective's mode; restore each module's own flag afterwards."""
        want = self.mode == "train"
        changed = [m for m in self._modules if m.training != want]
        try:
            for m in changed:
                m.training = want
            yield
        finally:
            for m in changed:
                m.training = not want

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Snapshot parameters, buffers, ``.grad``, ``requires_grad`` and modes; restore bit-exactly.

        Restores also when the body raises (:func:`landscape.guard.model_guard`); the model is
        additionally put into the objective's mode for the duration of the block.
        """
        with model_guard(self.model, self._all_param_objs, self._modules), self._evaluating():
            yield
