"""Shared pieces of the command lines (``python -m landscape ...``, ``python -m toy_problems ...``).

* one place that turns every failure into ONE line ``error: <what> — <how to fix>`` on stderr and
  an exit status (2 usage, 1 runtime, 130 Ctrl-C, 143 SIGTERM); ``--debug`` adds the traceback
  (:func:`run_cli`, :class:`CliError`, :class:`Parser`);
* argument types (:func:`positive_int`, :func:`finite_float`, ...);
* models and checkpoints (``--model``, ``--model-arg``, ``--state-dict``) are in
  :mod:`landscape.cli_models`, built on the errors defined here;
* data (:func:`load_data`), devices, and every path argument (:func:`check_path`: the kind of path,
  a trailing slash, the parent directories, a missing input, an unwritable location; one place for
  every command, built on :func:`landscape.io.require_path`);
* SIGTERM delivered as ``KeyboardInterrupt`` (:func:`sigterm_raises_interrupt`) and an exclusive
  lock file next to an output (:func:`output_lock`); lock files of other programs, or corrupt ones,
  are named as such, never guessed about (:func:`lock_pid`, :func:`foreign_lock`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from landscape.data import load_dataset
from landscape.io import PathError, require_path

DASH = " — "


# ------------------------------------------------------------------------------------------ errors
class CliError(Exception):
    """A failure the command line reports as ``error: <what> — <fix>`` with exit status ``status``."""

    status = 1

    def __init__(self, what: str, fix: str, status: int | None = None):
        super().__init__(f"{what}{DASH}{fix}")
        self.what, self.fix = what, fix
        if status is not None:
            self.status = status


class UsageError(CliError):
    """A bad command line (exit status 2)."""

    status = 2


class Terminated(KeyboardInterrupt):
    """SIGTERM (or another signal of :func:`sigterm_raises_interrupt`), raised as a
    ``KeyboardInterrupt`` so that code saving on Ctrl-C saves on it too; ``args[0]`` is the signal's
    name (``"SIGTERM"``, ``"SIGUSR2"``)."""

    @property
    def signal_name(self) -> str:
        return str(self.args[0]) if self.args else "SIGTERM"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors raise :class:`UsageError` instead of printing usage.

    ``intermixed``: the ``dest`` of a ``nargs="*"`` / ``"+"`` positional that also takes the
    positional arguments given after an option (``CONFIG a=1 --no-progress b=2``: plain argparse
    stops that positional at the option and rejects ``b=2``); their order is kept.
    """

    intermixed: str | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:  # type: ignore[override]
        namespace, extras = super().parse_known_args(args, namespace)
        if self.intermixed and extras:
            stray = [a for a in extras if not a.startswith("-")]
            if stray:
                given = getattr(namespace, self.intermixed, None) or []
                setattr(namespace, self.intermixed, [*given, *stray])
                extras = [a for a in extras if a.startswith("-")]
        return namespace, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, but unknown arguments are reported by the sub-command's parser, whose
        ``--help`` (``see `sharpscape run --help```) is the one that lists the accepted options."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen: argparse.ArgumentParser = self
            while True:
                subs = [a for a in chosen._actions if isinstance(a, argparse._SubParsersAction)]
                name = getattr(namespace, subs[0].dest, None) if subs else None
                if name is None or name not in subs[0].choices:
                    break
                chosen = subs[0].choices[name]
            chosen.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace

    def error(self, message: str) -> None:  # type: ignore[override]
        fix = f"see `{self.prog} --help`"
        if DASH in message:
            message, _, fix = message.partition(DASH)
        raise UsageError(message, fix)


def add_debug_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--debug", action="store_true", help="on error, print the full traceback before the error line"
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(text: str, limit: int = 900) -> str:
    text = " ".join(_ANSI.sub("", str(text)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _disk_full(exc: OSError) -> str:
    """A full disk outside the atomic writers (which raise ``landscape.io.DiskFullError``)."""
    if exc.filename is None:
        return "no space left on the device"
    where = Path(os.fsdecode(exc.filename))
    try:
        free = f"; {shutil.disk_usage(where if where.is_dir() else where.parent).free:,} bytes free there"
    except OSError:
        free = ""
    return f"no space left on the device writing {where}{free}"


def describe_error(exc: BaseException) -> tuple[int, str]:
    """``(exit status, "error: what — fix")`` for any exception."""
    if isinstance(exc, CliError):
        return exc.status, f"error: {one_line(exc.what)}{DASH}{one_line(exc.fix)}"
    if isinstance(exc, PathError):
        return 2 if exc.usage else 1, f"error: {one_line(exc.what)}{DASH}{one_line(exc.fix)}"
    if isinstance(exc, Terminated):
        return (
            143,
            f"error: terminated by {exc.signal_name}" + DASH + "nothing was saved; run the command again",
        )
    if isinstance(exc, KeyboardInterrupt):
        return 130, "error: interrupted (Ctrl-C)" + DASH + "nothing was saved; run the command again"
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        what, fix = "out of memory", "use a smaller --batch-size, --limit or grid, or another --device"
    elif isinstance(exc, OSError) and exc.errno in _NO_SPACE and DASH not in str(exc):
        what, fix = _disk_full(exc), "free some disk space, or write to another directory (out_dir / --out)"
    elif isinstance(exc, OSError) and exc.filename is not None:
        what = f"{exc.strerror or type(exc).__name__}: {exc.filename}"
        fix = "check the path and its permissions"
    elif isinstance(exc, (ValueError, TypeError, OSError)):
        what, fix = str(exc), "check the arguments against --help; --debug shows the traceback"
    else:
        what = f"{type(exc).__name__}: {exc}"
        fix = "an unexpected failure; run again with --debug and report the traceback"
    what = one_line(what)
    return 1, f"error: {what}" if DASH in what else f"error: {what}{DASH}{fix}"


def run_cli(body: Callable[[list[str]], int | None], argv: Sequence[str] | None) -> int:
    """Run ``body(argv)`` with SIGTERM raising :class:`Terminated`; return its exit code.

    Any failure prints one ``error:`` line on stderr (after the traceback under ``--debug``) and
    raises ``SystemExit`` with the status of :func:`describe_error`, as ``argparse`` does.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        with sigterm_raises_interrupt():
            return int(body(args) or 0)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the one place that reports every failure
        status, line = describe_error(exc)
        sys.stdout.flush()
        if debug and not isinstance(exc, UsageError):
            if exc.__suppress_context__ and exc.__context__ is not None:  # the cause behind a CliError
                traceback.print_exception(exc.__context__, file=sys.stderr)
            traceback.print_exception(exc, file=sys.stderr)
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(status) from None


def note(text: str) -> None:
    """An informational line (stdout, so that stderr holds only progress bars and errors)."""
    print(f"note: {text}", flush=True)


def format_seconds(seconds: float) -> str:
    """``42 s``, ``3.5 min``, ``2.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class TaskProgress:
    """Overall progress of a command that runs ``total`` long tasks one after another (the runs of a
    config, the figures): :meth:`begin` notes ``what k/n: NAME (elapsed T, about R left)``, the
    estimate the mean time of the tasks finished so far times those left (tasks that took under
    ``quick`` seconds -- finished runs found on disk -- do not count: they would make it too low)."""

    def __init__(self, total: int, what: str, *, quick: float = 1.0) -> None:
        self.total, self.what, self.quick = total, what, quick
        self.start = time.monotonic()
        self.durations: list[float] = []
        self.done = 0
        self._began: float | None = None

    def line(self, name: str) -> str:
        elapsed = time.monotonic() - self.start
        text = f"{self.what} {self.done + 1}/{self.total}: {name}"
        if self.done:
            text += f" (elapsed {format_seconds(elapsed)}"
            if self.durations:
                left = sum(self.durations) / len(self.durations) * (self.total - self.done)
                text += f", about {format_seconds(left)} left"
            text += ")"
        return text

    def begin(self, name: str) -> None:
        """Note the next task (stdout); call :meth:`end` when it finishes."""
        note(self.line(name))
        self._began = time.monotonic()

    def end(self) -> None:
        if self._began is None:
            raise RuntimeError("TaskProgress.end() without begin()")
        seconds = time.monotonic() - self._began
        if seconds >= self.quick:
            self.durations.append(seconds)
        self.done += 1
        self._began = None


# ------------------------------------------------------------------------------------------ signals
@contextlib.contextmanager
def sigterm_raises_interrupt(signums: Sequence[int] = (signal.SIGTERM,)) -> Iterator[None]:
    """While active (main thread only), the first of the signals ``signums`` (SIGTERM by default; a
    cluster task adds SIGUSR2, :mod:`experiments.cluster`) raises :class:`Terminated` naming it;
    later ones are ignored so that the save triggered by the first one is not cut short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal fired
        if not fired:
            fired = True
            name = signal.Signals(signum).name
            if interrupts_deferred.depth:  # inside an optimizer step: raised when the step ends
                interrupts_deferred.pending = name
                return
            raise Terminated(name)

    old = {s: signal.signal(s, handler) for s in signums}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        interrupts_deferred.pending = ""


class _Deferred:
    """``with interrupts_deferred:`` holds a SIGTERM that arrives inside the block (under
    :func:`sigterm_raises_interrupt`) until the block ends, then raises :class:`Terminated`.

    For the optimizer step of a training loop: an exception raised at an arbitrary bytecode could
    interrupt a two-pass step between perturbing the weights and restoring them (or inside a
    grad-mode switch, so that the restore itself fails); deferred to the step's end, the weights are
    whole when the run stops.  Re-entrant; costs two attribute updates per block."""

    def __init__(self) -> None:
        self.depth = 0
        self.pending = ""  # the name of the held signal

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: Any) -> None:
        self.depth -= 1
        if self.depth == 0 and self.pending and exc[0] is None:  # else: held for the next block's end
            name, self.pending = self.pending, ""
            raise Terminated(name)


interrupts_deferred = _Deferred()


# ------------------------------------------------------------------------------------- lock files
#: the largest PID a lock file may name: Linux PIDs stay below 2**22, every system's below 2**31
_PID_MAX = 2**31 - 1


def lock_pid(value: Any) -> int | None:
    """``value`` (an ``int``, or a ``str`` of ASCII digits) as a PID in ``1 .. 2**31 - 1``; ``None``
    for anything else (a negative, zero or overflowing number, a bool, text): such a lock names no
    process, and ``os.kill`` must never see it (``kill(0)`` and ``kill(-1)`` address groups)."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= _PID_MAX:
        return value
    return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` (a :func:`lock_pid`) exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        return True
    return True


def read_lock(lock: Path, limit: int = 1 << 20) -> bytes | None:
    """The first ``limit`` bytes of the lock file ``lock``; ``None`` if there is none. A lock that
    is a directory, or cannot be read, reads as a description in angle brackets (``b"<a
    directory>"``), which no lock holds: :func:`foreign_lock` shows it."""
    try:
        with open(lock, "rb") as fh:
            return fh.read(limit)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return b"<a directory>"
    except OSError as exc:
        return f"<unreadable: {exc.strerror or type(exc).__name__}>".encode()


def lock_content(raw: bytes, limit: int = 60) -> str:
    """A short rendering of a lock file's bytes for a message: its text, or the bytes (``b'...'``)
    of a binary file, cut at ``limit`` characters with ``…``."""
    more = "…" if len(raw) > limit else ""
    text = raw.decode("utf-8", errors="replace")
    if "\ufffd" in text or not "".join(text.split()).isprintable():
        return f"{raw[:limit]!r}{more}"
    return f"{text.strip()[:limit]!r}{more}"


def foreign_lock(lock: Path, raw: bytes, user: str, cls: type[CliError] = CliError) -> CliError:
    """The error (a ``cls``) for a lock file that no sharpscape run wrote (binary, corrupt, an
    impossible PID): named as such, with its content and the fix; ``user`` is what the lock guards
    (``"the run directory DIR"``, ``OUT``)."""
    return cls(
        f"lock file {lock} is not a lock written by sharpscape (content {lock_content(raw)})",
        f"remove it if no run is using {user}, then run again",
    )


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, *, force: bool = False) -> Iterator[Path]:
    """Hold ``PATH.lock`` (created with ``O_CREAT | O_EXCL``, holding ``"PID HOST"``) while writing
    ``path``; removed on exit. A lock of a dead process on this host is taken over; a live one is
    refused unless ``force``; so is a lock file that is not one of these (:func:`foreign_lock`),
    except an empty one older than 5 s (a writer that died between creating and writing it)."""
    lock = Path(f"{os.fspath(path)}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()} {socket.gethostname()}\n"
    for _ in range(5):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raw = read_lock(lock)
            try:
                age = time.time() - lock.stat().st_mtime
            except FileNotFoundError:
                continue
            if raw is None:
                continue
            words = raw.decode("utf-8", errors="replace").split()
            pid = lock_pid(words[0]) if len(words) == 2 else None
            if raw.strip() and pid is None and not force:
                raise foreign_lock(lock, raw, str(path)) from None
            here = pid is not None and words[1] == socket.gethostname()
            stale = (here and not pid_alive(pid)) or (not raw.strip() and age > 5.0)
            if not (stale or force):
                who = f"PID {pid} on {words[1]}" if pid is not None else "another process"
                raise CliError(
                    f"{path} is being written by another run ({who}; lock file {lock})",
                    "wait for that run to finish, or pass --force if it is gone",
                ) from None
            with contextlib.suppress(OSError):
                if read_lock(lock) == raw:
                    lock.unlink()
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        break
    else:
        raise CliError(f"cannot create the lock file {lock}", "remove it by hand if no run is writing")
    try:
        yield lock
    finally:
        with contextlib.suppress(OSError):
            if read_lock(lock) == token.encode():
                lock.unlink()


# ----------------------------------------------------------------------------------- argument types
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a whole number >= 1")
    return value


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a whole number >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a whole number >= 0")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a finite number such as -1 or 0.5")
    return value


class OneOrTwo(argparse.Action):
    """``nargs="+"`` limited to one or two values (``--grid N`` or ``--grid NX NY``)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        if not 1 <= len(values) <= 2:
            raise argparse.ArgumentError(
                self,
                f"takes one or two values, got {len(values)} ({' '.join(map(str, values))})"
                f"{DASH}write {option_string} N or {option_string} NX NY",
            )
        setattr(namespace, self.dest, list(values))


# -------------------------------------------------------------------------------- data and devices
DATA_HELP = (
    "digits[:train|test|all], digits-image, mnist[:DIR], fashion-mnist[:DIR], cifar10[:DIR], "
    "cifar100[:DIR], cifar100-coarse[:DIR], cifar10c:[DIR:]CORRUPTION:SEVERITY or svhn[:DIR] "
    "(local files, DIR defaults to $SHARPSCAPE_DATA; nothing is downloaded)"
)


def load_data(spec: str, split: str | None, limit: int | None, default_split: str) -> tuple[Any, Any]:
    """``--data`` (``digits:test`` is a split shorthand), ``--split`` and ``--limit`` -> ``(x, y)``."""

    name, _, rest = spec.partition(":")
    if name.lower() in ("digits", "digits-image") and rest:
        if rest not in ("train", "test", "all"):
            raise UsageError(
                f"--data {spec}: unknown split {rest!r}", f"write {name}:train, {name}:test or {name}:all"
            )
        if split is not None and split != rest:
            raise UsageError(f"--data {spec} and --split {split} disagree", "give the split once")
        spec, split = name, rest
    extra = {"limit": limit} if limit and name.lower() not in ("digits", "digits-image") else {}
    try:
        x, y = load_dataset(spec, split or default_split, **extra)
    except FileNotFoundError as exc:  # a bad command line (exit 2), like every path argument
        raise UsageError(
            f"--data {spec}: {exc}",
            "point --data at the directory that holds the files (nothing is downloaded)",
        ) from None
    except ValueError as exc:
        raise UsageError(f"--data {spec}: {exc}", "check --data (its forms are listed in --help)") from None
    if limit:
        x, y = x[:limit], y[:limit]
    if len(y) == 0:
        raise UsageError(
            f"--data {spec} (split {split or default_split}) has no examples", "choose another split"
        )
    return x, y


def check_device(name: str | None) -> None:
    """Refuse a device name torch does not parse or a device this machine does not have."""
    if name is None:
        return
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise UsageError(
            f"--device {name!r} is not a device name", "use cpu, cuda, cuda:1, mps, ..."
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {name}: CUDA is not available on this machine", "use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)",
                f"use cuda:0 ... cuda:{torch.cuda.device_count() - 1}",
            )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UsageError(f"--device {name}: MPS is not available on this machine", "use --device cpu")


def check_path(
    path: str | os.PathLike | None,
    option: str,
    kind: str = "file",
    *,
    read: bool = False,
    missing_fix: str = "check the path",
) -> None:
    """Check a path argument at the command line (every command, every path: outputs, inputs,
    directories): :func:`landscape.io.require_path`, whose :class:`~landscape.io.PathError` is one
    ``error:`` line naming ``option path`` with exit status 2 (1 for an unwritable location).
    ``None`` (an option not given) passes."""
    if path is not None:
        require_path(path, kind, read=read, option=option, missing_fix=missing_fix)


def check_figure(path: str | os.PathLike | None, option: str) -> None:
    """:func:`check_path` for a matplotlib figure: the name must end in a format matplotlib writes
    (``.png``, ``.pdf``, ``.svg``, ...), which is the format written (:func:`landscape.io.atomic_savefig`)."""
    if path is None:
        return
    check_path(path, option)
    from matplotlib.backend_bases import FigureCanvasBase  # optional dependency: only for a figure

    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in kinds:
        raise UsageError(
            f"{option} {os.fspath(path)}: matplotlib cannot write "
            + (f".{suffix} files" if suffix else "a file without an extension"),
            f"end the name in one of .{', .'.join(sorted(kinds))}",
        )


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def check_outputs(
    outputs: dict[str, str | os.PathLike | None],
    inputs: Sequence[tuple[str, str | os.PathLike]] = (),
    input_dirs: Sequence[tuple[str, str | os.PathLike]] = (),
) -> None:
    """Refuse an output that would replace another output or an input of the same command: two of
    ``outputs`` (option -> path; ``None``: not given) naming one file, an output that is one of the
    files ``inputs`` (``(label, path)``) or that lies inside one of the directories ``input_dirs``
    whose files the command reads. One :class:`UsageError` naming both; nothing is written."""
    given = [(opt, os.fspath(p)) for opt, p in outputs.items() if p is not None]
    for i, (opt, path) in enumerate(given):
        for opt2, path2 in given[i + 1 :]:
            if _same_file(path, path2):
                raise UsageError(
                    f"{opt} and {opt2} name the same file {path}", "give each output its own file"
                )
        real = os.path.realpath(path)
        clash = [
            f"is the {label} {os.fspath(src)}" for label, src in inputs if _same_file(path, os.fspath(src))
        ]
        clash += [
            f"lies inside the {label} {os.fspath(src)}"
            for label, src in input_dirs
            if real.startswith(os.path.join(os.path.realpath(src), ""))
        ]
        if clash:
            raise UsageError(
                f"{opt} {path} {clash[0]}, which this command reads",
                "write the output elsewhere (an output never replaces an input)",
            )
