"""The :class:`Surface` result: values on a 1-D/2-D grid with completion mask, npz/JSON files,
matplotlib and Plotly plots, offline HTML and VTK export."""

from __future__ import annotations

import json
import math
import os
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from landscape.io import atomic_write, atomic_write_text, read_json, to_jsonable
from landscape.results import Result, _conform

FORMAT_VERSION = 1
#: Metric names a surface file may hold (``loss`` is always present).
KNOWN_METRICS = ("loss", "accuracy")

__all__ = ["KNOWN_METRICS", "Surface", "load_surface"]


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
        return self.mask is not None and bool(np.all(self.mask))

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
        a JSON ``meta`` string (configuration: directions' recipes, BN policy, data, model hash).

        The surface is checked first (the same rules as :meth:`load`), so no file is written that
        could not be loaded back."""
        dirs = self.directions if include_directions else None
        coords, values, mask, dirs = _checked_parts(self.coords, self.values, self.mask, dirs, "Surface.save")
        arrays: dict[str, np.ndarray] = {f"coords_{i}": c for i, c in enumerate(coords)}
        arrays.update({f"value_{m}": v for m, v in values.items()})
        arrays["mask"] = mask
        dir_names: list[list[str]] = []
        for i, d in enumerate(dirs or []):
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
            "metrics": list(values),
            "direction_names": dir_names,
        }
        arrays["meta"] = np.array(json.dumps(meta, allow_nan=True))

        def writer(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.savez_compressed(fh, **arrays)

        return atomic_write(path, writer)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Surface:
        """Read a surface written by :meth:`save` (or a JSON file of :meth:`to_dict`).

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not a surface file, is truncated or corrupt, or its parts
                contradict each other (values or mask not of the grid's shape, unknown metrics,
                missing mask or arrays); the message names the file and the problem.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such surface file")
        if path.is_dir():
            raise ValueError(f"{path} is a directory, expected a surface file (.npz written by Surface.save)")
        with open(path, "rb") as fh:
            head = fh.read(64)
        if head[:4] != b"PK\x03\x04":
            if head.lstrip()[:1] == b"{":
                return _load_json_surface(path)
            shown = head[:4].hex(" ") if head else "an empty file"
            raise ValueError(
                f"{path}: not a surface file: expected a .npz archive written by Surface.save "
                f"(starting with the zip signature 50 4b 03 04), found {shown}"
            )
        arrays = _read_npz(path)
        meta = _read_meta(path, arrays.pop("meta", None))
        try:
            return _surface_from_npz(cls, arrays, meta, path)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    @classmethod
    def _from_fields(cls, kwargs: dict[str, Any]) -> Surface:
        parts = _checked_parts(
            kwargs.get("coords", []), kwargs.get("values", {}), kwargs.get("mask"),
            kwargs.get("directions"), "the surface",
        )  # fmt: skip
        kwargs.update(zip(("coords", "values", "mask", "directions"), parts))
        return cls(**kwargs)

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
        return atomic_write_text(path, html)

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
        return atomic_write_text(path, text)


def load_surface(path: str | os.PathLike) -> Surface:
    """Load a surface written by :meth:`Surface.save` (see :meth:`Surface.load` for the checks)."""
    return Surface.load(path)


# ------------------------------------------------------------------------------ checking surface files


def _array(x: Any, name: str, kinds: str, what: str) -> np.ndarray:
    try:
        a = np.asarray(x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x)
    except (ValueError, TypeError):
        a = None
    if a is None or a.dtype.kind not in kinds:
        got = "ragged nested lists" if a is None else f"elements of type {a.dtype}"
        raise ValueError(f"{name} must be an array of {what}, got {got}")
    return a


def _direction_tensor(v: Any, name: str) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    a = _array(v, name, "iuf", "numbers")
    return torch.from_numpy(a.copy() if a.dtype.kind == "f" else a.astype(np.float64))


def _checked_parts(coords: Any, values: Any, mask: Any, directions: Any, where: str) -> tuple:
    """Coordinates, values, mask and directions as arrays, checked against each other.

    Rules: one or two axes of finite, non-empty 1-D coordinates; metrics a subset of
    ``KNOWN_METRICS`` including ``loss``; every value array and the boolean ``mask`` of the grid's
    shape ``(len(xs)[, len(ys)])``; one direction (dict name -> floating tensor) per axis."""
    if not isinstance(coords, (list, tuple)) or len(coords) not in (1, 2):
        n = len(coords) if isinstance(coords, (list, tuple)) else type(coords).__name__
        raise ValueError(f"{where}: a surface has 1 or 2 coordinate axes, found {n}")
    cs = []
    for i, c in enumerate(coords):
        a = _array(c, f"{where}: coords_{i}", "iuf", "numbers").astype(np.float64)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(
                f"{where}: coords_{i} must be a non-empty 1-D array of finite numbers, got shape "
                f"{a.shape}{'' if np.all(np.isfinite(a)) else ' with NaN/inf entries'}"
            )
        cs.append(a)
    shape = tuple(len(c) for c in cs)
    if not isinstance(values, Mapping) or "loss" not in values:
        raise ValueError(f"{where}: no 'loss' values (metrics found: {list(values or [])})")
    unknown = [m for m in values if m not in KNOWN_METRICS]
    if unknown:
        raise ValueError(f"{where}: unknown metric name(s) {unknown}; a surface holds {list(KNOWN_METRICS)}")
    vals = {}
    for m, v in values.items():
        vals[m] = _array(v, f"{where}: value_{m}", "iuf", "numbers").astype(np.float64)
        if vals[m].shape != shape:
            raise ValueError(
                f"{where}: value_{m} has shape {vals[m].shape} but the coordinates give a grid of "
                f"shape {shape}"
            )
    if mask is None:
        raise ValueError(f"{where}: the completion mask is missing (which points were evaluated is unknown)")
    mk = _array(mask, f"{where}: mask", "biu", "booleans")
    if mk.dtype.kind != "b":
        if not np.all((mk == 0) | (mk == 1)):
            raise ValueError(f"{where}: mask must hold booleans (or 0/1), got other values")
        mk = mk.astype(bool)
    if mk.shape != shape:
        raise ValueError(
            f"{where}: mask has shape {mk.shape} but the coordinates give a grid of shape {shape}"
        )
    dirs = None
    if directions:
        if not isinstance(directions, (list, tuple)) or len(directions) != len(cs):
            n = len(directions) if isinstance(directions, (list, tuple)) else type(directions).__name__
            raise ValueError(f"{where}: {n} directions for {len(cs)} coordinate axes")
        dirs = []
        for i, d in enumerate(directions):
            if not isinstance(d, Mapping) or not all(isinstance(k, str) for k in d):
                raise ValueError(f"{where}: direction {i} must map parameter names to tensors")
            dirs.append({k: _direction_tensor(v, f"{where}: direction {i} {k!r}") for k, v in d.items()})
    return cs, vals, mk, dirs


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}  # reading every member checks its CRC now
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ValueError(
                f"{path}: holds a pickled object array, which surface files never do; refused"
            ) from None
        raise ValueError(f"{path}: corrupt .npz surface file ({exc})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError) as exc:
        raise ValueError(
            f"{path}: corrupt or truncated .npz surface file ({type(exc).__name__}: {exc}); "
            "an interrupted copy? compute it again or restore it"
        ) from None


def _read_meta(path: Path, meta_arr: np.ndarray | None) -> dict[str, Any]:
    if meta_arr is None:
        raise ValueError(f"{path} is not a surface file written by Surface.save (no 'meta' entry)")
    if meta_arr.shape != () or meta_arr.dtype.kind != "U":
        raise ValueError(
            f"{path}: the 'meta' entry must be one JSON string, got {meta_arr.dtype} {meta_arr.shape}"
        )
    try:
        meta = json.loads(str(meta_arr))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: the 'meta' entry is not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != "landscape.Surface":
        fmt = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ValueError(f"{path}: unknown format {fmt!r}, expected 'landscape.Surface'")
    version = meta.get("format_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise ValueError(
            f"{path}: format_version {version!r} is not one this version reads (1..{FORMAT_VERSION}); "
            "a newer landscape wrote it: upgrade"
        )
    return meta


def _surface_from_npz(cls: type[Surface], arrays: dict[str, np.ndarray], meta: dict, path: Path) -> Surface:
    metrics = _conform(meta.get("metrics"), list[str], "meta.metrics")
    names = _conform(meta.get("direction_names") or [], list[list[str]], "meta.direction_names")
    nd = sum(1 for k in arrays if k.startswith("coords_"))
    expected = {f"coords_{i}" for i in range(nd)} | {f"value_{m}" for m in metrics} | {"mask"}
    expected |= {f"direction_{i}_{j}" for i, ns in enumerate(names) for j in range(len(ns))}
    missing, extra = sorted(expected - set(arrays)), sorted(set(arrays) - expected)
    if missing or extra:
        raise ValueError(
            f"the arrays do not match the metadata (metrics {metrics}, {nd} axes): "
            f"missing {missing}, unexpected {extra}"
        )
    dirs = [{n: arrays[f"direction_{i}_{j}"] for j, n in enumerate(ns)} for i, ns in enumerate(names)]
    coords, values, mask, dirs = _checked_parts(
        [arrays[f"coords_{i}"] for i in range(nd)], {m: arrays[f"value_{m}"] for m in metrics},
        arrays["mask"], dirs or None, "the surface",
    )  # fmt: skip
    return cls(
        config=_conform(meta.get("config", {}), dict, "meta.config"),
        seconds=_conform(meta.get("seconds", 0.0), float, "meta.seconds"),
        coords=coords,
        values=values,
        mask=mask,
        directions=dirs,
        evaluations=_conform(meta.get("evaluations", 0), int, "meta.evaluations"),
        strategy=_conform(meta.get("strategy", ""), str, "meta.strategy"),
    )


def _load_json_surface(path: Path) -> Surface:
    d = read_json(path, what="surface file")
    if not isinstance(d, dict) or d.get("type") != "Surface":
        typ = d.get("type") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{path}: a JSON file of type {typ!r}, not a Surface (use landscape.load_result)")
    try:
        return Surface.from_dict(d)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


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
