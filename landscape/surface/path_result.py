"""The :class:`PathResult` of a path between two models (line or curve) and its barrier heights.

Barriers (:class:`PathResult`): with ``L_a = L(theta_0)``, ``L_b = L(theta_1)``,

* ``barrier = max_t [L(theta_t) - ((1 - t) L_a + t L_b)]`` (Entezari et al. 2022, "The role of
  permutation invariance in linear mode connectivity of neural networks", eq. 1): the height above
  the chord between the end losses; ``>= 0``;
* ``barrier_max_ends = max_t L(theta_t) - max(L_a, L_b)``;
* ``barrier_mean_ends = max_t L(theta_t) - (L_a + L_b) / 2`` (Frankle et al. 2020, "Linear mode
  connectivity and the lottery ticket hypothesis", Sec. 2, with the loss in place of the error);
* ``error_barrier``: the first definition applied to the error ``1 - accuracy``.

The maxima run over the evaluated ``t`` in ``[0, 1]`` and the two ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from landscape.results import Result

__all__ = ["BARRIER_DEFINITION", "PathResult", "barriers"]

#: The definition of ``PathResult.barrier`` (recorded in ``config``).
BARRIER_DEFINITION = "max_t [L(t) - ((1 - t) L(0) + t L(1))] over the evaluated t in [0, 1] and the ends"


@dataclass
class PathResult(Result):
    """Loss (and accuracy) along a path ``theta(t)`` between two models and its barrier heights.

    ``loss[i]`` and ``accuracy[i]`` are at ``t[i]``; ``loss_a`` / ``loss_b`` at ``t = 0`` / ``t = 1``.
    ``path`` is ``"line"``, ``"bezier"`` or ``"polychain"``. The barrier definitions are in the
    module docstring (``config["barrier_definition"]`` repeats the main one).
    """

    path: str = "line"
    t: list[float] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] | None = None
    loss_a: float = math.nan
    loss_b: float = math.nan
    barrier: float = math.nan
    t_barrier: float = math.nan
    barrier_max_ends: float = math.nan
    barrier_mean_ends: float = math.nan
    max_loss: float = math.nan
    t_max_loss: float = math.nan
    error_barrier: float | None = None
    evaluations: int = 0

    def __repr__(self) -> str:
        return (
            f"PathResult(path={self.path!r}, points={len(self.t)}, loss_a={self.loss_a:.4g}, "
            f"loss_b={self.loss_b:.4g}, max_loss={self.max_loss:.4g}, barrier={self.barrier:.4g})"
        )

    def _series(self, metric: str) -> tuple[np.ndarray, float | None, float | None]:
        if metric == "loss":
            return np.asarray(self.loss, dtype=np.float64), self.loss_a, self.loss_b
        if metric in ("accuracy", "error"):
            if self.accuracy is None:
                raise ValueError(f"metric {metric!r}: this path has no accuracy (targets not class labels)")
            acc = np.asarray(self.accuracy, dtype=np.float64)
            ends = self.config.get("accuracy_ends") or [None, None]
            if metric == "error":
                return 1.0 - acc, *(None if e is None else 1.0 - e for e in ends)
            return acc, ends[0], ends[1]
        raise ValueError(f"metric must be 'loss', 'accuracy' or 'error', got {metric!r}")

    def plot(self, metric: str = "loss", *, ax: Any = None, chord: bool = True, label: str | None = None):
        """Matplotlib plot of ``metric`` (``"loss"``, ``"accuracy"``, ``"error"``) against ``t``, with
        the chord between the end values (dashed; the barrier is measured from it). Returns the Axes."""
        import matplotlib.pyplot as plt

        y, ya, yb = self._series(metric)
        if ax is None:
            _, ax = plt.subplots()
        ax.plot(self.t, y, ".-", lw=1.5, label=label or self.path)
        if chord and ya is not None and yb is not None:
            ax.plot([0.0, 1.0], [ya, yb], "--", color="gray", lw=1)
        ax.set_xlabel("t")
        ax.set_ylabel(metric)
        ax.set_title(f"{self.path}: barrier {self.barrier:.3g}" if metric == "loss" else None)
        return ax

    def to_plotly(self, metric: str = "loss", *, title: str | None = None):
        """Plotly figure of ``metric`` against ``t`` with the chord between the end values."""
        import plotly.graph_objects as go

        y, ya, yb = self._series(metric)
        fig = go.Figure(go.Scatter(x=list(self.t), y=y, mode="lines+markers", name=self.path))
        if ya is not None and yb is not None:
            fig.add_trace(
                go.Scatter(x=[0.0, 1.0], y=[ya, yb], mode="lines", name="chord", line=dict(dash="dash"))
            )
        fig.update_layout(xaxis_title="t", yaxis_title=metric, title=title or f"{self.path} path")
        return fig


def barriers(ts, losses, accs, ends) -> dict[str, Any]:
    """Barrier heights (module docstring) from ``losses`` / ``accs`` (``None`` entries: no accuracy)
    at ``ts`` and ``ends = ((L_a, acc_a), (L_b, acc_b))``."""
    (la, aa), (lb, ab) = ends
    pts = [(0.0, la, aa), (1.0, lb, ab)] + [
        (t, lv, av) for t, lv, av in zip(ts, losses, accs) if 0.0 <= t <= 1.0
    ]
    excess = [(lv - ((1.0 - t) * la + t * lb), t) for t, lv, _ in pts]
    barrier, t_barrier = max(excess, key=lambda e: e[0])
    max_loss, t_max = max(((lv, t) for t, lv, _ in pts), key=lambda e: e[0])
    err_barrier = None
    if all(av is not None for _, _, av in pts):
        ea, eb = 1.0 - aa, 1.0 - ab
        err_barrier = max((1.0 - av) - ((1.0 - t) * ea + t * eb) for t, _, av in pts)
    return dict(
        barrier=float(barrier),
        t_barrier=float(t_barrier),
        barrier_max_ends=float(max_loss - max(la, lb)),
        barrier_mean_ends=float(max_loss - 0.5 * (la + lb)),
        max_loss=float(max_loss),
        t_max_loss=float(t_max),
        error_barrier=err_barrier,
    )
