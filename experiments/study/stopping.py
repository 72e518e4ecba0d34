"""A common stopping criterion for the members of a study: train until the cross-entropy on the full
training set reaches a target (Jiang et al. 2020, "Fantastic generalization measures and where to
find them", Sec. 2.2: every model is trained until its training cross-entropy reaches 0.01, so that
the models compared are at comparable points of their training; Andriushchenko et al. 2023, "A
modern look at the relationship between sharpness and generalization", show how much a sharpness
study's answer depends on such choices).

The study config's ``[stop]`` table (``train_loss``, ``max_epochs``) turns it on. A member is then
trained by the experiment runner's :class:`experiments.train.Trainer` for at most ``max_epochs``
epochs (the run's ``train.epochs``); after every epoch the model's mean cross-entropy and top-1
error on its whole training set (eval mode, no gradient,
:func:`experiments.study.measure.error_and_loss`, as the study's own ``train_loss``) are added to
the epoch's history row (``full_train_loss``, ``full_train_error``, so they reach ``log.jsonl``,
``log.csv`` and the checkpoint), and training stops after the first epoch whose loss is at most
``train_loss``. The check draws no random numbers, so with a constant learning rate (the study's
default) a member stopped after ``k`` epochs has the weights, bit for bit, of the runner trained for
``k`` epochs (``python -m experiments run <run_dir>/config.toml train.epochs=k out_dir=...``).

:func:`train_to_target` is :func:`experiments.runner.run_one` with this trainer: the same run
directory lock, configuration check, ``config.toml``, ``environment.json``, per-epoch checkpoints
(an interrupted member resumes from its last epoch), the runner's final evaluation and
``results.json``, whose ``details.stop`` records the rule, the epochs trained, whether the target
was reached and the final training loss and error. A member that reaches ``max_epochs`` without
reaching the target is reported as not converged (the study leaves it out of the correlations).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from experiments.checkpoint import check_checkpoint
from experiments.divergence import Diverged
from experiments.evaluate import evaluate_run
from experiments.parallel import DistContext
from experiments.run_check import check_run_dir
from experiments.run_identity import fingerprint
from experiments.run_lock import run_dir_lock
from experiments.runner import Run, completed, environment, save_run
from experiments.study.measure import error_and_loss
from experiments.toml_writer import dumps
from experiments.train import Trainer
from landscape.io import atomic_write_json, atomic_write_text, read_json

__all__ = ["StopMismatch", "stop_record", "train_to_target"]


class StopMismatch(ValueError):
    """A run directory was trained under another stopping rule."""


class _Reached(Exception):
    """Raised at the start of the epoch after the one that reached the target (its checkpoint is
    written by then)."""


class StoppingTrainer(Trainer):
    """:class:`experiments.train.Trainer` that records the full training-set loss and error after
    every epoch and starts no epoch after the one that reached ``target``. It extends the
    trainer's per-epoch hooks ``_end_of_epoch_checks`` and ``_train_epoch`` (so the trainer's own
    loop, checkpoints and logs are used unchanged; ``tests/test_study_stopping.py`` checks the
    result against the runner bit for bit) and ``restore``."""

    target: float = 0.0
    reached: bool = False

    def restore(self) -> bool:
        had = super().restore()
        losses = [h.get("full_train_loss") for h in self.history]
        if any(v is None for v in losses):
            raise StopMismatch(
                f"the checkpoint in {self.run_dir} was trained without the study's stopping rule "
                "(its history has no full_train_loss) — delete the run directory to train it again"
            )
        early = [i + 1 for i, v in enumerate(losses[:-1]) if v <= self.target]
        if early:
            raise StopMismatch(
                f"the checkpoint in {self.run_dir} trained past epoch {early[0]}, where the training "
                f"loss {losses[early[0] - 1]:.4g} had reached stop.train_loss = {self.target:g} "
                "(a run of another stopping rule) — delete the run directory to train it again"
            )
        self.reached = bool(losses) and losses[-1] <= self.target
        return had

    def _end_of_epoch_checks(self, row: dict[str, Any], epoch: int, evaluate: bool) -> None:
        super()._end_of_epoch_checks(row, epoch, evaluate)
        err, loss = error_and_loss(self.model, self.x_train, self.y_train)
        row["full_train_loss"], row["full_train_error"] = loss, err
        self.reached = loss <= self.target  # False for NaN

    def _train_epoch(self, epoch: int) -> dict[str, Any]:
        if self.reached:
            raise _Reached
        return super()._train_epoch(epoch)


def stop_record(history: list[dict[str, Any]], stop: dict[str, Any]) -> dict[str, Any]:
    """``details.stop`` of a member: the rule, the epochs trained, whether the target was reached and
    the last epoch's full training-set loss and error."""
    last = history[-1] if history else {}
    loss = last.get("full_train_loss", math.nan)
    return {
        "train_loss_target": stop["train_loss"],
        "max_epochs": stop["max_epochs"],
        "epochs": len(history),
        "reached": bool(loss <= stop["train_loss"]),
        "full_train_loss": loss,
        "full_train_error": last.get("full_train_error", math.nan),
    }


def _check_recorded(run: Run, stop: dict[str, Any], recorded: Any) -> None:
    if not isinstance(recorded, dict) or recorded.get("train_loss_target") != stop["train_loss"]:
        was = recorded.get("train_loss_target") if isinstance(recorded, dict) else "no stopping rule"
        raise StopMismatch(
            f"run {run.run_dir} was trained with stop.train_loss = {was}, the study now asks for "
            f"{stop['train_loss']} — delete the run directory (or use another --out) to train it again"
        )


def train_to_target(
    run: Run, stop: dict[str, Any], *, device: torch.device, progress: bool = False
) -> dict[str, Any]:
    """Train (or resume, or skip when finished) the member's run until its full training-set
    cross-entropy is at most ``stop["train_loss"]`` or ``stop["max_epochs"]`` (= the run's
    ``train.epochs``) epochs have passed, then evaluate it as the runner does; returns the runner's
    metrics row with ``stop`` (:func:`stop_record`) added, or ``{"status": "diverged", ...}``.

    Raises:
        StopMismatch: the run directory holds a run of another stopping rule.
    """
    if run.cfg["train"]["epochs"] != stop["max_epochs"]:
        raise ValueError(f"run {run.run_dir}: train.epochs must equal stop.max_epochs = {stop['max_epochs']}")
    ctx = DistContext()
    with run_dir_lock(run.run_dir, ctx=ctx, device=device):
        check_run_dir(run)
        done = completed(run)
        if done is not None:
            res = read_json(run.run_dir / "results.json", what="results file")
            if done.get("status") != "diverged":
                _check_recorded(run, stop, res.get("details", {}).get("stop"))
                return {**done, "stop": res["details"]["stop"]}
            return done
        t0 = time.perf_counter()
        fp = fingerprint(run.cfg, training_only=True)
        check_checkpoint(run.run_dir / "checkpoint.pt", fp)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.run_dir / "config.toml", dumps(run.cfg))
        trainer = StoppingTrainer(
            run.cfg, run.run_dir, seed=run.seed, device=device, ctx=ctx, progress=progress, fingerprint=fp
        )
        trainer.target = float(stop["train_loss"])
        env = environment(device, run.seed, ctx)
        atomic_write_json(run.run_dir / "environment.json", env)
        diverged = None
        try:
            trainer.fit()
        except _Reached:
            pass
        except Diverged as exc:  # recorded; the checkpoint of the last good epoch stays
            diverged = exc.record
        metrics: dict[str, Any] = {}
        details: dict[str, Any] = {}
        if diverged is None:
            try:
                metrics, details = evaluate_run(
                    trainer.model, trainer.opt, trainer.data, trainer.cfg, seed=run.seed, device=device
                )
            except Diverged as exc:
                diverged = exc.record
        details["stop"] = stop_record(trainer.history, stop)
        save_run(
            run,
            trainer,
            seconds=time.perf_counter() - t0,
            env=env,
            metrics=metrics,
            details=details,
            epochs=trainer.counters["epoch"],
            diverged=diverged,
        )
    if diverged is not None:
        return {"status": "diverged", "divergence": diverged.to_dict()}
    return {**metrics, "stop": details["stop"]}
