"""Choosing among equivalent product paths by timing them on the device that runs them.

Several engines compute the same Hessian product (``curvature.hessian``): which is fastest depends
on the model, the block width and the device (on an H100, forward-over-reverse beats double
backward from about 8 vectors per block on ResNet-20; on a CPU double backward with a cached graph
wins, measured by ``benchmarks/bench_products.py``). A fixed table cannot know the user's model and
card, so :class:`PathTimer` measures instead: on the first block of each width class (one vector,
or several) it runs every candidate twice -- once untimed, so that one-time costs (building and
caching a graph, tracing) do not count, then timed with the device synchronised -- keeps the
fastest for the rest of the operator's life, and records every timing, the choice and the
calibration's cost (``2 x candidates`` products per width class) for ``config()``. A candidate that
raises is dropped with its reason (except the exception types in ``passthrough``: errors about the
model or data rather than the path, which propagate). The block returned during calibration is the
chosen path's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["PathTimer", "short_error", "width_class"]


def short_error(err: BaseException) -> str:
    """Why a path failed, in one line: the exception's type and the start of its first line."""
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"


def width_class(k: int) -> str:
    """``"single"`` for one vector, ``"block"`` for several: the paths' costs scale differently."""
    return "single" if k == 1 else "block"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PathTimer:
    """Times ``call(path, V)`` for each of ``paths`` on the first block of each width class.

    Args:
        paths: the candidate names, in the order they are tried.
        device: the device the products run on (synchronised around each timing).
        timer: the clock (``time.perf_counter``; tests pass a scripted one).
        passthrough: exception types raised by a candidate that are not the path's failure (they
            propagate instead of dropping the candidate).
    """

    def __init__(
        self,
        paths: Sequence[str],
        device: torch.device,
        timer: Callable[[], float] = time.perf_counter,
        passthrough: tuple[type[BaseException], ...] = (),
    ) -> None:
        if not paths:
            raise ValueError("PathTimer needs at least one candidate path")
        self.paths, self.device, self.timer = list(paths), device, timer
        self.passthrough = tuple(passthrough)
        self.choice: dict[str, str] = {}
        self.timings: dict[str, dict[str, float]] = {}
        self.failed: dict[str, str] = {}
        self.calibration_products = 0

    def run(self, V: torch.Tensor, call: Callable[[str, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``call(best, V)``; the first block of a width class times every candidate first."""
        cls = width_class(int(V.shape[1]))
        if cls in self.choice:
            return call(self.choice[cls], V)
        seconds: dict[str, float] = {}
        results: dict[str, torch.Tensor] = {}
        for path in self.paths:
            if path in self.failed:
                continue
            try:
                call(path, V)  # one-time costs (graph, tracing) stay out of the timing
                _sync(self.device)
                start = self.timer()
                out = call(path, V)
                _sync(self.device)
                seconds[path] = self.timer() - start
                results[path] = out
            except self.passthrough:
                raise
            except Exception as err:  # noqa: BLE001 - a path this model cannot run: not a candidate
                self.failed[path] = short_error(err)
            self.calibration_products += 2 * int(V.shape[1])
        if not seconds:
            raise RuntimeError(f"no product path ran on this model: {self.failed}")
        best = min(seconds, key=seconds.__getitem__)
        self.choice[cls], self.timings[cls] = best, seconds
        return results[best]

    def config(self) -> dict[str, Any]:
        return {
            "calibrated_choice": dict(self.choice),
            "calibration_seconds": {c: dict(t) for c, t in self.timings.items()},
            "calibration_products": self.calibration_products,
            "calibration_failed": dict(self.failed),
        }
