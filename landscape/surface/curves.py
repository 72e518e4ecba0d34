"""Trained low-loss curves between two minima and the plane through their three defining points.

Garipov, Izmailov, Podoprikhin, Vetrov & Wilson, "Loss surfaces, mode connectivity, and fast
ensembling of DNNs", NeurIPS 2018, Sec. 3: a curve ``phi(t)``, ``t in [0, 1]``, with ``phi(0) =
theta_a`` and ``phi(1) = theta_b`` fixed and a bend ``theta_c`` trained by minimising
``E_{t ~ U(0, 1)} L(phi(t))`` with one sampled ``t`` per step (their eq. 3):

* quadratic Bezier curve: ``phi(t) = (1 - t)^2 theta_a + 2 t (1 - t) theta_c + t^2 theta_b``;
* polygonal chain with one bend: ``phi(t) = 2 (t theta_c + (0.5 - t) theta_a)`` for ``t <= 1/2`` and
  ``2 ((t - 0.5) theta_b + (1 - t) theta_c)`` for ``t > 1/2``.

The bend starts at the midpoint ``(theta_a + theta_b) / 2`` (both curves then coincide with the
straight line; Garipov et al.'s linear initialisation). During training BatchNorm layers use batch
statistics (the running statistics of ``phi(t)`` are unknown); at evaluation points they are
re-estimated (:func:`landscape.surface.paths.recompute_bn`). Every forward is a
``torch.func.functional_call`` with the curve's parameters: the caller's models are never written.
The plane through the ends and the bend is in :mod:`landscape.surface.planes`.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.checks import check_int, check_nonnegative, check_positive, check_seed
from landscape.inputs import _map_inputs
from landscape.surface.evaluators import model_hash
from landscape.surface.paths import (
    PathResult,
    Tensors,
    _buffers_at,
    _check_bn,
    _check_pair,
    _check_ts,
    _combine,
    _end_state,
    _make_objective,
    _run_path,
    _tracked_bn,
    recompute_bn,
)

__all__ = ["CURVES", "Curve", "curve_weights", "evaluate_path", "fit_curve"]

#: Curve kinds :func:`fit_curve` trains.
CURVES = ("bezier", "polychain")


def curve_weights(kind: str, t: float) -> tuple[float, float, float]:
    """Coefficients ``(w_a, w_c, w_b)`` of ``phi(t) = w_a theta_a + w_c theta_c + w_b theta_b``
    (Garipov et al. 2018, Sec. 3); exactly ``(1, 0, 0)`` at ``t = 0`` and ``(0, 0, 1)`` at ``t = 1``."""
    if kind == "bezier":
        return (1.0 - t) ** 2, 2.0 * t * (1.0 - t), t * t
    if kind == "polychain":
        return (1.0 - 2.0 * t, 2.0 * t, 0.0) if t <= 0.5 else (0.0, 2.0 - 2.0 * t, 2.0 * t - 1.0)
    raise ValueError(f"kind must be one of {CURVES}, got {kind!r}")


class Curve:
    """A curve ``phi(t)`` between two models with a (trained) bend; see the module docstring.

    Attributes:
        kind: ``"bezier"`` or ``"polychain"``.
        theta_a, theta_b, theta_c: dicts name -> tensor (all parameters; objective dtype/device).
        objective: the ``landscape.Objective`` the bend was trained on (``model_a`` and the data);
            its data re-estimates BatchNorm statistics at evaluation points by default.
        history: ``{"loss": [...], "t": [...]}``, the minibatch loss and sampled ``t`` of every step.
        config: the training configuration.
    """

    def __init__(self, kind, objective, theta_a, theta_b, theta_c, buffers_a, buffers_b, history, config):
        self.kind = kind
        self.objective = objective
        self.model = objective.model
        self.theta_a, self.theta_b, self.theta_c = theta_a, theta_b, theta_c
        self.buffers_a, self.buffers_b = buffers_a, buffers_b
        self.history = history
        self.config = config
        self.names = list(theta_a)

    def __repr__(self) -> str:
        return f"Curve(kind={self.kind!r}, steps={len(self.history['loss'])}, params={len(self.names)})"

    def weights(self, t: float) -> tuple[float, float, float]:
        return curve_weights(self.kind, float(t))

    def params_at(self, t: float, bend: Mapping[str, torch.Tensor] | None = None) -> Tensors:
        """The parameters ``phi(t)`` (``bend`` replaces ``theta_c``, e.g. tensors requiring grad)."""
        wa, wc, wb = self.weights(t)
        return _combine([wa, wc, wb], [self.theta_a, self.theta_c if bend is None else bend, self.theta_b],
                        self.names)  # fmt: skip

    def point(self, t: float, *, bn: str = "recompute", bn_data: Any = None) -> Tensors:
        """Parameters and buffers at ``phi(t)`` (names of ``named_parameters`` / ``named_buffers``;
        load with ``model.load_state_dict(sd, strict=False)``). ``bn="recompute"`` re-estimates
        BatchNorm statistics on ``bn_data`` (default: the training data); ``"eval"`` interpolates the
        ends' statistics linearly in ``t``."""
        t = _check_t(t)
        if bn not in ("recompute", "eval"):
            raise ValueError(f"bn must be 'recompute' or 'eval', got {bn!r}")
        if bn_data is not None and bn != "recompute":
            raise ValueError(f"bn_data is used only with bn='recompute' (got bn={bn!r}); drop it or switch")
        params = self.params_at(t)
        buffers = _buffers_at(t, self.buffers_a, self.buffers_b)
        if bn == "recompute" and _tracked_bn(self.model):
            bn_obj = self.objective if bn_data is None else self.objective.with_data(bn_data)
            buffers = recompute_bn(bn_obj, params, buffers)
        return {**params, **buffers}

    def model_at(self, t: float, *, bn: str = "recompute", bn_data: Any = None) -> nn.Module:
        """A new model (a deep copy of ``model_a``) holding :meth:`point` ``(t)``."""
        sd = self.point(t, bn=bn, bn_data=bn_data)
        model = copy.deepcopy(self.model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(sd[n])
                p.grad = None
            for n, b in model.named_buffers():
                b.copy_(sd[n])
        return model


def _check_t(t: Any) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
        raise TypeError(f"t must be a number in [0, 1], got {type(t).__name__}")
    if not 0.0 <= float(t) <= 1.0:
        raise ValueError(f"t must lie in [0, 1] (the curve's parameter), got {t!r}")
    return float(t)


def _make_optimizer(optimizer: Any, leaves: list[torch.Tensor], lr: float, momentum: float, wd: float):
    if callable(optimizer) and not isinstance(optimizer, str):
        opt = optimizer(leaves)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(
                f"optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}"
            )
        return opt
    if optimizer == "adam":
        return torch.optim.Adam(leaves, lr=lr, weight_decay=wd)
    if optimizer == "sgd":
        return torch.optim.SGD(leaves, lr=lr, momentum=momentum, weight_decay=wd)
    raise ValueError(f"optimizer must be 'adam', 'sgd' or a callable params -> Optimizer, got {optimizer!r}")


def _batch_stream(obj, batch_size: int | None, gen: torch.Generator) -> Iterable[tuple[Any, torch.Tensor]]:
    """Endless minibatches: seeded random subsets of one batch (``batch_size``), seeded random picks
    from a list of batches, or a re-iterable (DataLoader) cycled in its own order."""
    in_memory = isinstance(obj.data, (list, tuple))
    if batch_size is not None:
        ((x, y, _),) = list(obj.batches())
        n = int(y.shape[0])
        while True:
            idx = torch.randperm(n, generator=gen)[:batch_size].to(y.device)
            yield _map_inputs(x, lambda v, idx=idx: v[idx]), y[idx]
    if in_memory:
        cached = [(x, y) for x, y, _ in obj.batches()]
        while True:
            yield cached[int(torch.randint(len(cached), (1,), generator=gen))]
    while True:
        yield from ((x, y) for x, y, _ in obj.batches())


def fit_curve(
    model_a: nn.Module,
    model_b: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Any,
    *,
    kind: str = "bezier",
    steps: int = 1000,
    lr: float = 1e-2,
    optimizer: str | Callable[[list[torch.Tensor]], torch.optim.Optimizer] = "adam",
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    batch_size: int | None = None,
    seed: int = 0,
    init: nn.Module | Mapping[str, torch.Tensor] | None = None,
    mode: str = "eval",
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    output_fn: Callable[[Any], torch.Tensor] | None = None,
    reduction: str = "auto",
    progress: bool = False,
) -> Curve:
    """Train the bend of a curve from ``model_a`` to ``model_b`` (Garipov et al. 2018, Sec. 3, eq. 3).

    Every step draws ``t ~ U(0, 1)`` and a minibatch (both from one generator seeded with ``seed``),
    evaluates ``loss_fn`` at ``phi(t)`` with ``torch.func.functional_call`` and updates ``theta_c``
    (the parameters that require grad in ``model_a``; the others stay at the midpoint).

    Args:
        kind: ``"bezier"`` or ``"polychain"``.
        steps, lr, optimizer, momentum, weight_decay: ``steps`` updates with Adam (default) or SGD
            (``momentum``), or ``optimizer(params) -> torch.optim.Optimizer``; ``weight_decay`` on
            the bend (Garipov et al. use it).
        batch_size: minibatch size drawn from one ``(inputs, targets)`` batch (``None``: the whole
            batch, or one batch of a list picked at random per step).
        seed: seeds the draws of ``t`` and of minibatches.
        init: the initial bend (a model or dict name -> tensor; default the midpoint).
        mode, dtype, device, output_fn, reduction: as for ``landscape.Objective`` (BatchNorm layers
            use batch statistics during training whatever ``mode``).
        progress: tqdm bar over steps.

    Returns:
        :class:`Curve`; evaluate it with :func:`evaluate_path`.
    """
    t0 = time.perf_counter()
    _check_pair(model_a, model_b)
    if kind not in CURVES:
        raise ValueError(f"kind must be one of {CURVES}, got {kind!r}")
    check_int("steps", steps, minimum=0)
    check_positive("lr", lr)
    check_nonnegative("weight_decay", weight_decay)
    check_seed(seed, allow_generator=False)
    if batch_size is not None:
        check_int("batch_size", batch_size, minimum=1)
    obj = _make_objective(
        model_a,
        loss_fn,
        data,
        mode=mode,
        dtype=dtype,
        device=device,
        output_fn=output_fn,
        reduction=reduction,
    )
    if batch_size is not None and not (isinstance(obj.data, (list, tuple)) and len(obj.data) == 1):
        raise ValueError(
            "batch_size applies to one (inputs, targets) batch of tensors; with a list of batches or a "
            "DataLoader leave batch_size=None (one batch per step)"
        )
    pa, ba = _end_state(obj, model_a, "model_a")
    pb, bb = _end_state(obj, model_b, "model_b")
    names = list(pa)
    if init is None:
        pc = _combine([0.5, 0.5], [pa, pb], names)
    else:
        if isinstance(init, nn.Module):
            _check_pair(model_a, init)
            src = dict(init.named_parameters())
        else:
            src = dict(init)
        missing = [n for n in names if n not in src or tuple(src[n].shape) != tuple(pa[n].shape)]
        if missing:
            raise ValueError(
                f"init lacks parameters or has other shapes at {missing[:5]}; pass a model like model_a"
            )
        pc = {n: obj.convert(torch.as_tensor(src[n]).detach()).clone() for n in names}
    trainable = [n for n, p in model_a.named_parameters() if p.requires_grad]
    leaves = {n: pc[n].clone().requires_grad_(True) for n in trainable}
    opt = _make_optimizer(optimizer, list(leaves.values()), lr, momentum, weight_decay)
    gen = torch.Generator().manual_seed(int(seed))
    stream = _batch_stream(obj, batch_size, gen)
    weights = lambda t: curve_weights(kind, t)  # noqa: E731
    history: dict[str, list[float]] = {"loss": [], "t": []}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"fit {kind}", unit="step")
    try:
        with obj.guard():
            for _, m in _tracked_bn(obj.model):
                m.training = True
            scratch = obj.buffers()
            for step in range(steps):
                t = float(torch.rand((), generator=gen, dtype=torch.float64))
                x, y = next(stream)
                bend = {**pc, **leaves}
                with torch.enable_grad():
                    params = _combine(weights(t), [pa, bend, pb], names)
                    loss = obj.loss_fn(obj.call(params, scratch, x), y)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise FloatingPointError(
                        f"curve training diverged at step {step + 1} (loss {value}); lower lr"
                    )
                grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
                for leaf, g in zip(leaves.values(), grads):
                    leaf.grad = torch.zeros_like(leaf) if g is None else g
                opt.step()
                history["loss"].append(value)
                history["t"].append(t)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    theta_c = {n: (leaves[n] if n in leaves else pc[n]).detach().clone() for n in names}
    config = {
        "kind": kind,
        "steps": steps,
        "lr": lr,
        "optimizer": optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "callable"),
        "momentum": momentum if optimizer == "sgd" else None,
        "weight_decay": weight_decay,
        "batch_size": batch_size,
        "seed": seed,
        "init": "midpoint" if init is None else "given",
        "t_distribution": "uniform(0, 1), one t per step",
        "bn_during_training": "batch statistics" if _tracked_bn(model_a) else None,
        "trained": trainable,
        "model_hash_a": model_hash(model_a),
        "model_hash_b": model_hash(model_b),
        "objective": obj.config(),
        "seconds": time.perf_counter() - t0,
    }
    return Curve(kind, obj, pa, pb, theta_c, ba, bb, history, config)


def evaluate_path(
    curve: Curve,
    *,
    data: Any = None,
    n_points: int = 21,
    ts: Sequence[float] | np.ndarray | torch.Tensor | None = None,
    bn: str = "recompute",
    bn_data: Any = None,
    progress: bool = False,
) -> PathResult:
    """Loss and accuracy along a trained curve (at ``n_points`` evenly spaced ``t`` or at ``ts`` in
    ``[0, 1]``), its maximum and barrier heights (defined in :mod:`landscape.surface.path_result`).

    ``data``: the data to measure on (default: the training data). ``bn``: ``"recompute"``
    (default: BatchNorm statistics re-estimated at every point on ``bn_data``, default the
    training data), ``"eval"`` (the ends' statistics interpolated) or ``"train"``.
    """
    if not isinstance(curve, Curve):
        raise TypeError(f"evaluate_path takes a Curve from fit_curve, got {type(curve).__name__}")
    t0 = time.perf_counter()
    _check_bn(bn, bn_data)
    ts = _check_ts(ts, n_points, unit=True)
    obj = curve.objective if data is None else curve.objective.with_data(data)
    bn_obj = curve.objective if bn_data is None else curve.objective.with_data(bn_data)
    if data is None and bn_data is None:
        bn_obj = obj

    def state_at(t: float) -> tuple[Tensors, Tensors]:
        return curve.params_at(t), _buffers_at(t, curve.buffers_a, curve.buffers_b)

    config = {"curve": {k: v for k, v in curve.config.items() if k != "objective"}}
    desc = None
    if bn_obj is curve.objective and obj is not curve.objective:
        desc = f"the curve's training data ({bn_obj.num_examples} examples)"
    return _run_path(
        obj, curve.kind, ts, state_at, bn, bn_obj, progress=progress, config=config, t0=t0, bn_desc=desc
    )
