"""1-D and 2-D loss surfaces ``L(theta + x d1 + y d2)`` of real networks over a whole data set.

``s = ls.surface(obj, directions=[d1, d2], coords=[xs, ys])`` evaluates the Objective's loss (and
accuracy) on the grid; ``s.loss[i, j]`` is the value at ``(xs[i], ys[j])``. The plot follows Li et
al., "Visualizing the Loss Landscape of Neural Nets", NeurIPS 2018, eq. (1):
``f(alpha, beta) = L(theta* + alpha delta + beta eta)``.

Correctness by construction:

* every strategy forms the point as ``theta + x*d1 + y*d2`` with the same expression, so a grid
  point with ``x = y = 0`` is bit-identical to ``theta``, and the "loop" strategy evaluates it with
  the Objective's own arithmetic: the centre equals ``obj.loss()`` exactly;
* the caller's model is never written to (``functional_call`` with copies, inside ``obj.guard()``);
* BatchNorm is handled by an explicit policy (``bn_policy``), recorded in the result;
* progress is saved with a completion *mask* (not sentinel values), atomically, so an interrupted
  run resumes (``resume=path``) to the same values.

Evaluation strategies (``strategy``): ``"loop"`` (one ``functional_call`` pass per point),
``"linear_first_layer"`` (CPU default when the model is an ``nn.Sequential`` whose first
parametrised layer is a ``Linear``: its output ``X (W + x D1 + y D2)^T + b(...)`` is linear in the
coordinates, so ``X W^T``, ``X D1^T``, ``X D2^T`` are computed once and combined per point) and
``"vmap"`` (GPU default: chunks of ``batch_points`` points in one ``torch.func.vmap`` call).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from landscape._io import atomic_write, to_jsonable
from landscape.results import Result

__all__ = ["Surface", "surface", "load_surface", "add_cli", "model_hash"]

_METRICS = ("loss", "accuracy")
_STRATEGIES = ("auto", "loop", "vmap", "linear_first_layer")
_BN_POLICIES = ("eval", "train", "recompute")
FORMAT_VERSION = 1


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
        ``"line"`` (1-D). ``trajectory``: a :class:`~landscape.trajectory.Projection`, a recorder
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
            "the trajectory has no projected coordinates; project it first (landscape.trajectory.project)"
        )
    c = np.asarray(c, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 2:
        raise ValueError(f"trajectory coordinates must have shape [T, 2], got {c.shape}")
    return c[:, :2]


# ------------------------------------------------------------------------------------- utilities


def _hash_tensors(named: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(named):
        t = named[n].detach().cpu().contiguous()
        h.update(n.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def model_hash(model: nn.Module) -> str:
    """Short sha256 of a model's parameters and buffers (names, dtypes, shapes, bytes)."""
    return _hash_tensors({**dict(model.named_parameters()), **dict(model.named_buffers())})


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _point(base: Mapping[str, torch.Tensor], dirs, c: Sequence[float], names) -> dict[str, torch.Tensor]:
    """``theta + c1 d1 + c2 d2`` on ``names``, always with the same expression (zero coords give
    ``theta`` bit for bit)."""
    out = {}
    for n in names:
        t = base[n]
        for ci, d in zip(c, dirs):
            if n in d:
                t = torch.add(t, d[n], alpha=ci)  # t + ci * d in one pass; ci = 0 leaves t exact
        out[n] = t
    return out


# ------------------------------------------------------------------------------------ evaluators


class _Evaluator:
    """Evaluates points ``c`` (tuples of coordinates) -> ``(loss, correct or None)``."""

    name = "loop"
    want_accuracy = True

    def __init__(self, obj, dirs, bn_policy: str):
        from landscape.objective import _as_args, _num_correct

        self.obj = obj
        self.model = obj.model
        self.dirs = dirs
        self.bn_policy = bn_policy
        self._as_args = _as_args
        self._num_correct = _num_correct
        self.params = obj.all_params()
        self.buffers = obj.buffers()
        self.pnames = [n for n in self.params if any(n in d for d in dirs)]
        self.bnames = [n for n in self.buffers if any(n in d for d in dirs)]
        # data held in memory (a batch or a list of batches) is converted once and reused; a
        # DataLoader is re-iterated at every point (memory stays flat for large data sets)
        self._cached = list(obj.batches()) if isinstance(getattr(obj, "_data", None), (list, tuple)) else None

    @property
    def batches(self):
        return self._cached if self._cached is not None else self.obj.batches()

    def _state(self, c):
        p = dict(self.params)
        p.update(_point(self.params, self.dirs, c, self.pnames))
        b = (
            {n: t.clone() for n, t in self.buffers.items()}
            if self.bn_policy != "eval"
            else dict(self.buffers)
        )
        b.update(_point(self.buffers, self.dirs, c, self.bnames))
        return p, b

    def _recompute_bn(self, p, b) -> None:
        """Re-estimate BatchNorm running statistics at this point: cumulative average of the
        per-batch statistics over the data (as ``torch.optim.swa_utils.update_bn``)."""
        bns = _bn_modules(self.model)
        saved = [(m, m.momentum, m.training) for _, m in bns]
        try:
            for name, m in bns:
                pre = f"{name}." if name else ""
                if m.track_running_stats:
                    b[pre + "running_mean"] = torch.zeros_like(b[pre + "running_mean"])
                    b[pre + "running_var"] = torch.ones_like(b[pre + "running_var"])
                    b[pre + "num_batches_tracked"] = torch.zeros_like(b[pre + "num_batches_tracked"])
                m.momentum = None
                m.training = True
            for x, _, _ in self.batches:
                functional_call(self.model, (p, b), self._as_args(x))
        finally:
            for m, mom, tr in saved:
                m.momentum = mom
                m.training = tr

    def evaluate(self, points: Sequence[tuple[float, ...]]) -> list[tuple[float, float | None]]:
        out = []
        for c in points:
            p, b = self._state(c)
            if self.bn_policy == "recompute":
                self._recompute_bn(p, b)
            out.append(
                self._score(
                    (functional_call(self.model, (p, b), self._as_args(x)), y, w) for x, y, w in self.batches
                )
            )
        return out

    def _score(self, outputs) -> tuple[float, float | None]:
        """Weighted loss and accuracy (None when the targets are not class labels) of the model
        outputs over the whole data: ``outputs`` yields ``(outputs, targets, batch weight)``."""
        obj = self.obj
        total = torch.zeros((), dtype=obj.dtype, device=obj.device)
        correct = torch.zeros((), dtype=torch.float64, device=obj.device)
        classify = self.want_accuracy
        for o, y, w in outputs:
            total = total + w * obj.loss_fn(o, y)
            if classify:
                k = self._num_correct(o, y)
                if k is None:
                    classify = False
                else:
                    correct = correct + k
        return float(total), float(correct) / obj.num_examples if classify else None


class _LinearFirstEvaluator(_Evaluator):
    """``nn.Sequential`` whose first parametrised module is a ``Linear`` on the (flattened) input:
    ``Linear(Z; W + sum_i c_i D_i, b + sum_i c_i e_i) = (Z W^T + b) + sum_i c_i (Z D_i^T + e_i)``,
    so the three products are computed once per batch and combined per point."""

    name = "linear_first_layer"

    @staticmethod
    def split(model: nn.Module) -> int | None:
        """Index of the first Linear when everything before it is parameter-free and stateless."""
        if not isinstance(model, nn.Sequential):
            return None
        stateless = (nn.Flatten, nn.Identity, nn.Unflatten)
        for i, m in enumerate(model):
            if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward:
                return i
            if not isinstance(m, stateless):
                return None
        return None

    def __init__(self, obj, dirs, bn_policy: str):
        super().__init__(obj, dirs, bn_policy)
        k = self.split(self.model)
        if k is None:
            raise ValueError(
                "strategy 'linear_first_layer' needs an nn.Sequential starting with Flatten/Linear"
            )
        mods = list(self.model)
        self.prefix = mods[:k]
        self.rest = nn.Sequential(*mods[k + 1 :])
        # per module of the rest: plain nn.Linear -> F.linear (what its forward does), stateless
        # modules called directly, anything else through functional_call with its own entries
        self.kinds = []
        for j, mod in enumerate(self.rest):
            hooked = bool(mod._forward_hooks or mod._forward_pre_hooks)
            if type(mod) is nn.Linear and not hooked:
                self.kinds.append(("linear", f"{j}.weight", f"{j}.bias" if mod.bias is not None else None))
            elif (
                not hooked
                and next(iter(mod.parameters()), None) is None
                and next(iter(mod.buffers()), None) is None
            ):
                self.kinds.append(("plain", None, None))
            else:
                self.kinds.append(("call", f"{j}.", None))
        first = f"{k}."
        wn, bn = first + "weight", first + "bias"
        has_bias = bn in self.params

        def rename(n: str) -> str | None:
            head, _, tail = n.partition(".")
            i = int(head)
            return f"{i - k - 1}.{tail}" if i > k else None

        self.rename = rename
        self.first_names = [wn] + ([bn] if has_bias else [])
        self.rest_p = {rename(n): t for n, t in self.params.items() if rename(n) is not None}
        self.rest_b = {rename(n): t for n, t in self.buffers.items() if rename(n) is not None}
        self.rest_pnames = [n for n in self.pnames if rename(n) is not None]
        self.rest_bnames = [n for n in self.bnames if rename(n) is not None]
        W = self.params[wn]
        bias = self.params[bn] if has_bias else None
        self.pre = []  # per batch: (A0, [P_i or None], y, w)
        with torch.no_grad():
            for x, y, w in self.batches:
                z = x
                for m in self.prefix:
                    z = m(z)
                a0 = F.linear(z, W, bias)
                ps = []
                for d in dirs:
                    if wn in d or (has_bias and bn in d):
                        dw = d.get(wn, torch.zeros_like(W))
                        db = d.get(bn) if has_bias else None
                        ps.append(F.linear(z, dw, db))
                    else:
                        ps.append(None)
                self.pre.append((a0, ps, y, w))

    def _run_rest(self, a, p, b):
        for mod, (kind, x1, x2) in zip(self.rest, self.kinds):
            if kind == "linear":
                a = F.linear(a, p[x1], None if x2 is None else p[x2])
            elif kind == "plain":
                a = mod(a)
            else:
                n = len(x1)
                sp = {k[n:]: v for k, v in p.items() if k.startswith(x1)}
                sb = {k[n:]: v for k, v in b.items() if k.startswith(x1)}
                a = functional_call(mod, (sp, sb), (a,))
        return a

    def evaluate(self, points):
        out = []
        for c in points:
            p = dict(self.rest_p)
            for n, t in _point(self.params, self.dirs, c, self.rest_pnames).items():
                p[self.rename(n)] = t
            b = dict(self.rest_b)
            for n, t in _point(self.buffers, self.dirs, c, self.rest_bnames).items():
                b[self.rename(n)] = t
            out.append(self._score(self._outputs(c, p, b)))
        return out

    def _outputs(self, c, p, b):
        """Model outputs at point ``c``, batch by batch, from the precomputed first-layer terms."""
        for a0, ps, y, w in self.pre:
            a = a0
            for ci, pi in zip(c, ps):
                if pi is not None:
                    a = torch.add(a, pi, alpha=ci)
            yield self._run_rest(a, p, b), y, w


class _VmapEvaluator(_Evaluator):
    """Chunks of points in one ``torch.func.vmap`` over stacked parameter dicts."""

    name = "vmap"

    def evaluate(self, points):
        obj = self.obj
        cs = torch.as_tensor(np.asarray(points, dtype=np.float64), dtype=obj.dtype, device=obj.device)
        nb = cs.shape[0]
        stacked: dict[str, torch.Tensor] = {}
        for n in self.pnames + self.bnames:
            base = self.params[n] if n in self.params else self.buffers[n]
            t = base.unsqueeze(0).expand(nb, *base.shape)
            for i, d in enumerate(self.dirs):
                if n in d:
                    t = t + cs[:, i].reshape(nb, *([1] * base.ndim)) * d[n].unsqueeze(0)
            stacked[n] = t
        static_p = {n: t for n, t in self.params.items() if n not in stacked}
        static_b = {n: t for n, t in self.buffers.items() if n not in stacked}

        def f(sp, x, y):
            p = {**static_p, **{n: v for n, v in sp.items() if n in self.params}}
            b = {**static_b, **{n: v for n, v in sp.items() if n in self.buffers}}
            o = functional_call(self.model, (p, b), self._as_args(x))
            return obj.loss_fn(o, y), o

        vf = torch.func.vmap(f, in_dims=(0, None, None))
        total = torch.zeros(nb, dtype=obj.dtype, device=obj.device)
        correct = torch.zeros(nb, dtype=torch.float64, device=obj.device)
        classify = self.want_accuracy
        for x, y, w in self.batches:
            lk, o = vf(stacked, x, y)
            total = total + w * lk
            if classify:
                ks = [self._num_correct(o[i], y) for i in range(nb)]
                if any(k is None for k in ks):
                    classify = False
                else:
                    correct = correct + torch.stack(ks)
        tl = total.tolist()
        cl = (correct / obj.num_examples).tolist() if classify else [None] * nb
        return list(zip(tl, cl))


# ----------------------------------------------------------------------------------------- surface


def _check_inputs(obj, directions, coords):
    from landscape.objective import Objective

    if not isinstance(obj, Objective):
        raise TypeError(
            f"surface() takes a landscape.Objective, got {type(obj).__name__}; build one with "
            "ls.Objective(model, loss_fn, data)"
        )
    if isinstance(directions, Mapping):
        directions = [directions]
    if not isinstance(directions, Sequence) or not 1 <= len(directions) <= 2:
        raise ValueError("directions must be a list of one or two dicts name -> tensor")
    if (
        isinstance(coords, np.ndarray)
        and coords.ndim == 1
        or (isinstance(coords, torch.Tensor) and coords.ndim == 1)
    ):
        coords = [coords]
    if not isinstance(coords, Sequence) or len(coords) != len(directions):
        raise ValueError(
            f"coords must be a list with one 1-D array per direction ({len(directions)}), e.g. "
            "coords=[np.linspace(-1, 1, 51), np.linspace(-1, 1, 41)]"
        )
    cs = []
    for i, c in enumerate(coords):
        a = np.asarray(c.detach().cpu() if isinstance(c, torch.Tensor) else c, dtype=np.float64)
        if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
            raise ValueError(
                f"coords[{i}] must be a non-empty 1-D array of finite numbers, got shape {a.shape}"
            )
        cs.append(a)
    params = dict(obj.model.named_parameters())
    buffers = dict(obj.model.named_buffers())
    dirs = []
    for i, d in enumerate(directions):
        if not isinstance(d, Mapping) or not d:
            raise TypeError(
                f"directions[{i}] must be a non-empty dict name -> tensor (see ls.directions.random)"
            )
        dd = {}
        for n, t in d.items():
            ref = params.get(n, buffers.get(n))
            if ref is None:
                raise ValueError(
                    f"directions[{i}] has an entry {n!r} that is neither a parameter nor a buffer "
                    "of the model"
                )
            if tuple(t.shape) != tuple(ref.shape):
                raise ValueError(
                    f"directions[{i}][{n!r}] has shape {tuple(t.shape)}, expected {tuple(ref.shape)}"
                )
            if n in buffers and not ref.is_floating_point():
                raise ValueError(f"directions[{i}][{n!r}]: integer buffers cannot be perturbed")
            dd[n] = torch.as_tensor(t).detach().to(device=obj.device, dtype=obj.dtype)
        dirs.append(dd)
    return dirs, cs


def _resolve_strategy(strategy: str, obj, dirs, bn_policy: str) -> str:
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
    has_bn = bool(_bn_modules(obj.model))
    linear_ok = _LinearFirstEvaluator.split(obj.model) is not None and bn_policy != "recompute"
    has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in obj.model.modules())
    vmap_ok = (bn_policy == "eval" or not has_bn) and (obj.mode == "eval" or not has_dropout)
    if strategy == "linear_first_layer" and not linear_ok:
        raise ValueError(
            "strategy 'linear_first_layer' needs an nn.Sequential whose first parametrised module is "
            "an nn.Linear (after Flatten) and bn_policy != 'recompute'; use strategy='loop'"
        )
    if strategy == "vmap" and not vmap_ok:
        raise ValueError(
            "strategy 'vmap' cannot update BatchNorm statistics or draw dropout masks; use "
            "bn_policy='eval' (with mode='eval' for dropout) or strategy='loop'"
        )
    if strategy != "auto":
        return strategy
    if obj.device.type == "cpu":
        return "linear_first_layer" if linear_ok else "loop"
    return "vmap" if vmap_ok else "loop"


def surface(
    obj: Any,
    directions: Sequence[Mapping[str, torch.Tensor]],
    coords: Sequence[Any],
    *,
    metrics: Sequence[str] = ("loss", "accuracy"),
    bn_policy: str | None = None,
    batch_points: int | None = None,
    strategy: str = "auto",
    progress: bool = False,
    resume: str | os.PathLike | None = None,
    checkpoint_every: float = 60.0,
    distributed: bool | None = None,
    data_info: Mapping[str, Any] | None = None,
) -> Surface:
    """Evaluate ``L(theta + x d1 + y d2)`` (Li et al. 2018, eq. 1) on a grid over the whole data set.

    Args:
        obj: a ``landscape.Objective`` (model, loss, data, dtype/device, parameter selection).
        directions: one or two dicts name -> tensor (``ls.directions.random`` / ``eigen`` / ``pca``
            / ``between``); names may be parameters or floating buffers of the model.
        coords: one 1-D array per direction (any length, order and range; ``0`` hits ``theta``).
        metrics: any of ``"loss"``, ``"accuracy"`` (accuracy is dropped with a warning when the
            targets are not class labels).
        bn_policy: BatchNorm statistics used at each point: ``"eval"`` (the stored running
            statistics), ``"train"`` (batch statistics), ``"recompute"`` (running statistics
            re-estimated on the data at every point, then eval mode). Default: ``"eval"`` when
            ``obj.mode == "eval"``, else ``"train"`` (so the centre equals ``obj.loss()``).
        batch_points: grid points per vmap call (``"vmap"`` strategy; default 64) and the number of
            points between progress/checkpoint updates.
        strategy: ``"auto"`` (CPU: ``"linear_first_layer"`` when possible, else ``"loop"``; GPU:
            ``"vmap"``), ``"loop"``, ``"vmap"`` or ``"linear_first_layer"``.
        progress: tqdm bar over grid points.
        resume: a file: if it exists (a partial or complete surface of the same configuration),
            only the points its mask lacks are evaluated; progress is saved there atomically every
            ``checkpoint_every`` seconds and at the end.
        distributed: split the grid points across the ranks of an initialised
            ``torch.distributed`` process group (default: when one is initialised with > 1 rank)
            and gather the values on every rank (``all_reduce`` of disjoint parts).
        data_info: free-form description of the data (recorded in ``config``).

    Returns:
        :class:`Surface`; ``s.loss[i, j]`` is at ``(xs[i], ys[j])`` (``s.loss[i]`` in 1-D).
    """
    t0 = time.perf_counter()
    if isinstance(directions, Mapping):  # one direction given bare
        directions = [directions]
    dirs, cs = _check_inputs(obj, directions, coords)
    metrics = tuple(metrics)
    if not metrics or any(m not in _METRICS for m in metrics):
        raise ValueError(f"metrics must be a non-empty subset of {_METRICS}, got {metrics}")
    if "loss" not in metrics:
        metrics = ("loss", *metrics)
    if bn_policy is None:
        bn_policy = "eval" if obj.mode == "eval" else "train"
    if bn_policy not in _BN_POLICIES:
        raise ValueError(f"bn_policy must be one of {_BN_POLICIES}, got {bn_policy!r}")
    if batch_points is None:
        batch_points = 64
    if not isinstance(batch_points, int) or batch_points < 1:
        raise ValueError(f"batch_points must be a positive int, got {batch_points!r}")
    used = _resolve_strategy(strategy, obj, dirs, bn_policy)

    shape = tuple(len(c) for c in cs)
    dir_desc = [dict(getattr(d, "config", {}) or {}) for d in directions]
    config = {
        "objective": obj.config(),
        "directions": dir_desc,
        "directions_hash": _hash_tensors({f"{i}/{n}": t for i, d in enumerate(dirs) for n, t in d.items()}),
        "model_hash": model_hash(obj.model),
        "model_class": type(obj.model).__name__,
        "bn_policy": bn_policy,
        "metrics": list(metrics),
        "shape": list(shape),
        "ranges": [[float(c.min()), float(c.max())] for c in cs],
        "data": dict(data_info or {}),
        "strategy_requested": strategy,
        "torch": torch.__version__,
    }

    values = {m: np.full(shape, np.nan) for m in metrics}
    mask = np.zeros(shape, dtype=bool)
    if resume is not None and Path(resume).exists():
        old = load_surface(resume)
        problems = []
        if len(old.coords) != len(cs) or any(
            a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(old.coords, cs)
        ):
            problems.append("coordinates")
        for key in ("directions_hash", "model_hash", "bn_policy"):
            if old.config.get(key) != config[key]:
                problems.append(key)
        old_obj, new_obj = old.config.get("objective", {}), config["objective"]
        for key, what in (("num_examples", "data size"), ("loss", "loss"), ("reduction", "reduction"),
                          ("dtype", "dtype"), ("mode", "mode")):  # fmt: skip
            if old_obj.get(key) != new_obj.get(key):
                problems.append(what)
        missing_metrics = [m for m in metrics if m not in old.values]
        if missing_metrics:
            problems.append(f"metrics {missing_metrics}")
        if problems:
            raise ValueError(
                f"cannot resume from {resume}: it was computed with different {', '.join(problems)}; "
                "delete the file or choose another resume path"
            )
        mask = np.asarray(old.mask, dtype=bool).copy()
        for m in metrics:
            values[m] = np.where(mask, old.values[m], np.nan)

    idx_all = [tuple(int(v) for v in ix) for ix in np.argwhere(~mask)]
    rank, world = 0, 1
    dist_on = False
    if distributed is not False and torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        rank = torch.distributed.get_rank()
        dist_on = world > 1
    elif distributed:
        raise ValueError("distributed=True needs an initialised torch.distributed process group")
    mine = idx_all[rank::world] if dist_on else idx_all

    cls = {"loop": _Evaluator, "linear_first_layer": _LinearFirstEvaluator, "vmap": _VmapEvaluator}[used]
    new_vals = {m: np.zeros(shape) for m in metrics}
    new_mask = np.zeros(shape, dtype=bool)
    accuracy_ok = True
    evaluations = 0
    bar = None
    if progress and rank == 0:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(mine), desc=f"surface ({used})", unit="pt", file=sys.stderr)

    def snapshot(partial: bool) -> Surface:
        vals = {m: np.where(mask, values[m], np.nan) for m in metrics if m != "accuracy" or accuracy_ok}
        return Surface(
            config={**config, "strategy": used, "complete": not partial},
            seconds=time.perf_counter() - t0,
            coords=cs,
            values=vals,
            mask=mask.copy(),
            directions=[{n: t.detach().cpu() for n, t in d.items()} for d in dirs],
            evaluations=evaluations,
            strategy=used,
        )

    last_ckpt = time.perf_counter()
    try:
        with obj.guard(), torch.no_grad():
            for _, m in _bn_modules(obj.model):
                m.training = bn_policy == "train"
            ev = cls(obj, dirs, bn_policy)
            ev.want_accuracy = "accuracy" in metrics
            step = batch_points
            for start in range(0, len(mine), step):
                chunk = mine[start : start + step]
                pts = [tuple(float(cs[a][ix[a]]) for a in range(len(cs))) for ix in chunk]
                res = ev.evaluate(pts)
                evaluations += len(pts)
                for ix, (lv, av) in zip(chunk, res):
                    new_vals["loss"][ix] = lv
                    if "accuracy" in metrics:
                        if av is None:
                            accuracy_ok = False
                        else:
                            new_vals["accuracy"][ix] = av
                    new_mask[ix] = True
                    if not dist_on:
                        mask[ix] = True
                        for mm in metrics:
                            values[mm][ix] = new_vals[mm][ix]
                if bar is not None:
                    bar.update(len(pts))
                if (
                    resume is not None
                    and not dist_on
                    and time.perf_counter() - last_ckpt >= checkpoint_every
                    and start + step < len(mine)
                ):
                    snapshot(True).save(resume)
                    last_ckpt = time.perf_counter()
    except BaseException:
        # keep what is done: an interrupted run resumes from here
        if resume is not None and not dist_on and evaluations > 0:
            snapshot(True).save(resume)
        raise
    finally:
        if bar is not None:
            bar.close()

    if dist_on:
        import torch.distributed as dist

        dev = torch.device("cpu") if dist.get_backend() == "gloo" else obj.device
        cnt = torch.as_tensor(new_mask.astype(np.float64), device=dev)
        dist.all_reduce(cnt)
        for mm in metrics:
            t = torch.as_tensor(np.where(new_mask, new_vals[mm], 0.0), device=dev)
            dist.all_reduce(t)
            values[mm] = np.where(cnt.cpu().numpy() > 0, t.cpu().numpy(), values[mm])
        flag = torch.tensor([1.0 if accuracy_ok else 0.0], device=dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        accuracy_ok = bool(flag.item() > 0)
        mask = mask | (cnt.cpu().numpy() > 0)
        ev_t = torch.tensor([float(evaluations)], device=dev)
        dist.all_reduce(ev_t)
        evaluations = int(ev_t.item())
    if "accuracy" in metrics and not accuracy_ok:
        warnings.warn(
            "accuracy is not defined for these targets (not class labels or 0/1); dropped",
            UserWarning,
            stacklevel=2,
        )
    config["world_size"] = world
    result = snapshot(False)
    if "accuracy" in result.values and not accuracy_ok:
        del result.values["accuracy"]
    if resume is not None and rank == 0:
        result.save(resume)
    return result


# --------------------------------------------------------------------------------------------- CLI


def _build_model(spec: str, kwargs: dict[str, Any]) -> nn.Module:
    import importlib

    from landscape.models import available_models, model_factory

    if ":" in spec:
        mod_name, _, fn_name = spec.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ValueError(f"--model {spec}: cannot import module {mod_name!r} ({exc})") from exc
        fn = getattr(mod, fn_name, None)
        if fn is None:
            raise ValueError(f"--model {spec}: module {mod_name!r} has no attribute {fn_name!r}")
        model = fn(**kwargs)
    elif spec in available_models():
        model = model_factory(spec, **kwargs)
    else:
        raise ValueError(f"--model must be module:function or one of {available_models()}, got {spec!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"--model {spec} returned {type(model).__name__}, not an nn.Module")
    return model


def _run_cli(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from landscape import directions as dmod
    from landscape.data import batches, load_dataset
    from landscape.objective import Objective

    started_dist = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="gloo")
        started_dist = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
        model = _build_model(args.model, json.loads(args.model_kwargs) if args.model_kwargs else {})
        if args.state_dict:
            state = torch.load(args.state_dict, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
                state = state["state_dict"]
            model.load_state_dict(state)
        model = model.to(dtype)
        extra = {"limit": args.limit} if args.limit and not args.data.startswith("digits") else {}
        x, y = load_dataset(args.data, args.split, **extra)
        if args.limit:
            x, y = x[: args.limit], y[: args.limit]
        data = batches(x.to(dtype), y, args.batch_size)
        obj = Objective(model, nn.CrossEntropyLoss(), data, device=args.device)
        n = args.grid
        nx, ny = n[0], n[-1]
        xr = args.range
        yr = args.yrange or args.range
        d1 = dmod.random(obj, args.normalization, seed=args.seed)
        dirs, coords = [d1], [np.linspace(xr[0], xr[1], nx)]
        if args.dims == 2:
            dirs.append(dmod.random(obj, args.normalization, seed=args.seed + 1))
            coords.append(np.linspace(yr[0], yr[1], ny))
        s = surface(
            obj,
            dirs,
            coords,
            bn_policy=args.bn_policy,
            strategy=args.strategy,
            progress=not args.quiet and rank == 0,
            resume=args.out if args.resume else None,
            data_info={
                "spec": args.data,
                "split": args.split,
                "limit": args.limit,
                "batch_size": args.batch_size,
            },
        )
        if rank == 0:
            s.config["state_dict"] = str(args.state_dict) if args.state_dict else None
            s.config["model_spec"] = args.model
            s.save(args.out)
            print(f"wrote {args.out}: {s!r}")
            print(f"loss min {np.nanmin(s.loss):.6g} max {np.nanmax(s.loss):.6g}; {s.seconds:.3g} s")
            if args.html:
                s.to_html(args.html, include_plotlyjs="cdn")
                print(f"wrote {args.html}")
            if args.vtk:
                s.to_vtk(args.vtk)
                print(f"wrote {args.vtk}")
            if args.plot:
                import matplotlib

                matplotlib.use("Agg")
                ax = s.plot()
                ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
                print(f"wrote {args.plot}")
    finally:
        if started_dist:
            dist.destroy_process_group()
    return 0


def add_cli(subparsers: Any) -> None:
    """Register ``python -m landscape surface``."""
    p = subparsers.add_parser(
        "surface",
        help="loss surface of a saved model along random filter-normalised directions",
        description=(
            "Evaluate a 1-D/2-D loss surface of a model on a data set and write a self-describing .npz. "
            "Under torchrun the grid points are split across the ranks (gloo) and gathered."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="module:function returning an nn.Module, or a registered name (mlp, lenet5, resnet, ...)",
    )
    p.add_argument("--model-kwargs", default=None, help="JSON keyword arguments for the model constructor")
    p.add_argument("--state-dict", default=None, help="file saved with torch.save(model.state_dict())")
    p.add_argument(
        "--data", default="digits", help="digits | digits-image | mnist:DIR | fashion-mnist:DIR | cifar10:DIR"
    )
    p.add_argument("--split", default="all", choices=("train", "test", "all"))
    p.add_argument("--limit", type=int, default=None, help="use only the first N examples")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--grid", type=int, nargs="+", default=[51], help="points per axis (one value, or NX NY)")
    p.add_argument("--range", type=float, nargs=2, default=[-1.0, 1.0], metavar=("LO", "HI"))
    p.add_argument("--yrange", type=float, nargs=2, default=None, metavar=("LO", "HI"))
    p.add_argument("--dims", type=int, choices=(1, 2), default=2)
    p.add_argument("--normalization", default="filter", choices=("filter", "layer", "weight", "model"))
    p.add_argument("--seed", type=int, default=0, help="seed of direction 1 (direction 2 uses seed+1)")
    p.add_argument("--bn-policy", default=None, choices=_BN_POLICIES)
    p.add_argument("--strategy", default="auto", choices=_STRATEGIES)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the model's)")
    p.add_argument("--out", required=True, help="output .npz")
    p.add_argument("--resume", action="store_true", help="continue a partial --out file")
    p.add_argument("--plot", default=None, help="also write a matplotlib figure (png/pdf)")
    p.add_argument("--html", default=None, help="also write a Plotly HTML file")
    p.add_argument("--vtk", default=None, help="also write a legacy VTK file for ParaView")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_cli)
