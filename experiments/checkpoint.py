"""Atomic, resumable checkpoints of a training run, written after every epoch and at a signal.

A checkpoint holds everything the next step depends on: the model (parameters and buffers), the
optimizer (and the state of its own random generator), the learning-rate scheduler, the loss
scaler, the random states of torch (CPU and CUDA), numpy and Python, the data-order and
augmentation generators, the epoch and step counters (``epoch``: epochs completed, ``step``:
optimizer steps taken, ``skipped``, the divergence monitor's state) and the per-epoch history. It is
written with :func:`landscape.io.atomic_write` (a crash leaves the previous checkpoint intact) and
read with ``torch.load(weights_only=True)``; a run resumed from it continues bit-identically on the
same device and software.

A *mid-epoch* checkpoint (written by :class:`experiments.train.Trainer` when a SIGTERM or Ctrl-C
stops the run between two steps of an epoch) is the same file with, in addition,
``counters["batch"]`` (the steps done in the epoch in progress) and ``partial_epoch``: the data
generator's state before the epoch's ``randperm`` (so the same order is redrawn), the epoch's
partial :class:`experiments.divergence.StepLosses` (``state_dict``), its skipped steps, its first
learning rate and the seconds it had run. A checkpoint without them (every end-of-epoch checkpoint,
and the older epoch-only format) resumes at the start of the next epoch (``batch`` 0).

It also records the fingerprints of the run's training and test data
(:func:`experiments.data.data_fingerprints`): a resume on other data is refused, naming the set
that changed. A file that is not such a checkpoint (e.g. a pickle holding code) is refused in one
line naming it, without running anything in it; a write that fails (a full disk) names the path,
the bytes needed and the space free, and leaves the previous checkpoint intact.
"""

from __future__ import annotations

import pickle
import random
import re
import shutil
import warnings
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
    path: str | Path,
    *,
    model,
    optimizer,
    scheduler,
    scaler,
    generators,
    counters,
    history,
    fingerprint,
    data_fingerprint: dict[str, str] | None = None,
    partial_epoch: dict[str, Any] | None = None,
) -> None:
    """Write the checkpoint of a run atomically (see the module docstring); ``partial_epoch``: the
    state of the epoch in progress for a mid-epoch checkpoint (then ``counters["batch"]`` holds the
    steps done in it), ``None`` at the end of an epoch.

    Raises:
        OSError: the file could not be written (the message names the path, the bytes needed and
            the space free; an existing checkpoint at ``path`` is left as it was).
    """
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
    if data_fingerprint is not None:
        blob["data"] = dict(data_fingerprint)
    if partial_epoch is not None:
        blob["partial_epoch"] = dict(partial_epoch)
    try:
        atomic_write(path, lambda p: torch.save(blob, p))
    except (OSError, RuntimeError) as exc:
        raise _write_error(Path(path), blob, exc) from exc


def _tensor_bytes(obj: Any, seen: set[tuple[int, int]]) -> int:
    """Bytes of the tensor storages in ``obj`` (each storage once)."""
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if key in seen:
            return 0
        seen.add(key)
        return st.nbytes() + 512  # and the zip entry and pickle record of the tensor
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _write_error(path: Path, blob: dict[str, Any], exc: BaseException) -> OSError:
    """One line for a failed checkpoint write: path, bytes needed (estimated), space free."""
    need = _tensor_bytes(blob, set()) + len(pickle.dumps(blob.get("history", []))) + 64 * 1024
    try:
        n = shutil.disk_usage(path.parent).free
        free = f"{n:,} bytes ({_mb(n)})"
    except OSError:
        free = "an unknown number of bytes"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kept = "the previous checkpoint is intact" if path.is_file() else "no checkpoint was written"
    err = OSError(
        f"could not write the checkpoint {path} ({type(exc).__name__}: {reason}): it needs about "
        f"{need:,} bytes ({_mb(need)}), the file system has {free} free; {kept} — free some space (or "
        "choose an out_dir on another disk) and run the same command again to resume"
    )
    err.errno = getattr(exc, "errno", None)
    return err


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A checkpoint of the experiment runner, loaded without running code (``weights_only``); a
    ValueError naming the file for anything else (pickled objects, a truncated or foreign file)."""
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of foreign files
            warnings.simplefilter("ignore")
            blob = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = _GLOBAL.search(str(exc))
        what = f"Python objects ({found.group(1)})" if found else "Python objects"
        raise ValueError(
            f"{path}: refused to load: it holds pickled {what} that no checkpoint of the experiment "
            "runner contains, so this runner did not write it (nothing in it was run) — delete it to start "
            "the run afresh; do not load it with weights_only=False unless you trust its source"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ValueError(
            f"{path}: not a readable checkpoint ({type(exc).__name__}: {reason}); "
            "delete it to start the run afresh"
        ) from None
    if not isinstance(blob, dict) or blob.get("format") != "experiments-checkpoint-1":
        raise ValueError(f"{path} is not a checkpoint of the experiment runner; delete it to start afresh")
    return blob


def _read(path: str | Path, fingerprint: str) -> dict[str, Any]:
    blob = read_checkpoint(path)
    if blob["fingerprint"] != fingerprint:
        raise ValueError(
            f"{path} belongs to a run with another configuration; use another out_dir, or delete the run "
            "directory to start afresh"
        )
    return blob


def _check_data(path: str | Path, blob: dict[str, Any], now: dict[str, str] | None) -> None:
    """Refuse a checkpoint trained on other data than ``now`` (checkpoints without a record pass)."""
    then = blob.get("data")
    if not isinstance(then, dict) or now is None:
        return
    changed = [
        f"the {name} set (sha256 {then[k][:12]}…, now {now[k][:12]}…)"
        for k, name in (("train", "training"), ("test", "test"))
        if k in then and k in now and then[k] != now[k]
    ]
    if changed:
        raise ValueError(
            f"{path} was written on other data: {' and '.join(changed)} changed since (inputs or labels, "
            "e.g. data files replaced between the interruption and this resume) — put the original data "
            "back to resume, or use another out_dir / delete the run directory to start afresh"
        )


def check_checkpoint(path: str | Path, fingerprint: str) -> None:
    """Raise ``ValueError`` if ``path`` exists and is not a checkpoint of this configuration."""
    if Path(path).is_file():
        _read(path, fingerprint)


def load_checkpoint(
    path: str | Path,
    *,
    model,
    optimizer,
    scheduler,
    scaler,
    generators,
    fingerprint,
    data_fingerprint: dict[str, str] | None = None,
    partial_epoch: dict[str, Any] | None = None,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Restore a run from ``path``; returns ``(counters, history)``. With a ``partial_epoch`` dict,
    it is cleared and filled with the checkpoint's partial-epoch state (left empty for a checkpoint
    written at the end of an epoch, and for one of the older, epoch-only format).

    Raises:
        ValueError: the file is not a checkpoint of this runner, or it belongs to a run with another
            configuration (its fingerprint differs), or it was trained on other data than
            ``data_fingerprint`` (:func:`experiments.data.data_fingerprints`).
    """
    blob = _read(path, fingerprint)
    _check_data(path, blob, data_fingerprint)
    model.load_state_dict(blob["model"])
    optimizer.load_state_dict(blob["optimizer"])
    _set_generator_states(optimizer, blob["optimizer_generators"])
    scheduler.load_state_dict(blob["scheduler"])
    scaler.load_state_dict(blob["scaler"])
    for k, g in generators.items():
        g.set_state(blob["generators"][k])
    restore_rng(blob["rng"])
    if partial_epoch is not None:
        partial_epoch.clear()
        partial_epoch.update(blob.get("partial_epoch") or {})
    return blob["counters"], blob["history"]
