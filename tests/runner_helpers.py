"""The experiment runner's per-run trainer in the test's own process, on the CPU: what
``experiments run`` builds for one planned run, without the run lock, the worker pool or the
result files around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from experiments.members import EnsembleTrainer
from experiments.parallel import DistContext
from experiments.runner import plan_runs
from experiments.train import Trainer


def planned_run(cfg: dict[str, Any], method: str | None = None) -> Any:
    """The first planned run of a resolved config, or its first run of ``method``."""
    runs = plan_runs(cfg)
    return runs[0] if method is None else next(r for r in runs if r.method == method)


def cpu_trainer(
    run: Any,
    run_dir: Path | None = None,
    *,
    seed: int | None = None,
    ctx: DistContext | None = None,
    fingerprint: str = "t",
) -> Trainer:
    """The run's ``Trainer`` (``EnsembleTrainer`` for an ensemble method) on the CPU, single process
    unless ``ctx`` says otherwise; ``run_dir`` and ``seed`` default to the run's own."""
    cls = EnsembleTrainer if run.cfg["methods"][0].get("ensemble") else Trainer
    return cls(
        run.cfg,
        run.run_dir if run_dir is None else run_dir,
        seed=run.seed if seed is None else seed,
        device=torch.device("cpu"),
        ctx=ctx or DistContext(),
        fingerprint=fingerprint,
    )
