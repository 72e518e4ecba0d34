"""1-D and 2-D loss surfaces ``L(theta + x d1 + y d2)`` of real networks over a whole data set.

``s = ls.surface(obj, directions=[d1, d2], coords=[xs, ys])`` evaluates the Objective's loss (and
accuracy) on the grid; ``s.loss[i, j]`` is the value at ``(xs[i], ys[j])``. The plot follows Li et
al., "Visualizing the Loss Landscape of Neural Nets", NeurIPS 2018, eq. (1):
``f(alpha, beta) = L(theta* + alpha delta + beta eta)``.

Correctness by construction:

* every strategy forms the point as ``theta + x*d1 + y*d2`` with the same expression, so a grid
  point with ``x = y = 0`` is bit-identical to ``theta``, and the "loop" strategy evaluates it with
  the Objective's own arithmetic: the centre equals ``obj.loss()`` exactly;
* the caller's model is never written to (``functional_call`` with copies, inside ``obj.guard()``);
* BatchNorm is handled by an explicit policy (``bn_policy``), recorded in the result;
* progress is saved with a completion *mask* (not sentinel values), atomically, so an interrupted
  run resumes (``resume=path``) to the same values; the file records fingerprints of the data and
  the loss, and a resume on anything else is refused;
* the memory a grid and a strategy need is estimated before anything is allocated: a grid that
  cannot fit raises with its size and the fix.

Evaluation strategies (``strategy``): ``"loop"`` (one ``functional_call`` pass per point),
``"linear_first_layer"`` (CPU default when the model is an ``nn.Sequential`` whose first
parametrised layer is a ``Linear``: its output ``X (W + x D1 + y D2)^T + b(...)`` is linear in the
coordinates, so ``X W^T``, ``X D1^T``, ``X D2^T`` are computed once and combined per point) and
``"vmap"`` (GPU default: chunks of ``batch_points`` points in one ``torch.func.vmap`` call; ``"auto"``:
as many as fit ``max_memory``, :mod:`landscape.surface.budget`). ``precision="bf16"``/``"tf32"``
(:mod:`landscape.surface.precision`) records its error against full precision on 9 of the points.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["surface"]


from landscape import checks
from landscape.objective import Objective
from landscape.surface.budget import PointChunks
from landscape.surface.evaluators import (
    _bn_modules,
    _Evaluator,
    _hash_tensors,
    _LinearFirstEvaluator,
    _VmapEvaluator,
    data_fingerprint,
    loss_fingerprint,
    model_hash,
)
from landscape.surface.precision import Precision, resume_key
from landscape.surface.result import KNOWN_METRICS as _METRICS
from landscape.surface.result import Surface, load_surface

_STRATEGIES = ("auto", "loop", "vmap", "linear_first_layer")
_BN_POLICIES = ("eval", "train", "recompute")


def _check_inputs(obj, directions, coords):
    if not isinstance(obj, Objective):
        raise TypeError(
            f"surface() takes a landscape.Objective, got {type(obj).__name__}; build one with "
            "ls.Objective(model, loss_fn, data)"
        )
    if isinstance(directions, Mapping):
        directions = [directions]
    if not isinstance(directions, Sequence) or not 1 <= len(directions) <= 2:
        raise ValueError("directions must be a list of one or two dicts name -> tensor")
    if (
        isinstance(coords, np.ndarray)
        and coords.ndim == 1
        or (isinstance(coords, torch.Tensor) and coords.ndim == 1)
    ):
        coords = [coords]
    if not isinstance(coords, Sequence) or len(coords) != len(directions):
        raise ValueError(
            f"coords must be a list with one 1-D array per direction ({len(directions)}), e.g. "
            "coords=[np.linspace(-1, 1, 51), np.linspace(-1, 1, 41)]"
        )
    cs = []
    for i, c in enumerate(coords):
        a = np.asarray(c.detach().cpu() if isinstance(c, torch.Tensor) else c, dtype=np.float64)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(
                f"coords[{i}] must be a non-empty 1-D array of finite numbers, got shape {a.shape}"
            )
        cs.append(a)
    params = dict(obj.model.named_parameters())
    buffers = dict(obj.model.named_buffers())
    dirs = []
    for i, d in enumerate(directions):
        if not isinstance(d, Mapping) or not d:
            raise TypeError(
                f"directions[{i}] must be a non-empty dict name -> tensor (see ls.directions.random)"
            )
        dd = {}
        for n, t in d.items():
            ref = params.get(n, buffers.get(n))
            if ref is None:
                raise ValueError(
                    f"directions[{i}] has an entry {n!r} that is neither a parameter nor a buffer "
                    "of the model"
                )
            if not isinstance(t, (torch.Tensor, np.ndarray)):
                raise TypeError(f"directions[{i}][{n!r}] must be a tensor, got {type(t).__name__}")
            t = torch.as_tensor(t)
            if tuple(t.shape) != tuple(ref.shape):
                raise ValueError(
                    f"directions[{i}][{n!r}] has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
                )
            if n in buffers and not ref.is_floating_point():
                raise ValueError(f"directions[{i}][{n!r}]: integer buffers cannot be perturbed")
            if not t.is_floating_point():
                raise TypeError(
                    f"directions[{i}][{n!r}] has dtype {t.dtype}; a direction must be a real floating "
                    "tensor (it is cast to the objective's dtype)"
                )
            dd[n] = t.detach().to(device=obj.device, dtype=obj.dtype)
            if not bool(torch.isfinite(dd[n]).all()):
                raise ValueError(
                    f"directions[{i}][{n!r}] contains NaN or inf (after casting to {obj.dtype}): every "
                    "grid point except the centre would be NaN; pass a finite direction"
                )
        if not any(bool(t.any()) for t in dd.values()):
            raise ValueError(
                f"directions[{i}] is all zero: the surface would be constant along it; pass a non-zero "
                "direction (e.g. ls.directions.random(obj))"
            )
        dirs.append(dd)
    return dirs, cs


def _check_coords_order(cs: list[np.ndarray]) -> None:
    """Coordinates must be strictly increasing or strictly decreasing (plots, interpolation and
    the grid's meaning all assume an ordered axis; a repeated value evaluates a point twice)."""
    for i, a in enumerate(cs):
        steps = np.diff(a)
        if a.size > 1 and not (np.all(steps > 0) or np.all(steps < 0)):
            raise ValueError(
                f"coords[{i}] must be strictly increasing or strictly decreasing (no repeats), got "
                f"{np.array2string(a, threshold=8)}; sort it, e.g. np.unique(coords)"
            )


def _resolve_strategy(strategy: str, obj, dirs, bn_policy: str) -> str:
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
    has_bn = bool(_bn_modules(obj.model))
    # the linear-first-layer path runs the Sequential's modules itself: only for a plain forward
    plain = getattr(obj, "output_fn", None) is None and not getattr(obj, "random_forward", False)
    linear_ok = plain and _LinearFirstEvaluator.split(obj.model) is not None and bn_policy != "recompute"
    has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in obj.model.modules())
    vmap_ok = (bn_policy == "eval" or not has_bn) and (obj.mode == "eval" or not has_dropout)
    if strategy == "linear_first_layer" and not linear_ok:
        raise ValueError(
            "strategy 'linear_first_layer' needs an nn.Sequential whose first parametrised module is "
            "an nn.Linear (after Flatten), no output_fn or random forward, and bn_policy != 'recompute'; "
            "use strategy='loop'"
        )
    if strategy == "vmap" and not vmap_ok:
        raise ValueError(
            "strategy 'vmap' cannot update BatchNorm statistics or draw dropout masks; use "
            "bn_policy='eval' (with mode='eval' for dropout) or strategy='loop'"
        )
    if strategy != "auto":
        return strategy
    if obj.device.type == "cpu":
        return "linear_first_layer" if linear_ok else "loop"
    return "vmap" if vmap_ok else "loop"


def _check_resume(old: Surface, resume: Any, config: dict, cs: list, metrics: tuple, train_bn: bool) -> None:
    """Refuse to resume from a file computed with another configuration, naming what differs."""
    problems = []
    if len(old.coords) != len(cs) or any(
        a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(old.coords, cs)
    ):
        problems.append("coordinates")
    for key in ("directions_hash", "model_hash", "bn_policy"):
        if old.config.get(key) != config[key]:
            problems.append(key)
    if resume_key(old.config) != resume_key(config):
        problems.append("precision")
    old_obj, new_obj = old.config.get("objective", {}), config["objective"]
    for key, what in (("num_examples", "data size"), ("loss", "loss"), ("reduction", "reduction"),
                      ("dtype", "dtype"), ("mode", "mode")):  # fmt: skip
        if old_obj.get(key) != new_obj.get(key):
            problems.append(what)
    for key, what in (
        ("data_fingerprint", "data (a hash of the inputs and targets)"),
        ("loss_fingerprint", "loss function (a hash of its code and settings)"),
    ):
        if old.config.get(key) is None:
            problems.append(f"{what}: the file records none")
        elif old.config[key] != config[key]:
            problems.append(f"{what}: {old.config[key]} in the file, {config[key]} now")
    if train_bn and old_obj.get("batch_sizes") != new_obj.get("batch_sizes"):
        problems.append("batching (BatchNorm uses the statistics of each batch)")
    missing_metrics = [m for m in metrics if m not in old.values]
    if missing_metrics:
        problems.append(f"metrics {missing_metrics}")
    if problems:
        raise ValueError(
            f"cannot resume from {resume}: it was computed with different {'; '.join(problems)}; "
            "delete the file or choose another resume path"
        )


def _hash_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_fmt = checks.format_bytes


def _check_grid_memory(shape: tuple[int, ...], n_metrics: int) -> None:
    """The grid's host arrays (values, partial values and snapshots per metric, masks, point
    indices) must fit in memory: checked before any of them is allocated."""
    n_points = math.prod(shape)
    per_point = 3 * 8 * n_metrics + 3 + 8 * len(shape)
    need = n_points * per_point
    avail = checks.available_bytes(torch.device("cpu"))
    if avail is not None and need > avail:
        dims = " x ".join(str(n) for n in shape)
        raise ValueError(
            f"a {dims} grid has {n_points:,} points and needs about {_fmt(need)} of host memory for its "
            f"values, masks and indices ({per_point} bytes per point), but only {_fmt(avail)} is "
            "available; use fewer coordinates per axis (a coarser or smaller grid)"
        )


def _check_workspace_memory(obj, cls, dirs, bn_policy, shape, batch_points, data_bytes, world) -> None:
    """What the chosen strategy allocates on the objective's device, checked before allocating."""
    n_points = -(-math.prod(shape) // world)
    need, desc = cls.workspace_bytes(obj, dirs, bn_policy, n_points, batch_points, data_bytes)
    avail = checks.available_bytes(obj.device)
    if avail is None or need <= avail:
        return
    if cls.name == "vmap":
        per = max(1, need // max(1, min(batch_points, n_points)))
        fix = f"pass a smaller batch_points (about {max(1, avail // (2 * per))}) or strategy='loop'"
    elif cls.name == "linear_first_layer":
        fix = "use strategy='loop' (it keeps no per-example activations) or less data"
    else:
        fix = "use less data per Objective (e.g. a DataLoader, which is streamed) or a smaller model"
    raise ValueError(
        f"strategy {cls.name!r} would allocate about {_fmt(need)} on {obj.device} for {desc}, but only "
        f"{_fmt(avail)} is available; {fix}"
    )


def surface(
    obj: Any,
    directions: Sequence[Mapping[str, torch.Tensor]],
    coords: Sequence[Any],
    *,
    metrics: Sequence[str] = ("loss", "accuracy"),
    bn_policy: str | None = None,
    batch_points: int | str | None = None,
    strategy: str = "auto",
    max_memory: int | float | str | None = None,
    precision: str | None = None,
    progress: bool = False,
    resume: str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: float = 60.0,
    distributed: bool | None = None,
    data_info: Mapping[str, Any] | None = None,
) -> Surface:
    """Evaluate ``L(theta + x d1 + y d2)`` (Li et al. 2018, eq. 1) on a grid over the whole data set.

    Args:
        obj: a ``landscape.Objective`` (model, loss, data, dtype/device, parameter selection).
        directions: one or two dicts name -> tensor (``ls.directions.random`` / ``eigen`` / ``pca``
            / ``between``); names may be parameters or floating buffers of the model.
        coords: one 1-D array per direction: finite, strictly increasing or strictly decreasing,
            any length and range (``0`` hits ``theta``).
        metrics: any of ``"loss"``, ``"accuracy"`` (accuracy is dropped with a warning when the
            targets are not class labels).
        bn_policy: BatchNorm statistics used at each point: ``"eval"`` (the stored running
            statistics), ``"train"`` (batch statistics), ``"recompute"`` (running statistics
            re-estimated on the data at every point, then eval mode). Default: ``"eval"`` when
            ``obj.mode == "eval"``, else ``"train"`` (so the centre equals ``obj.loss()``).
        batch_points: grid points per vmap call (``"vmap"`` strategy) and between progress/checkpoint
            updates: an int, or ``"auto"`` (vmap: the widest chunk whose measured peak fits
            ``max_memory``; :mod:`landscape.surface.budget`). Default: ``"auto"`` for vmap on CUDA or
            with ``max_memory``, else 64. Recorded in ``config["batch_points"]``.
        strategy: ``"auto"`` (CPU: ``"linear_first_layer"`` when possible, else ``"loop"``; GPU:
            ``"vmap"``), ``"loop"``, ``"vmap"`` or ``"linear_first_layer"``.
        max_memory: budget of one vmap call with ``batch_points="auto"``: bytes, ``"2GiB"``,
            ``"50%"``, a fraction of the free memory, or ``None`` (half the free memory).
        precision: ``None`` (the objective's dtype, no change), ``"float32"``, ``"tf32"`` or
            ``"bf16"`` (:mod:`landscape.surface.precision`; float32 objectives only); with ``"tf32"``
            (CUDA) or ``"bf16"`` up to 9 points are also evaluated in full precision and the
            differences recorded in ``config["precision"]["error"]``.
        progress: tqdm bar over grid points.
        resume: a file: if it exists (a partial or complete surface of the same configuration),
            only the points its mask lacks are evaluated; progress is saved there atomically every
            ``checkpoint_every`` seconds and at the end. The configuration includes sha256
            fingerprints of the data (inputs and targets) and of the loss function: a file computed
            on other data of the same size, or with another loss, is refused.
        checkpoint: save the progress to this file instead (every ``checkpoint_every`` seconds
            and when interrupted), not the complete result, which the caller saves where it
            belongs: ``resume`` is then only read, so a finished file there is never replaced by a
            partial one (``python -m landscape surface`` keeps ``OUT.partial`` beside ``--out``).
        distributed: split the grid points across the ranks of an initialised
            ``torch.distributed`` process group (default: when one is initialised with > 1 rank)
            and gather the values on every rank (``all_reduce`` of disjoint parts).
        data_info: free-form description of the data (recorded in ``config``).

    Returns:
        :class:`Surface`; ``s.loss[i, j]`` is at ``(xs[i], ys[j])`` (``s.loss[i]`` in 1-D).
    """
    t0 = time.perf_counter()
    if isinstance(directions, Mapping):  # one direction given bare
        directions = [directions]
    dirs, cs = _check_inputs(obj, directions, coords)
    metrics = tuple(metrics)
    if not metrics or any(m not in _METRICS for m in metrics):
        raise ValueError(f"metrics must be a non-empty subset of {_METRICS}, got {metrics}")
    if "loss" not in metrics:
        metrics = ("loss", *metrics)
    if bn_policy is None:
        bn_policy = "eval" if obj.mode == "eval" else "train"
    if bn_policy not in _BN_POLICIES:
        raise ValueError(f"bn_policy must be one of {_BN_POLICIES}, got {bn_policy!r}")
    prec = Precision(precision, obj)
    used = _resolve_strategy(strategy, obj, dirs, bn_policy)
    plan = PointChunks(batch_points, max_memory, used, obj.device)
    _check_coords_order(cs)
    rank, world = 0, 1
    dist_on = False
    if distributed is not False and torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        rank = torch.distributed.get_rank()
        dist_on = world > 1
    elif distributed:
        raise ValueError("distributed=True needs an initialised torch.distributed process group")

    shape = tuple(len(c) for c in cs)
    cls = {"loop": _Evaluator, "linear_first_layer": _LinearFirstEvaluator, "vmap": _VmapEvaluator}[used]
    _check_grid_memory(shape, len(metrics))
    data_fp, data_bytes = data_fingerprint(obj)
    if dist_on:  # one fingerprint on every rank: replicated data, or the shards in rank order
        fps: list[Any] = [None] * world
        torch.distributed.all_gather_object(fps, data_fp)
        data_fp = fps[0] if len(set(fps)) == 1 else _hash_text("|".join(fps))
    _check_workspace_memory(obj, cls, dirs, bn_policy, shape, plan.min_points, data_bytes, world)
    dir_desc = [dict(getattr(d, "config", {}) or {}) for d in directions]
    config = {
        "objective": obj.config(),
        "directions": dir_desc,
        "directions_hash": _hash_tensors({f"{i}/{n}": t for i, d in enumerate(dirs) for n, t in d.items()}),
        "model_hash": model_hash(obj.model),
        "model_class": type(obj.model).__name__,
        "data_fingerprint": data_fp,
        "loss_fingerprint": loss_fingerprint(obj.loss_fn),
        "bn_policy": bn_policy,
        "metrics": list(metrics),
        "shape": list(shape),
        "ranges": [[float(c.min()), float(c.max())] for c in cs],
        "data": dict(data_info or {}),
        "strategy_requested": strategy,
        "precision": prec.config(),
        "torch": torch.__version__,
    }

    values = {m: np.full(shape, np.nan) for m in metrics}
    mask = np.zeros(shape, dtype=bool)
    if resume is not None and Path(resume).exists():
        old = load_surface(resume)
        _check_resume(
            old, resume, config, cs, metrics, train_bn=bn_policy == "train" and bool(_bn_modules(obj.model))
        )
        mask = np.asarray(old.mask, dtype=bool).copy()
        for m in metrics:
            values[m] = np.where(mask, old.values[m], np.nan)

    idx_all = np.argwhere(~mask)  # [points, ndim] in row-major order
    mine = idx_all[rank::world] if dist_on else idx_all

    new_vals = {m: np.zeros(shape) for m in metrics}
    new_mask = np.zeros(shape, dtype=bool)
    accuracy_ok = True
    evaluations = 0
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(mine), desc=f"surface ({used})", unit="pt", file=sys.stderr)

    def snapshot(partial: bool) -> Surface:
        vals = {m: np.where(mask, values[m], np.nan) for m in metrics if m != "accuracy" or accuracy_ok}
        return Surface(
            config={**config, "strategy": used, "complete": not partial},
            seconds=time.perf_counter() - t0,
            coords=cs,
            values=vals,
            mask=mask.copy(),
            directions=[{n: t.detach().cpu() for n, t in d.items()} for d in dirs],
            evaluations=evaluations,
            strategy=used,
        )

    save_to = resume if checkpoint is None else checkpoint
    last_ckpt = time.perf_counter()
    try:
        with obj.guard(), torch.no_grad(), prec.context():
            for _, m in _bn_modules(obj.model):
                m.training = bn_policy == "train"
            ev = cls(obj, dirs, bn_policy)
            ev.want_accuracy = "accuracy" in metrics
            start = step = 0
            while (start := start + step) < len(mine):
                step = plan.next(len(mine) - start)
                chunk = [tuple(int(v) for v in ix) for ix in mine[start : start + step]]
                pts = [tuple(float(cs[a][ix[a]]) for a in range(len(cs))) for ix in chunk]
                res = plan.evaluate(ev, pts)
                evaluations += len(pts)
                for ix, (lv, av) in zip(chunk, res):
                    new_vals["loss"][ix] = lv
                    if "accuracy" in metrics:
                        if av is None:
                            accuracy_ok = False
                        else:
                            new_vals["accuracy"][ix] = av
                    new_mask[ix] = True
                    if not dist_on:
                        mask[ix] = True
                        for mm in metrics:
                            values[mm][ix] = new_vals[mm][ix]
                if bar is not None:
                    bar.update(len(pts))
                if (
                    save_to is not None
                    and not dist_on
                    and time.perf_counter() - last_ckpt >= checkpoint_every
                    and start + step < len(mine)
                ):
                    snapshot(True).save(save_to)
                    last_ckpt = time.perf_counter()
    except BaseException:
        # keep what is done: an interrupted run resumes from here
        if save_to is not None and not dist_on and evaluations > 0:
            snapshot(True).save(save_to)
        raise
    finally:
        if bar is not None:
            bar.close()

    if dist_on:
        import torch.distributed as dist

        dev = torch.device("cpu") if dist.get_backend() == "gloo" else obj.device
        cnt = torch.as_tensor(new_mask.astype(np.float64), device=dev)
        dist.all_reduce(cnt)
        for mm in metrics:
            t = torch.as_tensor(np.where(new_mask, new_vals[mm], 0.0), device=dev)
            dist.all_reduce(t)
            values[mm] = np.where(cnt.cpu().numpy() > 0, t.cpu().numpy(), values[mm])
        flag = torch.tensor([1.0 if accuracy_ok else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        accuracy_ok = bool(flag.item() > 0)
        mask = mask | (cnt.cpu().numpy() > 0)
        ev_t = torch.tensor([float(evaluations)], device=dev)
        dist.all_reduce(ev_t)
        evaluations = int(ev_t.item())
    if "accuracy" in metrics and not accuracy_ok:
        warnings.warn(
            "accuracy is not defined for these targets (not class labels or 0/1); dropped",
            UserWarning,
            stacklevel=2,
        )
    config["world_size"] = world
    done = {m: values[m] for m in metrics if m != "accuracy" or accuracy_ok}
    prec.report(obj, cls, dirs, bn_policy, cs, done, max(1, plan.width))  # full-precision check
    config.update(precision=prec.config(), batch_points=plan.config())
    result = snapshot(False)
    if "accuracy" in result.values and not accuracy_ok:
        del result.values["accuracy"]
    if resume is not None and checkpoint is None and rank == 0:
        result.save(resume)
    return result


# --------------------------------------------------------------------------------------------- CLI
