"""Paths between two minima: the loss and accuracy along ``theta(t)``, ``t in [0, 1]``, and the barrier.

:func:`interpolate` evaluates the straight line ``theta_t = (1 - t) theta_a + t theta_b`` (Goodfellow,
Vinyals & Saxe 2015; Frankle et al. 2020); trained curves (quadratic Bezier, polygonal chain; Garipov
et al. 2018) live in :mod:`landscape.surface.curves` and are evaluated with the same machinery.

Exact end points: a point on a path is a weighted sum ``sum_i w_i(t) theta_i`` in which terms with
``w_i = 0`` are left out and a lone weight ``1`` is a copy, so ``t = 0`` is ``theta_a`` and ``t = 1``
is ``theta_b`` bit for bit (``theta_a + t (theta_b - theta_a)`` is not: at ``t = 1`` it rounds), and the
losses there equal ``Objective(model_a, ...).loss()`` / ``Objective(model_b, ...).loss()`` exactly
(``bn="eval"``; the arithmetic is the Objective's own).

BatchNorm (``bn``): interpolated weights with the end models' running statistics give wrong losses
(the statistics belong to other weights), so by default (``"recompute"``) every point's running
statistics are re-estimated on data (:func:`recompute_bn`, as Garipov et al. 2018, Sec. 3, do at
test time), then the point is evaluated in eval mode. ``"eval"`` interpolates the stored statistics
linearly in ``t`` (exact at the ends only); ``"train"`` uses batch statistics.

Barrier heights: :mod:`landscape.surface.path_result`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.inputs import _num_correct
from landscape.objective import Objective
from landscape.surface.evaluators import _bn_modules, model_hash
from landscape.surface.path_result import BARRIER_DEFINITION, PathResult, barriers

__all__ = ["BN_POLICIES", "PathResult", "interpolate", "recompute_bn"]

#: BatchNorm policies along a path (see the module docstring).
BN_POLICIES = ("recompute", "eval", "train")

Tensors = dict[str, torch.Tensor]


# ------------------------------------------------------------------------------------ path points


def _combine(weights: Sequence[float], sets: Sequence[Mapping[str, torch.Tensor]], names) -> Tensors:
    """``sum_i w_i sets[i][n]`` for every name; zero weights are left out and a lone weight 1 is a
    copy, so end points of a path are reproduced bit for bit."""
    terms = [(float(w), s) for w, s in zip(weights, sets) if float(w) != 0.0]
    if not terms:
        raise ValueError("a path point needs at least one non-zero weight")
    out = {}
    for n in names:
        if len(terms) == 1 and terms[0][0] == 1.0:
            out[n] = terms[0][1][n].clone()
            continue
        acc = terms[0][1][n] * terms[0][0]
        for w, s in terms[1:]:
            acc = acc + s[n] * w
        out[n] = acc
    return out


def _buffers_at(t: float, ba: Tensors, bb: Tensors) -> Tensors:
    """Floating buffers ``(1 - t) b_a + t b_b`` (exact at the ends); integer buffers (e.g.
    ``num_batches_tracked``) from the nearer end."""
    floats = [n for n, v in ba.items() if v.is_floating_point()]
    out = _combine([1.0 - t, t], [ba, bb], floats)
    for n, v in ba.items():
        if n not in out:
            out[n] = (v if t <= 0.5 else bb[n]).clone()
    return out


def _check_pair(model_a: Any, model_b: Any) -> None:
    for name, m in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(m, nn.Module):
            raise TypeError(f"{name} must be a torch.nn.Module, got {type(m).__name__}")
    if type(model_a) is not type(model_b):
        raise ValueError(
            f"model_a is a {type(model_a).__name__} and model_b a {type(model_b).__name__}; a path needs "
            "two models of one architecture"
        )
    for what, fa, fb in (
        ("parameters", model_a.named_parameters(), model_b.named_parameters()),
        ("buffers", model_a.named_buffers(), model_b.named_buffers()),
    ):
        sa = {n: tuple(t.shape) for n, t in fa}
        sb = {n: tuple(t.shape) for n, t in fb}
        if sa != sb:
            diff = sorted(set(sa) ^ set(sb)) or [n for n in sa if sa[n] != sb[n]]
            raise ValueError(
                f"model_a and model_b have different {what} (names or shapes differ at {diff[:5]}); a "
                "path needs two models of one architecture"
            )


def _end_state(obj, model: nn.Module, what: str) -> tuple[Tensors, Tensors]:
    """Copies of ``model``'s parameters and buffers in the objective's dtype/device."""
    params = {n: obj.convert(p.detach()).clone() for n, p in model.named_parameters()}
    bad = [n for n, p in params.items() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ValueError(f"{what} has NaN or inf parameters ({bad[:5]}); a path from it is undefined")
    buffers = {n: obj.convert(b.detach()).clone() for n, b in model.named_buffers()}
    return params, buffers


def _tracked_bn(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in _bn_modules(model) if m.track_running_stats and m.running_mean is not None]


# ----------------------------------------------------------------------------------------- BatchNorm


def recompute_bn(obj: Any, params: Any = None, buffers: Mapping[str, torch.Tensor] | None = None) -> Tensors:
    """Buffers with every BatchNorm layer's running statistics re-estimated on ``obj``'s data.

    One pass over the data with the BatchNorm layers in train mode (batch statistics, as in training
    and in ``torch.optim.swa_utils.update_bn``; every other module in ``obj.mode``); a layer's
    ``running_mean`` / ``running_var`` become the mean and the unbiased variance of its inputs over
    *all* examples (and positions), pooled exactly across batches (Chan et al.'s update of mean and
    sum of squares in float64), rather than an average of per-batch statistics; with one batch both
    agree. ``num_batches_tracked`` counts the batches.

    Args:
        obj: a ``landscape.Objective`` (model, data, dtype/device); its model is not modified.
        params: parameters to evaluate at (``None``: the model's; a dict or flat vector as
            ``Objective.loss`` takes).
        buffers: the buffers to start from (``None``: the model's); non-BatchNorm buffers are kept.

    Returns:
        A new dict name -> tensor of all buffers (the objective's dtype/device).
    """
    full = obj.point(params, copy=True)
    out = {n: t.clone() for n, t in (obj.buffers() if buffers is None else buffers).items()}
    bns = _tracked_bn(obj.model)
    if not bns:
        return out
    acc_dtype = torch.float32 if obj.device.type == "mps" else torch.float64
    stats: dict[str, list] = {name: [0, None, None] for name, _ in bns}  # count, mean, M2
    batches = [0]

    def make_hook(name: str):
        def hook(module, args):
            x = args[0].detach().to(acc_dtype)
            dims = [0, *range(2, x.ndim)]
            n = x.numel() // x.shape[1]
            mean = x.mean(dim=dims)
            m2 = ((x - mean.view(1, -1, *([1] * (x.ndim - 2)))) ** 2).sum(dim=dims)
            c, mu, s = stats[name]
            if c == 0:
                stats[name] = [n, mean, m2]
            else:
                delta, total = mean - mu, c + n
                stats[name] = [total, mu + delta * (n / total), s + m2 + delta**2 * (c * n / total)]

        return hook

    handles = []
    try:
        for name, m in bns:
            handles.append(m.register_forward_pre_hook(make_hook(name)))
        with obj.guard(), torch.no_grad():
            for _, m in bns:
                m.training = True
            scratch = {n: t.clone() for n, t in out.items()}
            for x, _, _ in obj.batches():
                obj.call(full, scratch, x)
                batches[0] += 1
    finally:
        for h in handles:
            h.remove()
    for name, _ in bns:
        count, mean, m2 = stats[name]
        pre = f"{name}." if name else ""
        if count < 2:
            raise ValueError(
                f"BatchNorm layer {name!r} saw {count} value(s) per channel in the data; its variance "
                "is undefined: recompute the statistics on more data"
            )
        rm, rv = out[pre + "running_mean"], out[pre + "running_var"]
        out[pre + "running_mean"] = mean.to(dtype=rm.dtype, device=rm.device)
        out[pre + "running_var"] = (m2 / (count - 1)).to(dtype=rv.dtype, device=rv.device)
        if pre + "num_batches_tracked" in out:
            nbt = out[pre + "num_batches_tracked"]
            out[pre + "num_batches_tracked"] = torch.full_like(nbt, batches[0])
    return out


# ---------------------------------------------------------------------------------------- evaluation


def _score(obj, params: Tensors, buffers: Tensors, bn_train: bool) -> tuple[float, float | None]:
    """Whole-data loss and accuracy at ``(params, buffers)`` with the arithmetic of
    ``Objective.loss`` / ``Objective.evaluate`` (so an end point reproduces them bit for bit)."""
    with obj.guard(), torch.no_grad():
        if bn_train:
            for _, m in _bn_modules(obj.model):
                m.training = True
            buffers = {n: t.clone() for n, t in buffers.items()}
        total = torch.zeros((), dtype=obj.dtype, device=obj.device)
        correct = torch.zeros((), dtype=torch.float64, device=obj.device)
        classify = True
        for x, y, w in obj.batches():
            out = obj.call(params, buffers, x)
            total = total + w * obj.loss_fn(out, y)
            if classify:
                c = _num_correct(out, y)
                classify = c is not None
                if classify:
                    correct = correct + c
        return float(total), float(correct) / obj.num_examples if classify else None


def _evaluate(obj, ts, state_at: Callable[[float], tuple[Tensors, Tensors]], bn: str, bn_obj, progress):
    """``(losses, accuracies)`` at every ``t`` of ``ts``."""
    has_bn = bool(_tracked_bn(obj.model))
    it = ts
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(ts, desc="path", unit="pt", leave=False)
    losses, accs = [], []
    for t in it:
        params, buffers = state_at(float(t))
        if has_bn and bn == "recompute":
            buffers = recompute_bn(bn_obj, params, buffers)
        lv, av = _score(obj, params, buffers, bn_train=bn == "train")
        losses.append(lv)
        accs.append(av)
    return losses, accs


def _check_ts(ts: Any, n_points: Any, unit: bool) -> list[float]:
    if ts is None:
        if isinstance(n_points, bool) or not isinstance(n_points, (int, np.integer)) or n_points < 2:
            raise ValueError(f"n_points must be an int >= 2 (it includes t = 0 and t = 1), got {n_points!r}")
        return [float(v) for v in np.linspace(0.0, 1.0, int(n_points))]
    a = np.asarray(ts.detach().cpu() if isinstance(ts, torch.Tensor) else ts, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"ts must be a non-empty 1-D array of finite numbers, got shape {a.shape}")
    if a.size > 1 and not np.all(np.diff(a) > 0):
        raise ValueError("ts must be strictly increasing (sort it, e.g. np.unique(ts))")
    if unit and (a[0] < 0.0 or a[-1] > 1.0):
        raise ValueError(f"a curve is defined for t in [0, 1]; got ts from {a[0]} to {a[-1]}")
    return [float(v) for v in a]


def _check_bn(bn: Any, bn_data: Any) -> None:
    if bn not in BN_POLICIES:
        raise ValueError(f"bn must be one of {BN_POLICIES}, got {bn!r}")
    if bn_data is not None and bn != "recompute":
        raise ValueError(f"bn_data is used only with bn='recompute' (got bn={bn!r}); drop it or switch")


def _run_path(
    obj,
    path: str,
    ts: list[float],
    state_at,
    bn: str,
    bn_obj,
    *,
    progress: bool,
    config: dict,
    t0: float,
    bn_desc: str | None = None,
) -> PathResult:
    """Evaluate ``state_at(t)`` at ``ts`` (plus the ends when missing) and build the result."""
    losses, accs = _evaluate(obj, ts, state_at, bn, bn_obj, progress)
    ends = []
    extra = 0
    for t_end in (0.0, 1.0):
        if t_end in ts:
            i = ts.index(t_end)
            ends.append((losses[i], accs[i]))
        else:
            lv, av = _evaluate(obj, [t_end], state_at, bn, bn_obj, False)
            ends.append((lv[0], av[0]))
            extra += 1
    has_acc = all(a is not None for a in accs) and all(e[1] is not None for e in ends)
    bars = barriers(ts, losses, accs if has_acc else [None] * len(ts), ends)
    has_bn = bool(_tracked_bn(obj.model))
    config = {
        **config,
        "path": path,
        "n_points": len(ts),
        "bn": bn,
        "bn_layers": len(_tracked_bn(obj.model)),
        "bn_effective": bn if has_bn else "none (the model has no BatchNorm with running statistics)",
        "bn_data": (bn_desc or ("data" if bn_obj is obj else f"bn_data ({bn_obj.num_examples} examples)"))
        if has_bn and bn == "recompute"
        else None,
        "barrier_definition": BARRIER_DEFINITION,
        "accuracy_ends": [ends[0][1], ends[1][1]] if has_acc else None,
        "objective": obj.config(),
    }
    return PathResult(
        config=config,
        seconds=time.perf_counter() - t0,
        path=path,
        t=list(ts),
        loss=losses,
        accuracy=[float(a) for a in accs] if has_acc else None,
        loss_a=ends[0][0],
        loss_b=ends[1][0],
        evaluations=len(ts) + extra,
        **bars,
    )


def _make_objective(model_a, loss_fn, data, *, mode, dtype, device, output_fn, reduction):
    return Objective(
        model_a,
        loss_fn,
        data,
        mode=mode,
        dtype=dtype,
        device=device,
        output_fn=output_fn,
        reduction=reduction,
    )


# ------------------------------------------------------------------------------------ interpolation


def interpolate(
    model_a: nn.Module,
    model_b: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    data: Any,
    *,
    n_points: int = 21,
    ts: Sequence[float] | np.ndarray | torch.Tensor | None = None,
    bn: str = "recompute",
    bn_data: Any = None,
    mode: str = "eval",
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    output_fn: Callable[[Any], torch.Tensor] | None = None,
    reduction: str = "auto",
    progress: bool = False,
) -> PathResult:
    """Loss and accuracy along the straight line ``theta_t = (1 - t) theta_a + t theta_b``.

    The linear path of Goodfellow, Vinyals & Saxe, "Qualitatively characterizing neural network
    optimization problems", ICLR 2015, and of linear mode connectivity (Frankle et al. 2020); the
    barrier heights are defined in the module docstring. ``t = 0`` and ``t = 1`` are the two models
    bit for bit (their losses equal ``Objective(model_a / model_b, ...).loss()`` exactly with
    ``bn="eval"``, or with ``bn="recompute"`` on a model without BatchNorm).

    Args:
        model_a, model_b: two models of one architecture (same class, parameter and buffer names and
            shapes); ``model_a``'s modules compute every point. Neither is modified.
        loss_fn, data: as for ``landscape.Objective`` (the data the loss is measured on).
        n_points: evenly spaced ``t`` in ``[0, 1]`` (ends included); ignored when ``ts`` is given.
        ts: explicit values of ``t``, strictly increasing; values outside ``[0, 1]`` extrapolate
            the line (they are plotted but do not enter the barrier).
        bn: ``"recompute"`` (default: BatchNorm running statistics re-estimated at every point on
            ``bn_data``, see :func:`recompute_bn`), ``"eval"`` (the ends' stored statistics
            interpolated) or ``"train"`` (batch statistics). Recorded in ``config``.
        bn_data: the data for ``"recompute"`` (default: ``data``; pass the training data when
            ``data`` is a test set).
        mode, dtype, device, output_fn, reduction: as for ``landscape.Objective``; points are formed
            in that dtype on that device.
        progress: tqdm bar over the points.

    Returns:
        :class:`PathResult` with ``path="line"``.
    """
    t0 = time.perf_counter()
    _check_pair(model_a, model_b)
    _check_bn(bn, bn_data)
    ts = _check_ts(ts, n_points, unit=False)
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
    bn_obj = obj if bn_data is None else obj.with_data(bn_data)
    pa, ba = _end_state(obj, model_a, "model_a")
    pb, bb = _end_state(obj, model_b, "model_b")
    names = list(pa)

    def state_at(t: float) -> tuple[Tensors, Tensors]:
        return _combine([1.0 - t, t], [pa, pb], names), _buffers_at(t, ba, bb)

    config = {"model_hash_a": model_hash(model_a), "model_hash_b": model_hash(model_b)}
    return _run_path(obj, "line", ts, state_at, bn, bn_obj, progress=progress, config=config, t0=t0)
