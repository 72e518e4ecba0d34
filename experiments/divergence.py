"""Divergence of a run as a recorded outcome (not a crash of the sweep).

A run is stopped and recorded as diverged (:class:`Diverged`, caught by
:func:`experiments.runner.run_one`, which writes ``results.json`` with ``status = "diverged"``) when

* ``"non-finite loss"``: a training step returns a NaN / inf loss (also when the step itself refuses
  the NaN / inf gradient that comes with it: :class:`optimizers.step_protocol.NonFiniteGradient`
  carries the loss, which is then checked as the step's);
* ``"non-finite gradient"``: a step refuses a NaN / inf gradient while its loss is finite (the SAM
  family and bSAM check their gradients, :mod:`optimizers.step_protocol`);
* ``"non-finite weights"``: a parameter or floating-point buffer of the model is NaN / inf at the end
  of an epoch (checked once per epoch, before the epoch's checkpoint is written);
* ``"non-finite predictions"``: an evaluation (the per-epoch test metrics, or the final point
  prediction, SWA, model average, ensemble member or CIFAR-10-C set) yields NaN / inf
  probabilities;
* ``"loss grew by more than divergence_factor"``: the running mean of the training loss over the
  last ``window`` steps (``window = min(10, steps per epoch)``; a single noisy batch does not trip
  it) exceeds ``train.divergence_factor`` times the *reference* loss, the loss of the run's first
  step (at the initial weights: a blow-up within the first steps would inflate a mean over them,
  while the first batch's loss at initialisation varies little). ``divergence_factor = 0`` turns
  this check off; a reference ``<= 0`` never trips it.

The default factor is 10. In the healthy runs of the paper configs (the digits configs and CPU
miniatures as they are, the CIFAR configs' methods and hyperparameters on the digits with an MLP
for 10 epochs; seed 0; 67 runs) the running mean never exceeded 2.1 x the first loss (bSAM at 60 %
label noise; VOGN 1.5, every other method at most 1.4) and no single step 3.3 x (VOGN), while the
finite blow-ups the check is for exceed it by orders of magnitude (plain SGD at lr 1e6 on a tanh
MLP: about 1e5 x, every number finite).

:class:`DivergenceMonitor` works on loss values on the host: :meth:`~DivergenceMonitor.update` takes
any number of consecutive step losses at once (the steps are numbered back from the last one). The
trainer keeps its step losses on the device (:class:`StepLosses`) and reads them back with one
host synchronisation every ``READ_EVERY`` steps (the monitor's window) and at the end of the epoch,
so the monitor records the same step, epoch, loss and reason as with a read every step; a run that
trips the check stops at the next read (the extra steps leave no checkpoint). Its state (reference and
window) is saved in the checkpoint's counters, so a resumed run decides as the uninterrupted one.

Data parallelism: every rank must stop at the same step, or the others would wait forever at the
next all-reduce. The closure returns the all-reduced loss (the same value on every rank), so the
per-step decision is the same everywhere (this assumes the optimizer's step returns the closure's
value, as the suite's data-parallel optimizers do), except with ``perturbation = "local"``, where
the SAM family returns each rank's own loss at ``w``; there a rank's decision is deferred to the end
of the epoch (the ranks train the rest of that epoch; the record keeps the step that tripped). At
A step that refuses a non-finite gradient (``"non-finite gradient"``, or ``"non-finite loss"``
with its loss) stops the run at once on every rank: the descent gradient it checks is the
all-reduced one, the same everywhere (with ``"local"`` a NaN at one rank's ``w`` reaches it through
that rank's perturbed pass). At
the end of every epoch the ranks agree with one all-reduce of the reasons (:func:`agree`), which
also carries the main rank's per-epoch evaluation to the others. The final evaluation runs on the
main rank only and needs no agreement.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "GROWTH",
    "NONFINITE_GRADIENT",
    "NONFINITE_LOSS",
    "NONFINITE_PREDICTIONS",
    "NONFINITE_WEIGHTS",
    "READ_EVERY",
    "REASONS",
    "WINDOW",
    "DivergenceMonitor",
    "DivergenceRecord",
    "Diverged",
    "StepLosses",
    "agree",
    "check_predictions",
    "nonfinite_weights",
]

NONFINITE_LOSS = "non-finite loss"
NONFINITE_GRADIENT = "non-finite gradient"
NONFINITE_WEIGHTS = "non-finite weights"
NONFINITE_PREDICTIONS = "non-finite predictions"
GROWTH = "loss grew by more than divergence_factor"
#: Every reason a run is recorded as diverged, in the order :func:`agree` prefers them.
REASONS: tuple[str, ...] = (
    NONFINITE_LOSS,
    NONFINITE_GRADIENT,
    NONFINITE_WEIGHTS,
    NONFINITE_PREDICTIONS,
    GROWTH,
)
#: Steps of the running mean (at most the steps of one epoch).
WINDOW = 10
#: Steps between two host reads of the training losses (:class:`StepLosses`); ``None``: the
#: monitor's window. A read every step (1) records the same divergence, only slower on a GPU.
READ_EVERY: int | None = None


@dataclass
class DivergenceRecord:
    """Where and why a run diverged. ``step`` is the global optimizer step (1-based, the step whose
    loss tripped the check, or the last step before the check), ``epoch`` the epoch it happened in
    (1-based), ``loss`` the value that tripped (the running mean for the growth check, the step loss
    for a non-finite loss, the last running mean otherwise), ``reference`` the initial loss."""

    reason: str
    step: int | None = None
    epoch: int | None = None
    loss: float | None = None
    reference: float | None = None
    factor: float | None = None
    window: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def complete(self, other: DivergenceRecord) -> DivergenceRecord:
        """Fill the fields left ``None`` from ``other``; returns ``self``."""
        for k in ("step", "epoch", "loss", "reference", "factor", "window"):
            if getattr(self, k) is None:
                setattr(self, k, getattr(other, k))
        return self

    def describe(self) -> str:
        """One line: ``<reason> at step S (epoch E): loss L, initial loss R[; detail]``."""
        where = f" at step {self.step}" if self.step is not None else ""
        where += f" (epoch {self.epoch})" if self.epoch is not None else ""
        vals = []
        if self.loss is not None:
            vals.append(f"loss {self.loss:.4g}")
        if self.reference is not None:
            vals.append(f"initial loss {self.reference:.4g}")
        text = f"{self.reason}{where}" + (": " + ", ".join(vals) if vals else "")
        return text + (f"; {self.detail}" if self.detail else "")


class Diverged(FloatingPointError):
    """A run diverged; ``record`` (a :class:`DivergenceRecord`) says where and why."""

    def __init__(self, record: DivergenceRecord, run_dir: Any = None) -> None:
        self.record = record
        where = f"run {run_dir}: " if run_dir is not None else ""
        super().__init__(
            f"{where}training diverged: {record.describe()}; lower the learning rate or rho "
            "(train.divergence_factor sets the growth check, 0 turns it off)"
        )


class DivergenceMonitor:
    """The per-step checks of the training loss (non-finite, growth); see the module docstring."""

    def __init__(self, factor: float, window: int = WINDOW) -> None:
        if not factor >= 0 or window < 1:
            raise ValueError(f"divergence factor must be >= 0 and window >= 1, got {factor}, {window}")
        self.factor, self.window = float(factor), int(window)
        self.reference: float | None = None
        self.recent: deque[float] = deque(maxlen=self.window)

    def running_mean(self) -> float | None:
        return sum(self.recent) / len(self.recent) if self.recent else None

    def update(self, values: Iterable[float], *, step: int, epoch: int) -> DivergenceRecord | None:
        """Feed consecutive step losses, the last one of global step ``step`` in epoch ``epoch``;
        returns the record of the first step that trips a check, or ``None``."""
        values = [float(v) for v in values]
        for i, v in enumerate(values):
            s = step - (len(values) - 1 - i)
            if not math.isfinite(v):
                return self._record(NONFINITE_LOSS, s, epoch, v)
            if self.reference is None:
                self.reference = v
            self.recent.append(v)
            if self.factor > 0 and self.reference > 0 and len(self.recent) == self.window:
                mean = self.running_mean()
                if mean > self.factor * self.reference:
                    return self._record(GROWTH, s, epoch, mean)
        return None

    def _record(
        self, reason: str, step: int | None, epoch: int | None, loss: float | None
    ) -> DivergenceRecord:
        return DivergenceRecord(reason, step, epoch, loss, self.reference, self.factor, self.window)

    def record(
        self, reason: str, *, step: int | None, epoch: int | None, detail: str = ""
    ) -> DivergenceRecord:
        """A record of ``reason`` found outside the loss checks (weights, predictions)."""
        rec = self._record(reason, step, epoch, self.running_mean())
        rec.detail = detail
        return rec

    def state_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any] | None, history: list[dict[str, Any]] = ()) -> None:
        """Restore :meth:`state_dict`; without one (a checkpoint written before the check existed)
        the reference is the first epoch's mean training loss of ``history``."""
        if state:
            self.reference = state.get("reference")
            self.recent = deque(state.get("recent", []), maxlen=self.window)
        elif history and math.isfinite(float(history[0].get("train_loss", math.nan))):
            self.reference = float(history[0]["train_loss"])


class StepLosses:
    """An epoch's step losses kept on the device (no host synchronisation per step) and read back
    with one ``torch.stack(...).tolist()`` per :meth:`read`. ``total / count`` is the epoch's mean
    loss over the finite values, each weighted by its batch size (summed in step order, as a sum of
    one ``float(loss)`` per step would be)."""

    def __init__(self) -> None:
        self.losses: list[Any] = []
        self.steps: list[int] = []
        self.sizes: list[int] = []
        self.total, self.count = 0.0, 0

    def add(self, loss: Any, step: int, size: int) -> None:
        """Keep the loss of global step ``step`` (a batch of ``size`` examples)."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.tensor(float(loss))
        self.losses.append(loss.detach() if loss.requires_grad else loss)
        self.steps.append(step)
        self.sizes.append(size)

    def read(self, monitor: DivergenceMonitor | None, epoch: int) -> DivergenceRecord | None:
        """Read the losses kept since the last read (one host synchronisation), add them to the mean
        and feed them to ``monitor`` (``None``: not) in runs of consecutive steps (a skipped step,
        fp16 loss scaling, has no loss); returns the monitor's record of the first step that trips."""
        if not self.losses:
            return None
        try:  # one-element losses of one shape, dtype promoted
            values = torch.stack(self.losses).reshape(-1).tolist()
        except RuntimeError:  # of different shapes or devices
            values = [float(t) for t in self.losses]
        steps, sizes = self.steps, self.sizes
        self.losses, self.steps, self.sizes = [], [], []
        for v, n in zip(values, sizes):
            if math.isfinite(v):
                self.total += v * n
                self.count += n
        found, start = None, 0
        for i in range(1, len(steps) + 1):
            if monitor is not None and found is None and (i == len(steps) or steps[i] != steps[i - 1] + 1):
                found = monitor.update(values[start:i], step=steps[i - 1], epoch=epoch)
                start = i
        return found

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def state_dict(self) -> dict[str, Any]:
        """The unread losses (0-d tensors, copied), their steps and sizes, and the running
        ``total`` / ``count``: what a mid-epoch checkpoint (:mod:`experiments.checkpoint`) keeps of
        a partial epoch, loadable with ``torch.load(weights_only=True)``."""
        return {
            "losses": [t.detach().clone() for t in self.losses],
            "steps": list(self.steps),
            "sizes": list(self.sizes),
            "total": self.total,
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Restore :meth:`state_dict` (the unread losses moved to ``device``); the next :meth:`read`
        then returns what it would have returned without the save."""
        self.losses = [t if device is None else t.to(device) for t in state["losses"]]
        self.steps = [int(s) for s in state["steps"]]
        self.sizes = [int(n) for n in state["sizes"]]
        if not len(self.losses) == len(self.steps) == len(self.sizes):
            raise ValueError(
                f"StepLosses state with {len(self.losses)} losses, {len(self.steps)} steps and "
                f"{len(self.sizes)} sizes: the three lists must have one entry per step"
            )
        self.total, self.count = float(state["total"]), int(state["count"])


def nonfinite_weights(model: nn.Module) -> list[str]:
    """Names of the parameters and floating-point buffers of ``model`` holding NaN / inf (one host
    synchronisation for the whole model)."""
    named = [(n, t) for n, t in model.named_parameters()]
    named += [(n, t) for n, t in model.named_buffers() if t.is_floating_point()]
    if not named:
        return []
    ok = torch.stack([torch.isfinite(t.detach()).all() for _, t in named]).cpu()
    return [n for (n, _), good in zip(named, ok.tolist()) if not good]


def check_predictions(probs: torch.Tensor | None, what: str) -> None:
    """Raise :class:`Diverged` (``"non-finite predictions"``) if ``probs`` holds NaN / inf."""
    if probs is None or bool(torch.isfinite(probs).all()):
        return
    bad = (~torch.isfinite(probs)).reshape(len(probs), -1).any(dim=1)
    first = int(bad.nonzero()[0, 0])
    detail = f"{what}: {int(bad.sum())} of {len(probs)} examples, first at example {first}"
    raise Diverged(DivergenceRecord(NONFINITE_PREDICTIONS, detail=detail))


def agree(ctx: Any, record: DivergenceRecord | None, device: torch.device) -> DivergenceRecord | None:
    """Data parallelism: the ranks agree whether (and why) the run diverged, with one all-reduce of
    the reasons; a rank that found nothing itself takes the first reason found anywhere. Without
    data parallelism ``record`` is returned unchanged."""
    if not ctx.data_parallel:
        return record
    flags = torch.zeros(len(REASONS), dtype=torch.float64, device=device)
    if record is not None:
        flags[REASONS.index(record.reason)] = 1.0
    total = ctx.all_reduce_sum(flags).cpu().tolist()
    if record is not None or not any(total):
        return record
    reason = REASONS[next(i for i, v in enumerate(total) if v > 0)]
    return DivergenceRecord(reason, detail=f"found on another rank ({int(sum(total))} of {ctx.world})")
