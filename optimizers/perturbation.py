"""The two-pass machinery of the SAM family: ``step(closure)`` is the closure, ``first_step``,
the closure and ``second_step``.

One step of a two-pass method (Foret et al. 2021, Alg. 1):

1. call the closure at ``w``  -> ``g = grad L_B(w)``;
2. :meth:`~PerturbationOptimizer.first_step`: ``eps`` from ``g`` (the method's rule,
   :meth:`PerturbationOptimizer._perturbation`), ``w`` saved, ``w <- w + eps`` in place;
3. call the closure again  -> ``g_eps = grad L_B(w + eps)``;
4. :meth:`~PerturbationOptimizer.second_step`: ``w`` restored with ``copy_`` (bit exact; ``.data`` is
   never rebound), the base optimizer steps at ``w`` with ``g_eps``.

Loops that run the passes themselves (mixed precision with a loss scaler, clipping the descent
gradient, Lightning, the HuggingFace ``Trainer``) call the halves, as in the one-file PyTorch SAM::

    loss_fn(model(x), y).backward()          # gradient at w
    opt.first_step(zero_grad=True)           # w <- w + eps(g); the gradients are cleared
    loss_fn(model(x), y).backward()          # gradient at w + eps
    opt.second_step(zero_grad=True)          # w restored, base optimizer steps with that gradient

``step()`` after ``first_step`` is ``second_step()``; ``cancel_step()`` restores ``w`` without an
update (e.g. after a loss-scale overflow). The order of the calls is checked
(:mod:`optimizers.step_protocol`): a call out of turn -- ``step(closure)`` or ``state_dict()`` while
a step is open, ``second_step()`` without a backward pass since ``first_step()`` -- is refused and
changes nothing, and a NaN / inf gradient raises
:class:`~optimizers.step_protocol.NonFiniteGradient` with the weights left at ``w``, bit for bit.
Weight decay stays in the base optimizer (not in the
ascent). ``base_optimizer``: a ``torch.optim.Optimizer`` class (or factory ``f(param_groups, **kw)``)
built on the wrapper's param groups, which it shares (LR schedulers act on the base optimizer);
``state_dict()``: :class:`optimizers.state.WrapperState`. ``self.last``: what the last step computed
(0-d tensors); ``self.perturbed``: the closure runs at a perturbed point. ``NORM_GUARD = 1e-12`` is
added to every norm divided by.

Closure contract (:mod:`optimizers.closure`): ``closure()`` zeroes the gradients, runs forward and
backward and **returns the loss**; the optimizer also clears the gradients before every call.

m-sharpness (Foret et al. 2021, Sec. 4.1): with ``m > 1`` the closure accepts a chunk index,
``closure(chunk)``, and computes the mean loss on sub-batch ``chunk`` (e.g. ``x_k =
torch.tensor_split(x, m)[chunk]``; :func:`make_closure` builds one). Each chunk gets its own
perturbation ``eps_k`` from its own gradient; the descent gradient is ``1/m sum_k grad L_k(w +
eps_k)``, the returned loss the mean of the chunk losses at ``w``. The engine is chosen once per step
(:func:`optimizers.m_sharpness.choose_engine`): the loop runs the closure and the halves chunk by
chunk (``2 m`` calls); with a closure from :func:`make_closure` two vectorised passes of
:func:`optimizers.m_sharpness.chunk_gradients` replace them (same update). Why a step took the loop
is in ``self.last["m_sharpness"]`` (``batched_m=False`` forces it). The rule is written once, for a
stack of chunks; the loop hands it a stack of one. The split step takes one perturbation (``m = 1``).

BatchNorm: with ``model=`` the running statistics are updated only by the pass at ``w`` (snapshot
and bit-exact restore around the pass at ``w + eps``, :mod:`optimizers.bn_state`; also right for
``momentum=None``); without it the closure can read ``optimizer.perturbed`` and wrap its forward
in ``bn_update_disabled(model)``. With ``m > 1`` each chunk's first pass updates them (``m``
updates, as ``m`` plain passes would); single-pass methods (RandomSAM) update them in their pass.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from landscape.checks import check_int, check_nonnegative
from landscape.deprecation import moved_names
from optimizers.bn_state import bn_restore, bn_snapshot
from optimizers.closure import ChunkClosure, accepts_chunk, check_closure_grads
from optimizers.m_sharpness import (
    NotVectorisable,
    choose_engine,
    chunk_gradients,
    fail,
    summarise,
    summarise_stacked,
)
from optimizers.state import WrapperState
from optimizers.step_protocol import IDLE, OPEN, SplitProtocol, check_finite, grad_marks

__all__ = ["NORM_GUARD", "PerturbationOptimizer", "global_norm", "make_closure", "params_with_grad"]

NORM_GUARD = 1e-12  # added to ||g|| before dividing (official SAM code: 1e-12)
#: names this module re-exported before; served with a DeprecationWarning for one release
__getattr__ = moved_names(
    __name__, {"bn_update_disabled": "optimizers.bn_state", "chunk_norms": "optimizers.m_sharpness"}
)


def global_norm(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Euclidean norm of the concatenation of ``tensors`` (a 0-d tensor; 0 for an empty list)."""
    if len(tensors) == 0:
        return torch.zeros(())
    norms = torch._foreach_norm(list(tensors), 2.0)
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


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
    """``closure(chunk=None)`` for ``loss_fn(model(inputs), targets)`` (contract above): a
    :class:`optimizers.m_sharpness.ChunkClosure`, which also carries the model, loss and sub-batches
    (``torch.tensor_split(., m)``, ``m`` defaulting to ``optimizer.m``) so ``m > 1`` can vectorise."""
    m_ = int(m if m is not None else getattr(optimizer, "m", 1))
    if m_ < 1:
        raise ValueError(f"m must be >= 1, got {m_}")
    return ChunkClosure(optimizer, model, loss_fn, inputs, targets, m_)


class PerturbationOptimizer(SplitProtocol, WrapperState, torch.optim.Optimizer):
    """Base class of the perturb-then-descend optimizers (see the module docstring).

    Subclasses implement :meth:`_perturbation` (``eps`` for a stack of chunk gradients) and may
    override :meth:`_begin_step` (reset per-step accumulators), :meth:`_adjust_descent` (edit the
    descent gradient before the base step), ``passes = 1`` (single-pass: ``eps`` without a
    gradient) and ``_extra_state`` / ``_load_extra_state`` (non-tensor state such as RNG state).

    Args:
        params: parameters or param groups (per-group hyperparameters allowed; norms are global).
        base_optimizer: a ``torch.optim.Optimizer`` class (or factory) that performs the descent.
        model: optional module whose BatchNorm running statistics only the first pass updates.
        m: number of sub-batches for m-sharpness (closure contract in the module docstring).
        batched_m: ``False`` forces the loop (:mod:`optimizers.m_sharpness`) for ``m > 1``.
        defaults: the method's own hyperparameters (``rho``, ...; validated here, once).
        **base_kwargs: keyword arguments of ``base_optimizer`` (``lr``, ``momentum``, ...).
    """

    passes: int = 2
    #: hyperparameters that must be finite and >= 0 in every param group (per-group values too)
    _nonnegative_hparams: tuple[str, ...] = ("lr", "rho")
    #: the open step (between the halves): its params, their saved weights, the BatchNorm snapshot,
    #: the diagnostics and (a step begun by first_step()) the gradients' marks (grad_marks)
    _split: dict[str, Any] | None = None

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
        own = dict(defaults or {})
        for key in self._nonnegative_hparams:
            if key in base_kwargs or key in own:
                check_nonnegative(key, base_kwargs[key] if key in base_kwargs else own[key])
        m = check_int("m (number of sub-batches for m-sharpness)", m, minimum=1)
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module or None, got {type(model).__name__}")
        self._own_defaults = own
        super().__init__(params, {**own, **base_kwargs})
        self.base_optimizer = base_optimizer(self.param_groups, **base_kwargs)
        if not isinstance(self.base_optimizer, torch.optim.Optimizer):
            raise TypeError("base_optimizer(...) must return a torch.optim.Optimizer")
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)
        self.model, self.m, self.batched_m = model, m, bool(batched_m)
        self.config: dict[str, Any] = {"m": m, "batched_m": self.batched_m}
        self._batched_failed: dict[int, str] = {}
        self.perturbed, self.last = False, {}

    def _check_group(self, group: dict[str, Any], index: int, keys: Iterable[str] | None = None) -> None:
        """Per-group hyperparameters (``keys``: those the group sets itself) obey the constructor's rules."""
        for key in self._nonnegative_hparams if keys is None else keys:
            if key in group and key in self._nonnegative_hparams:
                check_nonnegative(f"{key} (param group {index})", group[key])

    @property
    def step_state(self) -> str:
        return IDLE if self._split is None else OPEN

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._expect("add_param_group()", IDLE)
        given = list(param_group)  # the group's own values (the defaults were checked once, above)
        if "base_optimizer" not in self.__dict__:  # during __init__
            super().add_param_group(param_group)
            self._check_group(self.param_groups[-1], len(self.param_groups) - 1, given)
            return
        for k, v in self._own_defaults.items():
            param_group.setdefault(k, v)
        self._check_group(param_group, len(self.param_groups), given)
        self.base_optimizer.add_param_group(param_group)
        self.param_groups = self.base_optimizer.param_groups

    def _perturbation(
        self, pairs: list[tuple[dict[str, Any], torch.Tensor]], grads: list[torch.Tensor] | None
    ) -> tuple[list[torch.Tensor], dict]:
        """``(eps, diagnostics)`` for a stack of chunks: ``grads[i]`` is parameter ``pairs[i]``'s
        gradient at ``w`` stacked ``[n, *p.shape]`` (``n = 1`` in the loop, ``m`` on a vectorised
        engine; ``None`` for one-pass methods, one chunk); ``eps`` stacked alike, diagnostics per
        chunk (``[n]``, 0-d for one chunk: :func:`optimizers.m_sharpness.chunk_norms`)."""
        raise NotImplementedError

    def _begin_step(self) -> None:
        """Called at the start of every step (reset per-step accumulators); default: nothing."""

    def _adjust_descent(self) -> None:
        """Edit ``p.grad`` (the descent gradient) in place before the base step; default: nothing."""

    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """One step; returns the loss at ``w`` (the mean over chunks; single-pass methods: at the
        perturbed point). Without a closure after :meth:`first_step`: :meth:`second_step`."""
        if closure is None and self.step_state == OPEN:  # a step begun with first_step()
            return self.second_step()
        self._expect("step(closure)", IDLE)
        self._check_closure(closure)
        self._begin_step()
        engine, mode = (
            choose_engine(self, closure, [p for _, p in self._pairs()]) if self.m > 1 else (None, "")
        )
        stacked = self._chunk_step(engine, closure) if engine is not None else None
        if stacked is not None:
            last = summarise_stacked(stacked)
        else:
            if engine is not None:  # the engine failed on this model: the loop, from now on
                mode = f"sequential: {self._batched_failed[id(closure.model)]}"
            last = self._loop(closure)
        if mode:
            last["m_sharpness"] = self.config["m_sharpness"] = mode
        self._descend(last)
        return last["loss"]

    def _loop(self, closure: Callable[..., Any]) -> dict[str, Any]:
        """The loop engine: the closure and the two halves, chunk by chunk (``2 m`` closure calls);
        the descent gradient is the mean of the chunks' gradients at their perturbed points."""
        if self.m == 1:
            return self._halves(closure, None)
        sums: dict[torch.Tensor, torch.Tensor] = {}
        records = []
        for k in range(self.m):
            records.append(self._halves(closure, k))
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        if p in sums:
                            sums[p].add_(p.grad)
                        else:
                            sums[p] = p.grad.detach().clone()
        for p, s in sums.items():
            p.grad = s.div_(self.m)
        return summarise(records)

    def _halves(self, closure: Callable[..., Any], chunk: int | None) -> dict[str, Any]:
        """One chunk: the closure at ``w``, the first half, the closure at ``w + eps``, ``w`` restored."""
        loss = self._call(closure, chunk) if self.passes == 2 else None
        self._first_half()
        try:
            loss_eps = self._call(closure, chunk)
        finally:
            diag = self._restore()
        if loss is None:
            return {**diag, "loss_perturbed": loss_eps, "loss": loss_eps}
        return {"loss": loss, **diag, "loss_perturbed": loss_eps}

    def _chunk_step(self, engine: Any, closure: Any) -> dict[str, torch.Tensor] | None:
        """The vectorised engines: the ``m`` gradients at ``w`` (one pass), the ``m`` perturbations at
        once, the sum of the gradients at ``w + eps_k`` (one pass) as ``p.grad``; the per-chunk values
        ``[m]``, or ``None`` (nothing changed) after recording why the loop must run."""
        pairs = self._pairs()
        params = [p for _, p in pairs]  # chunk_gradients detaches
        gen = getattr(self, "generator", None)
        rng = gen.get_state() if isinstance(gen, torch.Generator) else None
        try:
            grads, losses, bn_stats = chunk_gradients(engine, params, stacked=False)
            eps, diag = self._perturbation(pairs, grads)
            points = torch._foreach_add(params, list(eps))
            descent, losses_eps, _ = chunk_gradients(engine, points, stacked=True, reduce=True)
        except NotVectorisable as exc:
            fail(self, closure, exc)
            if rng is not None:
                gen.set_state(rng)
            self._begin_step()
            return None
        torch._foreach_div_(descent, float(engine.m))
        for (_, p), d in zip(pairs, descent):
            p.grad = d
        engine.apply_bn_updates(bn_stats)
        return {"loss": losses, **diag, "loss_perturbed": losses_eps}

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
        check_closure_grads((p for g in self.param_groups for p in g["params"]), type(self).__name__)
        if not isinstance(loss, torch.Tensor):
            loss = torch.as_tensor(loss)
        return loss.detach() if loss.requires_grad else loss  # a detached loss as it is (no alias)

    def _check_closure(self, closure: Any) -> None:
        if closure is None or not callable(closure):
            raise TypeError(
                f"{type(self).__name__}.step requires a closure (zero_grad, forward, backward; closure "
                "must return the loss): opt.step(closure); or run the two passes yourself around "
                "opt.first_step() and opt.second_step() (optimizers.perturbation)"
            )
        if self.m > 1 and not accepts_chunk(closure):
            raise TypeError(
                f"with m={self.m} the closure must accept a chunk index, e.g. `def closure(chunk=None)`, "
                "and compute the loss on sub-batch `chunk` of the batch"
            )

    def _first_half(self) -> None:
        """``w <- w + eps`` from the gradients in ``p.grad`` (a stack of one chunk); ``w`` and the
        BatchNorm statistics saved for :meth:`_restore`."""
        if self.passes == 2:
            pairs = params_with_grad(self.param_groups)
            eps, diag = self._perturbation(pairs, [p.grad.unsqueeze(0) for _, p in pairs])
        else:
            pairs = self._pairs()
            eps, diag = self._perturbation(pairs, None)
        params = [p for _, p in pairs]
        saved = [p.clone() for p in params]  # under no_grad: plain copies
        snap = bn_snapshot(self.model) if self.passes == 2 else []
        if params:
            torch._foreach_add_(params, [e[0] for e in eps])
        self._split = dict(params=params, saved=saved, snap=snap, diag=diag, marks=None)
        self.perturbed = True

    def _restore(self) -> dict[str, Any]:
        """``w`` and the BatchNorm statistics back as before :meth:`_first_half`; its diagnostics."""
        split = self._split
        params, saved, snap = split["params"], split["saved"], split["snap"]  # type: ignore[index]
        self._split = None
        self.perturbed = False
        if params:  # no_grad: an exception may have left grad mode on while unwinding
            with torch.no_grad():
                torch._foreach_copy_(params, saved)
        bn_restore(snap)
        return split["diag"]  # type: ignore[index]

    def _pairs(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _descend(self, last: dict[str, Any]) -> None:
        """The base step from ``p.grad`` (``w`` restored): the gradients checked (the norm of the
        gradient at ``w`` the perturbation computed, ``last["grad_norm"]``, and the descent
        gradient; :func:`optimizers.step_protocol.check_finite`), then ``self.last = last``,
        :meth:`_adjust_descent` and the base optimizer's step."""
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        first = [last["grad_norm"]] if "grad_norm" in last else []
        check_finite(self, first, grads, ("at w", "at w + eps"), last.get("loss"))
        self.last = last
        self._adjust_descent()
        self.base_optimizer.step()

    def _check_split(self, name: str) -> None:
        # torch.optim wraps every subclass's step (profiling hooks): compare the functions inside
        if inspect.unwrap(type(self).step) is not inspect.unwrap(PerturbationOptimizer.step):
            # e.g. FlatSGLD's noise after the update, FlatSGVB's KL bookkeeping
            raise NotImplementedError(
                f"{type(self).__name__}.{name}: this optimizer does more in step() than the two halves "
                "can reproduce; use step(closure)"
            )
        if self.m != 1:
            raise ValueError(
                f"{type(self).__name__}.{name}: first_step/second_step take one perturbation per step; "
                f"with m={self.m} (m-sharpness) use step(closure) with closure(chunk)"
            )

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False) -> None:
        """``w <- w + eps`` from the gradients in ``p.grad`` (those at ``w``; single-pass methods
        need none); ``zero_grad=True`` then clears them for the pass at ``w + eps``."""
        self._expect("first_step()", IDLE)
        self._check_split("first_step")
        params = [p for g in self.param_groups for p in g["params"]]
        if self.passes == 2:
            self._require_new_grads("first_step()", params, "w")
        self._begin_step()
        self._first_half()
        if zero_grad:
            self.zero_grad()
        self._split.update(marked=params, marks=grad_marks(params))  # type: ignore[union-attr]

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False) -> None:
        """Restore ``w`` (and the BatchNorm statistics) and let the base optimizer step with the
        gradients in ``p.grad`` (those at ``w + eps``; clip them before this call if you clip).
        Refused, the step left open, when no backward pass wrote a gradient since :meth:`first_step`."""
        self._expect("second_step()", OPEN)
        params = [p for g in self.param_groups for p in g["params"]]
        self._require_new_grads("second_step()", params, "w + eps", ("first_step()", self._split["marks"]))
        self._descend(dict(self._restore()))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def cancel_step(self, zero_grad: bool = True) -> None:
        """Undo :meth:`first_step` without an update: ``w`` and the BatchNorm statistics restored."""
        self._expect("cancel_step()", OPEN)
        self._restore()
        if zero_grad:
            self.zero_grad()
