"""Per-example gradient moments: ``sum_i g_i``, ``sum_i g_i^2`` and ``||g_i||`` from one backward pass.

``g_i`` is the gradient of example ``i``'s loss ``losses[i]`` (the per-example losses, a ``[B]``
tensor: "sum" reduction inside; a mean loss ``(1/B) sum_i l_i`` has per-example gradients
``g_i / B``, so its moments are ``sum / B``, ``sum_sq / B^2`` and ``norms / B``).  These are the
quantities of VOGN's precision (Osawa et al. 2019, Alg. 1: the mean of the squared per-example
gradients), the empirical Fisher's diagonal, the gradient-noise scale and a diagonal Laplace.

Two implementations behind one call (:class:`PerExampleGradients`), chosen once per model with the
reason recorded (``config()``):

* ``"layers"``: forward hooks record every layer's input ``a`` and a hook on its output the gradient
  ``d = dL/dz`` of the ordinary backward pass of ``sum_i losses[i]`` (which also gives ``sum_i
  g_i``); the squares and norms come from ``(a, d)`` layer by layer
  (:mod:`optimizers.layer_gradients`: ``nn.Linear`` with any leading dimensions, ``nn.Conv1d/2d``,
  ``nn.LayerNorm``, ``nn.GroupNorm``, eval-mode batch norm, ``nn.Embedding``), as the authors'
  VOGN code (torchsso) and BackPACK (Dangel et al. 2020) compute them.  Cost: about one extra
  matrix product per linear layer.
* ``"batched_backward"``: the per-example Jacobian by batched backward passes over rows of an identity
  (``torch.autograd.grad(..., is_grads_batched=True)``, ``chunk_size`` rows at a time), or one
  backward per example where an op has no batching rule; for any model (also one whose examples
  interact, e.g. a train-mode BatchNorm: then ``g_i`` is the gradient of ``losses[i]`` through the
  batch statistics).

``"layers"`` needs: every differentiated parameter owned by a layer with a rule; no batch norm using
batch statistics (checked at every call, the mode may change); every recorded layer input with the
batch as dimension 0.  Functional code that mixes examples cannot be seen in the module tree: with
``verify=True`` (the default) the first call also runs ``"batched_backward"`` and compares; a
mismatch switches the model to it for good, with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from optimizers.layer_gradients import group_gradients, squared_sums, why_not

__all__ = [
    "GradientMoments",
    "PerExampleGradients",
    "batched_backward_moments",
    "empirical_fisher_diagonal",
    "per_example_moments",
]

METHODS = ("auto", "layers", "batched_backward")


@dataclass
class GradientMoments:
    """``sum[j] = sum_i g_ij``, ``sum_sq[j] = sum_i g_ij^2`` (``None``: parameter ``j`` unused),
    ``norms = [||g_i||]`` over all parameters, ``method`` the implementation that computed them."""

    sum: list[torch.Tensor | None]
    sum_sq: list[torch.Tensor | None]
    norms: torch.Tensor
    method: str


def batched_backward_moments(
    losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    chunk_size: int | None = None,
    state: dict[str, Any] | None = None,
    retain_graph: bool = True,
) -> GradientMoments:
    """The moments from the rows of the per-example Jacobian (the ``"batched_backward"`` method):
    batched backward passes over ``chunk_size`` rows of an identity at a time (``None``: all ``B``;
    memory ``chunk_size x p``); if an op has no batching rule, one backward per example from then on
    (``state["batched"] = False``, the error in ``state["batched_error"]``)."""
    state = {} if state is None else state
    params = list(params)
    B = int(losses.shape[0])
    cs = B if chunk_size is None else min(int(chunk_size), B)
    g_sum: list[torch.Tensor | None] = [None] * len(params)
    h_sum: list[torch.Tensor | None] = [None] * len(params)
    norms = losses.new_zeros(B)

    def add(rows: Sequence[torch.Tensor | None], start: int, stop: int) -> None:
        for j, r in enumerate(rows):
            if r is None:
                continue
            gs, hs = r.sum(0), r.square().sum(0)
            g_sum[j] = gs if g_sum[j] is None else g_sum[j] + gs
            h_sum[j] = hs if h_sum[j] is None else h_sum[j] + hs
            norms[start:stop] += r.reshape(r.shape[0], -1).square().sum(1).to(norms.dtype)

    eye = torch.eye(B, dtype=losses.dtype, device=losses.device)
    for start in range(0, B, cs):
        stop = min(B, start + cs)
        last = stop == B and not retain_graph
        if state.get("batched", True):
            try:
                rows = torch.autograd.grad(
                    losses,
                    params,
                    grad_outputs=(eye[start:stop],),
                    is_grads_batched=True,
                    retain_graph=not last,
                    allow_unused=True,
                )
                add(rows, start, stop)
                continue
            except RuntimeError as err:  # an op without a batching rule: one pass per example
                state["batched"] = False
                state["batched_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        for i in range(start, stop):
            gi = torch.autograd.grad(
                losses[i], params, retain_graph=not (last and i == stop - 1), allow_unused=True
            )
            add(tuple(None if g is None else g.unsqueeze(0) for g in gi), i, i + 1)
    return GradientMoments(g_sum, h_sum, norms.sqrt(), "batched_backward")


def _tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4}.get(dtype, 1e-2)


class PerExampleGradients:
    """Per-example gradient moments of ``params`` (parameters of ``model``), method chosen once.

    Use: ``with engine.capture(): losses = forward()`` (per-example losses ``[B]`` attached to the
    graph), then ``engine.moments(losses)`` -> :class:`GradientMoments`.  The forward must run inside
    :meth:`capture` (the layers' inputs and output gradients are recorded there).

    Args:
        params: the tensors to differentiate (each a parameter of ``model``).
        model: the module whose forward computes the losses (``None``: ``"batched_backward"``).
        method: ``"auto"`` (``"layers"`` where the model allows it), ``"layers"`` (raise if not),
            ``"batched_backward"``.
        chunk_size: Jacobian rows per batched backward (``"batched_backward"`` and verification).
        verify: the first :meth:`moments` call also runs ``"batched_backward"`` and keeps
            ``"layers"`` only if the two agree (relative 1e-9 in float64, 1e-4 in float32).
        state: the batched backward's memory of an op without a batching rule (``"batched"``).

    ``method`` / ``reason`` (why ``"batched_backward"``; ``""`` otherwise) and :meth:`config` record
    the choice; ``verified`` says whether the check ran.
    """

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        model: nn.Module | None = None,
        *,
        method: str = "auto",
        chunk_size: int | None = None,
        verify: bool = True,
        state: dict[str, Any] | None = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if chunk_size is not None and (isinstance(chunk_size, bool) or int(chunk_size) < 1):
            raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size!r}")
        self.params = list(params)
        self.chunk_size = chunk_size
        self.requested = method
        self.verify = bool(verify)
        self.verified = False
        self._state: dict[str, Any] = {} if state is None else state
        self._calls: list[list[Any]] = []
        #: per parameter index: its (module, attribute name) slots
        self._owners: list[list[tuple[nn.Module, str]]] = [[] for _ in self.params]
        self._modules: list[nn.Module] = []
        self._batchnorms: list[nn.Module] = []
        self.method, self.reason = "batched_backward", self._plan(model)
        if not self.reason:
            self.method = "layers"
        if method == "layers" and self.reason:
            raise ValueError(f"method='layers' is not possible for this model: {self.reason}")
        if method == "batched_backward":
            self.method, self.reason = "batched_backward", "requested (method='batched_backward')"

    # ------------------------------------------------------------------------------------- plan
    def _plan(self, model: nn.Module | None) -> str:
        """Why this model needs the batched backward ("": the layer rules cover it)."""
        if model is None:
            return "no model given"
        index = {id(p): j for j, p in enumerate(self.params)}
        seen: set[int] = set()
        for name, mod in model.named_modules():
            if isinstance(mod, _BatchNorm):
                self._batchnorms.append(mod)
            mine = [(a, p) for a, p in mod._parameters.items() if p is not None and id(p) in index]
            if not mine:
                continue
            why = why_not(mod)
            if why is not None:
                return f"{name or type(mod).__name__}: {why}"
            self._modules.append(mod)
            for attr, p in mine:
                self._owners[index[id(p)]].append((mod, attr))
                seen.add(id(p))
        missing = [j for j, p in enumerate(self.params) if id(p) not in seen]
        if missing:
            shape = tuple(self.params[missing[0]].shape)
            return f"{len(missing)} parameter(s) (e.g. shape {shape}) are not parameters of model"
        if not self._modules:
            return "no parameters to differentiate"
        return self._batch_statistics()

    def _batch_statistics(self) -> str:
        for mod in self._batchnorms:
            if mod.training or mod.running_mean is None:
                name = type(mod).__name__
                return f"{name} normalises with batch statistics (train mode): the examples interact"
        return ""

    def config(self) -> dict[str, Any]:
        """The choice: ``method``, ``reason``, ``requested``, ``verified``."""
        return dict(method=self.method, reason=self.reason, requested=self.requested, verified=self.verified)

    def _fall_back(self, reason: str) -> None:
        if self.requested == "layers":
            raise ValueError(f"method='layers' is not possible for this model: {reason}")
        self.method, self.reason = "batched_backward", reason

    # ------------------------------------------------------------------------------------- record
    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Record the layers' inputs and output gradients of the forward run inside."""
        self._calls = []
        if self.method != "layers":
            yield
            return
        handles = [mod.register_forward_hook(self._record) for mod in self._modules]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _record(self, mod: nn.Module, inputs: tuple[Any, ...], out: Any) -> None:
        if not torch.is_grad_enabled():
            return
        if not isinstance(out, torch.Tensor) or not inputs or not isinstance(inputs[0], torch.Tensor):
            self._calls.append([mod, None, None, -1])
            return
        if not out.requires_grad:
            return
        rec = [mod, inputs[0], None, inputs[0]._version]
        out.register_hook(lambda g, rec=rec: rec.__setitem__(2, g))
        self._calls.append(rec)

    def _call_problem(self, B: int) -> str:
        why = self._batch_statistics()
        if why:
            return why
        if not self._calls:
            return "no layer call was recorded (run the forward inside capture())"
        for mod, a, _, _ in self._calls:
            name = type(mod).__name__
            if a is None:
                return f"{name} was called without a tensor input or returned a non-tensor"
            if a.dim() == 0 or a.shape[0] != B:
                return (
                    f"{name} saw an input of shape {tuple(a.shape)} for {B} losses: the batch is not "
                    "dimension 0 of every layer input"
                )
        return ""

    # ------------------------------------------------------------------------------------- compute
    def moments(self, losses: torch.Tensor, retain_graph: bool = False) -> GradientMoments:
        """The moments of the per-example gradients of ``losses`` (``[B]``, from the forward run in
        :meth:`capture`); the recorded calls are released."""
        if not isinstance(losses, torch.Tensor) or losses.ndim != 1 or not losses.requires_grad:
            raise ValueError(
                "losses must be the per-example losses, a 1-D tensor [B] attached to the autograd graph "
                "(e.g. F.cross_entropy(model(x), y, reduction='none')), got "
                + (
                    f"shape {tuple(losses.shape)}"
                    if isinstance(losses, torch.Tensor)
                    else type(losses).__name__
                )
            )
        try:
            if self.method == "layers":
                problem = self._call_problem(int(losses.shape[0]))
                if problem:
                    self._fall_back(problem)
            if self.method != "layers":
                return self._batched(losses, retain_graph)
            check = self.verify and not self.verified
            got = self._layers(losses, retain_graph or check)
            if check:
                ref = self._batched(losses, retain_graph)
                self.verified = True
                bad = self._compare(got, ref)
                if bad:
                    self._fall_back(bad)
                    return ref
            return got
        finally:
            self._calls = []

    def _batched(self, losses: torch.Tensor, retain_graph: bool) -> GradientMoments:
        return batched_backward_moments(losses, self.params, self.chunk_size, self._state, retain_graph)

    def _layers(self, losses: torch.Tensor, retain_graph: bool) -> GradientMoments:
        B = int(losses.shape[0])
        sums = torch.autograd.grad(losses.sum(), self.params, retain_graph=retain_graph, allow_unused=True)
        by_module: dict[int, list[list[Any]]] = {}
        for rec in self._calls:
            if rec[2] is not None:
                if rec[1]._version != rec[3]:
                    raise RuntimeError(
                        f"the input of a {type(rec[0]).__name__} was modified in place after the layer used "
                        "it; use PerExampleGradients(..., method='batched_backward') for this model"
                    )
                by_module.setdefault(id(rec[0]), []).append(rec)
        sum_sq: list[torch.Tensor | None] = [None] * len(self.params)
        norms = losses.new_zeros(B)
        for j, (p, g) in enumerate(zip(self.params, sums)):
            if g is None:
                continue
            slots = [(rec, attr) for mod, attr in self._owners[j] for rec in by_module.get(id(mod), [])]
            if not slots:
                raise RuntimeError(
                    f"a parameter of shape {tuple(p.shape)} has a gradient but its layer recorded no call "
                    "(it is used outside its module's forward); use method='batched_backward' for this model"
                )
            with torch.no_grad():
                if len(slots) == 1:
                    (mod, a, d, _), attr = slots[0]
                    sq, nrm = squared_sums(mod, a, d, (attr,))[attr]
                else:  # a layer called several times / a tied parameter: sum per example, then square
                    per = sum(group_gradients(mod, a, d, B, (attr,))[attr] for (mod, a, d, _), attr in slots)
                    sq, nrm = per.square().sum(0), per.reshape(B, -1).square().sum(1)
                sum_sq[j] = sq.to(p.dtype)
                norms += nrm.to(norms.dtype)
        return GradientMoments(list(sums), sum_sq, norms.sqrt(), "layers")

    def _compare(self, got: GradientMoments, ref: GradientMoments) -> str:
        """The first disagreement of the layer rules with the batched backward ("" if none)."""
        for j, (a, b) in enumerate(zip(got.sum_sq, ref.sum_sq)):
            if (a is None) != (b is None):
                return f"parameter {j} is differentiated by one method only"
            if a is None:
                continue
            tol = _tolerance(b.dtype)
            err = float((a - b).abs().max())
            if err > tol * float(b.abs().max()) + 1e-30:
                return (
                    f"the layer rules disagree with the batched backward on parameter {j} (shape "
                    f"{tuple(b.shape)}, max error {err:.2e}): the examples interact, or the batch is not "
                    "dimension 0 of every layer"
                )
        return ""


def per_example_moments(
    model: nn.Module,
    losses_fn: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor] | None = None,
    *,
    method: str = "auto",
    chunk_size: int | None = None,
    verify: bool = False,
) -> GradientMoments:
    """One-shot :class:`PerExampleGradients`: ``losses_fn()`` runs ``model``'s forward and returns
    the per-example losses ``[B]``; ``params`` default to ``model``'s that require grad."""
    params = [p for p in model.parameters() if p.requires_grad] if params is None else list(params)
    engine = PerExampleGradients(params, model, method=method, chunk_size=chunk_size, verify=verify)
    with torch.enable_grad(), engine.capture():
        losses = losses_fn()
    return engine.moments(losses)


def empirical_fisher_diagonal(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Any,
    params: Sequence[torch.Tensor] | None = None,
    *,
    reduction: str = "mean",
    method: str = "auto",
    chunk_size: int | None = None,
) -> list[torch.Tensor]:
    """``c sum_n g_n^2`` per parameter over the examples of ``data`` (one ``(x, y)`` batch or an
    iterable of them): the diagonal of the empirical Fisher ``c sum_n g_n g_n^T`` (Kunstner et al.
    2019, "Limitations of the empirical Fisher approximation", eq. 3; ``c = 1/N`` for ``"mean"``,
    ``1`` for ``"sum"``, the convention of :func:`landscape.empirical_fisher`).  ``loss_fn(outputs,
    targets)`` must return the per-example losses ``[B]`` (e.g. ``nn.CrossEntropyLoss(reduction=
    "none")``).  The model is evaluated in its current mode."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    params = [p for p in model.parameters() if p.requires_grad] if params is None else list(params)
    engine = PerExampleGradients(params, model, method=method, chunk_size=chunk_size, verify=False)
    batches = (
        [data] if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor) else data
    )
    total: list[torch.Tensor] = [torch.zeros_like(p) for p in params]
    n = 0
    for x, y in batches:
        with torch.enable_grad(), engine.capture():
            losses = loss_fn(model(x), y)
        mom = engine.moments(losses)
        n += int(losses.shape[0])
        for t, s in zip(total, mom.sum_sq):
            if s is not None:
                t += s
    if n == 0:
        raise ValueError("data holds no examples; pass an (inputs, targets) batch or a list of them")
    if reduction == "mean":
        total = [t / n for t in total]
    return total
