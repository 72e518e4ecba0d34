"""Curvature block products within a memory budget: ``max_memory=`` of every operator.

A block ``A V`` of ``k`` products runs as one batched pass, so its peak memory grows with ``k`` (on a
GPU, 8 Hessian products on a ResNet-18 peaked at 51.9 GiB against 5.8 GiB for one).  With a budget
the columns of ``V`` are split into chunks whose *measured* peak stays under it; every column is
the same product as before (bit-identical where the operator computes columns independently, as the
double-backward Hessian does; batched paths agree to rounding).

**Budget** (:func:`parse_budget`): an ``int`` of bytes, a string (``"2GiB"``, ``"512MB"``, ``"50%"``),
a ``float`` fraction in ``(0, 1]`` of the free memory of the device when the operator is built
(:func:`free_memory`: CUDA ``mem_get_info`` plus the caching allocator's reserved-but-unused bytes;
CPU ``MemAvailable`` of ``/proc/meminfo``), or ``None``: no limit, no measurement, today's code
path (the default).  The budget bounds the bytes a ``matmat`` call allocates on top of what was
live when it started: its peak minus its starting point.

**Measuring the peak** (:func:`track_peak`).  On CUDA the caching allocator's counters
(``reset_peak_memory_stats``, ``max_memory_allocated - memory_allocated``; this resets the
device's peak statistics).  Elsewhere :class:`PeakTracker`, a ``TorchDispatchMode``: every op's
output tensors that do not alias an input (per the op's schema) add their untyped storage's
``nbytes`` to a live counter the first time the storage is seen, a ``weakref.finalize`` on the
storage subtracts it when the storage dies, and the maximum is the peak.  Dispatch modes sit below
autograd and functorch's ``vmap``/``jvp`` layers, so the tracker sees the real batched and dual
tensors (``base.saved_tensor_bytes`` sees only what autograd saves).  Not seen: memory a kernel
allocates for itself without the dispatcher (workspaces), and ``UntypedStorage.resize_``.

**Chunk size** (:class:`BlockBudget`).  The peak of a block of width ``w`` is modelled as
``peak(w) = a + b w``.  The first blocked call measures real columns of the requested product, so
nothing is computed twice: one column, then two, then three (a probe is skipped where the line
through the origin and the last point, ``peak(w-1) w / (w-1)``, would already exceed the budget).
Memory a probe keeps after it returns (``R``: a cached graph, output-space factors) is a one-time
cost: the point is ``peak - R``, and within that call ``R`` is charged to the budget.  Single
columns run a path of their own in most operators, so ``a`` and ``b`` come from the widths 2 and 3
(``b = peak(3) - peak(2)``, ``a = max_w peak(w) - b w``); a split call also holds its ``[p, k]``
result, so a chunk of ``c`` columns is allowed when ``a + b c + p k s <= budget`` (``s`` bytes per
entry).  The largest such ``c`` is used; if the whole block fits it runs unsplit, and later calls
of any width use the fit without measuring.  If even two columns do not fit the columns run one by
one, and a single column over the budget gives a ``RuntimeWarning`` instead of an error.  Points
are kept per product path (``_path_key``: e.g. the Hessian engine's path and width class), and a
point is dropped when the path changed during its call (a calibration or a fallback ran).  Chunks
only use widths whose path was measured: where the Hessian engine switches to forward-over-reverse
at 8 columns (``engine="auto"`` on a GPU, ``calibrate=False``) budgeted chunks stay below 8.

**Assumptions.**  The peak is affine in the width beyond two columns: batched (``vmap``) tensors
scale with it, the rest does not.  Past a ``vmap`` ``chunk_size`` the true peak stops growing, so
the line over-estimates (smaller chunks, never a larger peak).  One-time costs are allocated before
the call's peak and stay alive (``peak - R`` is then exact); a one-time *transient* (e.g. the
per-example gradients' working memory when they are first cached) stays in the point, again an
over-estimate.  The dispatch tracker counts tensor storage only: not the allocator's cache or
fragmentation, nor Python objects.  Measured calls run the dispatch mode's Python code on every op
(a few times slower on small models); no other call runs any of it.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import re
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["BlockBudget", "PeakTracker", "free_memory", "parse_budget", "track_peak"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"^\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*|%)\s*$", re.IGNORECASE)
_HOW = (
    "pass max_memory as an int of bytes (e.g. 2**30), a string such as '2GiB', '512MB' or '50%', a "
    "float in (0, 1] (that fraction of the free device memory), or None for no limit"
)


def _mib(n: float) -> str:
    """``n`` bytes, readably."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def free_memory(device: torch.device | str) -> int:
    """Free bytes of ``device``: CUDA ``mem_get_info`` plus what PyTorch's caching allocator holds
    unused (reserved minus allocated); CPU ``MemAvailable`` of ``/proc/meminfo``.  Raises a
    ``ValueError`` where the platform does not say."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    if device.type != "cpu":
        raise ValueError(
            f"max_memory as a fraction needs the free memory, which is unknown on a {device.type} device: "
            "pass bytes (an int) or a string such as '2GiB'"
        )
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kB (KiB)
    except OSError:
        pass
    raise ValueError(
        "max_memory as a fraction needs the free memory, and MemAvailable of /proc/meminfo is not "
        "readable on this platform: pass bytes (an int) or a string such as '2GiB'"
    )


def parse_budget(max_memory: int | float | str | None, device: torch.device | str) -> int | None:
    """``max_memory`` in bytes (``None``: no limit); module docstring for the accepted forms.

    Raises ``ValueError`` for a non-positive size, a fraction outside ``(0, 1]``, an unknown unit or
    text that is not a size, and ``TypeError`` for any other type; each message says what to pass."""
    if max_memory is None:
        return None
    if isinstance(max_memory, bool) or not isinstance(max_memory, (numbers.Real, str)):
        raise TypeError(f"max_memory must be an int, a float, a str or None, got {max_memory!r}: {_HOW}")
    if isinstance(max_memory, numbers.Integral):
        if max_memory <= 0:
            raise ValueError(f"max_memory={max_memory!r} bytes is not positive: {_HOW}")
        return int(max_memory)
    if not isinstance(max_memory, str):
        max_memory = float(max_memory)
        if not (math.isfinite(max_memory) and 0.0 < max_memory <= 1.0):
            raise ValueError(
                f"a float max_memory is a fraction of the free device memory in (0, 1], got {max_memory!r}: "
                f"{_HOW}"
            )
        return max(1, int(max_memory * free_memory(device)))
    m = _SIZE.match(max_memory)
    unit = m.group(2).lower() if m else None
    if m is None or (unit != "%" and unit not in _UNITS):
        raise ValueError(f"max_memory={max_memory!r} is not a memory size: {_HOW}")
    value = float(m.group(1))
    if value <= 0 or not math.isfinite(value):
        raise ValueError(f"max_memory={max_memory!r} is not a positive size: {_HOW}")
    if unit == "%" and value > 100:
        raise ValueError(f"max_memory={max_memory!r} is more than all of the free memory: {_HOW}")
    if unit == "%":
        return max(1, int(value / 100 * free_memory(device)))
    return max(1, int(value * _UNITS[unit]))


# --------------------------------------------------------------------------------------------
class PeakTracker(TorchDispatchMode):
    """Peak bytes of tensor storage allocated inside the block (module docstring).

    ``live``: bytes of storages first seen inside the block and alive now (frozen at exit);
    ``peak``: the maximum of ``live``; ``storages``: number of storages seen.  Storages that existed
    before the block (parameters, inputs, cached graphs) are not counted, nor are views and in-place
    results (outputs the op's schema marks as aliasing an input)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.storages = 0
        self._seen: dict[int, weakref.finalize] = {}

    def _free(self, key: int, nbytes: int) -> None:
        self._seen.pop(key, None)
        self.live -= nbytes

    def _track(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (e.g. sparse)
            return
        key = id(st)  # the storage's Python object lives as long as the storage (kept by torch)
        if key in self._seen or t.device.type == "meta":
            return
        nbytes = int(st.nbytes())
        self._seen[key] = weakref.finalize(st, self._free, key, nbytes)
        self.storages += 1
        self.live += nbytes
        if self.live > self.peak:
            self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # views and in-place/out= results alias an input: no new memory (lift_fresh: torch.tensor's)
        fresh = func is torch.ops.aten.lift_fresh.default
        if fresh or not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self._track(t)
        return out

    def __exit__(self, *exc: Any) -> None:
        for fin in list(self._seen.values()):
            fin.detach()  # storages dying after the block no longer change the counters
        self._seen.clear()
        return super().__exit__(*exc)

    def nbytes(self, t: torch.Tensor) -> int:
        """Bytes of ``t``'s storage (what returning ``t`` keeps alive)."""
        return int(t.untyped_storage().nbytes())


class _CudaPeak:
    """The caching allocator's counters around a block on one CUDA device (``PeakTracker``'s
    interface)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.live, self.peak, self.storages = device, 0, 0, 0

    def __enter__(self) -> _CudaPeak:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = max(0, torch.cuda.max_memory_allocated(self.device) - self._start)
        self.live = max(0, torch.cuda.memory_allocated(self.device) - self._start)

    def nbytes(self, t: torch.Tensor) -> int:
        return int(t.untyped_storage().nbytes())


@contextlib.contextmanager
def track_peak(device: torch.device | str | None = None, method: str = "auto") -> Iterator[Any]:
    """Peak bytes allocated inside the block, relative to its start: yields an object whose ``peak``
    and ``live`` (bytes allocated inside and still alive) are set at exit.

    ``method``: ``"allocator"`` (CUDA's counters), ``"dispatch"`` (:class:`PeakTracker`, any
    device) or ``"auto"``: the allocator on a CUDA device, the dispatch tracker elsewhere."""
    device = torch.device("cpu" if device is None else device)
    if method not in ("auto", "allocator", "dispatch"):
        raise ValueError(f"method must be 'auto', 'allocator' or 'dispatch', got {method!r}")
    use_allocator = method == "allocator" or (method == "auto" and device.type == "cuda")
    if use_allocator and device.type != "cuda":
        raise ValueError(f"method='allocator' needs a CUDA device, got {device}; use 'dispatch'")
    tracker = _CudaPeak(device) if use_allocator else PeakTracker()
    with tracker:
        yield tracker


# --------------------------------------------------------------------------------------------
class BlockBudget:
    """Splits the columns of a block into chunks whose measured peak stays within ``max_memory``.

    Args:
        max_memory: the budget (:func:`parse_budget`); ``None`` is not accepted here (the operators
            keep no ``BlockBudget`` without a budget: no overhead).
        device: the device the products run on.
        name: the operator, for messages.
        method: :func:`track_peak`'s method.

    :meth:`run` computes ``fn(V)`` chunk by chunk; :meth:`config` says what was measured and why each
    chunk width was chosen (module docstring)."""

    LADDER = (1, 2, 3)

    def __init__(
        self,
        max_memory: int | float | str,
        device: torch.device | str,
        name: str = "curvature",
        method: str = "auto",
    ) -> None:
        budget = parse_budget(max_memory, device)
        if budget is None:
            raise ValueError("BlockBudget needs a budget; build none for max_memory=None")
        self.spec, self.bytes, self.name, self.method = max_memory, budget, name, method
        self.device = torch.device(device)
        self.points: dict[str, dict[int, int]] = {}
        self.one_time_bytes = 0
        self.measured_columns = 0
        self.dropped_points = 0
        self.last_chunks: list[int] = []
        self.chunk_size: int | None = None
        self.reason = "no block multiplied yet"
        self.warning: str | None = None
        self._extra = 0
        self.measuring = False  # True inside a measured call (a compiled operator runs eagerly then)

    # ------------------------------------------------------------------ the fit
    def _point(self, key_of: Callable[[int], str], w: int) -> int | None:
        return self.points.get(key_of(w), {}).get(w)

    def _peak(self, key_of: Callable[[int], str], w: int) -> float:
        """The measured peak of ``w`` columns (``inf``: not measured)."""
        v = self._point(key_of, w)
        return math.inf if v is None else v

    def fit(self, key: str) -> tuple[float, float] | None:
        """``(a, b)`` of ``peak(w) = a + b w`` for the path ``key`` (``None``: not measured yet)."""
        pts = self.points.get(key, {})
        ws = sorted(w for w in pts if w >= 2)
        if len(ws) < 2:
            return None
        w1, w2 = ws[-2], ws[-1]
        b = max(0.0, (pts[w2] - pts[w1]) / (w2 - w1))
        a = max(pts[w] - b * w for w in ws)
        return a, b

    def _widest(self, a: float, b: float, avail: float, rem: int, key: str, key_of) -> int:
        """The most columns ``c <= rem`` (of path ``key``) with ``a + b c <= avail``."""
        c = (rem if a <= avail else 0) if b <= 0 else min(rem, math.floor((avail - a) / b))
        while c >= 2 and key_of(c) != key:
            c -= 1
        return c

    def _plan(self, rem: int, k: int, out_bytes: int, key_of) -> tuple[int, bool]:
        """``(width, measure)`` of the next chunk, with ``rem`` of ``k`` columns left."""
        budget = self.bytes - self._extra
        if rem == 1:
            return 1, self._point(key_of, 1) is None
        key = key_of(2)
        fit = self.fit(key)
        if fit is not None:
            a, b = fit
            if rem == k and key_of(k) == key and a + b * k <= budget:
                self.reason = f"whole block: {k} columns need about {_mib(a + b * k)} (a + b k)"
                return k, False
            c = self._widest(a, b, budget - out_bytes, k, key, key_of)  # the most the budget allows
            if c >= 2:
                self.reason = (
                    f"chunks of {c}: a + b c + result = {_mib(a + b * c + out_bytes)} <= budget "
                    f"{_mib(budget)}" + ("" if c == k else f"; {c + 1} columns would exceed it")
                )
                return min(c, rem), False
            need = _mib(a + 2 * b + out_bytes)
            self.reason = f"column by column: 2 columns need about {need} > {_mib(budget)}"
            return 1, self._point(key_of, 1) is None
        w = next((w for w in self.LADDER if self._point(key_of, w) is None), None)
        prev = None if w is None else (self._point(key_of, w - 1) if w > 1 else None)
        if w is None or (prev is not None and prev * w / (w - 1) + out_bytes > budget):
            # no fit possible, or the next probe could exceed the budget: the widest known to fit
            widths = range(2, min(rem, max(self.LADDER)) + 1)
            known = [v for v in widths if self._peak(key_of, v) + out_bytes <= budget]
            c = max(known, default=1)
            self.reason = f"chunks of {c}: wider blocks were not measured (they could exceed the budget)"
            if c == 1:
                one = self._point(key_of, 1)
                self.reason = "column by column: " + (
                    f"one column needs {_mib(one)} > {_mib(budget)}"
                    if one is not None and one > budget
                    else f"two columns could exceed the budget ({_mib(budget)}; bound 2 x peak(1))"
                )
            return c, c == 1 and self._point(key_of, 1) is None
        if rem < w:  # rem columns were measured already
            fits = self._peak(key_of, rem) + (0 if rem == k else out_bytes) <= budget
            self.reason = f"{rem} columns measured {'within' if fits else 'over'} the budget; no fit yet"
            return (rem, False) if fits else (1, False)
        self.reason = f"measuring the peak of {w} column(s)"
        return w, True

    # ------------------------------------------------------------------ products
    def _measure(self, block: torch.Tensor, fn, key_of) -> torch.Tensor:
        w = int(block.shape[1])
        before = key_of(w)
        self.measuring = True
        try:
            with track_peak(self.device, self.method) as t:
                res = fn(block)
        finally:
            self.measuring = False
        retained = max(0, t.live - t.nbytes(res))  # a cached graph, kept factors: one-time costs
        self._extra += retained
        self.one_time_bytes += retained
        self.measured_columns += w
        after = key_of(w)
        if before == after:
            self.points.setdefault(after, {})[w] = int(t.peak - retained)
        else:  # a calibration or a fallback ran in this call: not the memory of the path now used
            self.dropped_points += 1
        return res

    def run(
        self, V: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor], key_of: Callable[[int], str]
    ) -> torch.Tensor:
        """``fn(V)`` for ``V`` of shape ``[p, k]``, in chunks of columns (``key_of(w)``: the path a
        block of ``w`` columns runs on).  A single column runs as it is."""
        k = int(V.shape[1])
        if k == 1:
            return fn(V)
        self._extra = 0
        out_bytes = V.shape[0] * k * V.element_size()
        out: torch.Tensor | None = None
        chunks: list[int] = []
        steady: list[int] = []  # the chunks not measured: the width the fit (or the probes) allow
        s = 0
        while s < k:
            w, measure = self._plan(k - s, k, out_bytes, key_of)
            block = V if w == k else V[:, s : s + w]
            res = self._measure(block, fn, key_of) if measure else fn(block)
            chunks.append(w)
            if not measure:
                steady.append(w)
            if w == k:
                out = res
                break
            if out is None:
                out = torch.empty(V.shape[0], k, dtype=res.dtype, device=res.device)
            out[:, s : s + w] = res
            del res
            s += w
        self.last_chunks = chunks
        self.chunk_size = max(steady or chunks)
        self._check_single(key_of)
        return out

    def _check_single(self, key_of) -> None:
        one = self._point(key_of, 1)
        if self.warning is None and 1 in self.last_chunks and one is not None and one > self.bytes:
            self.warning = (
                f"one column of the {self.name} product needs {_mib(one)}, more than max_memory="
                f"{self.spec!r} ({_mib(self.bytes)}): computed column by column (the least memory "
                "this operator can use); raise max_memory or use smaller batches"
            )
            warnings.warn(self.warning, RuntimeWarning, stacklevel=4)

    def _tracker_name(self) -> str:
        cuda = self.method == "allocator" or (self.method == "auto" and self.device.type == "cuda")
        return "cuda_allocator" if cuda else "dispatch"

    def config(self) -> dict[str, Any]:
        """The budget, the measured points and fits per path, the chunks of the last call and why."""
        fits = {}
        for key, pts in self.points.items():
            f = self.fit(key)
            fits[key] = {"points": {str(w): int(v) for w, v in sorted(pts.items())}}
            if f is not None:
                fits[key].update(a=float(f[0]), b=float(f[1]))
        return {
            "max_memory": self.spec,
            "budget_bytes": self.bytes,
            "tracker": self._tracker_name(),
            "fits": fits,
            "chunk_size": self.chunk_size,
            "last_chunks": list(self.last_chunks),
            "reason": self.reason,
            "one_time_bytes": self.one_time_bytes,
            "measured_columns": self.measured_columns,
            "dropped_points": self.dropped_points,
            "warning": self.warning,
        }


def make_budget(max_memory: Any, device: torch.device | str, name: str) -> BlockBudget | None:
    """A :class:`BlockBudget` for ``max_memory``, or ``None`` without a budget (no overhead)."""
    return None if max_memory is None else BlockBudget(max_memory, device, name)
