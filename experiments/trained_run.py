"""A finished run read back from its directory: its configuration, its results and, on request,
the trained network and optimizer restored from its checkpoint.

What :mod:`experiments.runner` wrote (``config.toml``, ``results.json``, ``checkpoint.pt``,
``predictions.npz``) is read without running code: TOML and JSON, the checkpoint with
``torch.load(weights_only=True)`` (:func:`experiments.checkpoint.read_checkpoint`), the
predictions with ``numpy.load(allow_pickle=False)``. Every error names the run directory, what it
lacks and the configuration key that makes the runner write it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.config import ConfigError, load_config
from experiments.parallel import DistContext
from experiments.run_identity import fingerprint
from experiments.train import Trainer
from landscape.io import read_json

__all__ = ["FinishedRun", "find_runs", "read_run", "restore_trainer"]


@dataclass
class FinishedRun:
    """One finished run: its directory, resolved config and ``results.json`` content."""

    run_dir: Path
    cfg: dict[str, Any]
    results: dict[str, Any]

    @property
    def method(self) -> str:
        return str(self.results.get("method") or self.cfg["methods"][0]["name"])

    @property
    def seed(self) -> int:
        return int(self.results.get("seed", self.cfg["seeds"][0]))

    @property
    def variant(self) -> str:
        return str(self.results.get("variant", ""))

    @property
    def label(self) -> str:
        """``method`` or ``variant/method``: the runs of one label are the seeds of one setting."""
        return f"{self.variant}/{self.method}" if self.variant else self.method

    @property
    def details(self) -> dict[str, Any]:
        return self.results.get("details") or {}

    def predictions(self) -> dict[str, np.ndarray]:
        """The arrays of ``predictions.npz`` (``point`` / ``swa`` / ``bma`` probabilities, ``labels``)."""
        path = self.run_dir / "predictions.npz"
        if not path.is_file():
            raise FileNotFoundError(
                f"{self.run_dir} has no predictions.npz — set evaluation.save_predictions = true and run "
                "it again in a new out_dir"
            )
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}


def read_run(run_dir: str | Path) -> FinishedRun:
    """The finished run in ``run_dir`` (``config.toml`` and ``results.json``); a ValueError names
    a directory without them or a run that diverged."""
    run_dir = Path(run_dir)
    for name in ("config.toml", "results.json"):
        if not (run_dir / name).is_file():
            raise ValueError(
                f"{run_dir} has no {name}: not a finished run directory — give directories written by "
                "`python -m experiments run` (or a directory above them) after the run finished"
            )
    results = read_json(run_dir / "results.json", what="results file")
    if not isinstance(results, dict):
        raise ValueError(f"{run_dir / 'results.json'} is not a results file of the experiment runner")
    if results.get("status") == "diverged":
        raise ValueError(f"{run_dir}: the run diverged (results.json) and has nothing to plot — leave it out")
    try:
        cfg = load_config(run_dir / "config.toml")
    except ConfigError as exc:
        raise ValueError(f"{run_dir / 'config.toml'}: {exc}") from None
    return FinishedRun(run_dir, cfg, results)


def find_runs(paths: list[str | Path]) -> list[FinishedRun]:
    """The finished runs in ``paths``: run directories, or directories above them (searched for
    ``results.json`` files, in sorted order); a ValueError when there are none."""
    dirs: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(
                f"{p}: no such run directory — give directories written by `python -m experiments run`"
            )
        if (p / "results.json").is_file():
            dirs.append(p)
        elif p.is_dir():
            dirs += sorted(f.parent for f in p.rglob("results.json"))
    dirs = list(dict.fromkeys(dirs))
    if not dirs:
        raise ValueError(
            f"no finished runs (results.json) in {', '.join(map(str, paths))} — give the run directories "
            "of `python -m experiments run`"
        )
    return [read_run(d) for d in dirs]


def restore_trainer(run: FinishedRun, device: torch.device, progress: bool = False) -> Trainer:
    """The run's :class:`experiments.train.Trainer` with the model, optimizer (a SWAG's moments
    included) and data of its last checkpoint; the checkpoint's fingerprint must match
    ``config.toml`` (a ValueError otherwise)."""
    ckpt = run.run_dir / "checkpoint.pt"
    if run.cfg["methods"][0]["ensemble"]:
        raise ValueError(
            f"{run.run_dir} is a deep ensemble (methods.*.ensemble): its members have no posterior to sample"
        )
    if not ckpt.is_file():
        raise ValueError(
            f"{run.run_dir} has no checkpoint.pt (deleted?) — run `python -m experiments run "
            f"{run.run_dir / 'config.toml'}` in a new out_dir to train it again"
        )
    trainer = Trainer(
        run.cfg,
        run.run_dir,
        seed=run.seed,
        device=device,
        ctx=DistContext(),
        fingerprint=fingerprint(run.cfg, training_only=True),
        progress=progress,
    )
    trainer.restore()
    return trainer
