"""Per-epoch logs of a run: ``log.jsonl`` and ``log.csv`` (rewritten atomically from the history
after every epoch, so they always match the last checkpoint) and TensorBoard event files when
``torch.utils.tensorboard`` and the ``tensorboard`` package are importable.

With ``train.log_every = N > 0`` also the optimizer's per-step diagnostics (:class:`StepLogger`):
the scalar entries of ``opt.last`` (``loss``, ``grad_norm``, ``eps_norm``, ``loss_perturbed``, ...)
after optimizer steps 1, N + 1, 2N + 1, ... (the global step, counted from 1), one JSON object per
logged step in ``steps.jsonl`` (``{"step": ..., "grad_norm": ...}``) and TensorBoard scalars
``optimizer/<key>`` in ``tensorboard/steps``.  Records are kept in memory during an epoch and
appended after its checkpoint; a resumed run first drops the records past its checkpoint's step.
Steps skipped by fp16 loss scaling are not logged; only the main rank writes.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
from functools import reduce
from pathlib import Path
from typing import Any

import torch

from landscape.io import atomic_write_text, to_jsonable

__all__ = ["EpochLogger", "StepLogger", "step_scalars"]


def _columns(history: list[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for row in history:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


def _summary_writer(log_dir: Path, purge_step: int) -> Any:
    """A ``SummaryWriter`` (``purge_step`` drops the events redone after a resume), or ``None``."""
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(log_dir), purge_step=purge_step)


def _loggable(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class EpochLogger:
    """Writes the history of a run; ``tensorboard=False`` (or a missing package) skips event files.

    ``log_every > 0`` adds a :class:`StepLogger` (:attr:`steps`) whose records :meth:`write` appends.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = True,
        start_epoch: int = 0,
        log_every: int = 0,
        start_step: int = 0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.writer = _summary_writer(self.run_dir / "tensorboard", start_epoch + 1) if tensorboard else None
        self.steps = (
            StepLogger(self.run_dir, log_every, start_step=start_step, tensorboard=tensorboard)
            if log_every
            else None
        )

    def write(self, history: list[dict[str, Any]]) -> None:
        rows = to_jsonable(history)
        atomic_write_text(self.run_dir / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=_columns(rows), lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})
        atomic_write_text(self.run_dir / "log.csv", buf.getvalue())
        if self.writer is not None and rows:
            last = rows[-1]
            for k, v in last.items():
                if k != "epoch" and _loggable(v):
                    self.writer.add_scalar(k, v, last["epoch"])
            self.writer.flush()
        if self.steps is not None:
            self.steps.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.steps is not None:
            self.steps.close()


def step_scalars(last: dict[str, Any]) -> dict[str, float | int]:
    """The scalar entries of an optimizer's ``last`` dict as Python numbers, in its order.

    0-d real tensors are read from the device together (one stacked ``tolist()``: one host read, in
    the widest of their dtypes, at least float32); Python / numpy numbers are kept; lists, dicts,
    strings, Python booleans and tensors with more than one dimension are skipped.
    """
    out: dict[str, Any] = {}
    tensors: dict[str, torch.Tensor] = {}
    for k, v in last.items():
        if isinstance(v, torch.Tensor):
            if v.dim() == 0 and not v.is_complex():
                tensors[k] = v.detach()
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            out[k] = int(v) if isinstance(v, numbers.Integral) else float(v)
    if tensors:
        dtype = reduce(torch.promote_types, (t.dtype for t in tensors.values()), torch.float32)
        dev = next(iter(tensors.values())).device
        values = torch.stack([t.to(device=dev, dtype=dtype) for t in tensors.values()]).tolist()
        out.update(zip(tensors, values))
    return {k: out[k] for k in last if k in out}


def _step_of(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


class StepLogger:
    """``train.log_every``: the optimizer's diagnostics every ``every`` optimizer steps (module docstring).

    :meth:`record` is called after every step with the global step (counted from 1) and keeps
    :func:`step_scalars` of ``opt.last`` when ``(step - 1) % every == 0``; :meth:`flush` appends the
    kept records to ``steps.jsonl`` (and TensorBoard).  ``start_step``: the step of the checkpoint
    the run resumes from; records of later steps already in ``steps.jsonl`` are dropped.
    """

    def __init__(self, run_dir: Path, every: int, *, start_step: int = 0, tensorboard: bool = True) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self.every = every
        self.path = Path(run_dir) / "steps.jsonl"
        self.pending: list[dict[str, Any]] = []
        if self.path.is_file():
            lines = self.path.read_text().splitlines()
            kept = [line for line in lines if _step_of(line) <= start_step]  # (a torn line: dropped)
            if len(kept) != len(lines):
                atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        log_dir = Path(run_dir) / "tensorboard" / "steps"
        self.writer = _summary_writer(log_dir, start_step + 1) if tensorboard else None

    def record(self, step: int, optimizer: Any) -> None:
        if (step - 1) % self.every == 0:
            self.pending.append({"step": step, **step_scalars(getattr(optimizer, "last", None) or {})})

    def flush(self) -> None:
        if not self.pending:
            return
        rows, self.pending = to_jsonable(self.pending), []
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        if self.writer is not None:
            for r in rows:
                for k, v in r.items():
                    if k != "step" and _loggable(v):
                        self.writer.add_scalar(f"optimizer/{k}", v, r["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
