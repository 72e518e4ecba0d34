"""Shared plotting and saving helpers of the reproduced figures (matplotlib on the Agg backend, atomic
writes through ``landscape.io``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from landscape.io import atomic_write, atomic_write_json, atomic_write_text

__all__ = ["REDUCED_BELOW", "DPI", "pyplot", "save_png", "save_json", "save_html", "contour_levels"]

REDUCED_BELOW = 100
DPI = 100


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (unless a backend is already chosen)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: Path) -> None:
    """Write a matplotlib figure as PNG atomically and close it."""
    atomic_write(path, lambda p: fig.savefig(p, dpi=DPI, format="png", bbox_inches="tight"))
    pyplot().close(fig)


def save_json(obj: dict, path: Path) -> None:
    """Write the numbers a figure shows as JSON, atomically."""
    atomic_write_json(path, obj)


def save_html(fig, path: Path) -> None:
    """Write a Plotly figure as a stand-alone HTML page (plotly.js from its CDN), atomically."""
    atomic_write_text(path, fig.to_html(include_plotlyjs="cdn", full_html=True))


def contour_levels(z: np.ndarray, n: int = 30) -> np.ndarray:
    """``n`` contour levels from the minimum to the 98th percentile, denser near the minimum."""
    lo, hi = np.nanmin(z), np.nanpercentile(z, 98)
    return lo + (hi - lo) * np.linspace(0, 1, n) ** 2
