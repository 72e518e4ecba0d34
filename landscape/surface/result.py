"""The :class:`Surface` result: values on a 1-D/2-D grid with completion mask, npz/JSON files,
matplotlib and Plotly plots, offline HTML and VTK export."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from landscape.io import atomic_write, to_jsonable
from landscape.results import Result

FORMAT_VERSION = 1

__all__ = ["Surface", "load_surface"]


# ------------------------------------------------------------------------------------------ result


@dataclass
class Surface(Result):
    """Values of metrics on a grid; ``values[m][i, j]`` is at ``(coords[0][i], coords[1][j])``.

    ``mask[i, j]`` is True where the point has been evaluated (a partial surface from an
    interrupted run has False entries and NaN values there). ``directions`` (list of dicts
    name -> tensor, optional) are stored in the file so the plane can be reproduced.
    """

    coords: list = field(default_factory=list)
    values: dict = field(default_factory=dict)
    mask: Any = None
    directions: list | None = None
    evaluations: int = 0
    strategy: str = ""

    kind: ClassVar[str] = "surface"

    # ---------------------------------------------------------------- accessors
    @property
    def loss(self) -> np.ndarray:
        return self.values["loss"]

    @property
    def accuracy(self) -> np.ndarray | None:
        return self.values.get("accuracy")

    @property
    def ndim(self) -> int:
        return len(self.coords)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(c) for c in self.coords)

    @property
    def xs(self) -> np.ndarray:
        return self.coords[0]

    @property
    def ys(self) -> np.ndarray | None:
        return self.coords[1] if self.ndim > 1 else None

    @property
    def complete(self) -> bool:
        return bool(np.all(self.mask))

    def __repr__(self) -> str:
        done = int(np.sum(self.mask)) if self.mask is not None else 0
        return (
            f"Surface(shape={self.shape}, metrics={list(self.values)}, "
            f"done={done}/{int(np.prod(self.shape))}, "
            f"strategy={self.strategy!r}, seconds={self.seconds:.3g})"
        )

    def interpolate(self, points: np.ndarray, metric: str = "loss") -> np.ndarray:
        """Values at off-grid ``points`` (``[T, ndim]``) by (bi)linear interpolation."""
        from scipy.interpolate import RegularGridInterpolator

        pts = np.atleast_2d(np.asarray(points, dtype=np.float64))
        grid = [np.asarray(c) for c in self.coords]
        vals = np.asarray(self.values[metric], dtype=np.float64)
        order = [np.argsort(g) for g in grid]
        grid = [g[o] for g, o in zip(grid, order)]
        vals = vals[np.ix_(*order)]
        f = RegularGridInterpolator(grid, vals, bounds_error=False, fill_value=np.nan)
        return f(pts)

    # ---------------------------------------------------------------- files
    def save(self, path: str | os.PathLike, *, include_directions: bool = True) -> Path:
        """Write one self-describing ``.npz`` atomically: coordinates, values, mask, directions and
        a JSON ``meta`` string (configuration: directions' recipes, BN policy, data, model hash)."""
        arrays: dict[str, np.ndarray] = {}
        for i, c in enumerate(self.coords):
            arrays[f"coords_{i}"] = np.asarray(c, dtype=np.float64)
        for m, v in self.values.items():
            arrays[f"value_{m}"] = np.asarray(v, dtype=np.float64)
        arrays["mask"] = np.asarray(self.mask, dtype=bool)
        dir_names: list[list[str]] = []
        if include_directions and self.directions:
            for i, d in enumerate(self.directions):
                names = list(d)
                dir_names.append(names)
                for j, n in enumerate(names):
                    arrays[f"direction_{i}_{j}"] = d[n].detach().cpu().numpy()
        meta = {
            "format": "landscape.Surface",
            "format_version": FORMAT_VERSION,
            "config": to_jsonable(self.config),
            "seconds": self.seconds,
            "evaluations": self.evaluations,
            "strategy": self.strategy,
            "metrics": list(self.values),
            "direction_names": dir_names,
        }
        arrays["meta"] = np.array(json.dumps(meta))

        def writer(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, **arrays)

        return atomic_write(path, writer)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Surface:
        with np.load(path, allow_pickle=False) as z:
            if "meta" not in z.files:
                raise ValueError(f"{path} is not a surface file written by Surface.save (no 'meta' entry)")
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != "landscape.Surface":
                raise ValueError(f"{path}: unknown format {meta.get('format')!r}")
            nd = sum(1 for k in z.files if k.startswith("coords_"))
            coords = [z[f"coords_{i}"] for i in range(nd)]
            values = {m: z[f"value_{m}"] for m in meta["metrics"]}
            mask = z["mask"]
            dirs = None
            if meta.get("direction_names"):
                dirs = []
                for i, names in enumerate(meta["direction_names"]):
                    dirs.append(
                        {n: torch.from_numpy(z[f"direction_{i}_{j}"].copy()) for j, n in enumerate(names)}
                    )
        return cls(
            config=meta.get("config", {}),
            seconds=float(meta.get("seconds", 0.0)),
            coords=coords,
            values=values,
            mask=mask,
            directions=dirs,
            evaluations=int(meta.get("evaluations", 0)),
            strategy=meta.get("strategy", ""),
        )

    # ---------------------------------------------------------------- plots and exports
    def plot(
        self,
        kind: str | None = None,
        *,
        metric: str = "loss",
        trajectory: Any = None,
        ax: Any = None,
        levels: int = 30,
        log: bool = False,
        title: str | None = None,
        cmap: str = "viridis",
    ):
        """Matplotlib plot: ``"contour"`` (default in 2-D), ``"heatmap"``, ``"surface"`` (3-D) or
        ``"line"`` (1-D). ``trajectory``: a :class:`~landscape.surface.trajectory.Projection`, a recorder
        with on-the-fly coordinates, or an array ``[T, 2]``, drawn on the contour/heatmap/surface.
        Returns the Axes."""
        import matplotlib.pyplot as plt

        kind = kind or ("line" if self.ndim == 1 else "contour")
        allowed = ("line",) if self.ndim == 1 else ("contour", "heatmap", "surface")
        if kind not in allowed:
            raise ValueError(f"kind must be one of {allowed} for a {self.ndim}-D surface, got {kind!r}")
        if metric not in self.values:
            raise ValueError(f"metric {metric!r} not in this surface; available: {list(self.values)}")
        z = np.asarray(self.values[metric], dtype=np.float64)
        if log:
            z = np.log10(np.maximum(z, 1e-300))
        label = f"log10 {metric}" if log else metric
        if kind == "surface":
            if ax is None:
                fig = plt.figure()
                ax = fig.add_subplot(projection="3d")
        elif ax is None:
            _, ax = plt.subplots()
        if kind == "line":
            ax.plot(self.xs, z, "-", lw=1.5)
            ax.set_xlabel("x")
            ax.set_ylabel(label)
        else:
            X, Y = np.meshgrid(self.xs, self.ys, indexing="ij")
            if kind == "contour":
                cs = ax.contour(X, Y, z, levels=levels, cmap=cmap)
                ax.clabel(cs, inline=True, fontsize=6, fmt="%.2g")
            elif kind == "heatmap":
                pc = ax.pcolormesh(X, Y, z, shading="auto", cmap=cmap)
                ax.figure.colorbar(pc, ax=ax, label=label)
            else:
                ax.plot_surface(X, Y, z, cmap=cmap, linewidth=0, antialiased=True)
                ax.set_zlabel(label)
            ax.set_xlabel("x (direction 1)")
            ax.set_ylabel("y (direction 2)")
            tr = _trajectory_coords(trajectory)
            if tr is not None:
                if kind == "surface":
                    zt = self.interpolate(tr, metric)
                    ax.plot(tr[:, 0], tr[:, 1], np.log10(zt) if log else zt, "r.-", ms=3)
                else:
                    ax.plot(tr[:, 0], tr[:, 1], "r.-", ms=3, lw=1)
                    ax.plot(tr[-1:, 0], tr[-1:, 1], "r*", ms=8)
        if title:
            ax.set_title(title)
        return ax

    def to_plotly(
        self, *, metric: str = "loss", trajectory: Any = None, log: bool = False, title: str | None = None
    ):
        """Plotly figure: a 3-D surface (2-D grids) or a line (1-D) with an optional trajectory
        (projected coordinates; its height is the surface interpolated there)."""
        import plotly.graph_objects as go

        if metric not in self.values:
            raise ValueError(f"metric {metric!r} not in this surface; available: {list(self.values)}")
        z = np.asarray(self.values[metric], dtype=np.float64)
        tf = (lambda v: np.log10(np.maximum(v, 1e-300))) if log else (lambda v: v)
        label = f"log10 {metric}" if log else metric
        if self.ndim == 1:
            fig = go.Figure(go.Scatter(x=self.xs, y=tf(z), mode="lines", name=metric))
            fig.update_layout(xaxis_title="x", yaxis_title=label, title=title)
            return fig
        fig = go.Figure(go.Surface(x=self.xs, y=self.ys, z=tf(z).T, colorscale="Viridis", name=metric))
        tr = _trajectory_coords(trajectory)
        if tr is not None:
            zt = tf(self.interpolate(tr, metric))
            fig.add_trace(
                go.Scatter3d(
                    x=tr[:, 0],
                    y=tr[:, 1],
                    z=zt,
                    mode="lines+markers",
                    name="trajectory",
                    line=dict(color="red", width=4),
                    marker=dict(size=2, color="red"),
                )
            )
        fig.update_layout(
            title=title,
            scene=dict(xaxis_title="x (direction 1)", yaxis_title="y (direction 2)", zaxis_title=label),
        )
        return fig

    def to_html(self, path: str | os.PathLike, *, include_plotlyjs: bool | str = True, **kwargs) -> Path:
        """Write the Plotly figure (:meth:`to_plotly`) as a stand-alone HTML file, atomically."""
        fig = self.to_plotly(**kwargs)
        html = fig.to_html(include_plotlyjs=include_plotlyjs, full_html=True)
        return atomic_write(path, lambda p: p.write_text(html, encoding="utf-8"))

    def to_vtk(self, path: str | os.PathLike, *, metric: str = "loss", log: bool = False) -> Path:
        """Legacy-ASCII VTK structured grid (ParaView): points ``(x, y, value)``, every metric as
        point data. 1-D surfaces become a ``N x 1 x 1`` grid."""
        if metric not in self.values:
            raise ValueError(f"metric {metric!r} not in this surface; available: {list(self.values)}")
        xs = np.asarray(self.xs, dtype=np.float64)
        ys = np.asarray(self.ys, dtype=np.float64) if self.ndim > 1 else np.zeros(1)
        nx, ny = len(xs), len(ys)

        def grid(v):
            v = np.asarray(v, dtype=np.float64)
            return v.reshape(nx, ny)

        zv = grid(self.values[metric])
        if log:
            zv = np.log10(np.maximum(zv, 1e-300))
        lines = [
            "# vtk DataFile Version 3.0",
            f"landscape surface ({metric}{', log10' if log else ''})",
            "ASCII",
            "DATASET STRUCTURED_GRID",
            f"DIMENSIONS {nx} {ny} 1",
            f"POINTS {nx * ny} double",
        ]

        def num(v: float) -> str:
            return repr(float(v)) if math.isfinite(v) else "nan"

        for j in range(ny):  # VTK: x index varies fastest
            for i in range(nx):
                lines.append(f"{num(xs[i])} {num(ys[j])} {num(zv[i, j])}")
        lines.append(f"POINT_DATA {nx * ny}")
        for m, v in self.values.items():
            g = grid(v)
            lines += [f"SCALARS {m} double 1", "LOOKUP_TABLE default"]
            lines += [num(g[i, j]) for j in range(ny) for i in range(nx)]
        text = "\n".join(lines) + "\n"
        return atomic_write(path, lambda p: p.write_text(text, encoding="ascii"))


def load_surface(path: str | os.PathLike) -> Surface:
    """Load a surface written by :meth:`Surface.save`."""
    return Surface.load(path)


def _trajectory_coords(trajectory: Any) -> np.ndarray | None:
    if trajectory is None:
        return None
    c = getattr(trajectory, "coords", trajectory)
    if c is None:
        raise ValueError(
            "the trajectory has no projected coordinates; project it first"
            " (landscape.surface.trajectory.project)"
        )
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ValueError(f"trajectory coordinates must have shape [T, 2], got {c.shape}")
    return c[:, :2]
