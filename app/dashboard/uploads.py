"""Files the user uploads to the dashboard: checked, and explained in words when they are not what
the page expects (named by the file's own name, never by the temporary copy's path)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import landscape as ls

from . import UserInputError


def _safe_name(name: str) -> str:
    """The uploaded name reduced to a plain file name (no directories), for the temporary copy."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", Path(str(name).replace("\\", "/")).name)[-100:]
    return "upload.npz" if not base.strip(".") else base  # never "", "." or ".."; short enough


def open_uploaded_surface(name: str, data: bytes) -> ls.Surface:
    """Load an uploaded surface file (``Surface.save`` / ``python -m landscape surface`` output).

    Anything else raises :class:`UserInputError` whose message names ``name`` (the uploaded file's
    own name) and says what a surface file is; the temporary path never appears in it.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    shown = str(name) or "the uploaded file"
    if not data:
        raise UserInputError(f"{shown!r} is empty; upload a .npz file written by Surface.save")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / _safe_name(name)
        try:
            path.write_bytes(bytes(data))
        except OSError as exc:  # e.g. a full temporary directory on the server
            raise UserInputError(
                f"could not store {shown!r} ({len(data):,} bytes) for reading: "
                f"{exc.strerror or type(exc).__name__}. Free space in the server's temporary directory."
            ) from None
        try:
            return ls.load_surface(path)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one readable message
            reason = str(exc).replace(str(path), shown).replace(tmp, "")
            if "pickle" in reason.lower():  # numpy's wording for object arrays, in words a user can act on
                reason = "it holds Python objects, which a surface file never does"
            reason = reason.strip().rstrip(".")
            if reason.startswith(shown):
                reason = reason[len(shown) :].lstrip(" :")
            reason = re.sub(r"^(is )?not a surface file( written by Surface\.save)?\s*:?\s*", "", reason)
            if reason.startswith("(") and reason.endswith(")"):
                reason = reason[1:-1]
            raise UserInputError(
                f"{shown!r} is not a surface file: {reason}. Upload a .npz written by Surface.save or "
                "`python -m landscape surface`."
            ) from None
