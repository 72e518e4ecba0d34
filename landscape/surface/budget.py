"""How many grid points each evaluation call gets: ``surface(..., batch_points=, max_memory=)``.

``batch_points`` is a positive int (that many points per call; for the ``"loop"`` and
``"linear_first_layer"`` strategies, which evaluate one point at a time, it is only the number of
points between progress and checkpoint updates) or ``"auto"``.  Default (``None``): ``"auto"`` for
the ``"vmap"`` strategy on a CUDA device or whenever ``max_memory`` is given, else 64 (so a CPU run
behaves as before).

**``"auto"`` (vmap).**  The peak memory of one ``vmap`` call over ``k`` points is modelled as
``peak(k) = a + b k`` and the widest chunk within the budget is used.  The first calls measure real
grid points (nothing is computed twice) with :func:`landscape.curvature.memory.track_peak` (CUDA:
the caching allocator's peak; elsewhere the dispatch-mode :class:`~landscape.curvature.memory.PeakTracker`):
one point, then two (only when ``2 peak(1)``, a bound of ``peak(2)``, fits the budget).  The line
through both gives ``k = floor((budget - a) / b)``, capped at :data:`AUTO_MAX_POINTS` (progress and
checkpoints come once per chunk) and at the points left.  The first chunk of ``k`` points is
measured too; once two widths of 2 or more points are measured the line goes through the two
widest (one point's peak also holds first-call costs such as library workspaces), and a chunk over
the budget shrinks ``k``, until a measured width fits (such a probe is the one call that can exceed
the budget, where the peak grows faster than the line; the steady chunks were measured within it).
An unmeasured width is at most 4 times the widest measured one ``w``, or ``budget w / peak(w)`` if
more (the line through the origin and that point bounds the peak when ``a >= 0``), so a fit spoilt
by one-time costs cannot jump to a chunk that does not fit the device.  If two points could exceed
the budget the surface is evaluated one point per call, and if even one point exceeds it a
``RuntimeWarning`` says so (one point is the least this strategy can use).

**Budget**: ``max_memory`` as in :func:`landscape.curvature.memory.parse_budget` (bytes, ``"2GiB"``,
``"50%"``, a fraction of the free memory); ``None`` with ``"auto"``: half of the device's free
memory when the surface starts.  It bounds what one evaluation call allocates beyond what is live
when it starts (the model, the directions and the data an evaluator holds).

**Recorded** in ``config["batch_points"]``: ``requested``, ``used`` (the width of the steady
chunks), ``max_memory``, ``budget_bytes``, the tracker, the measured peaks per width, the fit
``a``, ``b``, the widths of the measured chunks, the number of chunks per width and the ``reason``
for ``used``.  On CPU the dispatch tracker runs Python code on every op of the measured calls only
(a few of them).

**Bit-identical values whatever the chunking?**  Every point is evaluated independently, and for
models made of ``Linear`` layers and elementwise functions the values do not depend on the chunk
width (checked by ``tests/test_surface_precision.py``).  Convolutions under ``vmap`` become one
grouped convolution per chunk, and the backend's algorithm can depend on the group count: values
then differ in the last bit or so between widths (on CPU, a one-point chunk against wider ones in
float32; widths 1, 2 and 3+ in float64).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from landscape.curvature.memory import _mib, free_memory, parse_budget, track_peak

__all__ = ["AUTO_MAX_POINTS", "PointChunks"]

AUTO_MAX_POINTS = 1024
_DEFAULT_FRACTION = 0.5
_FIXED_DEFAULT = 64
_GROWTH = 4


class PointChunks:
    """Chooses the width of each chunk of grid points and measures the calls that need it
    (module docstring).  ``next(remaining)`` gives the next width, ``evaluate(ev, points)`` runs
    the evaluator on them, ``config()`` says what was chosen and why."""

    def __init__(self, batch_points: int | str | None, max_memory: Any, strategy: str, device: Any) -> None:
        self.requested = batch_points
        self.device = torch.device(device)
        self.strategy = strategy
        if batch_points is None:
            auto = max_memory is not None or (strategy == "vmap" and self.device.type == "cuda")
            batch_points = "auto" if auto else _FIXED_DEFAULT
        if batch_points != "auto" and (
            isinstance(batch_points, bool) or not isinstance(batch_points, int) or batch_points < 1
        ):
            raise ValueError(f"batch_points must be a positive int or 'auto', got {batch_points!r}")
        if max_memory is not None and batch_points != "auto":
            raise ValueError(
                f"max_memory chooses batch_points within a budget: pass batch_points='auto' (or leave it "
                f"out) with max_memory={max_memory!r}, or a fixed batch_points={batch_points!r} without it"
            )
        self.spec = max_memory
        self.auto = batch_points == "auto" and strategy == "vmap"
        self.budget: int | None = None
        self.budget_from = None
        if max_memory is not None:
            self.budget = parse_budget(max_memory, self.device)
            self.budget_from = "max_memory"
        self.peaks: dict[int, int] = {}
        self.measured: list[int] = []
        self.too_wide: int | None = None  # the narrowest width measured over the budget
        self.fit: tuple[float, float] | None = None
        self.warning: str | None = None
        self._measure_next = False
        self.chosen: int | None = None
        self.chunks: dict[int, int] = {}
        if batch_points != "auto":
            self.width = int(batch_points)
            self.reason = (
                "fixed batch_points"
                if self.requested is not None
                else f"default on {self.device.type}: {_FIXED_DEFAULT} points per call"
                + (" ('auto' is the default on CUDA)" if strategy == "vmap" else ", one at a time")
            )
        elif not self.auto:
            self.width = _FIXED_DEFAULT
            self.reason = (
                f"strategy {strategy!r} evaluates one point per call: 'auto' gives {_FIXED_DEFAULT} points "
                "between progress updates" + ("; max_memory has no effect" if max_memory is not None else "")
            )
        else:
            if self.budget is None:
                self.budget = max(1, int(_DEFAULT_FRACTION * free_memory(self.device)))
                self.budget_from = f"default: {_DEFAULT_FRACTION:.0%} of the free memory of {self.device}"
            self.width = 0  # not chosen yet
            self.reason = "measuring"

    @property
    def min_points(self) -> int:
        """The fewest points one call may get (what the workspace estimate is checked for)."""
        return 1 if self.auto else self.width

    # ------------------------------------------------------------------ the plan
    def _choose(self) -> tuple[int, bool]:
        """``(width, measure)`` of the next chunk, and the reason."""
        budget, pk = self.budget, self.peaks
        assert budget is not None
        if 1 not in pk:
            self.reason = "measuring the peak of one point"
            return 1, True
        if pk[1] > budget:
            return self._one(f"one point needs {_mib(pk[1])} > budget {_mib(budget)}")
        if 2 not in pk:
            if 2 * pk[1] > budget:
                bound = _mib(2 * pk[1])
                return self._one(f"two points could exceed the budget {_mib(budget)} (2 x peak(1) = {bound})")
            self.reason = "measuring the peak of two points"
            return 2, True
        if pk[2] > budget:
            return self._one(f"two points need {_mib(pk[2])} > budget {_mib(budget)}")
        ws = [w for w in sorted(pk) if w >= 2]
        ws = ws if len(ws) >= 2 else sorted(pk)  # one point's peak holds first-call costs: fit without it
        w1, w2 = ws[-2], ws[-1]
        b = max(0.0, (pk[w2] - pk[w1]) / (w2 - w1))
        a = max(pk[w] - b * w for w in ws)
        self.fit = (a, b)
        k_fit = math.inf if b <= 0 else math.floor((budget - a) / b)
        wmax = max(w for w in pk if pk[w] <= budget)  # the widest chunk measured within the budget
        # unmeasured widths grow at most to 4 wmax or to the line through the origin and wmax (a
        # bound of the peak when a >= 0): a fit spoilt by one-time costs cannot jump to a huge chunk
        reach = max(_GROWTH * wmax, math.floor(budget * wmax / max(1, pk[wmax])))
        k = int(max(wmax, min(AUTO_MAX_POINTS, k_fit, (self.too_wide or math.inf) - 1, reach)))
        why = f"a + b k = {_mib(a)} + {_mib(b)} k <= budget {_mib(budget)} for k <= {k_fit}"
        if k == AUTO_MAX_POINTS:
            why += f", capped at {AUTO_MAX_POINTS} points"
        if self.too_wide is not None:
            why += f"; {self.too_wide} points measured {_mib(pk[self.too_wide])} > budget"
        if k in pk:
            self.reason = f"{k} points per call: {why}; measured peak({k}) = {_mib(pk[k])}"
            return k, False
        if k == reach and k < min(AUTO_MAX_POINTS, k_fit):
            why += f"; growing from {wmax} measured points (at most to {reach})"
        self.reason = f"{k} points per call: {why}"
        return k, True

    def _one(self, why: str) -> tuple[int, bool]:
        self.reason = f"one point per call: {why}"
        one = self.peaks.get(1)
        if self.warning is None and one is not None and self.budget is not None and one > self.budget:
            self.warning = (
                f"one grid point needs {_mib(one)} in a vmap call, more than max_memory={self.spec!r} "
                f"({_mib(self.budget)}): evaluated one point per call (the least the vmap strategy can "
                "use); raise max_memory or use strategy='loop' with less data per batch"
            )
            warnings.warn(self.warning, RuntimeWarning, stacklevel=5)
        return 1, False

    def next(self, remaining: int) -> int:
        """Width of the next chunk when ``remaining`` points are left."""
        self._measure_next = False
        if not self.auto:
            return min(self.width, remaining)
        w, measure = self._choose()
        self.chosen = w
        self._measure_next = measure
        return min(w, remaining)  # a short last chunk

    def evaluate(self, ev: Any, points: Sequence[tuple[float, ...]]) -> list:
        """``ev.evaluate(points)``, with its peak measured where the plan needs it."""
        w = len(points)
        self.chunks[w] = self.chunks.get(w, 0) + 1
        if not self._measure_next:
            self.width = max(self.width, w)
            return ev.evaluate(points)
        with track_peak(self.device) as t:
            res = ev.evaluate(points)
        self.peaks[w] = int(t.peak)
        self.measured.append(w)
        if self.budget is not None and t.peak > self.budget and w > 2:
            self.too_wide = w if self.too_wide is None else min(self.too_wide, w)
        else:  # within the budget (or one or two points, run whatever the budget)
            self.width = max(self.width, w)
        return res

    def config(self) -> dict[str, Any]:
        """Requested and used width, the budget, the measured peaks and fit, and why."""
        cfg: dict[str, Any] = {"requested": self.requested, "used": self.width, "reason": self.reason}
        if self.auto:
            cfg["chosen"] = self.chosen  # the plan's width (larger than used when the grid is smaller)
        if self.auto or self.spec is not None:
            tracker = "cuda_allocator" if self.device.type == "cuda" else "dispatch"
            cfg.update(
                max_memory=self.spec,
                budget_bytes=self.budget,
                budget_from=self.budget_from,
                tracker=tracker if self.auto else None,
                peaks={str(w): v for w, v in sorted(self.peaks.items())},
                fit=None if self.fit is None else {"a": float(self.fit[0]), "b": float(self.fit[1])},
                measured_chunks=list(self.measured),
                chunks={str(w): n for w, n in sorted(self.chunks.items())},
                cap=AUTO_MAX_POINTS,
                warning=self.warning,
            )
        return cfg
