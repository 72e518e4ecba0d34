"""Fingerprints of one pass over an :class:`~landscape.Objective`'s data, checked on every later pass.

An ``Objective`` is a fixed function of the parameters: every curvature product and estimator
iterates its data many times, and the Monte-Carlo Fisher draws its labels once per example position.
Data that changes between passes (a shuffling ``DataLoader``, random augmentation, ``drop_last``
with shuffling, tensors modified in place) would silently mix different data sets, so
:class:`DataFingerprint` records, during the construction scan, the batch sizes and two float64
numbers per example, and :meth:`DataFingerprint.check` compares every batch of every later pass as
it streams in (:class:`DataChangedError` at the first mismatch; nothing of the pass is buffered).

The fingerprint of an example is ``sum_t <vec(t_n), r_t>`` over the tensors ``t`` of its inputs (and,
separately, of its targets), with fixed pseudo-random float64 vectors ``r_t`` (a fixed seed per
tensor slot and feature size, cached per device), computed on the data's own device in float64 from
the raw batch the data yields (before the objective's dtype/device conversion): one elementwise
product and one row sum per tensor, ``O(N d)``, no loop over examples.  Equal tensors give bitwise
equal fingerprints: the row sum of a ``[B, d]`` product reduces every row serially (for ``B = 1`` the
row is doubled, since a single output is summed by several threads in an order that depends on
the thread count), and fingerprints are compared bit for bit (NaN included).  Tensors that are not
batch-first (0-d, or another length along dimension 0) enter every example's fingerprint alike.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["DataChangedError", "DataFingerprint", "example_fingerprints"]

_SEED = 0x5EED_DA7A
_PROBES: OrderedDict[tuple[int, int, str], torch.Tensor] = OrderedDict()
_MAX_PROBES = 64


class DataChangedError(TypeError, ValueError):
    """The data yields other examples (or the same in another order) than at construction.

    A ``TypeError`` like the other refusals of data that cannot be iterated repeatedly
    (``landscape.inputs.one_shot_error``), and a ``ValueError`` (the values changed)."""


def _probe(seed: int, d: int, device: torch.device) -> torch.Tensor:
    """The fixed vector ``r`` of length ``d`` for one tensor slot (drawn on CPU, cached per device)."""
    key = (seed, d, str(device))
    r = _PROBES.get(key)
    if r is None:
        gen = torch.Generator().manual_seed((_SEED * 1_000_003 + seed) % 2**63)
        r = torch.randn(d, generator=gen, dtype=torch.float64).to(device)
        _PROBES[key] = r
        if len(_PROBES) > _MAX_PROBES:
            _PROBES.popitem(last=False)
    else:
        _PROBES.move_to_end(key)
    return r


def _slot_seed(name: Any) -> int:
    return zlib.crc32(repr(name).encode())


def _dot(t: torch.Tensor, B: int, seed: int) -> torch.Tensor:
    """``[B]`` float64: ``<vec(t_n), r>`` per example (one shared value if ``t`` is not batch-first)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    batch_first = t.ndim > 0 and int(t.shape[0]) == B
    if B == 0 or (batch_first and t.numel() == 0):
        return torch.zeros(B, dtype=torch.float64, device=t.device)
    flat = t.reshape(B if batch_first else 1, -1)
    prod = flat.to(torch.float64) * _probe(seed, int(flat.shape[1]), t.device)
    rows = prod.shape[0]
    if rows == 1:  # keep the reduction order independent of the thread count (see the module doc)
        prod = torch.cat([prod, prod])
    out = prod.sum(1)[:rows]
    return out if batch_first else out.expand(B)


def example_fingerprints(inputs: Any, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``([B], [B])`` float64 on CPU: per-example fingerprints of the inputs (every tensor of a tuple or
    dict, each with its own vector) and of the targets."""
    B = int(targets.shape[0]) if isinstance(targets, torch.Tensor) and targets.ndim > 0 else -1
    if B < 0:
        raise DataChangedError("the targets are no longer a batch-first tensor")
    if isinstance(inputs, torch.Tensor):
        slots: list[tuple[Any, Any]] = [(0, inputs)]
    elif isinstance(inputs, Mapping):
        slots = list(inputs.items())
    else:
        slots = list(enumerate(inputs))
    fx = torch.zeros(B, dtype=torch.float64)
    for seed, name, t in sorted(((_slot_seed(n), n, t) for n, t in slots), key=lambda s: s[0]):  # key order
        if not isinstance(t, torch.Tensor):
            raise DataChangedError(f"input {name!r} is no longer a tensor but a {type(t).__name__}")
        fx = fx + _dot(t, B, seed).cpu()
    return fx, _dot(targets, B, _slot_seed("targets")).cpu()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64)


def _pair(bx: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
    """One int64 key per (inputs, targets) fingerprint pair (for messages only; wrapping product)."""
    return bx ^ (by * -7046029254386353131)


class DataFingerprint:
    """Batch sizes and per-example fingerprints of the pass at construction; see the module doc.

    :meth:`record` is called by the data scan for every batch; :attr:`inputs` and :attr:`targets`
    are then ``[N]`` float64 tensors (16 bytes per example) and :attr:`sizes` the batch sizes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._joined: tuple[torch.Tensor, torch.Tensor, list[int]] | None = None

    def record(self, inputs: Any, targets: torch.Tensor) -> None:
        fx, fy = example_fingerprints(inputs, targets)
        self.sizes.append(int(fx.shape[0]))
        self._parts.append((fx, fy))
        self._joined = None

    def _join(self) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        if self._joined is None:
            empty = torch.zeros(0, dtype=torch.float64)
            fx = torch.cat([p[0] for p in self._parts]) if self._parts else empty
            fy = torch.cat([p[1] for p in self._parts]) if self._parts else empty
            starts = [0]
            for s in self.sizes:
                starts.append(starts[-1] + s)
            self._parts = [(fx[a:b], fy[a:b]) for a, b in zip(starts, starts[1:])]  # views
            self._joined = (fx, fy, starts)
        return self._joined

    @property
    def inputs(self) -> torch.Tensor:
        return self._join()[0]

    @property
    def targets(self) -> torch.Tensor:
        return self._join()[1]

    def check(self, k: int, inputs: Any, targets: Any, data: Any = None) -> None:
        """Compare batch ``k`` of a later pass with the construction scan; raise
        :class:`DataChangedError` (naming the batch, what changed and the fix) if it differs."""
        self._join()
        if k >= len(self.sizes):
            more = f"this pass yields more than the {len(self.sizes)} batches seen at construction"
            raise DataChangedError(_message(more, data))
        try:
            fx, fy = example_fingerprints(inputs, targets)
        except DataChangedError as err:
            raise DataChangedError(_message(f"batch {k}: {err}", data)) from None
        rx, ry = self._parts[k]
        if fx.shape == rx.shape and torch.equal(_bits(fx), _bits(rx)) and torch.equal(_bits(fy), _bits(ry)):
            return
        raise DataChangedError(_message(self._explain(k, fx, fy), data))

    def _explain(self, k: int, fx: torch.Tensor, fy: torch.Tensor) -> str:
        """What differs in batch ``k``: its size, the order of its examples or the examples themselves."""
        all_x, all_y, _ = self._join()
        rx, ry = self._parts[k]
        size = "" if fx.shape == rx.shape else f" ({fx.shape[0]} examples instead of {rx.shape[0]})"
        bx, by = _bits(fx), _bits(fy)
        key = _pair(bx, by)
        if not size and torch.equal(key.sort().values, _pair(_bits(rx), _bits(ry)).sort().values):
            return f"batch {k} holds the same examples as at construction, but in another order"
        new = ~torch.isin(key, _pair(_bits(all_x), _bits(all_y)))  # (inputs, targets) pairs
        if not bool(new.any()):
            return (
                f"batch {k}{size} holds other examples of the data set than at construction: the order "
                "of the examples changed (the data is shuffled between passes)"
            )
        new_x = new & ~torch.isin(bx, _bits(all_x))
        what = " and ".join(w for w, m in (("inputs", new_x), ("targets", new & ~new_x)) if bool(m.any()))
        return (
            f"batch {k}{size} holds {int(new.sum())} example(s) whose {what} were not in the data at "
            "construction (random augmentation, a random sampler or shuffling with drop_last=True, or "
            "tensors modified in place after building the Objective)"
        )


def _loader_hint(data: Any) -> str:
    loader = torch.utils.data.DataLoader
    if not isinstance(data, loader):
        return ""
    parts = []
    sampler = getattr(data, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler):
        parts.append("shuffles (shuffle=True)")
    elif sampler is not None and not isinstance(sampler, torch.utils.data.SequentialSampler):
        parts.append(f"uses the sampler {type(sampler).__name__}")
    if getattr(data, "drop_last", False):
        parts.append("drops the last incomplete batch (drop_last=True)")
    return f" This DataLoader {' and '.join(parts)}." if parts else ""


def _message(detail: str, data: Any) -> str:
    return (
        f"the data changed between passes: {detail}.{_loader_hint(data)} An Objective is a fixed "
        "function of the parameters: every curvature product and estimator iterates the data many "
        "times, and the Monte-Carlo Fisher pairs labels drawn at construction with the examples by "
        "position, so results would silently mix different data. Fix: build the DataLoader with "
        "shuffle=False and drop_last=False (every pass sees all examples in the same order), without "
        "random augmentation in its dataset or collate_fn, and do not modify the data after building "
        "the Objective; or materialise one pass: data = list(loader) (for tensors: "
        "landscape.data.batches(x, y, batch_size))"
    )
