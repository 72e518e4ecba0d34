"""Runs beyond one process: disjoint shares of a grid (``--shard I/N``) and Slurm job arrays
submitted through `submitit <https://github.com/facebookincubator/submitit>`_ (``--slurm``).

The runner stays the same function on every machine (:func:`experiments.runner.run_one`, or a
study member's :func:`experiments.study.population.member_task`); the run directory on a shared
file system is the only state. ``submit`` turns each pending run into one task of one job array:

* **what is submitted**: the runs without a result whose earlier task is not still queued or
  running (so the same command, given again, submits only what is left and never a run twice);
  each run directory gets ``job.json`` (:func:`write_job`: the job id, the log files, the state);
  the tasks' logs (``<job>_<task>_0_log.out`` / ``.err``) are written to ``slurm/`` beside the run
  directories, submitit's pickles of the tasks too (written and read by submitit only; no result
  file of ours is a pickle).
* **a signalled task checkpoints and is requeued**: Slurm sends ``SIGUSR2`` ``signal_delay_s``
  seconds before a task's time limit (``sbatch --signal=USR2@N``), and ``scancel --signal=USR2``
  sends it by hand; preemption and ``scontrol requeue`` send ``SIGTERM``. Either stops training at
  the next step boundary, where the trainer writes a checkpoint
  (:class:`experiments.train.Trainer`); after ``SIGUSR2`` the task requeues itself
  (``scontrol requeue``, at most ``max_requeues`` times), after ``SIGTERM`` Slurm decides (a
  preempted or requeued task comes back, a cancelled one does not). The requeued task resumes the
  run from that checkpoint, bit-identical to an uninterrupted run. A task killed without warning
  (``SIGKILL``, a node failure) resumes from its last checkpoint when Slurm requeues it or when
  the command is given again; its lock is recognised as stale by its Slurm job id
  (:mod:`experiments.run_lock`).
* **what is not requeued**: a run that diverges (its result is recorded, as locally), a run the
  runner refuses (a bad config, another runner's lock) or one that fails: ``job.json`` records the
  failure's one-line error and the log file, which ``status`` shows (:mod:`experiments.status`).

``--shard I/N`` (0 <= I < N) runs the I-th of N disjoint shares of the grid in the current
process: runs ``I, I + N, I + 2N, ...`` of the grid's fixed order (:func:`shard`), for array jobs
of other schedulers or a plain shell loop; N shells give the same results as one process.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from experiments.run_lock import LOCK_NAME, lock_state
from landscape.cli_common import Terminated, describe_error, note, sigterm_raises_interrupt
from landscape.io import atomic_write_json, read_json_object

__all__ = [
    "JOB_FILE",
    "QUEUED",
    "RUNNING",
    "Work",
    "current_job",
    "execute",
    "parse_shard",
    "queue_states",
    "read_job",
    "shard",
    "submit",
    "write_job",
]

T = TypeVar("T")

#: a run directory's record of its cluster task
JOB_FILE = "job.json"
#: Slurm job states (``squeue -o %T``) of a task waiting to run, and of one running
QUEUED = frozenset(("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESV_DEL_HOLD"))
RUNNING = frozenset(("RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING"))


# ----------------------------------------------------------------------------------------- shards
def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` -> ``(I, N)`` with ``0 <= I < N``; ``ValueError`` naming the form otherwise."""
    head, sep, tail = str(text).partition("/")
    try:
        index, count = int(head), int(tail)
    except ValueError:
        index = count = -1
    if not sep or count < 1 or not 0 <= index < count:
        raise ValueError(
            f"--shard {text!r}: give I/N with 0 <= I < N, e.g. --shard 0/3 (the first of three shares; "
            "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT in an array job of --array=0-2)"
        )
    return index, count


def shard(items: Sequence[T], index: int, count: int) -> list[T]:
    """The ``index``-th of ``count`` disjoint shares of ``items``: ``items[index::count]``; the
    shares of ``index = 0 .. count - 1`` together hold every item once."""
    return list(items[index::count])


# ------------------------------------------------------------------------------------- job records
def read_job(run_dir: str | Path) -> dict[str, Any] | None:
    """The run directory's ``job.json`` (``None`` without one, or for an unreadable one)."""
    return read_json_object(Path(run_dir) / JOB_FILE, what="job record")


def write_job(run_dir: str | Path, **fields: Any) -> dict[str, Any]:
    """Merge ``fields`` into the run directory's ``job.json`` (written atomically); returns it."""
    doc = {**(read_job(run_dir) or {}), **fields, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(run_dir) / JOB_FILE, doc)
    return doc


def current_job() -> dict[str, Any] | None:
    """This process's Slurm task (``id`` as ``squeue`` prints it: ``<array job>_<task>`` for an
    array task, and ``restarts``, Slurm's count of requeues), or ``None`` outside Slurm."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return {
        "id": f"{array}_{task}" if array and task else job,
        "restarts": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }


def queue_states() -> dict[str, str] | None:
    """``{job id: state}`` of every job ``squeue`` lists (array tasks one by one, under the
    ``<array job>_<task>`` id and their own ``SLURM_JOB_ID``; ended jobs too
    while Slurm remembers them), or ``None`` where ``squeue`` is missing or fails (no scheduler
    reachable from here). Reads no accounting database (``sacct``), which small clusters lack."""
    exe = shutil.which("squeue")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--noheader", "--array", "--states=all", "--format=%i %A %T"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:  # an array task under both of its ids: 1230_4 and its own 1234
            states[parts[0]] = states[parts[1]] = parts[2]
    return states


# ------------------------------------------------------------------------------------------ tasks
@dataclass
class Work:
    """One task: ``fn(*args)`` trains (or skips, or resumes) the run in ``run_dir``; a signalled
    task is requeued at most ``max_requeues`` times."""

    run_dir: Path
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    label: str = ""
    max_requeues: int = 10


def _requeue(job_id: str) -> str:
    """``scontrol requeue JOB``; ``""`` on success, else why not."""
    exe = shutil.which("scontrol")
    if exe is None:
        return "scontrol is not on PATH"
    try:
        out = subprocess.run([exe, "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return "" if out.returncode == 0 else (out.stderr or out.stdout).strip() or f"exit {out.returncode}"


def execute(work: Work) -> Any:
    """Run one task on the node (what submitit calls): records ``state = "running"`` in
    ``job.json``, runs ``work.fn(*work.args)`` with ``SIGTERM`` and ``SIGUSR2`` stopping it at the
    next step boundary (after its checkpoint), and records how it ended (module docstring):
    ``finished``, ``requeued`` (``SIGUSR2``: time limit or a manual signal), ``stopped``
    (``SIGTERM``: preemption, ``scontrol requeue`` or ``scancel``) or ``failed`` with the one-line
    error and the log file."""
    job = current_job()
    restarts = job["restarts"] if job else 0
    write_job(
        work.run_dir,
        **({"id": job["id"]} if job else {}),
        state="running",
        error="",
        host=socket.gethostname(),
        pid=os.getpid(),
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        restarts=restarts,
    )
    try:
        with sigterm_raises_interrupt((signal.SIGTERM, signal.SIGUSR2)):
            result = work.fn(*work.args)
    except Terminated as exc:
        _stopped(work, job, exc.signal_name, restarts)
        raise SystemExit(143) from None
    except BaseException as exc:  # noqa: BLE001 - recorded, then raised as it came
        _, line = describe_error(exc)
        write_job(work.run_dir, state="failed", error=line.removeprefix("error: "))
        raise
    write_job(work.run_dir, state="finished")
    return result


def _stopped(work: Work, job: dict[str, Any] | None, name: str, restarts: int) -> None:
    """Record a task stopped by signal ``name`` and, after ``SIGUSR2``, requeue it."""
    if name != "SIGUSR2" or job is None:
        write_job(work.run_dir, state="stopped", signal=name)
        return
    if restarts >= work.max_requeues:
        write_job(
            work.run_dir,
            state="failed",
            signal=name,
            error=f"stopped by {name} after {restarts} requeues (slurm.max_requeues = {work.max_requeues}); "
            "the checkpoint is kept: submit again (or raise slurm.time / max_requeues) to resume",
        )
        return
    write_job(work.run_dir, state="requeued", signal=name)  # before: the requeue ends this process
    why = _requeue(job["id"])
    if why:
        write_job(work.run_dir, state="failed", error=f"could not requeue job {job['id']}: {why}")


# ------------------------------------------------------------------------------------- submission
def _executor(folder: Path, slurm: dict[str, Any], name: str, executor: str) -> Any:
    try:
        import submitit
    except ImportError:
        raise ValueError(
            "--slurm needs the submitit package, which is not installed — pip install submitit (or "
            "pip install 'sharpscape[cluster]')"
        ) from None
    if executor == "local":  # submitit's stand-in for a cluster: processes on this machine
        ex = submitit.LocalExecutor(folder=str(folder))
        ex.update_parameters(timeout_min=slurm["time"])
        return ex
    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=slurm["max_requeues"])
    params: dict[str, Any] = {
        "job_name": name,
        "time": slurm["time"],
        "signal_delay_s": slurm["signal_delay_s"],
        "additional_parameters": {"requeue": True, **slurm["sbatch"]},
    }
    for key in ("partition", "account", "qos", "constraint", "cpus_per_task", "gpus_per_task"):
        if slurm[key]:
            params[key] = slurm[key]
    if slurm["mem_gb"]:
        params["mem"] = f"{max(1, round(slurm['mem_gb'] * 1024))}M"
    if slurm["array_parallelism"]:
        params["array_parallelism"] = slurm["array_parallelism"]
    if slurm["setup"]:
        params["setup"] = list(slurm["setup"])
    ex.update_parameters(**params)
    return ex


def _drop_dead_lock(run_dir: Path, queue: dict[str, str] | None) -> None:
    """Remove the lock a killed Slurm task left (a task of a job the queue no longer runs), which
    a new task on another host could not tell from a live one (:mod:`experiments.run_lock`)."""
    state, holder = lock_state(run_dir)
    job = (holder or {}).get("slurm_job")
    if state not in ("remote", "stale") or not job or queue is None:
        return
    if queue.get(job) in QUEUED | RUNNING:
        return
    note(f"{run_dir}: removing the lock of Slurm job {job}, which no longer runs")
    (run_dir / LOCK_NAME).unlink(missing_ok=True)


def pending_work(works: Sequence[Work], done: Callable[[Work], bool]) -> tuple[list[Work], list[str]]:
    """The works to submit (those not ``done`` whose last task is not still queued or running; where
    ``squeue`` cannot be asked, those whose record says queued or running are left out too) and one
    note per work left out."""
    queue = queue_states()
    todo, notes = [], []
    for w in works:
        if done(w):
            continue
        job = read_job(w.run_dir) or {}
        if job.get("id") and queue is not None and queue.get(job["id"]) in QUEUED | RUNNING:
            notes.append(f"{w.label or w.run_dir}: already {queue[job['id']].lower()} as job {job['id']}")
            continue
        if queue is None and job.get("state") in ("queued", "requeued", "running"):
            notes.append(
                f"{w.label or w.run_dir}: not submitted again: its job {job.get('id')} may still be "
                f"{job['state']}, and squeue cannot be asked from here"
            )
            continue
        _drop_dead_lock(w.run_dir, queue)
        todo.append(w)
    return todo, notes


def submit(
    works: Sequence[Work], slurm: dict[str, Any], folder: str | Path, *, name: str, executor: str = "slurm"
) -> list[str]:
    """Submit ``works`` as one job array (``executor = "local"``: submitit's local stand-in) with
    the settings of a ``[slurm]`` table (:data:`experiments.config.SLURM_DEFAULTS`); writes each
    run directory's ``job.json`` (state ``queued``, job id, log files); returns the job ids."""
    if not works:
        return []
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ex = _executor(folder, slurm, name, executor)
    try:
        jobs = ex.map_array(execute, list(works))
    except Exception as exc:  # noqa: BLE001 - sbatch's own message, in one line
        why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(
            f"submitting {len(works)} tasks failed: {why} — check the [slurm] settings (partition, "
            "account, time) against `sinfo`"
        ) from None
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for w, job in zip(works, jobs):
        fields = {"scheduler": executor, "id": str(job.job_id), "submitted": now}
        fields.update(stdout=str(job.paths.stdout), stderr=str(job.paths.stderr))
        if (read_job(w.run_dir) or {}).get("id") != fields["id"]:  # else the task has started already
            fields.update(state="queued", error="")
        write_job(w.run_dir, **fields)
    return [str(j.job_id) for j in jobs]
