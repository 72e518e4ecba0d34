"""Curvature matrices of an :class:`~landscape.objective.Objective` as matrix-free linear operators.

All operators are ``p x p`` symmetric matrices at a fixed point ``theta`` (the objective's current
parameters when the operator is built, or ``params=``), for the whole-dataset loss
``L = sum_b w_b l(f(X_b), y_b)`` with ``w_b = |B_b|/N`` (mean) or ``1`` (sum):

* Hessian ``H = d^2 L / d theta^2`` (:class:`HessianOperator`, ``landscape.curvature.hessian``).
* Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` with ``J_b = df(X_b)/dtheta`` and
  ``H_out,b = d^2 l / d f^2`` obtained by autodiff, so any twice-differentiable loss works
  (Schraudolph 2002, "Fast curvature matrix-vector products", eq. 8; Martens 2020, "New insights
  and perspectives on the natural gradient method", Sec. 8).
* Empirical Fisher ``F_emp = c sum_n g_n g_n^T``, ``g_n`` the gradient of the loss of example ``n``
  alone (same reduction), ``c = 1/N`` (mean) or ``1`` (sum) (Kunstner et al. 2019, "Limitations of
  the empirical Fisher approximation", eq. 3).
* Monte-Carlo Fisher ``F_MC = (c/S) sum_n sum_s g_n(yhat_ns) g_n(yhat_ns)^T`` with labels
  ``yhat_ns`` drawn from the model's predictive distribution (Martens 2020, Sec. 9.2; Kunstner et
  al. 2019, eq. 2).  For cross-entropy ``E_yhat[g g^T] = J^T (diag(p) - p p^T) J = J^T H_out J``,
  so ``F_MC -> G`` as ``S -> infinity``; the same holds for ``BCEWithLogitsLoss`` with one logit.

Every operator exposes ``shape``, ``dtype``, ``device``, ``@``, ``matvec``, ``matmat``, ``to_scipy``,
``to_dense``, ``objective``, ``matvecs`` (count of matrix-vector products) and ``config()``.

Dtypes are never mixed silently: ``op @ v`` needs ``v.dtype == op.dtype`` and returns that dtype; any
other dtype (a float64 vector on a float32 operator, or the reverse) raises ``TypeError`` naming both
and the fix (``v.to(op.dtype)``, or an ``Objective(..., dtype=...)`` of the vector's dtype), as
``torch.matmul`` refuses mixed dtypes.  ``to_scipy()`` is the one explicit cast: scipy's float64
vectors are cast to ``op.dtype`` for the product and the result back to float64.  Vectors on
another device are moved to ``op.device``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from landscape.curvature.autotune import PathTimer, width_class
from landscape.curvature.memory import BlockBudget, make_budget
from landscape.objective import Objective


def _all_finite(t: torch.Tensor) -> bool:
    """True when ``t`` has no NaN/inf: a NaN propagates into ``aminmax`` and an inf is an extreme, so
    two scalars decide it (16x cheaper than ``isfinite(t).all()`` on a 1.9M-entry block)."""
    if t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def math_attention() -> contextlib.AbstractContextManager:
    """Differentiable attention for the duration of a product: scaled-dot-product attention on the
    math backend, and no fused inference path of ``nn.MultiheadAttention`` / ``nn.Transformer*``.

    The flash and memory-efficient SDPA kernels (the CPU default for ``nn.MultiheadAttention``) have
    neither forward-mode AD nor a double backward (torch 2.13: "derivative for
    aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"), and the fused
    eval-mode encoder layer (``aten::_transformer_encoder_layer_fwd``, taken when the parameters do
    not require grad, as under ``torch.func.jvp``) has no forward-mode AD; Hessian, GGN and Fisher
    products need both.  The math backend is built from differentiable ops.  Models without
    attention are unaffected; nothing is switched when it is off already."""
    stack = contextlib.ExitStack()
    mha = getattr(torch.backends, "mha", None)
    if mha is not None and hasattr(mha, "get_fastpath_enabled") and mha.get_fastpath_enabled():
        mha.set_fastpath_enabled(False)
        stack.callback(mha.set_fastpath_enabled, True)
    cb = torch.backends.cuda
    fused = [getattr(cb, f"{n}_sdp_enabled", lambda: False)() for n in ("flash", "mem_efficient", "cudnn")]
    if any(fused) or not cb.math_sdp_enabled():
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel
        except ImportError:  # pragma: no cover - torch without torch.nn.attention
            return stack
        stack.enter_context(sdpa_kernel(SDPBackend.MATH))
    return stack


@contextlib.contextmanager
def saved_tensor_bytes(skip: Iterable[torch.Tensor] = ()) -> Iterator[dict[int, int]]:
    """Count what autograd saves for the backward inside the block: yields a dict ``storage -> bytes``
    of the distinct storages saved (those of ``skip`` excluded: what exists anyway); sum its values
    after the block.  Saved tensors without a storage (tensor subclasses) are not counted."""
    skip_ptrs = {t.untyped_storage().data_ptr() for t in skip}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
        except Exception:  # noqa: BLE001 - e.g. a tensor subclass without storage
            return t
        if st.data_ptr() not in skip_ptrs:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


class _AffineEvalBatchNorm(TorchFunctionMode):
    """``F.batch_norm`` on running statistics as the per-channel affine map it is (see
    :func:`product_kernels`); every other call, train-mode batch norm included, passes through."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.batch_norm:
            out = _eval_batch_norm(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _eval_batch_norm(x, mean, var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """``(x - mean) * (weight / sqrt(var + eps)) + bias`` per channel, or ``None`` where the native
    kernel must run (batch statistics, missing statistics, mixed dtypes, fewer than 2 dims)."""
    if training or mean is None or var is None or x.dim() < 2:
        return None
    if any(t is not None and t.dtype != x.dtype for t in (mean, var, weight, bias)):
        return None
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = weight * scale
    out = (x - mean.view(shape)) * scale.view(shape)  # not addcmul: its backward saves grad * value
    return out if bias is None else out + bias.view(shape)


def product_kernels() -> contextlib.AbstractContextManager:
    """The kernels every curvature product runs with: :func:`math_attention`, and eval-mode batch
    norm as its affine map.

    In eval mode ``BatchNorm`` is ``y = (x - m) s + b`` with ``s = w / sqrt(v + eps)`` per channel.
    ``F.batch_norm``'s derivatives are the general (batch-statistics) formulas: its double backward
    (``NativeBatchNormBackwardBackward``) was 14% of a ResNet-20 Hessian-vector product on CPU; the
    same map written as ``sub``, ``mul``, ``add`` gives the same numbers to rounding (the centred form
    keeps ``d/dw = sum(g (x - m)) / sqrt(v + eps)`` free of cancellation) with cheaper first and
    second derivatives.  Train-mode batch norm (batch statistics) is left to the native kernel."""
    stack = contextlib.ExitStack()
    stack.enter_context(math_attention())
    stack.enter_context(_AffineEvalBatchNorm())
    return stack


class CurvatureOperator:
    """Base class: a symmetric ``p x p`` curvature matrix at a fixed point, applied matrix-free.

    The base owns everything around a product: :meth:`matmat` validates the block (shape, dtype,
    finite), restores the model's train/eval flags (products only see private copies of parameters
    and buffers), runs the product kernels (:func:`product_kernels`), splits the columns within
    ``max_memory`` (:mod:`landscape.curvature.memory`; ``None``: no limit, nothing measured), sums
    over ranks, checks the result and counts products; :meth:`_run` is the one loop over batches.

    A subclass supplies its per-batch products, ``product(batch, V) -> [p, k]`` with ``batch`` a
    :meth:`_new_batch` state (the batch and what the operator keeps of it), named in ``PRODUCTS``
    (path -> method), and :meth:`_choose`, the one function that picks the path a block runs on
    (like ``torch.optim.sgd`` picking ``_single_tensor``/``_multi_tensor``/``_fused``).  A path left
    to measurement (``_choose`` returns ``None``) is timed once per width class by
    :class:`~landscape.curvature.autotune.PathTimer` (:meth:`_calibrate`).
    """

    name = "curvature"
    PRODUCTS: dict[str, str] = {}  # path -> name of the per-batch product method
    _uses_per_example = False  # built from per-example gradients (undefined for a random forward)
    _budget: BlockBudget | None = None  # max_memory=None: one pass per block, nothing measured
    _timer: PathTimer | None = None  # calibrate: the candidate paths timed per width class
    _keep_batches = False  # keep the per-batch states (graphs, factors) between products
    _strict = False  # True while the paths are timed: a failing path raises (and is dropped)
    _reduce_products = True  # sum products over ranks (False: the operator's factors are summed already)

    def __init__(self, objective: Objective, params: Any = None, max_memory: Any = None) -> None:
        if not isinstance(objective, Objective):
            raise TypeError(f"expected a landscape.Objective, got {type(objective).__name__}")
        self._budget = make_budget(max_memory, objective.device, self.name)
        # non-finite data, or a forward drawing random numbers without stochastic="fixed": refuse
        objective.require_fixed(self.name.replace("_", " "), per_example=self._uses_per_example)
        self.objective = objective
        full = objective.point(params)
        # private copies: products never touch (or alias) the caller's parameters
        self._theta = {n: full[n].detach().clone() for n in objective.param_names}
        self._frozen = {n: t.detach().clone() for n, t in full.items() if n not in self._theta}
        p = objective.num_params
        self.shape = (p, p)
        self.dtype = objective.dtype
        self.device = objective.device
        self.matvecs = 0
        self._kept: list[Any] | None = None

    # ------------------------------------------------------------------ to implement
    def _choose(self, k: int) -> str | None:
        """The path a block of ``k`` columns runs on (``None``: time the candidates first)."""
        return next(iter(self.PRODUCTS))

    def _new_batch(self, index: int, x: Any, y: torch.Tensor, w: float, bufs: dict[str, torch.Tensor]) -> Any:
        """The state of batch ``index`` the products receive (default: the batch itself)."""
        return (x, y, w, bufs)

    def _calibrated(self, k: int) -> None:
        """After the timed first block of ``k`` columns (record the choice)."""

    def _extra_config(self) -> dict[str, Any]:
        return {}

    def _calibration(self, calibrate, name: str, mode: str, what: str, paths, timer, passthrough=()) -> None:
        """``calibrate=``: with ``name="auto"`` the ``paths`` are timed (``PathTimer``, clock ``timer``)
        if ``True``, or if ``"auto"`` on any device but the CPU (which runs its measured default)."""
        if calibrate not in (True, False, "auto"):
            raise ValueError(f"calibrate must be True, False or 'auto', got {calibrate!r}")
        if calibrate is True and mode != "auto":
            raise ValueError(
                f"calibrate=True times {what} against each other: use {name}='auto', not {mode!r}"
            )
        self.calibrate = mode == "auto" and (
            calibrate is True or (calibrate == "auto" and self.device.type != "cpu")
        )
        if self.calibrate:
            self._timer = PathTimer(paths, self.device, timer or time.perf_counter, passthrough=passthrough)

    def _path_key(self, k: int) -> str:
        """The product path a block of ``k`` columns runs on: memory fits are kept per path."""
        return f"{self._choose(k) or 'uncalibrated'}/{width_class(k)}"

    # ------------------------------------------------------------------ the loop over batches
    def _batches(self) -> Iterator[Any]:
        """The per-batch states of one pass: kept ones (``_keep_batches``), or new ones."""
        if self._kept is not None:
            yield from self._kept
            return
        obj, kept = self.objective, []
        bufs = obj.buffers()  # copies, once per pass
        for i, (x, y, w) in enumerate(obj.batches()):
            batch = self._new_batch(i, x, y, w, bufs)
            if self._keep_batches:
                kept.append(batch)
            yield batch
            del batch  # not kept: freed before the next batch's state is built
        if self._keep_batches:
            self._kept = kept

    def _run(self, path: str, V: torch.Tensor) -> torch.Tensor:
        """``A V = sum_b A_b V`` on the local data with the per-batch product of ``path``."""
        product = getattr(self, self.PRODUCTS[path])
        total = None
        for batch in self._batches():
            part = product(batch, V)
            total = part if total is None else total.add_(part)
            del batch, part  # an uncached graph is freed before the next batch's is built
        return total

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        """``A V`` for one chunk of columns on the local data: the chosen path, or its calibration."""
        path = self._choose(int(V.shape[1]))
        return self._calibrate(V) if path is None else self._run(path, V)

    def _calibrate(self, V: torch.Tensor) -> torch.Tensor:
        """The first block of a width class: every candidate path timed (untimed run, timed run;
        :class:`~landscape.curvature.autotune.PathTimer`), the fastest kept; the result is its."""
        self._strict = True  # a path failing while timed is dropped, not patched by a fallback
        try:
            out = self._timer.run(V, self._run)
        finally:
            self._strict = False
        self._calibrated(int(V.shape[1]))
        return out

    # ------------------------------------------------------------------ shared helpers
    def _split(self, V: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[p, k]`` -> dict name -> ``[k, *shape]``."""
        obj = self.objective
        out, off = {}, 0
        for n, shape, numel in zip(obj.param_names, obj.param_shapes, obj.param_numels):
            out[n] = V[off : off + numel].T.reshape(V.shape[1], *shape)
            off += numel
        return out

    def _join(self, d: dict[str, torch.Tensor], k: int) -> torch.Tensor:
        """dict name -> ``[k, *shape]`` -> ``[k, p]``."""
        return torch.cat([d[n].reshape(k, -1) for n in self.objective.param_names], dim=1)

    def _full(self, sel: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**self._frozen, **sel}

    # ------------------------------------------------------------------ public
    def matmat(self, V: torch.Tensor) -> torch.Tensor:
        """``A @ V`` for ``V`` of shape ``[p, k]`` and dtype ``self.dtype`` (summed over ranks under
        torch.distributed)."""
        p = self.shape[0]
        if not isinstance(V, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape [{p}, k], got {type(V).__name__}")
        if V.ndim != 2 or V.shape[0] != p:
            raise ValueError(
                f"expected a block of shape [{p}, k] (the operator is {p} x {p}), got {tuple(V.shape)}"
            )
        self._check_dtype(V, "block")
        V = V.to(device=self.device)
        if V.shape[1] == 0:
            return V.clone()
        if not _all_finite(V):
            raise ValueError(f"the block multiplied by the {self.name} operator contains NaN/inf entries")
        # Products run on private parameter copies and buffer copies (``objective.buffers()``), fill
        # every module slot exactly once (``Objective.call``) and never call ``.backward`` on
        # the model, so only the train/eval flags need restoring (every module's, also those the
        # forward switches itself): a full ``guard()`` snapshot per product would cost a copy of the
        # model every time.  Attention runs on the math SDPA backend (second-order AD, see above).
        with self.objective.evaluating(), product_kernels():
            out = self._chunked(V)
        if self._reduce_products:
            out = self.objective.all_reduce(out)
        self._check_finite(out)
        self.matvecs += V.shape[1]
        return out

    def _chunked(self, V: torch.Tensor) -> torch.Tensor:
        """``A V`` on the local data, in chunks of columns within ``max_memory`` (the one loop over them)."""
        return self._matmat(V) if self._budget is None else self._budget.run(V, self._matmat, self._path_key)

    def _check_finite(self, out: torch.Tensor) -> None:
        """A NaN/inf product names the parameters whose rows are affected (instead of NaN results)."""
        if _all_finite(out):
            return
        rows = ~torch.isfinite(out).all(dim=1)
        obj, names, off = self.objective, [], 0
        for n, numel in zip(obj.param_names, obj.param_numels):
            if bool(rows[off : off + numel].any()):
                names.append(n)
            off += numel
        raise ValueError(
            f"the {self.name} product is not finite in the rows of parameter(s) {names}: the gradient "
            "or its derivative is NaN/inf there at this point (e.g. sqrt, norm or pow at 0, log of 0, "
            "overflow in float32); check the model at this point or use dtype=torch.float64"
        )

    def _check_dtype(self, V: torch.Tensor, what: str) -> None:
        """Refuse a vector/block of another dtype than the operator's (no silent cast)."""
        if V.dtype != self.dtype:
            raise TypeError(
                f"the {self.name} operator is {self.dtype} but the {what} multiplied by it is {V.dtype}: "
                f"mixed dtypes are not cast silently; cast the {what} explicitly (v.to(op.dtype)), or "
                f"build the operator from an Objective(..., dtype={V.dtype}) to compute in {V.dtype}"
            )

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``A @ v`` for ``v`` of shape ``[p]`` and dtype ``self.dtype``."""
        p = self.shape[0]
        if not isinstance(v, torch.Tensor) or v.ndim != 1 or v.shape[0] != p:
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"expected a vector of shape [{p}] (the operator is {p} x {p}), got {got}")
        self._check_dtype(v, "vector")
        return self.matmat(v.reshape(-1, 1)).reshape(-1)

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        return self.matvec(v) if isinstance(v, torch.Tensor) and v.ndim == 1 else self.matmat(v)

    def to_scipy(self):
        """A ``scipy.sparse.linalg.LinearOperator`` (float64 numpy in and out; the vectors are cast to
        ``self.dtype`` for the product, so a float32 operator computes in float32)."""
        from scipy.sparse.linalg import LinearOperator  # scipy: needed only here (optional elsewhere)

        def mv(x: np.ndarray) -> np.ndarray:
            t = torch.as_tensor(np.asarray(x, dtype=np.float64).reshape(-1)).to(self.dtype)
            return self.matvec(t).detach().to("cpu", torch.float64).numpy()

        def mm(X: np.ndarray) -> np.ndarray:
            t = torch.as_tensor(np.asarray(X, dtype=np.float64)).to(self.dtype)
            return self.matmat(t).detach().to("cpu", torch.float64).numpy()

        return LinearOperator(self.shape, matvec=mv, rmatvec=mv, matmat=mm, dtype=np.float64)

    def to_dense(self, chunk_size: int = 64) -> torch.Tensor:
        """The full ``p x p`` matrix, ``chunk_size`` columns at a time (``p`` products)."""
        p = self.shape[0]
        out = torch.empty(p, p, dtype=self.dtype, device=self.device)
        for start in range(0, p, chunk_size):
            stop = min(p, start + chunk_size)
            E = torch.zeros(p, stop - start, dtype=self.dtype, device=self.device)
            E[torch.arange(start, stop), torch.arange(stop - start)] = 1.0
            out[:, start:stop] = self.matmat(E)
        return out

    def config(self) -> dict[str, Any]:
        budget = None if self._budget is None else self._budget.config()
        return {
            "operator": self.name,
            "objective": self.objective.config(),
            **self._extra_config(),
            "memory_budget": budget,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, device={self.device})"
