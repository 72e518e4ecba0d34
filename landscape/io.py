"""Atomic file writing (a result file is either the old one or the complete new one, never half)
and JSON reading that turns a bad file into a clear error.

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
        raise
    return path


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
