"""One writer per run directory: ``<run_dir>/.lock``.

:func:`experiments.runner.run_one` holds the lock of its run directory from before its first write
to its end (also when it fails, on Ctrl-C and on SIGTERM, which the command line raises as
``KeyboardInterrupt``). The lock file is created atomically (written under a temporary name, then
hard-linked to ``.lock``, which fails if it exists; ``O_CREAT | O_EXCL`` where the file system has no
hard links) and holds JSON: ``pid``, ``host``, ``started`` (local time), ``command`` (the argv) and,
on Linux, ``proc_start`` (the process's start time in clock ticks, to recognise a reused PID).

Under Slurm (:mod:`experiments.cluster`) the lock also records the task's job id
(``slurm_job``, from ``SLURM_JOB_ID``): Slurm runs one instance of a job at a time, so a lock of the
same job id held by another process (on any host) is the killed predecessor of this requeued task,
and is stale.

A second runner on a locked run directory refuses (:class:`RunLocked`, one line naming the
holder's PID, host, start time and command, and the fix) and writes nothing there. A lock left by a
process that is gone (same host, PID not alive or reused) is *stale*: it is taken over, with a note.
A lock of another host is never guessed about: the refusal names the file to delete if nothing on
that host uses the directory any more. Processes on one host that see different PID namespaces
(containers sharing a host name and a volume) are not told apart. A ``.lock`` that is not one of
these (binary or corrupt content, an impossible PID such as a negative or overflowing number, a
directory) is reported as a lock file not written by sharpscape, naming the file and its content,
never guessed about (:func:`landscape.cli_common.foreign_lock`).

Under ``torch.distributed`` data parallelism only rank 0 (:attr:`DistContext.is_main`) takes the
lock; the other ranks learn whether it succeeded through one ``all_reduce``. A deep ensemble's
members (``member<k>/``) are covered by the lock of the ensemble's run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from landscape.cli_common import CliError, foreign_lock, lock_pid, note, pid_alive, read_lock
from landscape.io import require_path

__all__ = ["LOCK_NAME", "RunLock", "RunLocked", "acquire", "lock_state", "run_dir_lock"]

LOCK_NAME = ".lock"
_FIX_GONE = "if that process is gone, delete the lock file and run again"


class RunLocked(CliError):
    """The run directory is locked by another runner (exit status 1)."""


def _proc_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or ``None``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _read(lock: Path) -> tuple[bytes | None, dict[str, Any] | None]:
    """``(content, info)`` of the lock file; ``(None, None)`` if there is none; ``info`` is ``None``
    unless the content is a runner's lock (UTF-8 JSON with a valid ``pid``). An empty file (the
    moment between ``O_EXCL`` creation and the write) is re-read for up to two seconds."""
    raw: bytes | None = b""
    for _ in range(20):
        raw = read_lock(lock)
        if raw is None:
            return None, None
        if raw.strip():
            try:
                info = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                return raw, None
            pid = info.get("pid") if isinstance(info, dict) else None
            valid = isinstance(pid, int) and lock_pid(pid) is not None  # written as a number
            return raw, info if valid else None
        time.sleep(0.1)
    return raw, None


def _holder(info: dict[str, Any]) -> str:
    cmd = info.get("command")
    cmd = " ".join(map(str, cmd)) if isinstance(cmd, list) else str(cmd or "?")
    cmd = cmd if len(cmd) <= 160 else cmd[:159] + "…"
    return f"PID {info['pid']} on host {info.get('host', '?')}, started {info.get('started', '?')}: {cmd}"


def _slurm_job() -> str | None:
    return os.environ.get("SLURM_JOB_ID") or None


def _stale(info: dict[str, Any]) -> bool | None:
    """``True``: the holder is gone; ``False``: it runs; ``None``: another host (cannot tell)."""
    mine = _slurm_job()
    if mine is not None and info.get("slurm_job") == mine:  # this task's killed predecessor ...
        return not (info.get("host") == socket.gethostname() and info["pid"] == os.getpid())
    if info.get("host") != socket.gethostname():
        return None
    pid = int(info["pid"])
    if pid == os.getpid():
        return False  # this very process (another thread, or a nested run of the same directory)
    if not pid_alive(pid):
        return True
    recorded, now = info.get("proc_start"), _proc_start(pid)
    return isinstance(recorded, int) and now is not None and now != recorded  # the PID was reused


def _create(lock: Path, text: str) -> bool:
    """Create ``lock`` holding ``text`` atomically; ``False`` if it exists already."""
    tmp = lock.with_name(f"{lock.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        try:
            os.link(tmp, lock)  # atomic, and the lock is complete the moment it exists
            return True
        except FileExistsError:
            return False
        except OSError:  # no hard links here (some network / FUSE file systems)
            pass
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _take_over(lock: Path, seen: bytes) -> None:
    """Remove the stale lock whose text is ``seen``: moved aside atomically first, so that of two
    processes taking it over at once only one removes it; a fresh lock moved by mistake (another
    process took over between our read and the move) is put back."""
    aside = lock.with_name(f"{lock.name}.{uuid.uuid4().hex}.stale")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    try:
        if read_lock(aside) != seen:
            with contextlib.suppress(OSError):
                os.link(aside, lock)
    finally:
        aside.unlink(missing_ok=True)


class RunLock:
    """A held lock; :meth:`release` removes the file if it is still this holder's."""

    def __init__(self, path: Path, text: str) -> None:
        self.path, self.text = path, text

    def release(self) -> None:
        with contextlib.suppress(OSError):
            if read_lock(self.path) == self.text.encode("utf-8"):
                self.path.unlink()


def acquire(run_dir: str | os.PathLike, *, command: list[str] | None = None) -> RunLock:
    """Take the lock of ``run_dir`` (created if missing); raises :class:`RunLocked` if another live
    runner, a runner of another host or an unreadable lock file holds it (see the module docstring)."""
    run_dir = require_path(run_dir, "directory", option="run directory")
    lock = run_dir / LOCK_NAME
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": list(command if command is not None else [sys.executable, *sys.argv]),
        "proc_start": _proc_start(os.getpid()),
        "token": uuid.uuid4().hex,
    }
    if _slurm_job() is not None:
        info["slurm_job"] = _slurm_job()
    text = json.dumps(info) + "\n"
    for _ in range(10):
        seen, held = _read(lock)
        if seen is None:
            run_dir.mkdir(parents=True, exist_ok=True)
            if _create(lock, text):
                return RunLock(lock, text)
            continue  # another runner created it first: look at it
        if held is None:
            raise foreign_lock(lock, seen, f"the run directory {run_dir}", RunLocked)
        stale = _stale(held)
        if stale is None:
            raise RunLocked(
                f"run directory {run_dir} is locked by a runner on another host ({_holder(held)}); "
                f"whether it still runs cannot be checked from {socket.gethostname()}",
                f"wait for it to finish, or use another out_dir; if nothing on {held.get('host')} uses "
                f"this directory any more, delete {lock} and run again",
            )
        if not stale:
            raise RunLocked(
                f"run directory {run_dir} is in use by another runner ({_holder(held)}; lock file {lock})",
                f"wait for that run to finish, or use another out_dir; {_FIX_GONE}",
            )
        note(f"taking over the stale lock {lock} of a runner that no longer runs ({_holder(held)})")
        _take_over(lock, seen)
    raise RunLocked(
        f"could not take the lock {lock}: other runners keep creating it",
        f"run one runner per run directory; {_FIX_GONE}",
    )


def lock_state(run_dir: str | os.PathLike) -> tuple[str, dict[str, Any] | None]:
    """``(state, holder)`` of ``run_dir``'s lock, read without taking it: ``"free"`` (no lock),
    ``"held"`` (a live runner of this host), ``"stale"`` (its runner is gone), ``"remote"``
    (a runner of another host: whether it still runs cannot be told here) or ``"foreign"`` (not a
    runner's lock file); ``holder`` is the lock's JSON (``None`` for free and foreign)."""
    _, held = _read(Path(run_dir) / LOCK_NAME)
    if held is None:
        return ("free" if not (Path(run_dir) / LOCK_NAME).exists() else "foreign"), None
    stale = _stale(held)
    return ("remote" if stale is None else "stale" if stale else "held"), held


@contextlib.contextmanager
def run_dir_lock(
    run_dir: str | os.PathLike, *, ctx: Any = None, device: Any = None
) -> Iterator[RunLock | None]:
    """Hold the lock of ``run_dir`` while the body runs (released on any exit).

    With a data-parallel :class:`experiments.parallel.DistContext` only the main rank takes it,
    and every rank raises :class:`RunLocked` if the main rank could not (one ``all_reduce`` on
    ``device``)."""
    held: RunLock | None = None
    error: RunLocked | None = None
    if ctx is None or ctx.is_main:
        try:
            held = acquire(run_dir)
        except RunLocked as exc:
            error = exc
    try:
        if ctx is not None and ctx.data_parallel:
            import torch

            failed = ctx.all_reduce_sum(torch.tensor([0.0 if error is None else 1.0], device=device))
            if error is None and float(failed.sum()) > 0:
                error = RunLocked(
                    f"run directory {run_dir} is locked by another runner (rank 0 could not take its lock)",
                    "see rank 0's error line",
                )
        if error is not None:
            raise error
        yield held
    finally:
        if held is not None:
            held.release()
