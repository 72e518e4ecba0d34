"""``python -m experiments run CONFIG --estimate``: the projected time of a config's full protocol.

Every distinct (variant, method) of the grid is built as :func:`experiments.runner.run_one` builds it
(the same resolved config, budget and overrides, the runner's own :class:`experiments.train.Trainer`
on the configured device) and its real training step is timed: ``warmup`` untimed steps, then
``steps`` timed ones through ``Trainer._train_epoch`` (each step is timed from one call of
:data:`experiments.train.STEP_HOOK` to the next: data order, batch indexing and augmentation, the
method's closure and optimizer step, the schedule and the divergence monitor). One evaluation pass
(:func:`experiments.evaluate.evaluate_run` without sharpness and corruption sets: test and OOD
predictions, the model average of methods with a posterior) is timed on the briefly trained model.
Per run::

    training h   = members x epochs x steps_per_epoch x median step time
    evaluation h = the timed evaluation pass (x members for a deep ensemble)
    total h      = runs x (training h + evaluation h)    (runs = the number of seeds)
    h per run    = training h + evaluation h              (one task of ``run --slurm``)

The last line proposes ``slurm.time`` for ``--slurm``: the longest run's time plus a fifth, in
minutes (:mod:`experiments.cluster`; a shorter limit is no error, the task is requeued).

Sharpness measures and CIFAR-10-C corruption sets are not timed and are listed as "not included";
neither are the per-epoch test metrics (``evaluation.every``) nor checkpoints. Nothing is written
under ``out_dir``: the trainers run in a temporary directory. The data are loaded once per distinct
data setting. A (variant, method) that fails to build or diverges during the timed steps gets a row
with its one-line error; the others are estimated.
"""

from __future__ import annotations

import copy
import json
import math
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from experiments import train as train_module
from experiments.budget import apply_budget
from experiments.data import prepare_data
from experiments.evaluate import evaluate_run
from experiments.members import member_seed
from experiments.parallel import DistContext
from experiments.run_identity import fingerprint
from experiments.runner import validate
from experiments.train import Trainer

__all__ = ["Estimate", "estimate_runs", "format_estimate"]

WARMUP_STEPS = 3


@dataclass
class Estimate:
    """One (variant, method) of the grid; hours per run and over its ``runs`` seeds."""

    variant: str
    method: str
    runs: int
    steps_per_epoch: int = 0
    epochs: int = 0
    members: int = 1
    step_ms: float | None = None  #: median of the timed steps
    step_ms_all: list[float] = field(default_factory=list)
    eval_s: float | None = None  #: one evaluation pass (x members for an ensemble)
    not_included: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def train_h(self) -> float | None:
        if self.step_ms is None:
            return None
        return self.members * self.epochs * self.steps_per_epoch * self.step_ms / 3.6e6

    @property
    def eval_h(self) -> float:
        return (self.eval_s or 0.0) / 3600.0

    @property
    def run_h(self) -> float | None:
        """One run: one task of ``run --slurm`` (:mod:`experiments.cluster`)."""
        train = self.train_h
        return None if train is None else train + self.eval_h

    @property
    def total_h(self) -> float | None:
        run = self.run_h
        return None if run is None else self.runs * run


class _Stop(Exception):
    """Raised by the step hook once enough steps are timed."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    """``cuda:0 (NVIDIA H100 ...)`` or ``cpu (<processor>, N threads)``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return (
        f"{device} ({platform.processor() or platform.machine() or 'cpu'}, {torch.get_num_threads()} threads)"
    )


def time_steps(trainer: Any, *, steps: int, warmup: int = WARMUP_STEPS) -> list[float]:
    """Milliseconds of ``steps`` training steps of ``trainer`` after ``warmup`` untimed ones (as many
    epochs of ``Trainer._train_epoch`` as needed, stopped by the step hook)."""
    device = trainer.device
    stamps: list[float] = []
    needed = warmup + steps + 1  # a step lasts from one hook call to the next

    def hook(_step: int) -> None:
        _sync(device)
        stamps.append(time.perf_counter())
        if len(stamps) >= needed:
            raise _Stop

    previous = train_module.STEP_HOOK
    train_module.STEP_HOOK = hook
    try:
        for epoch in range(needed):  # at least one step per epoch: never more epochs than this
            trainer._train_epoch(epoch)
    except _Stop:
        pass
    finally:
        train_module.STEP_HOOK = previous
    times = [1e3 * (b - a) for a, b in zip(stamps[warmup:], stamps[warmup + 1 :])]
    if not times:
        raise RuntimeError("no training step was timed (the step hook was not called)")
    return times


def _data_key(cfg: dict[str, Any], seed: int) -> str:
    """What :func:`experiments.data.prepare_data` reads: runs with equal keys share their data."""
    e = cfg["evaluation"]
    keep = {
        "data": cfg["data"],
        "ood": [e["ood"], e["ood_kwargs"]],
        "budget": cfg["budget"],
        "precision": cfg["precision"],
        "batch_size": cfg["train"]["batch_size"],
        "model_kwargs": cfg["model"]["kwargs"],
        "seed": seed,
    }
    return json.dumps(keep, sort_keys=True, default=str)


def _not_included(cfg: dict[str, Any]) -> list[str]:
    e = cfg["evaluation"]
    out = [f"sharpness {label}" for label in e["sharpness"]]
    if e.get("corruptions"):
        out.append("corruption sets")
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _eval_config(cfg: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    out["evaluation"]["sharpness"] = []
    out["evaluation"]["corruptions"] = ""
    return out


def _estimate_one(
    run: Any, *, device: torch.device, steps: int, warmup: int, data_cache: dict, tmp: Path
) -> Any:
    validate([run])
    cfg = run.cfg
    ensemble = cfg["methods"][0]["ensemble"]
    members = int(ensemble["members"]) if ensemble else 1
    seed = member_seed(run.seed, 0, members) if ensemble else run.seed
    key = _data_key(cfg, run.seed)
    if key not in data_cache:  # a failure to load is kept too: the data are tried once
        try:
            data_cache[key] = prepare_data(apply_budget(cfg), run.seed)
        except Exception as exc:  # noqa: BLE001 - reported in the row of every method using them
            data_cache[key] = exc
    if isinstance(data_cache[key], Exception):
        raise data_cache[key]
    run_dir = tmp / f"{len(list(tmp.iterdir()))}"
    trainer = Trainer(
        cfg,
        run_dir,
        seed=seed,
        device=device,
        ctx=DistContext(),
        fingerprint=fingerprint(cfg, training_only=True),
        data=data_cache[key],
    )
    times = time_steps(trainer, steps=steps, warmup=warmup)
    t0 = time.perf_counter()
    evaluate_run(
        trainer.model,
        trainer.opt,
        trainer.data,
        _eval_config(trainer.cfg),
        seed=run.seed,
        device=device,
    )
    _sync(device)
    eval_s = (time.perf_counter() - t0) * members
    return trainer, times, eval_s, members


def estimate_runs(
    runs: list[Any], *, device: torch.device, steps: int = 20, warmup: int = WARMUP_STEPS
) -> list[Estimate]:
    """One :class:`Estimate` per distinct (variant, method) of ``runs`` (a :func:`plan_runs` grid),
    each timed with its first seed; writes nothing outside a temporary directory."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warm-up >= 0, got {steps}, {warmup}")
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in runs:
        groups.setdefault((r.variant, r.method), []).append(r)
    data_cache: dict[str, Any] = {}
    out: list[Estimate] = []
    with tempfile.TemporaryDirectory(prefix="experiments_estimate_") as tmp:
        for (variant, method), group in groups.items():
            est = Estimate(variant, method, runs=len(group), not_included=_not_included(group[0].cfg))
            out.append(est)
            try:
                trainer, times, eval_s, members = _estimate_one(
                    group[0], device=device, steps=steps, warmup=warmup, data_cache=data_cache, tmp=Path(tmp)
                )
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - a method that fails is a row; the others go on
                est.error = _one_line(exc)
                continue
            est.steps_per_epoch, est.epochs = trainer.steps_per_epoch, trainer.cfg["train"]["epochs"]
            est.members, est.step_ms_all = members, times
            est.step_ms, est.eval_s = statistics.median(times), eval_s
            del trainer
    return out


def _h(v: float | None) -> str:
    return "" if v is None else f"{v:.3g}"


def format_estimate(estimates: list[Estimate], device: str, *, steps: int, warmup: int = WARMUP_STEPS) -> str:
    """The markdown table, the totals per method and for the grid, and what is not included."""
    lines = [
        f"Estimated time of the full protocol on {device} (median of {steps} timed steps after {warmup} "
        "warm-up steps per method):",
        "",
        "| variant | method | steps/epoch | epochs | ms/step | projected training h | evaluation h | runs "
        "| total h | h per run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in estimates:
        variant = e.variant or "-"
        if e.error is not None:
            text = e.error.replace("|", "/")
            lines.append(f"| {variant} | {e.method} | error: {text} | | | | | {e.runs} | | |")
            continue
        epochs = f"{e.epochs} x {e.members} members" if e.members > 1 else str(e.epochs)
        lines.append(
            f"| {variant} | {e.method} | {e.steps_per_epoch} | {epochs} | {e.step_ms:.3g} | {_h(e.train_h)} "
            f"| {_h(e.eval_h)} | {e.runs} | {_h(e.total_h)} | {_h(e.run_h)} |"
        )
    per_method: dict[str, float] = {}
    for e in estimates:
        if e.total_h is not None:
            per_method[e.method] = per_method.get(e.method, 0.0) + e.total_h
    lines.append("")
    for method, h in per_method.items():
        lines.append(f"total {method}: {_h(h)} h")
    failed = [e for e in estimates if e.error is not None]
    total = sum(per_method.values())
    runs = sum(e.runs for e in estimates if e.error is None)
    tail = f" ({len(failed)} (variant, method) not estimated: errors above)" if failed else ""
    lines.append(f"total: {_h(total)} h for {runs} runs on {device}{tail}")
    longest = max((e for e in estimates if e.run_h is not None), key=lambda e: e.run_h, default=None)
    if longest is not None:
        where = f"{longest.variant}, {longest.method}" if longest.variant else longest.method
        minutes = math.ceil(longest.run_h * 72)  # minutes, a fifth more: checkpoints, metrics, start-up
        lines.append(
            f"per task (one run under --slurm): at most {_h(longest.run_h)} h ({where}); slurm.time = "
            f"{minutes} (minutes, a fifth above it) runs each task in one go, a shorter limit requeues it"
        )
    missing = sorted({x for e in estimates for x in e.not_included})
    if missing:
        lines.append(f"not included: {', '.join(missing)}; per-epoch test metrics and checkpoints")
    else:
        lines.append("not included: per-epoch test metrics and checkpoints")
    return "\n".join(lines) + "\n"
