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

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def atomic_write(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` on a temporary file in the target directory, then rename it.

    The rename is atomic on POSIX and Windows (``os.replace``); if ``writer`` raises, the temporary
    file is removed and any existing file at ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        writer(tmp_path)
        # mkstemp creates the file 0600; give it the permissions a plain open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


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


def read_json(path: str | os.PathLike, *, what: str = "JSON file") -> Any:
    """Parse the JSON file ``path``; ``NaN`` / ``Infinity`` / ``-Infinity`` become floats.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is empty, not UTF-8 text (a ``.npz`` or other binary file), not valid
            JSON (truncated or corrupt; the message gives line and column) or nested too deeply.
            The message names the file and ``what`` was expected.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such {what}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, expected a {what}")
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"{path}: the {what} is empty (an interrupted copy?)")
    if raw[:4] == b"PK\x03\x04":
        raise ValueError(
            f"{path}: a zip/.npz archive, not a {what}; surfaces are loaded with landscape.load_surface"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a {what}: byte {exc.start} is not UTF-8 text (a binary file?)"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path}: not a valid {what}: {exc.msg} (line {exc.lineno}, column {exc.colno}); "
            "the file is truncated or corrupt"
        ) from None
    except RecursionError:
        raise ValueError(f"{path}: the {what} nests too deeply; the file is corrupt or malicious") from None
