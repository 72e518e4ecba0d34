"""Where the runs of a grid (or the members of a study) stand: ``sharpscape status RUN_DIR``.

``run`` (in every mode: one process, ``--jobs``-free grids, ``--shard``, ``--slurm``) and
``study run`` first write ``plan.json`` beside their run directories (:func:`write_plan`): every
planned run's directory, label, number of epochs and the file that appears when it is done. Each
planned run is then, from its directory alone (plus ``squeue`` where a Slurm scheduler answers,
:func:`experiments.cluster.queue_states`):

========== ==============================================================================
done       its result file exists (``results.json``; a study member's ``models/<id>.json``)
diverged   its result records a divergence (the reason is shown)
failed     its task recorded an error (the error line and its log file), or its Slurm task
           ended without a result (killed, timed out, cancelled: the last line of its log)
running    a live runner holds its lock (this host), or its Slurm task runs: epoch k / E and
           the time left at the mean epoch time so far
queued     its Slurm task waits in the queue
stopped    it has a checkpoint and no runner (interrupted; the same command resumes it)
not started nothing of it exists yet
========== ==============================================================================

A run directory given without a ``plan.json`` at or above it is found by its ``config.toml``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from experiments.cluster import QUEUED, RUNNING, queue_states, read_job
from experiments.run_lock import lock_state
from landscape.cli_common import format_seconds
from landscape.io import atomic_write_json, read_json, read_json_object

__all__ = ["PLAN_FILE", "STATES", "RunState", "format_status", "missing_runs", "run_states", "write_plan"]

PLAN_FILE = "plan.json"
#: every state, in the order the summary counts them
STATES = ("done", "diverged", "failed", "running", "queued", "stopped", "not started")


def write_plan(root: str | Path, entries: list[dict[str, Any]]) -> None:
    """Write ``root/plan.json``: ``entries`` of ``{"dir", "label", "epochs", "done"}`` with ``dir`` and
    ``done`` (the file that marks the run finished) relative to ``root``. Rewritten (atomically)
    only when it changes, so that concurrent shards of one grid write the same file once."""
    root = Path(root)
    doc = {"format": "sharpscape-plan-1", "runs": entries}
    path = root / PLAN_FILE
    if path.is_file():
        try:
            if read_json(path, what="plan").get("runs") == entries:
                return
        except (ValueError, AttributeError):
            pass
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, doc)


@dataclass
class RunState:
    """One planned run: ``state`` (one of :data:`STATES`), what to show beside it, and where."""

    dir: str
    label: str
    state: str
    detail: str = ""
    epoch: int | None = None
    epochs: int | None = None
    seconds_left: float | None = None
    log: str = ""
    job: str = ""


def _plans(paths: list[Path]) -> list[tuple[Path, list[dict[str, Any]]]]:
    """The plans at or under ``paths``, else the nearest one above each path (its runs under it)."""
    found: dict[Path, list[dict[str, Any]]] = {}
    for p in paths:
        below = sorted(p.rglob(PLAN_FILE)) if p.is_dir() else []
        above = [q / PLAN_FILE for q in p.resolve().parents if (q / PLAN_FILE).is_file()][:1]
        for f in below or above:
            try:
                runs = read_json(f, what="plan").get("runs")
            except (ValueError, AttributeError):
                continue
            if isinstance(runs, list):
                root = f.parent
                keep = runs if below else [r for r in runs if _under(root / r["dir"], p)]
                found.setdefault(root, [])
                found[root].extend(r for r in keep if r not in found[root])
    return list(found.items())


def _under(path: Path, top: Path) -> bool:
    try:
        path.resolve().relative_to(top.resolve())
        return True
    except ValueError:
        return False


def _unplanned(paths: list[Path], planned: set[Path]) -> list[tuple[Path, list[dict[str, Any]]]]:
    """Run directories (a ``config.toml`` beside a checkpoint, job record, lock or result) under
    ``paths`` that no plan lists."""
    out = []
    for p in paths:
        cands = [p] if (p / "config.toml").is_file() else [c.parent for c in sorted(p.rglob("config.toml"))]
        for d in cands:
            if d.resolve() in planned or d.parent.name.startswith("member"):
                continue
            out.append((d, [{"dir": ".", "label": str(d), "epochs": None, "done": "results.json"}]))
    return out


def _history(run_dir: Path) -> list[dict[str, Any]]:
    """The epochs of ``log.jsonl`` (a deep ensemble's: of its members in turn)."""
    files = sorted(run_dir.glob("member*/log.jsonl")) or [run_dir / "log.jsonl"]
    rows: list[dict[str, Any]] = []
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _progress(st: RunState, run_dir: Path) -> None:
    rows = _history(run_dir)
    if not rows:
        st.detail = st.detail or "no epoch finished yet"
        return
    st.epoch = len(rows)
    secs = [r["seconds"] for r in rows if isinstance(r.get("seconds"), (int, float))]
    text = f"epoch {st.epoch}" + (f"/{st.epochs}" if st.epochs else "")
    if secs and st.epochs:
        st.seconds_left = max(0, st.epochs - st.epoch) * sum(secs) / len(secs)
        text += f", about {format_seconds(st.seconds_left)} left"
    st.detail = text


def _last_line(path: str) -> str:
    """The last non-empty line of a log file (progress bars split at ``\\r``), or ``""``."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 65536))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for chunk in text.split("\n") for ln in chunk.split("\r") if ln.strip()]
    return lines[-1][:300] if lines else ""


def _result_state(root: Path, entry: dict[str, Any], run_dir: Path) -> RunState | None:
    done = root / entry.get("done", "results.json") if entry.get("done") else run_dir / "results.json"
    doc = read_json_object(done, what="result")
    if doc is None:
        return None
    row = doc.get("row") if isinstance(doc.get("row"), dict) else doc  # a study member's models/<id>.json
    if row.get("status") == "diverged":
        reason = row.get("divergence")
        reason = reason.get("reason", "") if isinstance(reason, dict) else str(reason or "")
        return RunState(str(run_dir), entry["label"], "diverged", reason)
    return RunState(str(run_dir), entry["label"], "done", epochs=entry.get("epochs"))


def _state(root: Path, entry: dict[str, Any], queue: dict[str, str] | None) -> RunState:
    run_dir = (root / entry["dir"]).resolve() if entry["dir"] != "." else root
    done = _result_state(root, entry, run_dir)
    if done is not None:
        return done
    st = RunState(str(run_dir), entry["label"], "not started", epochs=entry.get("epochs"))
    job = read_job(run_dir) or {}
    st.job, st.log = str(job.get("id", "")), str(job.get("stderr", ""))
    lock, _ = lock_state(run_dir)
    in_queue = queue.get(st.job) if queue is not None and st.job else None
    if job.get("state") == "failed":
        st.state, st.detail = "failed", str(job.get("error", "")) or _last_line(st.log)
    elif lock == "held" or in_queue in RUNNING or (lock == "remote" and (queue is None or not job)):
        st.state = "running"
        _progress(st, run_dir)
    elif in_queue in QUEUED or (queue is None and job.get("state") in ("queued", "requeued")):
        st.state, st.detail = "queued", f"job {st.job}" + (f" ({in_queue.lower()})" if in_queue else "")
    elif queue is None and job.get("state") == "running":  # the job record alone: no scheduler answers
        st.state = "running"
        _progress(st, run_dir)
    elif job.get("state") in ("queued", "requeued", "running", "stopped") and queue is not None:
        # the scheduler no longer runs it, and it left no result: killed, timed out, cancelled
        ended = f"Slurm: {in_queue.lower()}" if in_queue else "no longer in the queue"
        line = _last_line(st.log)
        st.state = "failed"
        st.detail = f"the task ended without a result ({ended})" + (f": {line}" if line else "")
    elif (run_dir / "checkpoint.pt").is_file() or list(run_dir.glob("member*/checkpoint.pt")):
        st.state = "stopped"
        _progress(st, run_dir)
        st.detail += "; the same command resumes it"
    return st


def run_states(paths: list[str | Path], *, queue: dict[str, str] | None | bool = True) -> list[RunState]:
    """The state of every planned run under ``paths`` (module docstring), in plan order;
    ``queue``: ``True`` asks ``squeue`` (:func:`experiments.cluster.queue_states`), a dict gives
    the queue's states, ``None`` / ``False`` means no scheduler.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: no planned run and no run directory under ``paths``."""
    ps = [Path(p) for p in paths]
    for p in ps:
        if not p.exists():
            raise FileNotFoundError(
                f"{p} does not exist; give the out_dir of a run (or a directory above it)"
            )
    plans = _plans(ps)
    planned = {(root / e["dir"]).resolve() for root, entries in plans for e in entries}
    plans += _unplanned(ps, planned)
    if not plans:
        raise ValueError(
            "no planned runs (plan.json) and no run directories (config.toml) under "
            f"{', '.join(map(str, ps))} — give the directory a `run` or `study run` command wrote "
            "(out_dir/NAME, or --out)"
        )
    q = queue_states() if queue is True else (queue or None)
    return [_state(root, e, q) for root, entries in plans for e in entries]


def missing_runs(paths: list[str | Path], have: set[str]) -> list[RunState]:
    """The planned runs under ``paths`` whose directory is not in ``have`` (the directories with a
    result), with their states; ``[]`` where no plan lists any."""
    ps = [Path(p) for p in paths if Path(p).exists()]
    have_r = {Path(d).resolve() for d in have}
    plans = _plans(ps)
    if not plans:
        return []
    left = [
        (root, e) for root, entries in plans for e in entries if (root / e["dir"]).resolve() not in have_r
    ]
    q = queue_states() if left else None
    return [_state(root, e, q) for root, e in left]


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def format_status(states: list[RunState], fmt: str = "text") -> str:
    """A table of the runs (``fmt = "json"``: a JSON document) and a summary line: the count per
    state and, for what is left, the epochs still to train where known."""
    counts = {s: sum(1 for x in states if x.state == s) for s in STATES}
    left = [x for x in states if x.state not in ("done", "diverged")]
    if fmt == "json":
        doc = {
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "counts": counts,
            "runs": [asdict(x) for x in states],
        }
        return json.dumps(doc, indent=2) + "\n"
    width = max((len(x.label) for x in states), default=3)
    lines = []
    for x in states:
        extra = x.detail
        if x.state == "failed" and x.log:
            extra += f" (log: {x.log})"
        lines.append(f"{x.state:<11}  {x.label:<{width}}  {extra}".rstrip())
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines.append(f"{_runs(len(states))}: {summary}")
    if left:
        secs = [x.seconds_left for x in left if x.state == "running" and x.seconds_left is not None]
        eta = f"; the running ones need about {format_seconds(max(secs))} more" if secs else ""
        lines.append(f"left: {_runs(len(left))}{eta}")
    else:
        lines.append("left: nothing; every run has its result")
    return "\n".join(lines) + "\n"
