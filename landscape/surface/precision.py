"""Reduced-precision loss surfaces (``surface(..., precision=)``) and the error they cost.

``precision`` (default ``None``: the objective's own dtype, global flags as they are, no change):

* ``"float32"``: full float32 arithmetic for the duration of the call: TF32 off
  (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``) and
  ``torch.set_float32_matmul_precision("highest")``, whatever the caller set globally;
* ``"tf32"``: on CUDA, TF32 matmuls and convolutions (both flags on, matmul precision ``"high"``)
  for the duration of the call only. On any other device it is a no-op, recorded as
  ``"no effect on cpu"``: no flag is touched (``set_float32_matmul_precision`` would also switch
  oneDNN's CPU matmuls), so the values are the float32 values bit for bit;
* ``"bf16"``: the model forward (and the loss) under ``torch.autocast(device_type, torch.bfloat16)``
  (CPU and CUDA): the autocast op lists decide what runs in bfloat16 (matmuls, convolutions) and
  what stays in float32 (e.g. ``cross_entropy``); the per-point sums over the data stay in float32.

Every flag is saved before and restored after the call, also when it raises: the legacy switches
above and, where this PyTorch has them, the ``fp32_precision`` attributes of ``torch.backends``,
``torch.backends.cuda.matmul``, ``torch.backends.cudnn.{conv,rnn}`` and
``torch.backends.mkldnn.{matmul,conv,rnn}`` (restoring only the legacy switches would leave
``"ieee"`` where ``"none"`` was).

The three values need a float32 objective: with a float64 (or half-precision) objective they would
silently mix precisions, and are refused.

**The error report.**  With ``"tf32"`` (on CUDA) or ``"bf16"`` a small fixed subset of the grid is
evaluated again in full precision (the ``"float32"`` setting above, a fresh evaluator of the same
strategy, in chunks no wider than the surface's own): for a 2-D grid the 9 points whose indices are
the first, middle and last of each axis (the corners, the edge midpoints and the centre of the
index grid), for a 1-D grid 9 evenly spaced indices (fewer on small grids). The surface's config
records, under ``config["precision"]["error"]``, the points and both values, and the max and
median of the absolute and relative loss differences (relative to the full-precision loss) and, when
the surface records accuracy, of the absolute accuracy differences; this costs up to 9 extra point
evaluations.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from landscape.surface.evaluators import _bn_modules

__all__ = ["PRECISIONS", "Precision", "precision_flags", "restored_flags"]

PRECISIONS = ("float32", "tf32", "bf16")
_SUBSET = 9  # points evaluated twice for the error report

# owners of the fp32_precision switches of newer PyTorch versions (absent ones are skipped); the
# generic one first: setting it rewrites the others
_FP32_PRECISION = (
    "backends",
    "backends.cuda.matmul",
    "backends.cudnn.conv",
    "backends.cudnn.rnn",
    "backends.mkldnn.matmul",
    "backends.mkldnn.conv",
    "backends.mkldnn.rnn",
)


def _owner(path: str) -> Any:
    obj: Any = torch
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def precision_flags() -> dict[str, Any]:
    """The global switches a precision setting may change (legacy TF32 flags, the float32 matmul
    precision and, where present, every ``fp32_precision`` attribute)."""
    flags: dict[str, Any] = {
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    for path in _FP32_PRECISION:
        owner = _owner(path)
        value = getattr(owner, "fp32_precision", None) if owner is not None else None
        if isinstance(value, str):
            flags[f"{path}.fp32_precision"] = value
    return flags


def _restore(flags: Mapping[str, Any]) -> None:
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    for path in _FP32_PRECISION:  # after the legacy switches, which rewrite these
        key = f"{path}.fp32_precision"
        if key in flags:
            _owner(path).fp32_precision = flags[key]


@contextlib.contextmanager
def restored_flags() -> Iterator[dict[str, Any]]:
    """Saves :func:`precision_flags` and restores them at exit, also when the block raises."""
    saved = precision_flags()
    try:
        yield saved
    finally:
        _restore(saved)


class Precision:
    """A validated ``precision=`` of :func:`landscape.surface.surface` for one objective: the
    context the evaluation runs in, the full-precision context of the reference points and the
    report recorded in the surface's config (module docstring)."""

    def __init__(self, precision: str | None, obj: Any) -> None:
        if precision is not None and precision not in PRECISIONS:
            raise ValueError(
                f"precision must be one of {PRECISIONS} or None (the objective's own dtype), got "
                f"{precision!r}"
            )
        self.requested = precision
        self.device = torch.device(obj.device)
        self.dtype = obj.dtype
        dt = str(obj.dtype).replace("torch.", "")
        if precision is not None and obj.dtype != torch.float32:
            raise ValueError(
                f"precision={precision!r} needs a float32 objective, but this one computes in {dt}: "
                f"{'bf16 autocast or TF32' if precision != 'float32' else 'float32'} arithmetic on "
                f"{dt} parameters would silently mix precisions; pass precision=None (the "
                f"objective's {dt}) or build the Objective with dtype=torch.float32"
            )
        cuda = self.device.type == "cuda"
        self.active = precision == "bf16" or precision == "float32" or (precision == "tf32" and cuda)
        if precision is None:
            self.effect = f"none: the objective's {dt}, global precision flags as they are"
        elif precision == "float32":
            self.effect = "full float32: TF32 off and float32 matmul precision 'highest' during the call"
        elif precision == "bf16":
            self.effect = f"model forward under torch.autocast({self.device.type!r}, dtype=torch.bfloat16)"
        elif not cuda:
            self.effect = (
                f"no effect on {self.device.type}: TF32 is a mode of CUDA matmuls and convolutions; "
                "no flag was touched, the values are the float32 values"
            )
        else:
            major, minor = torch.cuda.get_device_capability(self.device)
            self.effect = (
                "TF32 matmuls and convolutions during the call (allow_tf32 flags on, float32 matmul "
                "precision 'high')"
                + (
                    ""
                    if major >= 8
                    else f"; no effect on this GPU (compute capability {major}.{minor} < 8.0)"
                )
            )
        self.error: dict[str, Any] | None = None
        self.flags_during: dict[str, Any] | None = None

    # ------------------------------------------------------------------ contexts
    @contextlib.contextmanager
    def _mode(self, name: str | None, record: bool = False) -> Iterator[None]:
        if name is None or (name == "tf32" and self.device.type != "cuda"):
            yield
            return
        with restored_flags():
            if name == "float32":
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                torch.set_float32_matmul_precision("highest")
            elif name == "tf32":
                torch.backends.cuda.matmul.allow_tf32 = True
                torch.backends.cudnn.allow_tf32 = True
                torch.set_float32_matmul_precision("high")
            if record:
                self.flags_during = precision_flags()
            if name != "bf16":
                yield
                return
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                yield

    def context(self) -> contextlib.AbstractContextManager:
        """The context every grid point is evaluated in (a no-op for ``None`` and CPU ``"tf32"``)."""
        return self._mode(self.requested, record=True)

    def full_precision(self) -> contextlib.AbstractContextManager:
        """The context of the reference points: full float32 (TF32 off, no autocast)."""
        return self._mode("float32")

    @property
    def reduced(self) -> bool:
        """Whether the values may differ from full precision (an error report is due)."""
        return self.requested == "bf16" or (self.requested == "tf32" and self.device.type == "cuda")

    # ------------------------------------------------------------------ the error report
    @staticmethod
    def subset(shape: Sequence[int]) -> list[tuple[int, ...]]:
        """Grid indices evaluated again in full precision: per axis the first, middle and last index
        (2-D: corners, edge midpoints, centre), or 9 evenly spaced indices of a 1-D grid."""
        per = 3 if len(shape) == 2 else _SUBSET
        axes = [sorted({int(round(v)) for v in np.linspace(0, n - 1, min(per, n))}) for n in shape]
        return [tuple(ix) for ix in np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(shape))]

    def report(
        self,
        obj: Any,
        cls: Any,
        dirs: Sequence[Mapping[str, torch.Tensor]],
        bn_policy: str,
        cs: Sequence[np.ndarray],
        values: Mapping[str, np.ndarray],
        width: int,
    ) -> dict[str, Any] | None:
        """Evaluates :meth:`subset` in full precision with a fresh ``cls`` evaluator (chunks of at
        most ``width`` points) and compares with ``values``; the result is also kept in ``error``."""
        if not self.reduced:
            return None

        t0 = time.perf_counter()
        idx = self.subset([len(c) for c in cs])
        pts = [tuple(float(cs[a][ix[a]]) for a in range(len(cs))) for ix in idx]
        full: list[tuple[float, float | None]] = []
        with obj.guard(), torch.no_grad(), self.full_precision():
            for _, m in _bn_modules(obj.model):
                m.training = bn_policy == "train"
            ev = cls(obj, dirs, bn_policy)
            ev.want_accuracy = "accuracy" in values
            for s in range(0, len(pts), max(1, width)):
                full.extend(ev.evaluate(pts[s : s + max(1, width)]))
        ref = np.array([lv for lv, _ in full], dtype=np.float64)
        red = np.array([values["loss"][ix] for ix in idx], dtype=np.float64)
        out: dict[str, Any] = {
            "reference": "float32: TF32 off, no autocast, the same strategy",
            "points": [list(ix) for ix in idx],
            "coords": [list(p) for p in pts],
            "loss_full": ref.tolist(),
            "loss_reduced": red.tolist(),
            **error_stats(red, ref),
        }
        if "accuracy" in values and all(av is not None for _, av in full):
            acc_ref = np.array([av for _, av in full], dtype=np.float64)
            acc_red = np.array([values["accuracy"][ix] for ix in idx], dtype=np.float64)
            diff = np.abs(acc_red - acc_ref)
            out.update(
                accuracy_full=acc_ref.tolist(),
                accuracy_reduced=acc_red.tolist(),
                accuracy_abs_diff_max=float(np.max(diff)),
                accuracy_abs_diff_median=float(np.median(diff)),
            )
        out["seconds"] = time.perf_counter() - t0
        self.error = out
        return out

    def config(self) -> dict[str, Any]:
        """What was requested, what it did, the flags during the call and the error report."""
        return {
            "requested": self.requested,
            "used": self.requested or "default",
            "objective_dtype": str(self.dtype).replace("torch.", ""),
            "device": str(self.device),
            "effect": self.effect,
            "flags_during_call": self.flags_during,
            "error": self.error,
        }


def error_stats(reduced: np.ndarray, full: np.ndarray) -> dict[str, float]:
    """Max and median of ``|reduced - full|`` and of ``|reduced - full| / |full|`` (the absolute
    difference where ``full`` is 0 and they differ: ``inf``; ``0`` where both are 0)."""
    reduced, full = np.asarray(reduced, dtype=np.float64), np.asarray(full, dtype=np.float64)
    diff = np.abs(reduced - full)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / np.abs(full))
    return {
        "loss_abs_diff_max": float(np.max(diff)),
        "loss_abs_diff_median": float(np.median(diff)),
        "loss_rel_diff_max": float(np.max(rel)),
        "loss_rel_diff_median": float(np.median(rel)),
    }


def resume_key(config: Mapping[str, Any]) -> str:
    """The precision a surface file was computed with (files from before this option: default)."""
    p = config.get("precision")
    return str(p.get("used", "default")) if isinstance(p, Mapping) else "default"
