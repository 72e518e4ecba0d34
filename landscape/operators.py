"""Curvature matrices of an :class:`~landscape.objective.Objective` as matrix-free linear operators.

All operators are ``p x p`` symmetric matrices at a fixed point ``theta`` (the objective's current
parameters when the operator is built, or ``params=``), for the whole-dataset loss
``L = sum_b w_b l(f(X_b), y_b)`` with ``w_b = |B_b|/N`` (mean) or ``1`` (sum):

* Hessian ``H = d^2 L / d theta^2`` (:class:`HessianOperator`, engines in ``landscape.hvp``).
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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import grad as func_grad
from torch.func import vjp, vmap

from landscape.hvp import HVPEngine
from landscape.objective import Objective, _map_inputs

__all__ = [
    "CurvatureOperator",
    "HessianOperator",
    "GGNOperator",
    "EmpiricalFisherOperator",
    "FisherOperator",
    "hessian",
    "ggn",
    "empirical_fisher",
    "fisher",
]


class CurvatureOperator:
    """Base class: a symmetric ``p x p`` curvature matrix at a fixed point, applied matrix-free.

    Subclasses implement ``_matmat(V) -> [p, k]`` on the local data; the base class validates the
    input, restores the model's train/eval flags (products only ever see private copies of
    parameters and buffers, so the model itself cannot change), sums over data-parallel ranks
    and counts products.
    """

    name = "curvature"

    def __init__(self, objective: Objective, params: Any = None) -> None:
        if not isinstance(objective, Objective):
            raise TypeError(f"expected a landscape.Objective, got {type(objective).__name__}")
        self.objective = objective
        full = objective._merge(params)
        # private copies: products never touch (or alias) the caller's parameters
        self._theta = {n: full[n].detach().clone() for n in objective.param_names}
        self._frozen = {n: t.detach().clone() for n, t in full.items() if n not in self._theta}
        p = objective.num_params
        self.shape = (p, p)
        self.dtype = objective.dtype
        self.device = objective.device
        self.matvecs = 0

    # ------------------------------------------------------------------ to implement
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _extra_config(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ shared helpers
    def _split(self, V: torch.Tensor) -> dict[str, torch.Tensor]:
        """``[p, k]`` -> dict name -> ``[k, *shape]``."""
        obj = self.objective
        out, off = {}, 0
        for n, shape, numel in zip(obj.param_names, obj.param_shapes, obj._numels):
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
        """``A @ V`` for ``V`` of shape ``[p, k]`` (summed over ranks under torch.distributed)."""
        p = self.shape[0]
        if not isinstance(V, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor of shape [{p}, k], got {type(V).__name__}")
        if V.ndim != 2 or V.shape[0] != p:
            raise ValueError(
                f"expected a block of shape [{p}, k] (the operator is {p} x {p}), got {tuple(V.shape)}"
            )
        V = V.to(device=self.device, dtype=self.dtype)
        if V.shape[1] == 0:
            return V.clone()
        # Products run on private parameter copies and buffer copies (``objective.buffers()``) and
        # never call ``.backward`` on the model, so only the train/eval flags need restoring: a full
        # ``guard()`` snapshot per product would cost a copy of the model every time.
        with self.objective._evaluating():
            out = self._matmat(V)
        out = self.objective._all_reduce(out)
        self.matvecs += V.shape[1]
        return out

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``A @ v`` for ``v`` of shape ``[p]``."""
        p = self.shape[0]
        if not isinstance(v, torch.Tensor) or v.ndim != 1 or v.shape[0] != p:
            got = tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            raise ValueError(f"expected a vector of shape [{p}] (the operator is {p} x {p}), got {got}")
        return self.matmat(v.reshape(-1, 1)).reshape(-1)

    def __matmul__(self, v: torch.Tensor) -> torch.Tensor:
        if isinstance(v, torch.Tensor) and v.ndim == 1:
            return self.matvec(v)
        return self.matmat(v)

    def to_scipy(self):
        """A ``scipy.sparse.linalg.LinearOperator`` (float64 numpy in and out)."""
        from scipy.sparse.linalg import LinearOperator

        def mv(x: np.ndarray) -> np.ndarray:
            t = torch.as_tensor(np.asarray(x, dtype=np.float64).reshape(-1))
            return self.matvec(t).detach().to("cpu", torch.float64).numpy()

        def mm(X: np.ndarray) -> np.ndarray:
            t = torch.as_tensor(np.asarray(X, dtype=np.float64))
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
        return {"operator": self.name, "objective": self.objective.config(), **self._extra_config()}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, device={self.device})"


# --------------------------------------------------------------------------------------------
class HessianOperator(CurvatureOperator):
    """Hessian ``H = d^2 L / d theta^2`` of the whole-dataset loss (engines: ``landscape.hvp``)."""

    name = "hessian"

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        engine: str = "auto",
        chunk_size: int | None = 32,
        cache_graph: bool | str = "auto",
        fd_eps: float | None = None,
    ) -> None:
        super().__init__(objective, params)
        self.engine = HVPEngine(
            objective,
            self._full(self._theta),
            engine=engine,
            chunk_size=chunk_size,
            cache_graph=cache_graph,
            fd_eps=fd_eps,
        )

    @property
    def engine_used(self) -> str:
        return self.engine.engine_used

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        return self.engine.matmat(V)

    def _extra_config(self) -> dict[str, Any]:
        return self.engine.config()


# --------------------------------------------------------------------------------------------
def _vmap_or_loop(
    fn: Callable, tangents: dict[str, torch.Tensor], k: int, chunk_size: int | None, state: dict
):
    """``vmap(fn)(tangents)``; if vmap is unsupported by some op, loop over the ``k`` columns once and
    remember it in ``state["vmap"]``."""
    if state.get("vmap", True):
        try:
            return vmap(fn, chunk_size=chunk_size)(tangents)
        except Exception as err:  # noqa: BLE001 - fall back to a plain loop
            state["vmap"] = False
            state["vmap_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    cols = [fn({n: t[j] for n, t in tangents.items()}) for j in range(k)]
    return {n: torch.stack([c[n] for c in cols]) for n in cols[0]}


class GGNOperator(CurvatureOperator):
    """Generalised Gauss-Newton ``G = sum_b w_b J_b^T H_out,b J_b`` (Schraudolph 2002, eq. 8).

    ``J_b v`` is obtained reverse-only as the vjp of the (linear) map ``u -> J_b^T u``, ``H_out,b``
    by reverse-over-reverse on the loss as a function of the outputs (exact for any loss, no
    forward-mode AD needed), then ``J_b^T (w_b H_out,b J_b v)`` by one more vjp; the probes are
    batched with ``vmap``.
    """

    name = "ggn"

    def __init__(self, objective: Objective, params: Any = None, *, chunk_size: int | None = 32) -> None:
        super().__init__(objective, params)
        self.chunk_size = chunk_size
        self._state: dict[str, Any] = {}

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        obj = self.objective
        k = V.shape[1]
        tangents = self._split(V)
        bufs = obj.buffers()
        total = torch.zeros(k, obj.num_params, dtype=self.dtype, device=self.device)
        for x, y, w in obj.batches():
            out, vjp_fn = vjp(lambda sel, x=x: obj._call(self._full(sel), bufs, x), self._theta)
            out = out.detach()
            _, hout_fn = vjp(func_grad(lambda o, y=y: obj.loss_fn(o, y)), out)
            _, jvp_fn = vjp(vjp_fn, torch.zeros_like(out))

            def col(t, w=w, vjp_fn=vjp_fn, hout_fn=hout_fn, jvp_fn=jvp_fn):
                (jv,) = jvp_fn((t,))
                (hjv,) = hout_fn(jv)
                return vjp_fn(w * hjv)[0]

            total += self._join(_vmap_or_loop(col, tangents, k, self.chunk_size, self._state), k)
        return total.T

    def _extra_config(self) -> dict[str, Any]:
        return {"chunk_size": self.chunk_size, "vmap": self._state.get("vmap", True)}


# --------------------------------------------------------------------------------------------
class EmpiricalFisherOperator(CurvatureOperator):
    """Empirical Fisher ``F = c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum; Kunstner et al. 2019).

    ``g_n`` is the gradient of ``loss_fn`` on example ``n`` alone, computed for a whole batch at once
    with ``vmap`` over examples; ``F V = c sum_b G_b^T (G_b V)`` with ``G_b`` the ``[B, p]`` matrix of
    per-example gradients.  The ``G_b`` are kept between calls while they fit in ``cache_bytes``.
    BatchNorm must be in eval mode (per-example gradients of batch statistics are not defined).
    """

    name = "empirical_fisher"

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        chunk_size: int | None = None,
        cache_bytes: int = 2**28,
    ) -> None:
        super().__init__(objective, params)
        self.chunk_size = chunk_size
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        self._cache_ok = (
            objective.num_examples * objective.num_params * itemsize * self._copies() <= cache_bytes
        )
        self._cache: list[torch.Tensor] | None = None
        self._state: dict[str, Any] = {}

    def _copies(self) -> int:
        return 1

    def _scale(self) -> float:
        return 1.0 / self.objective.num_examples if self.objective.reduction == "mean" else 1.0

    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """``[B', p]`` rows ``g_n`` of batch ``k`` (``B' = B`` here, ``S B`` for the MC Fisher)."""
        return self._per_example(x, y, bufs)

    def _per_example(self, x, y, bufs) -> torch.Tensor:
        """``[B, p]`` per-example gradients of ``loss_fn(f(x_n), y_n)``."""
        obj = self.objective

        def li(sel, xi, yi):
            xb = _map_inputs(xi, lambda t: t.unsqueeze(0))
            return obj.loss_fn(obj._call(self._full(sel), bufs, xb), yi.unsqueeze(0))

        B = int(y.shape[0])
        if self._state.get("vmap", True):
            try:
                g = vmap(func_grad(li), in_dims=(None, 0, 0), chunk_size=self.chunk_size)(self._theta, x, y)
                return self._join(g, B)
            except Exception as err:  # noqa: BLE001 - unsupported by vmap: loop over examples
                self._state["vmap"] = False
                self._state["vmap_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        rows = []
        for i in range(B):
            xi = _map_inputs(x, lambda t, i=i: t[i])
            rows.append(
                self._join({n: t.unsqueeze(0) for n, t in func_grad(li)(self._theta, xi, y[i]).items()}, 1)
            )
        return torch.cat(rows)

    def _gradient_blocks(self):
        if self._cache is not None:
            yield from self._cache
            return
        bufs = self.objective.buffers()
        blocks = []
        for k, (x, y, _) in enumerate(self.objective.batches()):
            gs = self._batch_gradients(k, x, y, bufs)
            if self._cache_ok:
                blocks.append(gs)
            yield gs
        if self._cache_ok:
            self._cache = blocks

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(V)
        for G in self._gradient_blocks():
            out += G.T @ (G @ V)
        return out * (self._scale() / self._copies())

    def _extra_config(self) -> dict[str, Any]:
        return {"chunk_size": self.chunk_size, "vmap": self._state.get("vmap", True)}


# --------------------------------------------------------------------------------------------
_LIKELIHOODS = ("categorical", "gaussian", "bernoulli")


def _infer_likelihood(loss_fn: Any) -> str:
    if isinstance(loss_fn, nn.CrossEntropyLoss) or loss_fn is nn.functional.cross_entropy:
        if isinstance(loss_fn, nn.CrossEntropyLoss) and (
            loss_fn.weight is not None or loss_fn.label_smoothing != 0.0
        ):
            raise ValueError(
                "the Monte-Carlo Fisher needs a plain negative log-likelihood: CrossEntropyLoss with "
                "class weights or label smoothing is not one; pass likelihood='categorical' to force it"
            )
        return "categorical"
    if isinstance(loss_fn, nn.MSELoss) or loss_fn is nn.functional.mse_loss:
        return "gaussian"
    if isinstance(loss_fn, nn.BCEWithLogitsLoss) or loss_fn is nn.functional.binary_cross_entropy_with_logits:
        return "bernoulli"
    raise ValueError(
        f"cannot infer the predictive distribution of loss {type(loss_fn).__name__}; pass "
        f"likelihood= one of {_LIKELIHOODS} (CrossEntropyLoss, MSELoss and BCEWithLogitsLoss are detected)"
    )


def sample_targets(
    outputs: torch.Tensor, likelihood: str, samples: int, generator: torch.Generator
) -> torch.Tensor:
    """Draw ``samples`` label sets ``[S, *targets_shape]`` from the model's predictive distribution.

    The draw is on CPU in float64 with ``generator`` (reproducible across devices):

    * ``"categorical"``: ``torch.multinomial(softmax(outputs, 1), S, replacement=True)`` -> ``[B, S]``,
      transposed to ``[S, B]``;
    * ``"gaussian"``: ``outputs + torch.randn((S, *outputs.shape))`` (unit variance);
    * ``"bernoulli"``: ``torch.bernoulli(sigmoid(outputs).expand(S, *outputs.shape))``.
    """
    out = outputs.detach().to("cpu", torch.float64)
    if likelihood == "categorical":
        if out.ndim != 2:
            raise ValueError(f"categorical sampling needs outputs of shape [B, C], got {tuple(out.shape)}")
        probs = torch.softmax(out, dim=1)
        return torch.multinomial(probs, samples, replacement=True, generator=generator).T.contiguous()
    if likelihood == "gaussian":
        return out.unsqueeze(0) + torch.randn((samples, *out.shape), generator=generator, dtype=torch.float64)
    if likelihood == "bernoulli":
        probs = torch.sigmoid(out)
        return torch.bernoulli(
            probs.unsqueeze(0).expand(samples, *out.shape).contiguous(), generator=generator
        )
    raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {likelihood!r}")


class FisherOperator(EmpiricalFisherOperator):
    """Monte-Carlo Fisher ``F = (c/S) sum_n sum_{s<S} g_n(yhat_ns) g_n(yhat_ns)^T`` (Martens 2020, Sec. 9.2).

    ``yhat_ns`` are drawn once, at construction, from the model's predictive distribution at the
    operator's point (see :func:`sample_targets`; batches are visited in order, one generator seeded
    with ``seed``), so the operator is a fixed symmetric PSD matrix; ``c`` as in the empirical Fisher.
    Equivalently it is the empirical Fisher of the data set in which each example appears ``S``
    times with the sampled labels, divided by ``S`` (sum) or with ``N S`` examples (mean).

    Scaling: for ``CrossEntropyLoss`` (and ``BCEWithLogitsLoss`` with one output per example)
    ``E[F] = G``, the GGN with the same reduction.  For ``MSELoss`` with ``C`` outputs and mean
    reduction, the loss is not the Gaussian NLL: ``E[F] = (2/C) G`` (sum reduction: ``2 G``).
    The data must be iterated in the same order every time (no shuffling DataLoader).
    """

    name = "fisher"

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        samples: int = 1,
        seed: int = 0,
        likelihood: str | None = None,
        chunk_size: int | None = None,
        cache_bytes: int = 2**28,
    ) -> None:
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        self.samples = samples
        self.seed = seed
        self.likelihood = likelihood if likelihood is not None else _infer_likelihood(objective.loss_fn)
        if self.likelihood not in _LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {self.likelihood!r}")
        super().__init__(objective, params, chunk_size=chunk_size, cache_bytes=cache_bytes)
        self.sampled_targets = self._sample()

    def _copies(self) -> int:
        return self.samples

    def _generator(self) -> torch.Generator:
        # under torch.distributed every rank draws its own labels (landscape.distributed sets .rank)
        rank = int(getattr(self.objective, "rank", 0))
        return torch.Generator().manual_seed(self.seed + 1_000_003 * rank)

    def _sample(self) -> list[torch.Tensor]:
        obj = self.objective
        gen = self._generator()
        out: list[torch.Tensor] = []
        with obj.guard(), torch.no_grad():
            bufs = obj.buffers()
            full = self._full(self._theta)
            for x, y, _ in obj.batches():
                f = obj._call(full, bufs, x)
                t = sample_targets(f, self.likelihood, self.samples, gen)
                if self.likelihood == "categorical":
                    t = t.to(device=obj.device, dtype=y.dtype if not y.is_floating_point() else torch.long)
                else:
                    t = t.to(device=obj.device, dtype=obj.dtype).reshape(self.samples, *f.shape)
                out.append(t)
        return out

    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """Per-example gradients for all ``S`` label draws at once: inputs repeated ``S`` times."""
        S = self.samples
        t = self.sampled_targets[k]
        xs = _map_inputs(x, lambda a: a.repeat(S, *([1] * (a.ndim - 1))))
        ys = t.reshape(S * t.shape[1], *t.shape[2:])
        if self.likelihood != "categorical" and ys.shape[1:] != y.shape[1:]:
            ys = ys.reshape(S * y.shape[0], *y.shape[1:])
        return self._per_example(xs, ys, bufs)

    def _extra_config(self) -> dict[str, Any]:
        return {
            **super()._extra_config(),
            "samples": self.samples,
            "seed": self.seed,
            "likelihood": self.likelihood,
        }


# --------------------------------------------------------------------------------------------
def hessian(
    objective: Objective,
    *,
    params: Any = None,
    engine: str = "auto",
    chunk_size: int | None = 32,
    cache_graph: bool | str = "auto",
    fd_eps: float | None = None,
) -> HessianOperator:
    """The Hessian of the whole-dataset loss as a :class:`CurvatureOperator` (see ``landscape.hvp``)."""
    return HessianOperator(
        objective, params, engine=engine, chunk_size=chunk_size, cache_graph=cache_graph, fd_eps=fd_eps
    )


def ggn(objective: Objective, *, params: Any = None, chunk_size: int | None = 32) -> GGNOperator:
    """The generalised Gauss-Newton matrix ``sum_b w_b J_b^T H_out,b J_b`` as an operator."""
    return GGNOperator(objective, params, chunk_size=chunk_size)


def empirical_fisher(
    objective: Objective, *, params: Any = None, chunk_size: int | None = None, cache_bytes: int = 2**28
) -> EmpiricalFisherOperator:
    """The empirical Fisher ``c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum) as an operator."""
    return EmpiricalFisherOperator(objective, params, chunk_size=chunk_size, cache_bytes=cache_bytes)


def fisher(
    objective: Objective,
    samples: int = 1,
    seed: int = 0,
    *,
    params: Any = None,
    likelihood: str | None = None,
    chunk_size: int | None = None,
    cache_bytes: int = 2**28,
) -> FisherOperator:
    """Monte-Carlo Fisher with ``samples`` labels per example drawn (``seed``) from the predictive."""
    return FisherOperator(
        objective,
        params,
        samples=samples,
        seed=seed,
        likelihood=likelihood,
        chunk_size=chunk_size,
        cache_bytes=cache_bytes,
    )
