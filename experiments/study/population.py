"""Populations of trained models and their sharpness measures (Jiang et al. 2020, "Fantastic
generalization measures and where to find them", Sec. 3-4: many models over a hyperparameter space,
each measure correlated with the generalisation gap).

A study has ``populations`` populations: population ``i`` is the sample of
:func:`experiments.study.config.plan_population` with sampling seed ``sampling_seed + i``, so the
study can tell the variability between populations from that of the bootstrap within one
(:mod:`experiments.study.combine`). Every distinct member (a point of one or more populations) is
trained once as a run of the experiment runner (:mod:`experiments.study.members`; under a ``stop``
table until the common training loss, :mod:`experiments.study.stopping`) in
``<out>/runs/<id>/<optimizer>/seed<k>/`` and then measured on the weights read back from that run
directory (:mod:`experiments.study.measure`). One JSON file per member (``models/<id>.json``,
written atomically) holds its table row, its sharpness rows, the runner's metrics and history, and
the configuration: a member whose file records the same configuration is neither trained nor
measured again, and a member whose run was interrupted resumes from the run's last epoch checkpoint.

``jobs > 1`` trains and measures that many members at a time in worker processes (``spawn``), each
with ``threads`` torch threads; every member's result is the same as in one process, because each
member's training and measures draw only from their own seeded generators. ``timing.json`` records
the wall time of every invocation that trained members and ``populations.json`` the members of each
population.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from experiments.cluster import Work, pending_work, shard, submit
from experiments.run_identity import semantic_config
from experiments.runner import Run
from experiments.status import write_plan
from experiments.study.config import model_id, plan_population
from experiments.study.measure import measure_member
from experiments.study.members import load_member, member_run, sharpness_subset, train_member
from landscape.io import atomic_write_json, read_json, read_json_object

__all__ = [
    "member_runs",
    "member_task",
    "population_ids",
    "run_population",
    "submit_population",
    "train_and_measure",
]

#: Study keys that do not change what a member is (how it is sampled, named or run).
_NOT_SEMANTIC = ("space", "sampling", "n_models", "bases", "threads", "name", "populations", "slurm")
#: Runner keys that do not change what a member is.
_RUNNER_NOT_SEMANTIC = ("out_dir", "progress", "threads", "device")


def population_ids(cfg: dict[str, Any]) -> list[list[str]]:
    """The member ids of every population (``populations`` lists, in plan order)."""
    return [[model_id(p) for p in plan_population(cfg, i)] for i in range(cfg.get("populations", 1))]


def member_runs(cfg: dict[str, Any], out_dir: str | Path) -> list[tuple[dict[str, Any], Run]]:
    """Every distinct member of the study's populations with its runner run (planned and checked
    before any training), in order of first appearance; the run directories lie under
    ``<out_dir>/runs``."""
    root = Path(out_dir) / "runs"
    seen: dict[str, dict[str, Any]] = {}
    for i in range(cfg.get("populations", 1)):
        for p in plan_population(cfg, i):
            seen.setdefault(model_id(p), p)
    return [(p, member_run(p, cfg, root)) for p in seen.values()]


def train_and_measure(
    point: dict[str, Any], cfg: dict[str, Any], run: Run, *, progress: bool = False
) -> dict[str, Any]:
    """Train the member's run with the experiment runner (resuming or skipping it as the runner
    does; under the study's ``stop`` table until the target training loss), load its weights and
    measure them; returns ``{"row", "measures", "runner_metrics", "history", "run_dir"}``.

    The row's ``status`` is ``completed``, ``not_converged`` (the stopping rule's target was not
    reached in ``max_epochs``: measured, but left out of the correlations) or ``diverged``
    (:mod:`experiments.divergence`; not measured, its row holds the reason in ``divergence``);
    ``epochs`` is the number of epochs trained and ``cpu_seconds`` the process time spent."""
    t0, c0 = time.perf_counter(), time.process_time()
    device = torch.device(cfg["device"])
    metrics = train_member(run, device=device, progress=progress, stop=cfg.get("stop") or None)
    if metrics.get("status") == "diverged":  # recorded, not measured; the report leaves it out
        div = metrics.get("divergence", {})
        row = {"id": model_id(point), **point, "status": "diverged", "divergence": div.get("reason", "")}
        row["seconds"], row["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
        return {
            "row": row,
            "measures": {},
            "runner_metrics": metrics,
            "history": [],
            "run_dir": str(run.run_dir),
        }
    model, data, history = load_member(run, device=device)
    subset = sharpness_subset(run, data, cfg["sharpness_subset"])
    res = measure_member(point, cfg, model, data, subset, history, device=device, progress=progress)
    row = res["row"]
    stop = metrics.get("stop")
    row["status"] = "completed" if stop is None or stop["reached"] else "not_converged"
    row["epochs"] = len(history)
    row["seconds"], row["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
    return {**res, "runner_metrics": metrics, "history": history, "run_dir": str(run.run_dir)}


def _fingerprint(point: dict[str, Any], cfg: dict[str, Any], run: Run) -> str:
    keep = {k: v for k, v in cfg.items() if k not in _NOT_SEMANTIC and not (k == "stop" and not v)}
    runner = {k: v for k, v in semantic_config(run.cfg).items() if k not in _RUNNER_NOT_SEMANTIC}
    text = json.dumps({"point": point, "cfg": keep, "runner": runner}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finished(path: Path, fp: str) -> dict[str, Any] | None:
    d = read_json_object(path, what="model result")
    return d if d is not None and d.get("fingerprint") == fp else None


def member_task(task: tuple[dict[str, Any], dict[str, Any], Run, str, str, bool]) -> dict[str, Any]:
    """Train and measure one member with the study's ``threads`` torch threads (in this process,
    a worker process or a Slurm task alike) and write ``models/<id>.json``; returns that document."""
    point, cfg, run, out, fp, progress = task
    torch.set_num_threads(cfg["threads"])
    res = train_and_measure(point, cfg, run, progress=progress)
    res["run_dir"] = str(run.run_dir.relative_to(out))
    done = {"fingerprint": fp, "config": {"point": point, "study": cfg, "runner": run.cfg}, **res}
    atomic_write_json(Path(out) / "models" / f"{model_id(point)}.json", done)
    return done


def _log_outcome(log: Any, row: dict[str, Any]) -> None:
    if log is None:
        return
    if row.get("status") == "diverged":
        log(f"{row['id']} diverged ({row['divergence']}); excluded from the correlations")
    elif row.get("status") == "not_converged":
        log(
            f"{row['id']} did not reach the target training loss in {row['epochs']} epochs (training "
            f"loss {row['train_loss']:.3g}, error {row['train_error']:.3f}); excluded from the correlations"
        )


def _record_timing(out: Path, entry: dict[str, Any]) -> None:
    path = out / "timing.json"
    try:
        runs = read_json(path, what="timing").get("invocations", []) if path.is_file() else []
    except (ValueError, AttributeError):
        runs = []
    atomic_write_json(path, {"invocations": [*runs, entry]})


def _prepare(
    cfg: dict[str, Any], out: Path, shares: tuple[int, int] | None, progress: bool, log: Any
) -> tuple[list[tuple[dict[str, Any], Run]], dict[str, dict[str, Any]], list[Any]]:
    """Plan the members (checked before any training), write ``study_config.json``,
    ``populations.json`` and ``plan.json``; returns ``(members, finished documents, tasks to do)``
    of this share of the members (all of them when ``shares`` is ``None``)."""
    members = member_runs(cfg, out)
    (out / "models").mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "study_config.json", cfg)
    atomic_write_json(out / "populations.json", {"populations": population_ids(cfg)})
    write_plan(
        out,
        [
            {
                "dir": str(run.run_dir.relative_to(out)),
                "label": model_id(p),
                "epochs": cfg["epochs"],
                "done": f"models/{model_id(p)}.json",
            }
            for p, run in members
        ],
    )
    if shares is not None:
        members = shard(members, *shares)
    docs: dict[str, dict[str, Any]] = {}
    todo = []
    for point, run in members:
        mid = model_id(point)
        fp = _fingerprint(point, cfg, run)
        done = _finished(out / "models" / f"{mid}.json", fp)
        if done is None:
            todo.append((point, cfg, run, str(out), fp, progress))
        else:
            docs[mid] = done
            if log is not None:
                log(f"skipped {mid} (results exist)")
    return members, docs, todo


def submit_population(
    cfg: dict[str, Any], out_dir: str | Path, *, log: Any = None, executor: str = "slurm"
) -> tuple[list[str], int]:
    """Submit every member without a result (and without a task still in the queue) as one task of
    a Slurm job array (:mod:`experiments.cluster`; ``executor = "local"``: submitit's local
    stand-in); returns ``(job ids, number of members)``. ``study report`` tabulates them when done."""
    out = Path(out_dir)
    members, _, todo = _prepare(cfg, out, None, False, log)
    works = [
        Work(task[2].run_dir, member_task, (task,), model_id(task[0]), cfg["slurm"]["max_requeues"])
        for task in todo
    ]
    works, notes = pending_work(works, lambda w: False)
    for text in notes if log is not None else ():
        log(text)
    return submit(works, cfg["slurm"], out / "slurm", name=cfg["name"], executor=executor), len(members)


def run_population(
    cfg: dict[str, Any],
    out_dir: str | Path,
    *,
    progress: bool = True,
    log: Any = None,
    jobs: int = 1,
    shares: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Train and measure every member of :func:`member_runs` (skipping those whose
    ``models/<id>.json`` records the same configuration), ``jobs`` at a time; returns the table rows
    in plan order. ``shares = (I, N)``: only the I-th of N disjoint shares of the members
    (:func:`experiments.cluster.shard`; the rows are this share's).

    Writes ``study_config.json``, ``populations.json``, ``plan.json``, the runner's run directories
    under ``runs/``, one ``models/<id>.json`` per member (atomically) and appends this invocation's
    wall time to ``timing.json``."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be a positive integer, got {jobs!r}")
    t0 = time.perf_counter()
    out = Path(out_dir)
    members, docs, todo = _prepare(cfg, out, shares, progress and jobs == 1, log)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(members), initial=len(docs), desc="members", unit="model", smoothing=0.05)

    def finished(doc: dict[str, Any]) -> None:
        docs[doc["row"]["id"]] = doc
        _log_outcome(log, doc["row"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(last=doc["row"]["id"])

    try:
        if jobs == 1 or len(todo) <= 1:
            for task in todo:
                finished(member_task(task))
        else:
            import multiprocessing

            # LeNet-5 members first: the longest tasks do not end the run on one worker
            todo.sort(key=lambda t: t[0]["model"] == "mlp")
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(jobs) as pool:
                for doc in pool.imap_unordered(member_task, todo):
                    finished(doc)
    finally:
        if bar is not None:
            bar.close()
        if todo:
            trained = sum(1 for t in todo if model_id(t[0]) in docs)
            _record_timing(
                out,
                {
                    "started": time.strftime(
                        "%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - (time.perf_counter() - t0))
                    ),
                    "wall_seconds": time.perf_counter() - t0,
                    "members": trained,
                    "jobs": jobs,
                    "threads": cfg["threads"],
                },
            )
    return [docs[model_id(p)]["row"] for p, _ in members]
