"""Atomic file writing (a result file is either the old one or the complete new one, never half),
JSON reading that turns a bad file into a clear error, and the check of a path a user gives
(:func:`require_path`: a file where a directory is expected and vice versa, a trailing slash, a file
among the parent directories, a missing input, an unwritable location).

Every writer of a result goes through :func:`atomic_write` (text: :func:`atomic_write_text`, JSON:
:func:`atomic_write_json`, matplotlib figures: :func:`atomic_savefig`); an error names the user's
path, never the temporary file's.

Non-finite numbers in JSON: the JSON standard has no NaN or infinities, but results legitimately
contain them (a diverged loss, an infinite standard error). Files written here use the tokens
``NaN``, ``Infinity`` and ``-Infinity`` for them, the extension Python's ``json`` module writes
and reads by default (also read by e.g. pandas and JSON5 parsers, not by JavaScript's
``JSON.parse``), so they round-trip as floats, never as strings, and a string such as ``"inf"`` in
a configuration stays a string.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: errors of a full file system (or an exhausted quota): :func:`atomic_write` turns them into a
#: :class:`DiskFullError` naming the file, the bytes and the free space
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class PathError(ValueError):
    """A path that cannot serve as what was asked: one line ``<what> — <fix>``.

    ``usage`` is ``True`` when the path itself is wrong (a file where a directory is expected, a
    missing input, ...: a bad command line, exit status 2) and ``False`` when the path is right but
    the location cannot be written (an environment problem, exit status 1)."""

    def __init__(self, what: str, fix: str, *, usage: bool = True):
        super().__init__(f"{what} — {fix}")
        self.what, self.fix, self.usage = what, fix, usage


#: the characters that end a directory name: ``/`` (and ``\\`` on Windows)
_SEPARATORS = "".join(sorted({"/", os.sep, os.altsep or "/"}))


def _ends_in_separator(text: str) -> bool:
    """``out.npz/``, but not the root ``/`` itself."""
    return text.endswith(tuple(_SEPARATORS)) and text.strip(_SEPARATORS) != ""


def _first_existing(path: Path) -> Path:
    """``path`` or the nearest of its parents that exists (``os.path.lexists``: a dangling link counts)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def require_path(
    path: str | os.PathLike,
    kind: str = "file",
    *,
    read: bool = False,
    option: str | None = None,
    missing_fix: str = "check the path",
) -> Path:
    """Check that ``path`` can serve as a ``kind`` (``"file"``, ``"directory"`` or ``"any"``) to read
    (``read=True``: it must exist) or to write (it may be missing: it and its missing parents are
    created); return it as a :class:`Path`, or raise :class:`PathError` naming ``option path``.

    Refused: a file name that ends in a slash (``out.npz/`` names a directory), an existing path of
    the other kind, a file among the parent directories, a missing input, and for an output a
    location whose nearest existing directory cannot be written (``usage=False``)."""
    text = os.fspath(path)
    name = f"{option} {text}" if option else text
    if not text.strip():  # Path("") is the current directory: never what an empty argument meant
        raise PathError(f"{option or 'the path'} is empty{f' ({text!r})' if text else ''}", "give a path")
    if text == "-":
        raise PathError(
            f"{name}: '-' (standard input / output) is not supported here",
            f"give a file name{', or leave out the option' if option and not read else ''}",
        )
    p = Path(text)
    exists = p.exists()
    if _ends_in_separator(text) and not p.is_dir():
        plain = text.rstrip(_SEPARATORS)
        if exists:
            raise PathError(
                f"{name} ends in a slash but {plain} is a file", f"write {plain} without the slash"
            )
        if kind == "file":
            raise PathError(
                f"{name} ends in a slash, which names a directory, but a file is expected",
                f"give a file name without the trailing slash ({plain})",
            )
    if exists:
        if kind == "file" and p.is_dir():
            raise PathError(
                f"{name} is a directory, not a file",
                "give a file inside it" if read else f"give a file name, e.g. {p / 'result'}",
            )
        if kind == "directory" and not p.is_dir():
            raise PathError(
                f"{name} is a file, not a directory",
                "give a directory" if read else "give a directory (it is created if missing)",
            )
        where = p if p.is_dir() else p.parent
    else:
        where = _first_existing(p.parent)
        if os.path.lexists(where) and not where.is_dir():
            raise PathError(f"{name}: {where} is a file, not a directory", "choose another path")
        if read:
            raise PathError(f"{name} does not exist", missing_fix)
    if not read and not os.access(where, os.W_OK | os.X_OK):
        raise PathError(f"{name}: {where} is not writable", "choose a writable directory", usage=False)
    return p


class DiskFullError(OSError):
    """Writing ``path`` failed for lack of space; the previous file at ``path`` (if any) is intact.

    An ``OSError`` with ``errno = ENOSPC`` whose message is one line ``<what> — <fix>``: the path,
    the bytes it tried to write, the free space on that file system and what to do."""

    def __init__(self, path: Path, nbytes: int | None, written: int, free: int | None, existed: bool):
        size = f"{nbytes:,} bytes" if nbytes is not None else f"a file (failed after {written:,} bytes)"
        room = f"{free:,} bytes free" if free is not None else "free space unknown"
        kept = f"the previous {path.name} is unchanged" if existed else f"no {path.name} was written"
        message = (
            f"no space left on the device writing {path} ({size}; {room} in {path.parent}); {kept}"
            " — free some disk space, or write to another directory (another out_dir / --out)"
        )
        super().__init__(errno.ENOSPC, message)
        self.path, self.nbytes, self.written, self.free = path, nbytes, written, free

    def __str__(self) -> str:
        return str(self.strerror)


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def atomic_write(
    path: str | os.PathLike, writer: Callable[[Path], None], *, nbytes: int | None = None
) -> Path:
    """Call ``writer(tmp_path)`` on a temporary file in the target directory, then rename it.

    The rename is atomic on POSIX and Windows (``os.replace``); if ``writer`` raises, the temporary
    file is removed and any existing file at ``path`` is left untouched. A full disk (``ENOSPC``,
    ``EDQUOT``) raises :class:`DiskFullError` naming ``path``, the bytes to write (``nbytes`` when
    the caller knows them) and the free space.
    """
    path = Path(path)
    if path.is_dir():
        raise PathError(f"{path} is a directory, not a file", f"give a file name, e.g. {path / 'result'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path: Path | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp_path = Path(tmp)
        writer(tmp_path)
        # mkstemp creates the file 0600; give it the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException as exc:
        written = 0
        if tmp_path is not None:
            try:
                written = tmp_path.stat().st_size
            except OSError:
                pass
            tmp_path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, DiskFullError) and exc.errno in _NO_SPACE:
            raise DiskFullError(path, nbytes, written, _free_bytes(path.parent), path.exists()) from exc
        if isinstance(exc, OSError) and _is_temporary(exc.filename, path):  # name the user's file
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise
    return path


def _is_temporary(filename: Any, path: Path) -> bool:
    """Whether ``filename`` (of an ``OSError``) is a temporary file of :func:`atomic_write` for ``path``."""
    if filename is None:
        return False
    name = Path(os.fsdecode(filename)).name
    return name.startswith(f".{path.name}.") and name.endswith(".tmp")


def _write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` with ``os.write`` (every byte, or an ``OSError`` such as ``ENOSPC``)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_BINARY", 0))
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    data = text.encode("utf-8")
    return atomic_write(path, lambda p: _write_bytes(p, data), nbytes=len(data))


def atomic_savefig(path: str | os.PathLike, fig: Any, **kwargs: Any) -> Path:
    """Write the matplotlib figure ``fig`` atomically (``fig.savefig(..., **kwargs)``); the format is
    the one the file name ends in (``.png``, ``.pdf``, ``.svg``, ...; PNG without one)."""
    fmt = kwargs.pop("format", None) or Path(path).suffix.lstrip(".").lower() or "png"
    return atomic_write(path, lambda p: fig.savefig(p, format=fmt, **kwargs))


def to_jsonable(obj: Any) -> Any:
    """Convert tensors, numpy arrays/scalars, paths, tuples and dataclasses to JSON-friendly values."""
    import dataclasses

    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().tolist()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (torch.dtype, torch.device, Path)):
        return str(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj  # non-finite floats stay floats: written as NaN / Infinity / -Infinity (see above)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` (through :func:`to_jsonable`) as indented JSON, atomically; non-finite floats
    are written as ``NaN`` / ``Infinity`` / ``-Infinity`` and read back as floats by :func:`read_json`."""
    text = json.dumps(to_jsonable(obj), indent=2, sort_keys=False, allow_nan=True)
    return atomic_write_text(path, text + "\n")


def read_json(path: str | os.PathLike, *, what: str = "JSON file", fix: str | None = None) -> Any:
    """Parse the JSON file ``path``; ``NaN`` / ``Infinity`` / ``-Infinity`` become floats.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, not UTF-8 text (a ``.npz`` or other binary file), not valid
            JSON (truncated or corrupt; the message gives line and column) or nested too deeply.
            The message names the file and ``what`` was expected; with ``fix`` it is one line
            ``<what is wrong> — <fix>`` (e.g. ``"delete it and run ... again"``).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such {what}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, expected a {what}")
    tail = f" — {fix}" if fix else ""
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"{path}: the {what} is empty (an interrupted copy?){tail}")
    if raw[:4] == b"PK\x03\x04":
        raise ValueError(
            f"{path}: a zip/.npz archive, not a {what}; surfaces are loaded with landscape.load_surface"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a {what}: byte {exc.start} is not UTF-8 text (a binary file?){tail}"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not a valid {what}: {exc.msg} (line {exc.lineno}, column {exc.colno}); "
            f"the file is truncated or corrupt{tail}"
        ) from None
    except RecursionError:
        raise ValueError(
            f"{path}: the {what} nests too deeply; the file is corrupt or malicious{tail}"
        ) from None


def read_json_object(path: str | os.PathLike, *, what: str = "JSON file") -> dict[str, Any] | None:
    """The JSON object (a dict) in ``path``, or ``None`` when there is no such file or it is not a
    readable JSON object (a record that is missing or half-written counts as absent)."""
    if not Path(path).is_file():
        return None
    try:
        doc = read_json(path, what=what)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
