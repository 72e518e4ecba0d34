"""A run's initial weights from a file: ``model.checkpoint = "PATH"`` (fine-tuning a pre-trained
network; SGLD / F-SGLD started from a trained one, as the flat-seeking BNN authors' code does).

The file is read without running code: a ``.safetensors`` file by :func:`read_safetensors` (the
format's 8-byte header length, JSON header and raw little-endian tensor bytes; no dependency), any
other file by ``torch.load(..., weights_only=True)``, which refuses pickled Python objects. A
state dict, or a checkpoint holding one under ``state_dict`` / ``model_state_dict`` / ``model``,
is accepted.

:func:`load_initial_weights` loads it into the freshly built (seeded) network: with
``model.checkpoint_strict = true`` (default) every key and shape must match, else a
:class:`experiments.config.ConfigError` lists the first mismatches; with ``false`` the matching
entries are loaded and the rest (a replaced classifier head: missing, unexpected or reshaped keys)
keep the seeded initialisation and are listed in the returned note.

:func:`file_sha256` is the file's SHA-256, which the runner writes to ``model.checkpoint_sha256`` of
every run's configuration (:func:`experiments.runner.plan_runs`), so a changed file is a different
run (:mod:`experiments.run_identity`) and a given hash is checked against the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from experiments.config import ConfigError

__all__ = ["file_sha256", "load_initial_weights", "read_safetensors", "read_weights"]

#: the safetensors dtype names (https://github.com/huggingface/safetensors, format description)
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")
_SAVE_HINT = "save the weights with torch.save(model.state_dict(), PATH) or safetensors.torch.save_file"
_HASHES: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of the file (64 hex digits), cached by path, size and modification time."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise ConfigError(
            f"model.checkpoint {str(path)!r} does not exist; give the path of a .safetensors file or a "
            f"torch state dict ({_SAVE_HINT})"
        ) from None
    if not p.is_file():
        raise ConfigError(f"model.checkpoint {str(path)!r} is not a file; give a .safetensors or .pt file")
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASHES[key] = h.hexdigest()
    return _HASHES[key]


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file: ``u64`` little-endian header size ``N``, ``N`` bytes of
    JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
    the data, offsets relative to its start. Raises :class:`ConfigError` for a malformed file."""
    where = f"model.checkpoint {str(path)!r}"
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ConfigError(f"{where} is too short for a .safetensors file ({len(data)} bytes)")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ConfigError(f"{where}: header of {n} bytes in a file of {len(data)}: not a .safetensors file")
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ConfigError(f"{where}: the header is not JSON: not a .safetensors file") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{where}: the header is not a JSON object: not a .safetensors file")
    body = memoryview(data)[8 + n :]
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(
                f"{where}: tensor {name!r} has dtype / shape / data_offsets {info!r}; known dtypes: "
                f"{sorted(_SAFETENSORS_DTYPES)}"
            ) from None
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(body) or end - begin != size:
            raise ConfigError(
                f"{where}: tensor {name!r}: offsets [{begin}, {end}] do not hold {shape} {dtype}"
            )
        raw = bytearray(body[begin:end])
        flat = torch.frombuffer(raw, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
    return out


def _is_state(d: Any) -> bool:
    tensors = isinstance(d, dict) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in d.items())
    return bool(d) and tensors


def read_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The state dict in ``path`` (see the module docstring); nothing in the file can run code."""
    where = f"model.checkpoint {str(path)!r}"
    file_sha256(path)  # exists, is a file
    if str(path).endswith(".safetensors"):
        return read_safetensors(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"{where} holds pickled Python objects that weights_only loading refuses (unpickling can "
            f"run arbitrary code; {' '.join(str(exc).split())[:160]}); {_SAVE_HINT}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, EOFError, ... for a bad file
        raise ConfigError(
            f"{where} is not a PyTorch or .safetensors file ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:160]}); {_SAVE_HINT}"
        ) from None
    if _is_state(obj):
        return obj
    if isinstance(obj, dict):
        for key in _WRAPPER_KEYS:
            if _is_state(obj.get(key)):
                return obj[key]
    raise ConfigError(
        f"{where} holds a {type(obj).__name__} that is not a state dict of tensors; {_SAVE_HINT}"
    )


def _few(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def load_initial_weights(model: nn.Module, path: str | os.PathLike, *, strict: bool = True) -> dict[str, Any]:
    """Load the weights of ``path`` into ``model`` (see the module docstring); returns the note
    ``{"path", "sha256", "loaded"}`` (how many entries) and the key lists ``"missing"``,
    ``"unexpected"``, ``"reshaped"``.

    Raises:
        ConfigError: the file cannot be read safely, or (``strict``) a key or shape does not match,
            or (not ``strict``) no entry of the file fits the model.
    """
    state = read_weights(path)
    own = model.state_dict()
    reshaped = [
        f"{k} {tuple(state[k].shape)} in the file vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    where = f"model.checkpoint {str(path)!r}"
    if strict and (reshaped or missing or unexpected):
        parts = [
            f"{what}: {_few(keys)}"
            for what, keys in (
                ("shapes differ", reshaped),
                ("missing from the file", missing),
                ("not in the model", unexpected),
            )
            if keys
        ]
        raise ConfigError(
            f"{where} does not fit model {type(model).__name__}: {'; '.join(parts)}. Build the network the "
            "file was saved from (model.name, model.kwargs), or set model.checkpoint_strict = false to "
            "load the matching entries and keep the seeded initialisation of the rest (a replaced "
            "classifier head)"
        )
    bad = {r.split(" ", 1)[0] for r in reshaped}
    fits = {k: v for k, v in state.items() if k in own and k not in bad}
    if not fits:
        raise ConfigError(
            f"{where}: no entry of the file fits model {type(model).__name__} (file keys: "
            f"{_few(list(state))}; model keys: {_few(list(own))}); check model.name and model.kwargs"
        )
    with torch.no_grad():
        model.load_state_dict(fits, strict=False)
    return {
        "path": str(path),
        "sha256": file_sha256(path),
        "loaded": len(fits),
        "missing": missing,
        "unexpected": unexpected,
        "reshaped": reshaped,
    }
