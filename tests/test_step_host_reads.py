"""No host-device synchronisation per training step (issue 25, item 2).

On a GPU every ``float(t)``, ``t.item()``, ``bool(t)``, ``int(t)`` of a device tensor blocks the host
until the device has caught up. All of them dispatch to ``aten._local_scalar_dense`` (or
``aten.is_nonzero``), so a :class:`~torch.utils._python_dispatch.TorchDispatchMode` counts them on
the CPU too; ``Tensor.tolist`` and ``Tensor.numpy`` (which do not dispatch) are counted by wrapping
them. Every method of the experiment runner (:func:`experiments.methods.available_methods`, plus the
m-sharpness variants) trains a few steps of a tiny MLP on the digits through the runner's
:class:`experiments.train.Trainer`, and

* inside ``opt.step`` nothing is read, except ``torch.optim``'s own step counter
  (``optimizer.state[p]["step"]`` of a ``torch.optim`` optimizer: a CPU tensor even when the
  parameters live on a GPU, so not a device synchronisation), identified by the tensor read, and
  the one read of the SAM family's and bSAM's gradient check (below);
* the runner's own per-step code (``Trainer._epoch`` outside ``opt.step``) reads nothing outside
  its window reads (:meth:`experiments.divergence.StepLosses.read`, once every
  ``divergence.READ_EVERY`` steps and at the end of the epoch).

G-TRACER decides on the host whether a step is finite (its ``FloatingPointError``) and how far to
bound its correction: its step makes exactly one read, a single ``tolist`` of every number it needs
(:data:`ONE_READ`). Likewise the optimizers with a split step (the SAM family, bSAM: a
:class:`optimizers.step_protocol.SplitProtocol`) refuse a NaN / inf gradient before their update
(:func:`optimizers.step_protocol.check_finite`): one scalar read per step, the sum of the
gradients' norms (:data:`FINITE_READ`), and nothing else.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import experiments.divergence as dv
from experiments.config import resolve_config
from experiments.methods import available_methods
from experiments.runner import plan_runs
from experiments.train import Trainer
from optimizers.step_protocol import SplitProtocol
from tests.runner_helpers import cpu_trainer

READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default"}
ROOT = Path(__file__).resolve().parents[1]
BATCH, STEPS = 64, 3
TRACERS = ("gtracer", "sgd_tracer", "adam_tracer")
#: G-TRACER's one read per step: every number its host-side decisions need, in one transfer
ONE_READ = [("Tensor.tolist", ("optimizers/bayes/tracer.py", "step"))]
#: the gradient check of the optimizers with a split step: one scalar read per step
FINITE_READ = [("aten._local_scalar_dense.default", ("optimizers/step_protocol.py", "check_finite"))]

#: Method tables and hyperparameters some methods need (the runner's ConfigError names them).
EXTRA: dict[str, dict] = {
    "fsgvb": {"bayesian": {"kl_weight": 1.0}},
    "flat_sgvb": {"bayesian": {"kl_weight": 1.0}},
    "f_sgvb": {"bayesian": {"kl_weight": 1.0}},
}
#: F-MC-Dropout: its optimizer (SAM) with an mc_dropout table and a model with dropout
F_MC_DROPOUT = {"optimizer": "f_mc_dropout", "mc_dropout": {"samples": 2}}
M_SHARPNESS = ["sam", "asam", "fsam", "bsam"]  # with m = 4 sub-batches, vectorised


def _cases() -> list[tuple[str, dict]]:
    cases = [(m, {"optimizer": m, **EXTRA.get(m, {})}) for m in available_methods() if m != "f_mc_dropout"]
    assert "f_mc_dropout" in available_methods()
    cases.append(("f_mc_dropout", F_MC_DROPOUT))
    cases += [
        (f"{m}_m4", {"optimizer": m, "hyperparameters": {"m": 4, "batched_m": True}}) for m in M_SHARPNESS
    ]
    return [pytest.param(n, e, id=n) for n, e in cases]


def _where() -> tuple[str, str]:
    """The innermost frame of the project's own code outside the tests: (file, function)."""
    for frame in reversed(traceback.extract_stack()):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in ("optimizers", "experiments"):
            return str(path.relative_to(ROOT)), frame.name
    return "", ""


class _Reads(TorchDispatchMode):
    """Records every host read with its phase (``step``, ``runner``; ``window`` reads are not
    recorded), the step it happened in and where."""

    def __init__(self, opt) -> None:
        super().__init__()
        self.opt, self.phase, self.step = opt, "runner", 0
        self.found: list[tuple[str, int, str, tuple[str, str]]] = []

    def _step_counters(self) -> list[torch.Tensor]:
        """``state[p]["step"]`` of every torch.optim optimizer reachable from the run's optimizer."""
        seen, todo, out = set(), [self.opt], []
        while todo:
            o = todo.pop()
            if id(o) in seen:
                continue
            seen.add(id(o))
            if isinstance(o, torch.optim.Optimizer) and type(o).__module__.startswith("torch.optim"):
                out += [s["step"] for s in o.state.values() if isinstance(s.get("step"), torch.Tensor)]
            todo += [v for v in vars(o).values() if isinstance(v, torch.optim.Optimizer)]
        return out

    def note(self, what: str, t: torch.Tensor) -> None:
        if self.phase == "window":
            return
        if self.phase == "step" and t.device.type == "cpu" and any(t is s for s in self._step_counters()):
            return  # torch.optim's CPU step counter
        self.found.append((self.phase, self.step, what, _where()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in READS:
            self.note(str(func), args[0])
        return func(*args, **(kwargs or {}))


def _phase(mode: _Reads, phase: str, fn):
    def wrapped(*a, **k):
        old, mode.phase = mode.phase, phase
        try:
            return fn(*a, **k)
        finally:
            mode.phase = old

    return wrapped


def _count(monkeypatch, opt, run) -> _Reads:
    """Run ``run()`` with every host read recorded (module docstring)."""
    mode = _Reads(opt)

    step = opt.step  # the run's optimizer step, marked as the "step" phase

    def in_step(*a, **k):
        mode.phase, mode.step = "step", mode.step + 1
        try:
            return step(*a, **k)
        finally:
            mode.phase = "runner"

    for name in ("tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, _name=name, **k):
            mode.note(f"Tensor.{_name}", self)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    monkeypatch.setattr(opt, "step", in_step)
    monkeypatch.setattr(dv.StepLosses, "read", _phase(mode, "window", dv.StepLosses.read))
    with mode:
        run()
    return mode


def _checks_finite(opt) -> bool:
    """Is ``opt``, or an optimizer it wraps, one with the split step's gradient check?"""
    todo, seen = [opt], set()
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, SplitProtocol):
            return True
        todo += [v for v in vars(o).values() if isinstance(v, torch.optim.Optimizer)]
    return False


def _trainer(tmp: Path, name: str, entry: dict) -> Trainer:
    model_kwargs = {"sizes": [64, 8, 10], "activation": "tanh"}
    if "mc_dropout" in entry:
        model_kwargs["dropout"] = 0.1
    raw = {
        "name": "reads",
        "seeds": [0],
        "device": "cpu",
        "threads": 1,
        "progress": False,
        "precision": "float32",
        "out_dir": str(tmp),
        "data": {"name": "digits", "limit_train": BATCH * STEPS},
        "model": {"name": "mlp", "kwargs": model_kwargs},
        "train": {"epochs": 1, "batch_size": BATCH, "lr": 0.01},
        "methods": [{"name": name, **entry}],
        "evaluation": {"sharpness": [], "every": 0, "metrics": ["accuracy"]},
    }
    (run,) = plan_runs(resolve_config(raw))
    return cpu_trainer(run, seed=0)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
@pytest.mark.parametrize("name, entry", _cases())
def test_no_host_reads_per_step(tmp_path, monkeypatch, name, entry):
    monkeypatch.setattr(dv, "READ_EVERY", 2)  # a window read inside the epoch too (steps 2 and 3)
    t = _trainer(tmp_path, name, entry)
    if name == "f_mc_dropout":  # the name resolves to its builder in optimizers.bayes: SAM
        assert type(t.opt).__name__ == "SAM" and t.opt.param_groups[0]["rho"] == 0.05
    mode = _count(monkeypatch, t.opt, lambda: t._epoch(0))
    assert mode.step == STEPS
    runner = [(s, what, where) for phase, s, what, where in mode.found if phase == "runner"]
    assert not runner, f"the runner's step loop reads the device between its window reads: {runner}"
    got: dict[int, list] = {}
    for _, s, what, where in mode.found:
        if s == 1 and where == ("optimizers/per_example.py", "_compare"):
            continue  # VOGN's one-time check of its layer rules against the batched backward, step 1 only
        got.setdefault(s, []).append((what, where))
    one = ONE_READ if name in TRACERS else FINITE_READ if _checks_finite(t.opt) else None
    allowed = {s: one for s in range(1, STEPS + 1)} if one else {}
    assert got == allowed, f"{name}: host reads inside opt.step, by step: {got}"
