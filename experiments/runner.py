"""The grid of an experiment (sweep variants x methods x seeds) and the files of each run.

Each run has a directory ``<out_dir>/<name>/[<variant>/]<method>/seed<k>/`` holding

* ``config.toml``: the run's resolved configuration (one method, one seed, the variant's values
  applied; ``python -m experiments run <dir>/config.toml`` repeats exactly this run),
* ``environment.json``: Python / torch / numpy versions, device, seed, git commit, host name,
* ``noisy_labels.npz`` (with label noise): the clean and noisy training labels,
* ``checkpoint.pt``, ``log.jsonl``, ``log.csv`` (and ``tensorboard/``) while and after training
  (a deep ensemble keeps them per member, in ``member<k>/``: :mod:`experiments.members`),
* ``metrics.json`` (the flat row of the results table) and ``results.json`` (a :class:`RunResult`:
  every metric, the CIFAR-10-C table, the sharpness rows and curves, the reliability diagrams, the
  history, the environment),
* ``predictions.npz`` (with ``evaluation.save_predictions = true``): the test probabilities.

A run whose ``results.json`` records the same configuration (its fingerprint,
:mod:`experiments.run_identity`) is skipped; one with a checkpoint
resumes from it; a checkpoint of another configuration or of other data is refused, and so is a run
directory whose ``config.toml`` / ``results.json`` record another configuration in any key that can
change a result (:mod:`experiments.run_check`) or that another runner holds (:mod:`experiments.run_lock`).
"""

from __future__ import annotations

import copy
import itertools
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from experiments import run_identity
from experiments.checkpoint import check_checkpoint
from experiments.config import ConfigError, resolve_config, set_key, sweep_method
from experiments.data import check_splits
from experiments.divergence import Diverged, DivergenceRecord
from experiments.evaluate import check_metric_names, evaluate_run, sharpness_measures
from experiments.initial_weights import file_sha256
from experiments.members import EnsembleTrainer, member_dirs
from experiments.methods import check_run
from experiments.parallel import DistContext
from experiments.run_check import check_run_dir
from experiments.run_lock import run_dir_lock
from experiments.toml_writer import dumps
from experiments.train import Trainer, check_model
from landscape.data import CIFAR10C_ALL_CORRUPTIONS
from landscape.deprecation import moved_names
from landscape.io import atomic_write, atomic_write_json, atomic_write_text, read_json_object
from landscape.models import available_models, model_factory
from landscape.results import Result

__all__ = ["Run", "RunResult", "environment", "plan_entries", "plan_runs", "run_one", "run_task", "validate"]

#: names that moved to :mod:`experiments.run_identity`: importable from here, with a warning, for one
#: release
__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        (
            "semantic_config",
            "run_settings",
            "fingerprint",
            "_LATER_KEYS",
            "_LATER_METHOD_KEYS",
            "_LATER_SWAG_KEYS",
            "_TRAIN_NOT_SEMANTIC",
            "_NOT_SEMANTIC",
            "_EVAL_ONLY",
        ),  # fmt: skip
        "experiments.run_identity",
    ),
)


@dataclass
class RunResult(Result):
    """Everything one run produced (see the module docstring)."""

    method: str = ""
    seed: int = 0
    variant: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    history: list[Any] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    optimizer_arguments: dict[str, Any] = field(default_factory=dict)
    effective: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = ""
    #: ``"completed"``, or ``"diverged"`` with ``divergence`` the record of where and why
    #: (:class:`experiments.divergence.DivergenceRecord`) and no metrics
    status: str = "completed"
    divergence: dict[str, Any] = field(default_factory=dict)

    kind: ClassVar[str] = "experiment_run"


@dataclass
class Run:
    """One cell of the grid."""

    variant: str
    method: str
    seed: int
    cfg: dict[str, Any]
    run_dir: Path


def _fmt(v: Any) -> str:
    return repr(v) if isinstance(v, float) else str(v)


def plan_runs(cfg: dict[str, Any]) -> list[Run]:
    """Every run of the grid, in a fixed order (variants, then methods, then seeds).

    A sweep key of the whole experiment (``data.label_noise``) multiplies every method; a key of
    one method (``methods.sam.hyperparameters.rho``, :func:`experiments.config.sweep_method`)
    multiplies only that method, whose variant label names it (``rho=0.05``): the other methods
    run once per value of the remaining keys, under the variant of those keys alone (no variant
    when there are none), so a rho sweep of SAM beside SGD trains SGD once per seed.
    """
    sweep = cfg["sweep"]
    keys = list(sweep)
    owner = {k: sweep_method(k, cfg["methods"]) for k in keys}
    combos = list(itertools.product(*(sweep[k] for k in keys))) if keys else [()]
    root = Path(cfg["out_dir"]) / cfg["name"]
    runs: list[Run] = []
    planned: set[tuple[str, str]] = set()
    for combo in combos:
        base = copy.deepcopy(cfg)
        base["sweep"] = {}
        for k, v in zip(keys, combo):
            set_key(base, k.split("."), v, f"sweep.{k}")
        for method in base["methods"]:
            mine = [(k, v) for k, v in zip(keys, combo) if owner[k] in (None, method["name"])]
            variant = ",".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in mine)
            if (variant, method["name"]) in planned:  # a sweep of another method's key
                continue
            planned.add((variant, method["name"]))
            for seed in cfg["seeds"]:
                one = copy.deepcopy(base)
                one["methods"], one["seeds"] = [copy.deepcopy(method)], [seed]
                if method["epochs"]:  # a method trained for its own number of epochs
                    one["train"]["epochs"] = method["epochs"]
                if method["schedule"]:  # ... or with its own schedule ("none": its optimizer's)
                    one["train"]["schedule"] = method["schedule"]
                one = _with_checkpoint_hash(resolve_config(one))
                d = root / variant if variant else root
                runs.append(Run(variant, method["name"], seed, one, d / method["name"] / f"seed{seed}"))
    return runs


def _with_checkpoint_hash(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with ``model.checkpoint_sha256`` set to the SHA-256 of ``model.checkpoint`` (a changed
    file is a different run, :mod:`experiments.run_identity`); a hash given in the config must match.

    Raises:
        ConfigError: the file is missing, or its hash is not the given one."""
    m = cfg["model"]
    if not m["checkpoint"]:
        return cfg
    sha = file_sha256(m["checkpoint"])
    if m["checkpoint_sha256"] and m["checkpoint_sha256"] != sha:
        raise ConfigError(
            f"model.checkpoint {m['checkpoint']} has SHA-256 {sha}, but model.checkpoint_sha256 = "
            f"{m['checkpoint_sha256']}: the file is not the one the config names; use that file, or "
            "remove checkpoint_sha256 (a new run)"
        )
    m["checkpoint_sha256"] = sha
    return cfg


def validate(runs: list[Run]) -> None:
    """Check what can be checked before any training: optimizers, models and sharpness measures
    exist (raises :class:`experiments.config.ConfigError` naming the problem)."""
    for run in runs:
        check_splits(run.cfg)
        contract = check_run(run.cfg)
        name = run.cfg["model"]["name"]
        if name not in available_models():
            raise ConfigError(
                f"model.name {name!r} is not a registered model; available: {', '.join(available_models())}"
            )
        if run.cfg["methods"][0]["mc_dropout"] or contract.independent_examples:
            _check_meta_model(run.cfg, contract)
        try:
            sharpness_measures(run.cfg)
            check_metric_names(run.cfg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        bad = [c for c in run.cfg["evaluation"]["corruption_names"] if c not in CIFAR10C_ALL_CORRUPTIONS]
        if bad:
            raise ConfigError(
                f"evaluation.corruption_names: unknown CIFAR-10-C corruption(s) {bad}; known: "
                f"{', '.join(CIFAR10C_ALL_CORRUPTIONS)}"
            )


def _check_meta_model(cfg: dict[str, Any], contract: Any) -> None:
    """The method's checks against its model, built on the ``meta`` device (no memory, no time)."""
    try:
        model = model_factory(cfg["model"]["name"], device="meta", **cfg["model"]["kwargs"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"model {cfg['model']['name']!r} rejects model.kwargs {cfg['model']['kwargs']}: {exc}"
        ) from None
    check_model(cfg, model, contract)


def _git_commit(root: Path | None = None) -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it, read without writing:
    ``GIT_OPTIONAL_LOCKS=0`` stops ``git status`` from refreshing ``.git/index`` (a run writes
    nothing outside its run directory)."""
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, env=env
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None}
    if head.returncode != 0:
        return {"git_commit": None}
    clean = dirty.returncode == 0 and not dirty.stdout.strip()
    return {"git_commit": head.stdout.strip(), "git_dirty": None if dirty.returncode else not clean}


def environment(device: torch.device, seed: int, ctx: DistContext) -> dict[str, Any]:
    """Versions, device, seed, git commit and host of a run."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "cuda": torch.version.cuda,
        "seed": seed,
        "world_size": ctx.world,
        "rank": ctx.rank,
        "distributed_mode": ctx.mode,
        "command": [sys.executable, *sys.argv],
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "threads": torch.get_num_threads(),
    }
    env.update(_git_commit())
    return env


def _save_noise(run_dir: Path, data: Any) -> None:
    """``noisy_labels.json``: the noisy and clean training labels and the flipped mask
    (``landscape.data.NoisyLabels``, read back with ``landscape.load_result``) and the indices of the
    training examples used (a subset under ``limit`` / ``budget``)."""
    if data.noise is None:
        return
    data.noise.config["train_indices"] = data.train_indices.tolist()
    data.noise.save(run_dir / "noisy_labels.json")


def completed(run: Run) -> dict[str, Any] | None:
    """The metrics of a finished run with this configuration (``{"status": "diverged", "divergence":
    record}`` for a run that diverged), or ``None``."""
    d = read_json_object(run.run_dir / "results.json", what="results file")
    if d is not None and d.get("fingerprint") == run_identity.fingerprint(run.cfg, training_only=False):
        if d.get("status") == "diverged":
            return {"status": "diverged", "divergence": d.get("divergence", {})}
        return d.get("metrics")
    return None


def run_one(run: Run, *, device: torch.device, ctx: DistContext, progress: bool = False) -> dict[str, Any]:
    """Train (or resume) and evaluate one run; returns its metrics row.

    Holds the run directory's lock throughout (:mod:`experiments.run_lock`: one runner per run
    directory) and first checks that the directory holds no files of another configuration
    (:func:`experiments.run_check.check_run_dir`)."""
    with run_dir_lock(run.run_dir, ctx=ctx, device=device):
        check_run_dir(run)
        return _run_one(run, device=device, ctx=ctx, progress=progress)


def _run_one(run: Run, *, device: torch.device, ctx: DistContext, progress: bool = False) -> dict[str, Any]:
    """:func:`run_one` under the run directory's lock."""
    done = completed(run)
    if done is not None:
        return done
    t0 = time.perf_counter()
    ensemble = run.cfg["methods"][0]["ensemble"]
    dirs = member_dirs(run.run_dir, ensemble["members"]) if ensemble else [run.run_dir]
    for d in dirs:
        check_checkpoint(d / "checkpoint.pt", run_identity.fingerprint(run.cfg, training_only=True))
    if ctx.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run.run_dir / "config.toml", dumps(run.cfg))
    trainer = (EnsembleTrainer if ensemble else Trainer)(
        run.cfg,
        run.run_dir,
        seed=run.seed,
        device=device,
        ctx=ctx,
        progress=progress,
        fingerprint=run_identity.fingerprint(run.cfg, training_only=True),
    )
    env = environment(device, run.seed, ctx)
    if ctx.is_main:
        atomic_write_json(run.run_dir / "environment.json", env)
        _save_noise(run.run_dir, trainer.data)
    diverged = None
    try:
        trainer.fit()
    except Diverged as exc:  # recorded below; the checkpoint of the last good epoch stays
        diverged = exc.record
    metrics: dict[str, Any] = {}
    details: dict[str, Any] = {}
    if ctx.is_main:
        if diverged is None:
            try:
                metrics, details = evaluate_run(
                    trainer.model,
                    trainer.opt,
                    trainer.data,
                    trainer.cfg,
                    seed=run.seed,
                    device=device,
                    progress=progress,
                )
            except Diverged as exc:  # e.g. a model average over posterior samples
                diverged, metrics, details = exc.record.complete(_state_at_end(trainer)), {}, {}
        if trainer.data.noise is not None:
            details["label_noise"] = {
                k: v for k, v in trainer.data.noise.config.items() if k != "train_indices"
            }
            details["label_noise"]["realised_rate"] = trainer.data.noise.realised_rate
        save_run(
            run,
            trainer,
            seconds=time.perf_counter() - t0,
            env=env,
            metrics=metrics,
            details=details,
            epochs=trainer.cfg["train"]["epochs"],
            diverged=diverged,
        )
    ctx.barrier()
    if diverged is not None:
        return {"status": "diverged", "divergence": diverged.to_dict()}
    return metrics


def save_run(
    run: Run,
    trainer: Any,
    *,
    seconds: float,
    env: dict[str, Any],
    metrics: dict[str, Any],
    details: dict[str, Any],
    epochs: int,
    diverged: Any,
) -> None:
    """Write a finished run's ``metrics.json`` (the row tables average; only the status for a run
    that diverged) and then ``results.json`` (everything; its presence marks the run done).

    ``epochs``: the epochs the run was set to (the study's stopping rule passes those it ran)."""
    effective = {
        "epochs": epochs,
        "n_train": getattr(trainer, "n", None),  # an ensemble that diverged has no member 0 yet
        "n_test": len(trainer.data.y_test),
        "batch_size": getattr(trainer, "batch_size", None),
        "steps_per_epoch": getattr(trainer, "steps_per_epoch", None),
        "steps": trainer.counters["step"],
        "skipped_steps": trainer.counters["skipped"],
    }
    notes = getattr(trainer, "notes", None) or getattr(getattr(trainer, "first", None), "notes", None)
    if notes and "initial_weights" in notes:  # model.checkpoint: what was loaded, what kept its init
        effective["initial_weights"] = notes["initial_weights"]
    result = RunResult(
        config=run.cfg,
        seconds=seconds,
        method=run.method,
        seed=run.seed,
        variant=run.variant,
        metrics=metrics,
        details=details,
        history=trainer.history,
        environment=env,
        optimizer_arguments=getattr(trainer, "opt_args", {}),
        effective=effective,
        fingerprint=run_identity.fingerprint(run.cfg, training_only=False),
        status="completed" if diverged is None else "diverged",
        divergence={} if diverged is None else diverged.to_dict(),
    )
    predictions = details.pop("predictions", None)
    if predictions:  # evaluation.save_predictions: before results.json, which marks the run done
        save_predictions(run.run_dir / "predictions.npz", predictions)
    ids = {"method": run.method, "seed": run.seed, "variant": run.variant}
    row = {**ids, **metrics} if diverged is None else {**ids, "status": "diverged"}  # nothing to average
    atomic_write_json(run.run_dir / "metrics.json", row)
    result.save(run.run_dir / "results.json")


def save_predictions(path: Path, predictions: dict[str, torch.Tensor]) -> None:
    """``predictions.npz`` (``evaluation.save_predictions``): the test probabilities of each
    evaluation (``point``, ``swa``, ``bma``: ``[n_test, classes]`` float64) and the test ``labels``,
    written atomically; read it with ``numpy.load(path, allow_pickle=False)``."""
    arrays = {k: v.detach().cpu().numpy() for k, v in predictions.items()}

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: numpy adds no ".npz" to the temporary name
            np.savez(f, **arrays)

    atomic_write(path, write)


def _state_at_end(trainer: Any) -> Any:
    """Where a run that diverged in its final evaluation stood: its last step and epoch, the last
    epoch's training loss and the reference loss of its divergence monitor."""
    mon = getattr(trainer, "monitor", None)
    last = trainer.history[-1].get("train_loss") if trainer.history else None
    return DivergenceRecord(
        "",
        step=trainer.counters["step"],
        epoch=trainer.counters["epoch"],
        loss=last,
        reference=getattr(mon, "reference", None),
        factor=getattr(mon, "factor", trainer.cfg["train"].get("divergence_factor")),
        window=getattr(mon, "window", None),
    )


def resolve_device(name: str) -> torch.device:
    """``auto``: ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {name!r} is not a device name; use auto, cpu, cuda, cuda:1, ...") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: CUDA is not available on this machine; use device=cpu or auto")
    return dev


def run_task(run: Run) -> dict[str, Any]:
    """:func:`run_one` in a process of its own (a cluster task, :mod:`experiments.cluster`): on the
    run's ``device`` with its ``threads``, outside any data-parallel group, without progress bars
    (the per-epoch log is what ``status`` reads)."""
    if run.cfg["threads"]:
        torch.set_num_threads(run.cfg["threads"])
    return run_one(run, device=resolve_device(run.cfg["device"]), ctx=DistContext(), progress=False)


def plan_entries(runs: list[Run], root: Path) -> list[dict[str, Any]]:
    """The ``plan.json`` entries of ``runs`` (:func:`experiments.status.write_plan`) under ``root``."""
    return [
        {
            "dir": str(r.run_dir.relative_to(root)),
            "label": str(r.run_dir.relative_to(root)),
            "epochs": r.cfg["train"]["epochs"],
            "done": "",
        }
        for r in runs
    ]
