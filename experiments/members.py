"""Deep ensembles in the runner: a method with ``ensemble = { members = M }`` trains ``M`` runs
and evaluates their average (Lakshminarayanan et al. 2017, Sec. 2.4 and Alg. 1, without their
optional adversarial training; with ``optimizer = "sam"`` the F-Deep-Ensembles of Nguyen et al.
2023, Tables 1-2).

Member ``k`` of the ensemble with seed ``s`` is the run with seed ``s * M + k`` (so the members of
the ensembles of different seeds are disjoint): its own initialisation, data order, augmentation
and optimizer noise, exactly what a single run with that seed would do, trained on the ensemble's
data (the label noise of seed ``s``). It lives in ``<run dir>/member<k>/`` with its own per-epoch
checkpoint and logs, so a stopped ensemble resumes member by member, bit-identically. The run
directory itself holds the ensemble's ``config.toml``, ``results.json`` and ``metrics.json``, like
every other method's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from experiments.budget import apply_budget
from experiments.data import RunData, prepare_data
from experiments.divergence import Diverged
from experiments.ensembles import Members
from experiments.parallel import DistContext
from experiments.train import Trainer

__all__ = ["EnsembleTrainer", "member_dirs", "member_seed"]


def member_seed(seed: int, k: int, members: int) -> int:
    """The seed of member ``k`` of the ``members``-member ensemble with seed ``seed``: ``seed * M + k``."""
    return int(seed) * int(members) + int(k)


def member_dirs(run_dir: Path, members: int) -> list[Path]:
    """``<run_dir>/member0 ... member<M-1>``."""
    return [Path(run_dir) / f"member{k}" for k in range(members)]


class EnsembleTrainer:
    """Train the members of an ensemble run one after the other (see the module docstring).

    After :meth:`fit`, ``model`` / ``opt_args`` / ``data`` / ``n`` / ``batch_size`` /
    ``steps_per_epoch`` are member 0's, ``opt`` is the :class:`experiments.ensembles.Members`
    (every member's weights and buffers, on the CPU) that :func:`experiments.evaluate.evaluate_run`
    averages, ``history`` every member's epochs (with a ``member`` column) and ``counters`` the
    steps summed over the members.
    """

    def __init__(
        self,
        cfg: dict[str, Any],
        run_dir: Path,
        *,
        seed: int,
        device: torch.device,
        ctx: DistContext,
        fingerprint: str,
        progress: bool = False,
    ) -> None:
        self.raw_cfg = cfg
        self.cfg = apply_budget(cfg)
        self.run_dir = Path(run_dir)
        self.seed, self.device, self.ctx = seed, device, ctx
        self.fingerprint, self.progress = fingerprint, progress
        self.num_members = int(self.cfg["methods"][0]["ensemble"]["members"])
        self.seeds = [member_seed(seed, k, self.num_members) for k in range(self.num_members)]
        self.dirs = member_dirs(self.run_dir, self.num_members)
        self.data: RunData = prepare_data(self.cfg, seed)
        self.counters = {"epoch": 0, "step": 0, "skipped": 0}
        self.history: list[dict[str, Any]] = []
        self.opt: Members | None = None

    def _member(self, k: int) -> Any:
        return Trainer(
            self.raw_cfg,
            self.dirs[k],
            seed=self.seeds[k],
            device=self.device,
            ctx=self.ctx,
            fingerprint=self.fingerprint,
            progress=self.progress,
            data=self.data,
        )

    def fit(self) -> None:
        """Train (or resume, or just load) every member; afterwards the ensemble is ready to evaluate."""
        states: list[dict[str, torch.Tensor]] = []
        self.history, self.counters = [], {"epoch": 0, "step": 0, "skipped": 0}
        for k in range(self.num_members):
            if self.ctx.is_main:
                self.dirs[k].mkdir(parents=True, exist_ok=True)
            trainer = self._member(k)
            try:
                trainer.fit()
            except Diverged as exc:  # the run diverged: keep the member's epochs, name the member
                self.history += [{"member": k, "seed": self.seeds[k], **row} for row in trainer.history]
                self.counters["step"] += trainer.counters["step"]
                exc.record.detail = "; ".join(
                    filter(None, [f"member {k} (seed {self.seeds[k]})", exc.record.detail])
                )
                raise
            states.append(
                {name: v.detach().to("cpu", copy=True) for name, v in trainer.model.state_dict().items()}
            )
            self.history += [{"member": k, "seed": self.seeds[k], **row} for row in trainer.history]
            self.counters["epoch"] = trainer.counters["epoch"]
            self.counters["step"] += trainer.counters["step"]
            self.counters["skipped"] += trainer.counters["skipped"]
            if k == 0:
                self.first = trainer
        first = self.first
        self.model, self.n, self.batch_size = first.model, first.n, first.batch_size
        self.steps_per_epoch = first.steps_per_epoch
        self.opt_args = {**first.opt_args, "members": self.num_members, "member_seeds": self.seeds}
        self.opt = Members(states, list(self.seeds))
