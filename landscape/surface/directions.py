"""Directions in parameter space for loss surfaces: seeded Gaussian with filter / layer / weight
normalisation, top Hessian eigenvectors, PCA of a training trajectory, the line between two models.

A direction is a :class:`Direction`: a plain ``dict`` name -> tensor (parameter names, and buffer
names for :func:`between` with ``include_buffers=True``) that also carries ``.config``, the
JSON-friendly recipe that produced it (kind, seed, normalisation, ...). Surfaces record it.

Filter normalisation follows Li, Xu, Taylor, Studer & Goldstein, "Visualizing the Loss Landscape of
Neural Nets", NeurIPS 2018, Sec. 4 (eq. in the text): for each filter ``j`` of layer ``i``,
``d_ij <- d_ij / ||d_ij|| * ||theta_ij||``, where a filter is one slice along dimension 0 (an output
channel of a Conv / an output neuron of a Linear weight, PyTorch's layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from landscape.checks import check_int, check_positive, check_seed
from landscape.curvature.eigen import eigenvalues

__all__ = ["Direction", "DirectionSet", "random", "eigen", "pca", "between", "named_parameters_of"]

_NORMALIZATIONS = ("filter", "layer", "weight", "model", None)


class Direction(dict):
    """``dict`` name -> tensor with a ``config`` attribute describing how it was made."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None, config: dict | None = None):
        super().__init__(tensors or {})
        self.config: dict[str, Any] = dict(config or {})

    def flat(self, names: Sequence[str] | None = None) -> torch.Tensor:
        """Concatenate the tensors (in ``names`` order, default own order) into one vector."""
        names = list(self) if names is None else names
        return torch.cat([self[n].reshape(-1) for n in names])

    def norm(self) -> float:
        return float(torch.sqrt(sum((t.double() ** 2).sum() for t in self.values())))

    def __repr__(self) -> str:
        return f"Direction({len(self)} tensors, config={self.config})"


class DirectionSet(list):
    """A list of :class:`Direction` with extra information (e.g. PCA explained variance)."""

    def __init__(self, items: Iterable[Direction] = (), **info: Any):
        super().__init__(items)
        self.info: dict[str, Any] = info

    @property
    def explained_variance_ratio(self) -> np.ndarray | None:
        v = self.info.get("explained_variance_ratio")
        return None if v is None else np.asarray(v)


def _is_objective(x: Any) -> bool:
    return hasattr(x, "param_names") and hasattr(x, "params") and hasattr(x, "model")


def named_parameters_of(model_or_obj: Any) -> dict[str, torch.Tensor]:
    """Detached copies of the parameters a direction lives on.

    An Objective gives its selected parameters (in its dtype/device); an ``nn.Module`` its
    parameters that require grad; a dict is used as given.
    """
    if _is_objective(model_or_obj):
        return model_or_obj.params()
    if isinstance(model_or_obj, nn.Module):
        out = {n: p.detach().clone() for n, p in model_or_obj.named_parameters() if p.requires_grad}
        if not out:
            raise ValueError("the model has no parameters that require grad")
        return out
    if isinstance(model_or_obj, Mapping):
        return {n: torch.as_tensor(t).detach().clone() for n, t in model_or_obj.items()}
    raise TypeError(
        "expected an nn.Module, a landscape.Objective or a dict name -> tensor, "
        f"got {type(model_or_obj).__name__}"
    )


def _generator(seed: int | torch.Generator | None) -> tuple[torch.Generator, Any]:
    if isinstance(seed, torch.Generator):
        if seed.device.type != "cpu":
            raise ValueError("pass a CPU torch.Generator (directions are drawn on CPU in float64)")
        return seed, "generator"
    check_seed(seed)
    seed = 0 if seed is None else int(seed)
    return torch.Generator().manual_seed(seed), seed


def _rescale_filters(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Give every slice ``d[j]`` the norm of ``w[j]`` (Li et al. 2018, Sec. 4)."""
    dims = tuple(range(1, d.ndim))
    dn = torch.linalg.vector_norm(d, dim=dims, keepdim=True)
    wn = torch.linalg.vector_norm(w, dim=dims, keepdim=True)
    return d * (wn / dn.clamp_min(torch.finfo(d.dtype).tiny))


def _rescale_whole(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    dn = torch.linalg.vector_norm(d)
    return d * (torch.linalg.vector_norm(w) / dn.clamp_min(torch.finfo(d.dtype).tiny))


def random(
    model_or_obj: Any,
    normalization: str | None = "filter",
    *,
    ignore_1d: bool | str = True,
    seed: int | torch.Generator | None = 0,
    dtype: torch.dtype | None = None,
) -> Direction:
    """A seeded Gaussian direction ``d ~ N(0, I)``, normalised against the weights ``theta``.

    Args:
        model_or_obj: ``nn.Module`` (parameters requiring grad), ``landscape.Objective`` (its
            selected parameters, dtype and device) or a dict name -> tensor.
        normalization:
            ``"filter"`` -- per filter (slice along dim 0: conv output channel / linear output
            neuron), ``d_j <- d_j ||theta_j|| / ||d_j||`` (Li et al. 2018, Sec. 4);
            ``"layer"`` -- per tensor, ``d <- d ||theta|| / ||d||``;
            ``"weight"`` -- elementwise ``d <- d * theta`` (Li et al.'s code, ``--dir_type weights``);
            ``"model"`` -- the whole vector rescaled to ``||theta||``;
            ``None`` -- raw Gaussian.
        ignore_1d: how 1-D tensors (biases, BatchNorm weight/bias) are treated under ``"filter"``
            and ``"layer"``: ``True`` -> zero (Li et al.'s default, ``--xignore biasbn``);
            ``"weight"`` -> the direction equals the weights themselves (their code's other option);
            ``False`` -> normalised like a single filter (``||d|| = ||theta||``).
        seed: int or CPU ``torch.Generator``. Draws happen on CPU in float64 in parameter order,
            so the same seed gives the same direction on every device and dtype.
        dtype: dtype of the returned tensors (default: the parameters').

    Returns:
        :class:`Direction` (dict name -> tensor) with ``config`` = kind, seed, normalisation.
    """
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {_NORMALIZATIONS}, got {normalization!r}")
    if not any(ignore_1d is v for v in (True, False)) and ignore_1d != "weight":
        raise ValueError(f"ignore_1d must be True, False or 'weight', got {ignore_1d!r}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be None or a floating torch.dtype such as torch.float32, got {dtype!r}")
    theta = named_parameters_of(model_or_obj)
    gen, seed_desc = _generator(seed)
    out: dict[str, torch.Tensor] = {}
    for name, w in theta.items():
        w64 = w.detach().to(device="cpu", dtype=torch.float64)
        d = torch.randn(w.shape, generator=gen, dtype=torch.float64)
        if normalization in ("filter", "layer") and w.ndim <= 1:
            if ignore_1d is True:
                d = torch.zeros_like(d)
            elif ignore_1d == "weight":
                d = w64.clone()
            else:
                d = _rescale_whole(d, w64)
        elif normalization == "filter":
            d = _rescale_filters(d, w64)
        elif normalization == "layer":
            d = _rescale_whole(d, w64)
        elif normalization == "weight":
            d = d * w64
        out[name] = d
    if normalization == "model":
        total_d = torch.sqrt(sum((d**2).sum() for d in out.values()))
        total_w = torch.sqrt(sum((w.detach().double().cpu() ** 2).sum() for w in theta.values()))
        out = {n: d * (total_w / total_d) for n, d in out.items()}
    result = {n: d.to(device=theta[n].device, dtype=dtype or theta[n].dtype) for n, d in out.items()}
    config = {
        "kind": "random",
        "distribution": "gaussian",
        "seed": seed_desc,
        "normalization": normalization,
        "ignore_1d": ignore_1d,
        "names": list(result),
    }
    return Direction(result, config)


def eigen(
    obj: Any, k: int = 2, *, which: str = "largest", seed: int = 0, tol: float = 1e-6, **kwargs
) -> DirectionSet:
    """The top-``k`` Hessian eigenvectors of ``obj`` (unit norm) as directions.

    Uses :func:`landscape.eigenvalues` (thick-restart Lanczos) on the Hessian of the Objective;
    the eigenvalues, residuals and convergence flags are kept in ``.info`` and each direction's
    ``config``. Eigenvector signs are fixed so the largest-magnitude entry is positive.
    """
    if not _is_objective(obj):
        raise TypeError("eigen directions need a landscape.Objective (the Hessian of its loss)")
    check_positive("k", k, integer=True)

    res = eigenvalues(obj, k=k, which=which, seed=seed, tol=tol, **kwargs)
    vecs = res.vectors
    dirs = []
    for i in range(k):
        v = vecs[:, i].to(torch.float64)
        if v[v.abs().argmax()] < 0:
            v = -v
        parts = obj.unflatten(v.to(device=obj.device, dtype=obj.dtype))
        dirs.append(
            Direction(
                {n: t.clone() for n, t in parts.items()},
                {
                    "kind": "eigen",
                    "index": i,
                    "which": which,
                    "eigenvalue": float(res.values[i]),
                    "residual": float(res.residuals[i]) if res.residuals is not None else None,
                    "converged": bool(res.converged[i]) if res.converged else None,
                    "seed": seed,
                    "names": list(parts),
                },
            )
        )
    return DirectionSet(
        dirs,
        eigenvalues=[float(v) for v in res.values[:k]],
        converged=list(res.converged[:k]),
        matvecs=res.matvecs,
    )


def _trajectory_matrix(trajectory: Any) -> tuple[torch.Tensor, list[str], list[torch.Size]]:
    """``[T, p]`` float64 matrix, names and shapes from a Trajectory, list of dicts/models or tensor."""
    if hasattr(trajectory, "weights") and hasattr(trajectory, "names"):
        w = trajectory.weights
        if w is None or len(w) == 0:
            raise ValueError("the trajectory holds no stored weights (record with store=True)")
        return torch.as_tensor(w, dtype=torch.float64), list(trajectory.names), list(trajectory.shapes)
    if isinstance(trajectory, (list, tuple)) and trajectory:
        items = [named_parameters_of(t) for t in trajectory]
        names = list(items[0])
        for i, it in enumerate(items):
            if list(it) != names:
                raise ValueError(f"trajectory point {i} has parameter names {list(it)}, expected {names}")
        shapes = [items[0][n].shape for n in names]
        mat = torch.stack([torch.cat([it[n].double().cpu().reshape(-1) for n in names]) for it in items])
        return mat, names, shapes
    raise TypeError(
        "trajectory must be a landscape.surface.trajectory.Trajectory(-Recorder) or a non-empty list of "
        "models / dicts name -> tensor"
    )


def pca(
    trajectory: Any,
    k: int = 2,
    *,
    origin: str | Mapping[str, torch.Tensor] | nn.Module = "last",
    center: bool = True,
    like: Any = None,
) -> DirectionSet:
    """Principal directions of a recorded training trajectory (Li et al. 2018, Sec. 7).

    The rows ``theta_t - origin`` (origin: the final point by default, as in the paper) are
    centred (``center=True``, as sklearn's PCA in their code) and decomposed by SVD,
    ``M = U S V^T``; the directions are the first ``k`` rows of ``V^T`` (unit norm, sign fixed so
    the largest-magnitude entry is positive). ``.info`` holds ``explained_variance`` (``S^2/(T-1)``)
    and ``explained_variance_ratio`` over all components.

    ``like``: an optional model/Objective whose parameters give the returned tensors' dtype/device.
    """
    mat, names, shapes = _trajectory_matrix(trajectory)
    T, p = mat.shape
    check_int("k", k, minimum=1, maximum=min(T, p))
    if isinstance(origin, str):
        if origin not in ("last", "first"):
            raise ValueError(f"origin must be 'last', 'first', a model or a dict, got {origin!r}")
        o = mat[-1] if origin == "last" else mat[0]
        origin_desc = origin
    else:
        od = named_parameters_of(origin)
        missing = [n for n in names if n not in od]
        wrong = [n for n, shp in zip(names, shapes) if n in od and tuple(od[n].shape) != tuple(shp)]
        if missing or wrong:
            raise ValueError(
                f"origin does not match the trajectory: missing {missing}, other shapes {wrong}; pass "
                "the model (or dict) the trajectory was recorded from"
            )
        o = torch.cat([od[n].double().cpu().reshape(-1) for n in names])
        origin_desc = "given"
    if not bool(torch.isfinite(mat).all()) or not bool(torch.isfinite(o).all()):
        raise ValueError("the trajectory (or origin) contains NaN or inf weights; PCA is undefined")
    m = mat - o
    if center:
        m = m - m.mean(dim=0, keepdim=True)
    _, s, vt = torch.linalg.svd(m, full_matrices=False)
    rank_tol = float(s[0]) * max(T, p) * torch.finfo(torch.float64).eps if s.numel() else 0.0
    rank = int((s > rank_tol).sum())
    if rank < k:
        raise ValueError(
            f"the {'centred ' if center else ''}trajectory has only {rank} non-zero principal "
            f"component(s), so {k} PCA directions are undefined (a direction of zero variance is "
            f"arbitrary); record more (distinct) points or ask for k <= {rank}"
        )
    var = s**2 / max(T - 1, 1)
    ratio = var / var.sum() if float(var.sum()) > 0 else torch.zeros_like(var)
    ref = named_parameters_of(like) if like is not None else None
    dirs = []
    for i in range(k):
        v = vt[i]
        if v[v.abs().argmax()] < 0:
            v = -v
        parts, off = {}, 0
        for n, shp in zip(names, shapes):
            numel = int(np.prod(shp)) if len(shp) else 1
            t = v[off : off + numel].reshape(shp).clone()
            if ref is not None and n in ref:
                t = t.to(device=ref[n].device, dtype=ref[n].dtype)
            parts[n] = t
            off += numel
        dirs.append(
            Direction(
                parts,
                {
                    "kind": "pca",
                    "index": i,
                    "explained_variance_ratio": float(ratio[i]),
                    "num_points": T,
                    "origin": origin_desc,
                    "center": center,
                    "names": names,
                },
            )
        )
    return DirectionSet(
        dirs,
        explained_variance=var.tolist(),
        explained_variance_ratio=ratio.tolist(),
        singular_values=s.tolist(),
    )


def between(model_a: Any, model_b: Any, *, include_buffers: bool = False) -> Direction:
    """The line from ``model_a`` to ``model_b``: ``d = theta_b - theta_a`` (so ``x = 1`` is ``b``).

    ``include_buffers=True`` also interpolates floating buffers (BatchNorm running statistics),
    so the surface at ``x = 1`` evaluates model ``b`` with its own statistics.
    """
    for m in (model_a, model_b):
        if not isinstance(m, nn.Module):
            raise TypeError(f"between() takes two nn.Modules, got {type(m).__name__}")
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    if list(pa) != list(pb) or any(pa[n].shape != pb[n].shape for n in pa):
        raise ValueError(
            "the two models have different parameter names or shapes; they must share an architecture"
        )
    out = {
        n: (pb[n].detach() - pa[n].detach().to(pb[n].device)).to(pa[n].dtype)
        for n in pa
        if pa[n].requires_grad
    }
    if include_buffers:
        ba, bb = dict(model_a.named_buffers()), dict(model_b.named_buffers())
        if list(ba) != list(bb):
            raise ValueError("the two models have different buffers")
        for n in ba:
            if ba[n].is_floating_point():
                out[n] = (bb[n].detach() - ba[n].detach().to(bb[n].device)).to(ba[n].dtype)
    return Direction(out, {"kind": "between", "include_buffers": include_buffers, "names": list(out)})
