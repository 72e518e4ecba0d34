"""Atomic, resumable checkpoints of a training run.

A checkpoint holds everything the next epoch depends on: the model (parameters and buffers), the
optimizer (and the state of its own random generator), the learning-rate scheduler, the loss
scaler, the random states of torch (CPU and CUDA), numpy and Python, the data-order and
augmentation generators, the epoch and step counters and the per-epoch history. It is written with
:func:`landscape.io.atomic_write` (a crash leaves the previous checkpoint intact) and read with
``torch.load(weights_only=True)``; a run resumed from it continues bit-identically on the same
device and software.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from landscape.io import atomic_write

__all__ = ["capture_rng", "check_checkpoint", "load_checkpoint", "restore_rng", "save_checkpoint"]


def capture_rng() -> dict[str, Any]:
    """The global random states (torch CPU and CUDA, numpy, Python) in ``weights_only``-loadable form."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    py = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.as_tensor(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "python": [py[0], list(py[1]), py[2]],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    v, internal, gauss = state["python"]
    random.setstate((v, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _generator_states(opt: Any) -> dict[str, torch.Tensor]:
    """States of the generators an optimizer (or the optimizer a SWAG wraps) draws from."""
    out = {}
    for name, obj in (("outer", opt), ("inner", getattr(opt, "optimizer", None))):
        gen = getattr(obj, "generator", None)
        if isinstance(gen, torch.Generator):
            out[name] = gen.get_state()
    return out


def _set_generator_states(opt: Any, states: dict[str, torch.Tensor]) -> None:
    for name, obj in (("outer", opt), ("inner", getattr(opt, "optimizer", None))):
        gen = getattr(obj, "generator", None)
        if name in states and isinstance(gen, torch.Generator):
            gen.set_state(states[name])


def save_checkpoint(
    path: str | Path, *, model, optimizer, scheduler, scaler, generators, counters, history, fingerprint
) -> None:
    """Write the checkpoint of a run atomically (see the module docstring)."""
    blob = {
        "format": "experiments-checkpoint-1",
        "fingerprint": fingerprint,
        "counters": dict(counters),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "optimizer_generators": _generator_states(optimizer),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "generators": {k: g.get_state() for k, g in generators.items()},
        "rng": capture_rng(),
        "history": history,
    }
    atomic_write(path, lambda p: torch.save(blob, p))


def _read(path: str | Path, fingerprint: str) -> dict[str, Any]:
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise ValueError(
            f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc}); "
            "delete it to start the run afresh"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != "experiments-checkpoint-1":
        raise ValueError(f"{path} is not a checkpoint of the experiment runner; delete it to start afresh")
    if blob["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} belongs to a run with another configuration; use another out_dir, or delete the run "
            "directory to start afresh"
        )
    return blob


def check_checkpoint(path: str | Path, fingerprint: str) -> None:
    """Raise ``ValueError`` if ``path`` exists and is not a checkpoint of this configuration."""
    if Path(path).is_file():
        _read(path, fingerprint)


def load_checkpoint(
    path: str | Path, *, model, optimizer, scheduler, scaler, generators, fingerprint
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Restore a run from ``path``; returns ``(counters, history)``.

    Raises:
        ValueError: the file is not a checkpoint of this runner, or it belongs to a run with another
            configuration (its fingerprint differs).
    """
    blob = _read(path, fingerprint)
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    _set_generator_states(optimizer, blob["optimizer_generators"])
    scheduler.load_state_dict(blob["scheduler"])
    scaler.load_state_dict(blob["scaler"])
    for k, g in generators.items():
        g.set_state(blob["generators"][k])
    restore_rng(blob["rng"])
    return blob["counters"], blob["history"]
