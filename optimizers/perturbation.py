"""Shared machinery of the perturb-then-descend (SAM family) optimizers.

One step of a two-pass method (Foret et al. 2021, Alg. 1):

1. call the closure at ``w``  -> ``g = grad L_B(w)``;
2. compute ``eps`` (method specific: :meth:`PerturbationOptimizer._perturbation`);
3. save ``w`` (clones), set ``w <- w + eps`` in place;
4. call the closure again  -> ``g_eps = grad L_B(w + eps)``;
5. restore ``w`` with ``copy_`` from the clones (bit exact; ``.data`` is never rebound);
6. hand ``g_eps`` to the base optimizer, which steps at ``w``.

Weight decay stays in the base optimizer (it acts at ``w`` and is not part of the ascent), as in the
widely used PyTorch SAM.

Public API (stable; other modules of the package import it)
-----------------------------------------------------------
``PerturbationOptimizer(params, base_optimizer, *, model=None, m=1, defaults=None, **base_kwargs)``
    Base class.  ``base_optimizer`` is any ``torch.optim.Optimizer`` class (or factory
    ``f(param_groups, **kw)``); it is built on the wrapper's param groups, and the wrapper shares
    them (``opt.param_groups is opt.base_optimizer.param_groups``), so LR schedulers attached to the
    wrapper change the learning rate the base optimizer uses.  ``state_dict()`` contains the base
    optimizer's state under ``"base_optimizer"`` and subclass extras (e.g. RNG state) under
    ``"extra"``.  ``self.last`` holds what the last step computed (0-d tensors; ``float()`` them).
    ``self.perturbed`` is ``True`` while the closure runs at a perturbed point.
``global_norm(tensors) -> Tensor``
    ``sqrt(sum_i ||t_i||^2)`` over a list of tensors (0-d tensor; zero for an empty list).
``params_with_grad(param_groups) -> list[tuple[dict, Tensor]]``
    ``(group, param)`` pairs of the parameters whose ``.grad`` is not ``None``.
``bn_snapshot(model) -> list[tuple[Tensor, Tensor]]`` / ``bn_restore(snapshot)``
    Clone / restore (``copy_``) the running statistics of every BatchNorm layer
    (``running_mean``, ``running_var``, ``num_batches_tracked``; whichever exist).
``bn_update_disabled(model)``
    Context manager: BN running statistics are restored bit-exactly on exit (also when the body
    raises), so forward passes inside it do not update them.  Works for ``momentum=None``
    (cumulative averages) as well, unlike the "set momentum to 0" trick.
``make_closure(optimizer, model, loss_fn, inputs, targets, m=None)``
    A closure following the contract below (``inputs``/``targets`` tensors split along dim 0).
``NORM_GUARD = 1e-12``
    Added to every norm (or square root of a quadratic form) that is divided by.

Closure contract
----------------
``closure()`` zeroes the gradients, runs forward and backward and **returns the loss** (a
``ValueError`` "closure must return the loss" is raised otherwise).  The optimizer also clears
gradients (``set_to_none``) before every call, so a closure that forgets ``zero_grad`` still works.

m-sharpness (Foret et al. 2021, Sec. 4.1; ``m`` sub-batches, each with its own perturbation):
construct the optimizer with ``m > 1``; the closure must then accept a chunk index,
``closure(chunk)``, and compute the mean loss on sub-batch ``chunk`` (``0 <= chunk < m``) of the
current batch, e.g. ``x_k = torch.tensor_split(x, m)[chunk]``.  For each ``k`` the optimizer calls
``closure(k)`` at ``w`` (gradient ``g_k``), builds ``eps_k`` from ``g_k`` alone, calls
``closure(k)`` at ``w + eps_k`` and restores ``w``.  The descent gradient is the plain mean
``1/m sum_k grad L_k(w + eps_k)``; the returned loss is the mean of the chunk losses at ``w``.
With ``m = 1`` the closure is called without arguments, so ordinary closures work unchanged.
With ``m > 1`` and a closure from :func:`make_closure` (equal sub-batches) the ``2 m`` calls are
replaced by two vectorised passes (:mod:`optimizers.batched_chunks`, same update); why a step
took the loop instead is in ``self.last["m_sharpness"]`` (``batched_m=False`` forces the loop).

BatchNorm
---------
Pass ``model=`` to have running statistics updated only by the first pass at ``w``: they are
snapshotted before the pass at ``w + eps`` and restored bit-exactly after it (so the statistics
after a step equal those of one plain train-mode forward pass).  Without ``model=`` the closure
can read ``optimizer.perturbed`` and wrap its forward in ``bn_update_disabled(model)`` itself.
A model without BatchNorm is unaffected either way.  With ``m > 1`` each chunk's first pass
updates the statistics (``m`` updates per step, as ``m`` plain forward passes over the chunks
would); single-pass methods (RandomSAM) update them in their only pass.  Snapshot/restore is used
rather than the "momentum = 0" trick because it is bit exact and also
covers ``momentum=None`` (cumulative averages, where ``num_batches_tracked`` drives the update).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from landscape.checks import check_nonnegative
from optimizers.batched_chunks import (
    ChunkClosure,
    NotVectorisable,
    batched_reason,
    chunk_norms,
    perturbation_chunks,
)
from optimizers.bn_state import bn_restore, bn_snapshot, bn_update_disabled
from optimizers.split_step import SplitStep
from optimizers.state import check_state_dict, tag_state_dict

__all__ = [
    "NORM_GUARD",
    "PerturbationOptimizer",
    "global_norm",
    "params_with_grad",
    "bn_snapshot",
    "bn_restore",
    "bn_update_disabled",
    "make_closure",
    "chunk_norms",
    "check_nonnegative",  # re-exported from landscape.checks
]

NORM_GUARD = 1e-12  # added to ||g|| before dividing (official SAM code: 1e-12)


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------
def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Euclidean norm of the concatenation of ``tensors`` (a 0-d tensor; 0 for an empty list)."""
    if len(tensors) == 0:
        return torch.zeros(())
    norms = torch._foreach_norm(list(tensors), 2.0)
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


_ACCEPTS_CHUNK: dict[Any, bool] = {}


def accepts_chunk(closure: Callable[..., Any]) -> bool:
    """Can ``closure(0)`` be called (the m-sharpness contract)?  ``True`` where the signature
    cannot be introspected (builtins: the caller is trusted).  Cached per code object (a training
    loop builds a new closure every step from the same code: ``inspect.signature`` took 9 us)."""
    code = getattr(closure, "__code__", None)
    if code is not None:  # a function: its code and positional defaults decide
        key: Any = (code, getattr(closure, "__defaults__", None))
    else:  # an instance of a Python class with __call__ (e.g. ChunkClosure): the class decides
        call = getattr(type(closure), "__call__", None)  # noqa: B004 - the class's method, not callable()
        key = ("instance", type(closure)) if hasattr(call, "__code__") else None
    try:
        if key in _ACCEPTS_CHUNK:
            return _ACCEPTS_CHUNK[key]
    except TypeError:  # unhashable defaults: not cached
        key = None
    try:
        inspect.signature(closure).bind(0)
        ok = True
    except TypeError:
        ok = False
    except ValueError:  # signature not introspectable (builtins): trust the caller
        ok = True
    if key is not None and len(_ACCEPTS_CHUNK) < 4096:
        _ACCEPTS_CHUNK[key] = ok
    return ok


def params_with_grad(param_groups: Iterable[dict[str, Any]]) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """``(group, param)`` for every parameter whose ``.grad`` is not ``None`` (others are skipped)."""
    return [(g, p) for g in param_groups for p in g["params"] if p.grad is not None]


def make_closure(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    m: int | None = None,
) -> ChunkClosure:
    """Closure ``closure(chunk=None)`` for ``loss_fn(model(inputs), targets)`` (see contract above).

    A :class:`optimizers.batched_chunks.ChunkClosure`: it also carries the model, loss and
    sub-batches, so that an optimizer with ``m > 1`` can vectorise the sub-batches.
    ``chunk=None`` uses the whole batch; ``chunk=k`` uses ``torch.tensor_split(., m)[k]`` of the
    inputs and targets, with ``m`` defaulting to ``optimizer.m`` (1 for optimizers without it).
    """
    m_ = int(m if m is not None else getattr(optimizer, "m", 1))
    if m_ < 1:
        raise ValueError(f"m must be >= 1, got {m_}")
    return ChunkClosure(optimizer, model, loss_fn, inputs, targets, m_)


# --------------------------------------------------------------------------------------------
# the base class
# --------------------------------------------------------------------------------------------
class PerturbationOptimizer(SplitStep, torch.optim.Optimizer):
    """Base class of the perturb-then-descend optimizers (see the module docstring).

    Subclasses implement :meth:`_perturbation` (``eps`` from the gradient at ``w``) and optionally
    :meth:`_begin_step` (reset per-step accumulators), :meth:`_adjust_descent` (edit the descent
    gradient, e.g. add a penalty, before the base step),
    set ``passes = 1`` for single-pass methods (perturbation does not use the gradient), and
    :meth:`_extra_state` / :meth:`_load_extra_state` for non-tensor state such as RNG state.

    Args:
        params: parameters or param groups (per-group values of the method's hyperparameters are
            allowed; norms are always global over all groups).
        base_optimizer: a ``torch.optim.Optimizer`` class (or factory) that performs the descent.
        model: optional module whose BatchNorm running statistics are updated only by the first
            pass (see module docstring).
        m: number of sub-batches for m-sharpness (closure contract in the module docstring).
        batched_m: with ``m > 1``, vectorise the sub-batches when the closure allows it
            (:mod:`optimizers.batched_chunks`); ``False`` forces the sequential loop.
        defaults: the method's own hyperparameters (``rho``, ...), stored in every param group.
        **base_kwargs: keyword arguments of ``base_optimizer`` (``lr``, ``momentum``, ...).
    """

    passes: int = 2
    #: hyperparameters that must be finite and >= 0 in every param group (per-group values too)
    _nonnegative_hparams: tuple[str, ...] = ("lr", "rho")

    def __init__(
        self,
        params: Any,
        base_optimizer: Any,
        *,
        model: nn.Module | None = None,
        m: int = 1,
        defaults: dict[str, Any] | None = None,
        batched_m: bool = True,
        **base_kwargs: Any,
    ) -> None:
        if isinstance(base_optimizer, torch.optim.Optimizer):
            raise TypeError(
                "base_optimizer must be an optimizer class such as torch.optim.SGD (plus its kwargs, "
                "e.g. lr=0.1, momentum=0.9), not an optimizer instance"
            )
        if not callable(base_optimizer):
            raise TypeError(f"base_optimizer must be a torch.optim.Optimizer class, got {base_optimizer!r}")
        if "lr" in base_kwargs:
            check_nonnegative("lr", base_kwargs["lr"])
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m (number of sub-batches for m-sharpness) must be an int >= 1, got {m!r}")
        for key in self._nonnegative_hparams:
            if key in (defaults or {}):
                check_nonnegative(key, defaults[key])
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module or None, got {type(model).__name__}")
        own = dict(defaults or {})
        self._own_defaults = own
        super().__init__(params, {**own, **base_kwargs})
        self.base_optimizer = base_optimizer(self.param_groups, **base_kwargs)
        if not isinstance(self.base_optimizer, torch.optim.Optimizer):
            raise TypeError("base_optimizer(...) must return a torch.optim.Optimizer")
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)
        self.model = model
        self.m = m
        self.batched_m = bool(batched_m)
        self.config: dict[str, Any] = {"m": m, "batched_m": self.batched_m}
        self._batched_failed: dict[int, str] = {}
        self.perturbed = False
        self.last: dict[str, Any] = {}

    # ---- param groups / state ---------------------------------------------------------------
    def _check_group(self, group: dict[str, Any], index: int) -> None:
        """Per-group hyperparameters obey the same rules as the constructor's arguments."""
        for key in self._nonnegative_hparams:
            if key in group:
                check_nonnegative(f"{key} (param group {index})", group[key])

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "base_optimizer" not in self.__dict__:  # during __init__
            super().add_param_group(param_group)
            self._check_group(self.param_groups[-1], len(self.param_groups) - 1)
            return
        for k, v in self._own_defaults.items():
            param_group.setdefault(k, v)
        self._check_group(param_group, len(self.param_groups))
        self.base_optimizer.add_param_group(param_group)
        self.param_groups = self.base_optimizer.param_groups

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["base_optimizer"] = self.base_optimizer.state_dict()
        sd["base_optimizer_class"] = type(self.base_optimizer).__name__
        sd["extra"] = self._extra_state()
        return tag_state_dict(sd, self, self.param_groups)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if isinstance(state_dict, dict) and "base_optimizer" not in state_dict:
            raise ValueError(
                "state_dict has no 'base_optimizer' entry; pass a dict produced by this optimizer's "
                "state_dict()"
            )
        sd = check_state_dict(state_dict, self, self.param_groups, required=("state", "param_groups"))
        base_cls = sd.pop("base_optimizer_class", None)
        if base_cls is not None and base_cls != type(self.base_optimizer).__name__:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state dict's base optimizer is {base_cls}, "
                f"this one's is {type(self.base_optimizer).__name__}; build the optimizer with the same "
                "base_optimizer class"
            )
        for i, group in enumerate(sd["param_groups"]):
            self._check_group(group, i)
        base_sd = sd.pop("base_optimizer")
        extra = sd.pop("extra", {})
        super().load_state_dict(sd)
        self.base_optimizer.load_state_dict(base_sd)
        # re-share the (new) group dicts and keep the method's own hyperparameters
        for own_group, base_group in zip(self.param_groups, self.base_optimizer.param_groups):
            for k in self._own_defaults:
                if k in own_group:
                    base_group[k] = own_group[k]
        self.param_groups = self.base_optimizer.param_groups
        self._load_extra_state(extra)

    # ---- hooks for subclasses ----------------------------------------------------------------
    def _perturbation(
        self, pairs: list[tuple[dict[str, Any], torch.Tensor]]
    ) -> tuple[list[torch.Tensor], dict]:
        """Return ``eps`` (one tensor per ``(group, param)`` in ``pairs``) and a dict of diagnostics.

        For two-pass methods ``pairs`` are the parameters with a gradient at ``w``; for one-pass
        methods all parameters (``p.grad`` is then not available).
        """
        raise NotImplementedError

    #: Optional: ``_perturbation_batched(pairs, grads)`` with ``grads[i]`` of shape ``[m, *p.shape]``
    #: (chunk ``k``'s gradient in slice ``k``) returns ``eps`` stacked the same way and diagnostics of
    #: shape ``[m]``: the ``m`` perturbations of the batched m-sharpness path in one pass, equal to
    #: ``m`` calls of :meth:`_perturbation`.  ``None`` (the attribute or its result): that path calls
    #: ``_perturbation`` chunk by chunk.
    _perturbation_batched: Callable[..., tuple[list[torch.Tensor], dict]] | None = None

    def _begin_step(self) -> None:
        """Called at the start of every step (reset per-step accumulators); default: nothing."""

    def _adjust_descent(self) -> None:
        """Edit ``p.grad`` (the descent gradient) in place before the base step; default: nothing."""

    # ---- the step ----------------------------------------------------------------------------
    def _call(self, closure: Callable[..., Any], chunk: int | None) -> torch.Tensor:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
        with torch.enable_grad():
            loss = closure() if chunk is None else closure(chunk)
        if loss is None:
            raise ValueError(
                f"{type(self).__name__}.step: closure must return the loss (it returned None); end the "
                "closure with `return loss` after loss.backward()"
            )
        if not isinstance(loss, torch.Tensor):
            loss = torch.as_tensor(loss)
        return loss.detach()

    def _check_closure(self, closure: Any) -> None:
        if closure is None or not callable(closure):
            raise TypeError(
                f"{type(self).__name__}.step requires a closure (zero_grad, forward, backward; closure "
                "must return the loss): opt.step(closure); or run the two passes yourself around "
                "opt.first_step() and opt.second_step() (optimizers.split_step)"
            )
        if self.m > 1 and not accepts_chunk(closure):
            raise TypeError(
                f"with m={self.m} the closure must accept a chunk index, e.g. `def closure(chunk=None)`, "
                "and compute the loss on sub-batch `chunk` of the batch"
            )

    def _all_pairs(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """One optimizer step; returns the loss at ``w`` (mean over chunks for ``m > 1``).

        Without a closure after :meth:`first_step`: :meth:`second_step` (returns ``None``).

        Single-pass methods (``passes == 1``) return the loss at the perturbed point instead.
        """
        if closure is None and self._split is not None:  # a step begun with first_step()
            self.second_step()
            return None
        self._check_closure(closure)
        assert closure is not None
        self._begin_step()
        mode = batched_reason(self, closure) if self.m > 1 else ""
        stacked = self._batched(closure) if mode == "batched" else None
        if stacked is None:
            if mode == "batched":
                mode = f"sequential: {self._batched_failed[id(closure.model)]}"
            self.last = _summarise(self._sequential(closure))
        else:
            self.last = _summarise_stacked(stacked)
        if mode:
            self.last["m_sharpness"] = self.config["m_sharpness"] = mode
        self._adjust_descent()
        self.base_optimizer.step()
        return self.last["loss"]

    def _batched(self, closure: Any) -> dict[str, torch.Tensor] | None:
        """Vectorised sub-batches (per-chunk values stacked ``[m]``), or ``None`` after recording why
        the loop must run."""
        gen = getattr(self, "generator", None)
        rng = gen.get_state() if isinstance(gen, torch.Generator) else None
        try:
            return perturbation_chunks(self, closure)
        except NotVectorisable as exc:
            self._batched_failed[id(closure.model)] = str(exc)
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None
            if rng is not None:
                gen.set_state(rng)
            self._begin_step()
            return None

    def _sequential(self, closure: Callable[..., Any]) -> list[dict[str, Any]]:
        """The loop over sub-batches (``2 m`` closure calls); sets the descent gradient."""
        chunks: list[int | None] = [None] if self.m == 1 else list(range(self.m))
        sums: dict[torch.Tensor, torch.Tensor] = {}
        records: list[dict[str, Any]] = []
        for k in chunks:
            rec: dict[str, Any] = {}
            if self.passes == 2:
                rec["loss"] = self._call(closure, k)
                pairs = params_with_grad(self.param_groups)
            else:
                pairs = self._all_pairs()
            eps, diag = self._perturbation(pairs)
            rec.update(diag)
            params = [p for _, p in pairs]
            saved = [p.detach().clone() for p in params]
            snap = bn_snapshot(self.model) if self.passes == 2 else []
            self.perturbed = True
            try:
                if params:
                    torch._foreach_add_(params, eps)
                loss_eps = self._call(closure, k)
            finally:
                self.perturbed = False
                if params:  # no_grad: an exception may have left grad mode on while unwinding
                    with torch.no_grad():
                        torch._foreach_copy_(params, saved)
                bn_restore(snap)
            rec["loss_perturbed"] = loss_eps
            if self.passes == 1:
                rec["loss"] = loss_eps
            records.append(rec)
            if self.m > 1:
                for g in self.param_groups:
                    for p in g["params"]:
                        if p.grad is not None:
                            if p in sums:
                                sums[p].add_(p.grad)
                            else:
                                sums[p] = p.grad.detach().clone()
        if self.m > 1:
            for p, s in sums.items():
                p.grad = s.div_(self.m)
        return records


def _summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-level values: the mean over chunks (the value itself for one chunk); plus ``per_chunk``."""
    if len(records) == 1:
        return dict(records[0])
    out: dict[str, Any] = {}
    for key in records[0]:
        vals = [r[key] for r in records]
        if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals):
            out[key] = torch.stack([v.to(vals[0].dtype) for v in vals]).mean()
        else:
            out[key] = vals[-1]
    out["per_chunk"] = records
    return out


def _summarise_stacked(stacked: dict[str, torch.Tensor]) -> dict[str, Any]:
    """:func:`_summarise` of the records whose values are the slices of ``stacked`` (each ``[m]``)."""
    keys, vals = list(stacked), list(stacked.values())
    first = vals[0]
    if all(v.dtype == first.dtype and v.device == first.device and v.dim() == 1 for v in vals):
        table = torch.stack(vals)  # [keys, m]: a handful of operations instead of two per key
        out: dict[str, Any] = dict(zip(keys, table.mean(1).unbind(0)))
        cells = table.t().reshape(-1).unbind(0)
        n = len(keys)
        out["per_chunk"] = [dict(zip(keys, cells[k * n : (k + 1) * n])) for k in range(table.shape[1])]
        return out
    out = {key: v.mean() for key, v in stacked.items()}
    out["per_chunk"] = [dict(zip(keys, vs)) for vs in zip(*(v.unbind(0) for v in vals))]
    return out


PerturbationOptimizer._two_halves_of = PerturbationOptimizer.step
