"""Normalise the inputs accepted by the spectral estimators and count their matrix-vector products.

The eigen/trace/density routines accept

* any *linear operator*: an object with ``.shape == (p, p)``, ``.dtype``, ``.device`` and
  ``matmat(V [p, k]) -> [p, k]`` (e.g. :class:`landscape.curvature.CurvatureOperator`);
* a dense symmetric ``torch.Tensor`` (or numpy array) of shape ``[p, p]``;
* a :class:`landscape.Objective`, meaning its Hessian (``landscape.curvature.hessian``).

:func:`as_linop` wraps any of them in a :class:`LinOp` that computes in float64 (inputs are cast to
the operator's dtype for the call and the result back to float64) and counts every column it
multiplies in ``.matvecs``.  :func:`blocks` splits an input into its diagonal blocks (one per
parameter tensor) for the ``per_layer=True`` options.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from landscape.checks import check_int, check_seed
from landscape.curvature.autocompile import auto_compile
from landscape.curvature.hessian import hessian
from landscape.objective import Objective

__all__ = ["LinOp", "as_linop", "blocks", "make_generator", "is_objective"]


def is_objective(obj: Any) -> bool:
    """True for a :class:`landscape.Objective`."""
    return isinstance(obj, Objective)


class LinOp:
    """A float64 view of a symmetric linear operator with a matvec counter.

    ``matmat(V)`` accepts ``[p]`` or ``[p, k]`` tensors of any floating dtype and returns float64
    on ``self.device``; ``matvecs`` counts the columns multiplied so far.
    """

    def __init__(self, fn, p: int, dtype: torch.dtype, device: torch.device, source: str, base: Any = None):
        self._fn = fn
        self.p = int(p)
        self.shape = (self.p, self.p)
        self.op_dtype = dtype
        self.dtype = torch.float64
        self.device = torch.device(device)
        self.source = source
        self.base = base
        self.matvecs = 0

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        vec = V.ndim == 1
        if vec:
            V = V[:, None]
        if V.ndim != 2 or V.shape[0] != self.p:
            raise ValueError(f"expected a [{self.p}, k] block of vectors, got shape {tuple(V.shape)}")
        if V.shape[1] == 0:
            return torch.zeros(self.p, 0, dtype=torch.float64, device=self.device)
        out = self._fn(V.to(device=self.device, dtype=self.op_dtype))
        if not isinstance(out, torch.Tensor):
            out = torch.as_tensor(np.asarray(out))
        out = out.to(device=self.device, dtype=torch.float64).reshape(self.p, V.shape[1])
        self.matvecs += V.shape[1]
        if not bool(torch.isfinite(out).all()):
            raise ValueError(
                f"the operator ({self.source}) returned NaN/inf in a matrix-vector product: the loss or "
                "its curvature is not finite at this point; check the parameters and the data (or "
                "evaluate in float64)"
            )
        return out[:, 0] if vec else out

    __matmul__ = matmat

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"source": self.source, "p": self.p, "dtype": str(self.op_dtype)}
        base_cfg = getattr(self.base, "config", None)
        if callable(base_cfg):
            try:
                cfg["operator"] = base_cfg()
            except Exception:  # a config is informative only; never fail the analysis for it
                pass
        return cfg


def _check_symmetric(A: torch.Tensor) -> None:
    scale = float(A.abs().max()) if A.numel() else 0.0
    tol = 1e-6 if A.dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-10
    if scale > 0 and float((A - A.T).abs().max()) > tol * scale:
        raise ValueError(
            "the dense matrix is not symmetric; the spectral estimators need a symmetric operator "
            "(pass 0.5 * (A + A.T) if that is what you mean)"
        )


def as_linop(
    op: Any, *, device: str | torch.device | None = None, compile: bool | str = False, products: int = 0
) -> LinOp:
    """Wrap an operator, a dense symmetric tensor/array or an Objective (its Hessian).

    ``compile``: ``True``/``"auto"`` compile a Hessian or GGN operator's products (always / when
    the ``products`` the caller will run pay for it), :mod:`landscape.curvature.autocompile`."""
    if isinstance(op, LinOp):
        return op
    if compile is not False:
        if is_objective(op):
            op = hessian(op)
        op = auto_compile(op, products, compile)
    if isinstance(op, np.ndarray):
        op = torch.from_numpy(op)
    if isinstance(op, torch.Tensor):
        if op.ndim != 2 or op.shape[0] != op.shape[1]:
            raise ValueError(f"a dense operator must be a square [p, p] matrix, got shape {tuple(op.shape)}")
        if not op.is_floating_point():
            raise TypeError(f"a dense operator must have a floating dtype, got {op.dtype}")
        if device is not None:
            op = op.to(device)
        if not bool(torch.isfinite(op).all()):
            raise ValueError("the dense matrix contains NaN or inf entries; pass a finite symmetric matrix")
        _check_symmetric(op)
        A = op.detach()
        return LinOp(lambda V: A @ V, A.shape[0], A.dtype, A.device, "dense", base=None)
    if hasattr(op, "matmat") and hasattr(op, "shape"):
        shape = tuple(op.shape)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ValueError(f"the operator must be square (p, p), got shape {shape}")
        dtype = getattr(op, "dtype", torch.float64)
        if not isinstance(dtype, torch.dtype):  # e.g. a scipy LinearOperator
            return _scipy_linop(op)
        dev = getattr(op, "device", "cpu")
        return LinOp(op.matmat, shape[0], dtype, torch.device(dev), type(op).__name__, base=op)
    if is_objective(op):
        return as_linop(hessian(op))
    raise TypeError(
        f"cannot use a {type(op).__name__} as a linear operator: pass an object with .shape, .dtype, "
        ".device and matmat(V) (e.g. ls.hessian(obj)), a dense symmetric torch.Tensor, or an Objective"
    )


def _scipy_linop(op: Any) -> LinOp:
    def fn(V: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(np.asarray(op.matmat(V.cpu().numpy())), dtype=torch.float64)

    return LinOp(fn, op.shape[0], torch.float64, torch.device("cpu"), type(op).__name__, base=op)


def _objective_of(op: Any) -> Any:
    if is_objective(op):
        return op
    base = op.base if isinstance(op, LinOp) else op
    obj = getattr(base, "objective", None)
    return obj if obj is not None and is_objective(obj) else None


class _BlockOp:
    """The diagonal block ``P_b^T A P_b`` of an operator (``P_b`` selects an index range)."""

    def __init__(self, op: LinOp, start: int, stop: int):
        self.op, self.start, self.stop = op, start, stop
        self.shape = (stop - start, stop - start)
        self.dtype = torch.float64
        self.device = op.device

    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(self.op.p, V.shape[1], dtype=torch.float64, device=self.device)
        full[self.start : self.stop] = V.to(device=self.device, dtype=torch.float64)
        return self.op.matmat(full)[self.start : self.stop]

    def config(self) -> dict[str, Any]:
        return {"block": [self.start, self.stop], "of": self.op.config()}


def blocks(op: Any, per_layer: bool | Mapping[str, int]) -> dict[str, Any]:
    """Split an input into named diagonal blocks.

    * ``per_layer`` a mapping ``name -> size`` (sizes adding up to ``p``): consecutive diagonal
      blocks of any operator (each block matvec costs one matvec of the full operator).
    * ``per_layer=True`` with an :class:`Objective` (or an operator built from one, with an
      ``objective`` attribute): one block per parameter tensor. For an Objective the block is the
      Hessian of ``obj.subset([name])``; for an operator with a ``subset`` method, ``op.subset``;
      otherwise the diagonal block of the operator by index range.
    """
    if isinstance(per_layer, Mapping):
        sizes = {str(k): check_int(f"per_layer[{k!r}]", v, minimum=1) for k, v in per_layer.items()}
        lin = as_linop(op)
        if sum(sizes.values()) != lin.p:
            raise ValueError(
                f"per_layer sizes {list(sizes.values())} must be positive and add up to p = {lin.p}"
            )
        out, start = {}, 0
        for name, size in sizes.items():
            out[name] = _BlockOp(lin, start, start + size)
            start += size
        return out
    if per_layer is not True:
        raise TypeError(f"per_layer must be True/False or a mapping name -> block size, got {per_layer!r}")
    obj = _objective_of(op)
    if obj is None:
        raise TypeError(
            "per_layer=True needs an Objective or an operator built from one (with .objective); for "
            "other operators pass per_layer={name: block_size, ...}"
        )
    names = list(obj.param_names)
    if is_objective(op):
        return {n: hessian(obj.subset([n])) for n in names}
    base = op.base if isinstance(op, LinOp) else op
    if callable(getattr(base, "subset", None)):
        return {n: base.subset([n]) for n in names}
    sizes = {n: int(torch.Size(s).numel()) for n, s in zip(names, obj.param_shapes)}
    return blocks(op, sizes)


def make_generator(seed: int | torch.Generator | None) -> torch.Generator:
    """A CPU generator from a seed (probes are drawn on the CPU, then moved: device-independent)."""
    check_seed(seed)
    if isinstance(seed, torch.Generator):
        return seed
    return torch.Generator().manual_seed(0 if seed is None else int(seed))


def rademacher(p: int, k: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``[p, k]`` float64 Rademacher (+-1) probes drawn on the CPU from ``gen``."""
    z = torch.randint(0, 2, (k, p), generator=gen, dtype=torch.int8).T  # probe j: draws j*p..(j+1)*p-1
    return (2.0 * z.to(torch.float64) - 1.0).to(device)


def gaussian(p: int, k: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(p, k, generator=gen, dtype=torch.float64).to(device)


def seed_config(seed: int | torch.Generator | None) -> Any:
    return "generator" if isinstance(seed, torch.Generator) else seed
