"""Empirical Fisher (Kunstner et al. 2019, eq. 3) and Monte-Carlo Fisher (Martens 2020, Sec. 9.2).

Both are ``c sum_n sum_s g_ns g_ns^T`` (one label per example for the empirical Fisher, ``S`` sampled
labels for the Monte-Carlo Fisher, divided by ``S``) with ``g_ns`` the gradient of the loss of
example ``n`` alone (for the Monte-Carlo Fisher: of the summed negative log-likelihood of the
loss's own likelihood, with ``c = 1/(N m)``; see :class:`FisherOperator`).  By the chain rule
``g_ns = J_n^T r_ns`` with ``J_n`` the Jacobian of example
``n``'s output and ``r_ns = d l(f_n, y_ns) / d f_n`` its output gradient, so

    ``F v = c sum_n J_n^T Lambda_n (J_n v)``,  ``Lambda_n = (1/S) sum_s r_ns r_ns^T``

(Kunstner et al. 2019, Sec. 3; Martens 2020, Sec. 9.2), i.e. a generalised Gauss-Newton product
with the output-space matrix ``Lambda`` in place of the output Hessian.  ``method="output_space"``
(default) computes it with one ``jvp`` and one backward pass of the batch forward per product
(:class:`~landscape.curvature.output_space.OutputSpaceOperator`), keeping only the ``r_ns`` (output-sized)
and the forward graph where it is cheap (``cache``) -- the memory of a GGN product.
``method="per_example"`` instead forms the ``[B, p]`` per-example gradients with ``vmap`` and keeps
them between products while they fit in ``cache_bytes``: far more memory, but a cached product is
two matrix products (``G^T (G V)``), much faster when many vectors are multiplied.

The output-space form needs row ``n`` of the batch output to be example ``n``'s output alone.
That is checked on the first batch (examples ``0`` and ``B-1`` run alone, outputs compared); a
model whose output is not ``[B, ...]`` or that couples examples falls back to the per-example
method, recorded in ``config()["fallback_reason"]``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.func import grad as func_grad
from torch.func import vmap

from landscape.curvature.autotune import short_error
from landscape.curvature.likelihoods import (
    check_likelihood,
    fisher_term_scale,
    infer_likelihood,
    nll_output_gradients,
    nll_sum,
    sample_targets,
    terms_per_example,
)
from landscape.curvature.output_moments import outer_apply, output_gradients, term_kind, term_outer_apply
from landscape.curvature.output_space import OutputSpaceOperator
from landscape.inputs import _map_inputs
from landscape.objective import Objective

__all__ = ["EmpiricalFisherOperator", "FisherOperator", "empirical_fisher", "fisher", "sample_targets"]

METHODS = ("output_space", "per_example")
PER = ("example", "loss_term")


class _NotSeparable(Exception):
    """The batch output is not one row per example computed from that example alone."""


# --------------------------------------------------------------------------------------------
class EmpiricalFisherOperator(OutputSpaceOperator):
    """Empirical Fisher ``F = c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum; Kunstner et al. 2019).

    ``per="example"`` (default): ``g_n`` is the gradient of ``loss_fn`` on example ``n`` alone, with
    the loss's own reduction over that example's outputs (Kunstner et al.'s definition).
    ``per="loss_term"``: curvlinops' ``EFLinearOperator`` convention, one gradient per loss term --
    every position of the output's extra dimensions (between the batch and the class dimension 1
    for cross-entropy, the last dimension for MSE and BCE) is a term of its own, with the gradient
    of the *sum*-reduced loss of that term -- and ``c = 1/R``, ``R`` the number of terms the mean divides by
    (``N m``, ``m`` as in :func:`~landscape.curvature.likelihoods.terms_per_example`):
    ``F = (1/R) sum_{n,l} g_nl g_nl^T``.  The two agree for cross-entropy on ``[B, C]`` outputs;
    for MSE or BCE on ``[B, C]`` the loss-term Fisher is ``C`` times the example one (mean
    reduction), and with extra output dimensions they differ by more than a factor (the example
    convention keeps the cross terms between positions).  ``method="output_space"``
    (default): ``F v = c J^T [r_n (r_n^T (J v)_n)]_n`` with one ``jvp`` and one ``vjp`` per product
    (module docstring); ``method="per_example"``: ``F V = c sum_b G_b^T (G_b V)`` with the ``[B, p]``
    per-example gradients ``G_b`` (``vmap`` over examples), kept between calls while they fit in
    ``cache_bytes`` -- opt in when many vectors are multiplied and the memory is there.
    BatchNorm must be in eval mode (per-example gradients of batch statistics are not defined) and
    the forward deterministic: both are refused at construction with a ValueError.

    Args:
        objective: the :class:`~landscape.Objective`.
        params: the point (default: the objective's current parameters).
        method: ``"output_space"`` or ``"per_example"``.
        chunk_size: columns of ``V`` (output space) or examples (per example) per ``vmap`` call.
        cache: output space: keep each batch's forward graph between products (``"auto"``: for a
            single-batch objective).
        jvp: output space: ``"auto"`` (default), ``"forward"``, ``"linearize"`` or ``"double_vjp"``
            (as for the GGN, :class:`~landscape.curvature.output_space.OutputSpaceOperator`).
        cache_bytes: per example: keep the per-example gradients while they fit in this many bytes.
        per: ``"example"`` or ``"loss_term"`` (above; ``"loss_term"`` needs the output-space method).
        max_memory: split blocks into chunks of columns whose measured peak stays within this budget
            (:mod:`landscape.curvature.memory`; ``None``: no limit).
        calibrate, timer: output space, ``jvp="auto"``: time the ``J V`` paths (as for the GGN).
    """

    name = "empirical_fisher"
    PRODUCTS = {**OutputSpaceOperator.PRODUCTS, "per_example": "_per_example"}
    _uses_per_example = True
    _passthrough = (_NotSeparable,)  # decides the method, not the jvp path: never a timing failure

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        method: str = "output_space",
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "auto",
        cache_bytes: int = 2**28,
        per: str = "example",
        max_memory: int | float | str | None = None,
        calibrate: bool | str = "auto",
        timer: Any = None,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if per not in PER:
            raise ValueError(f"per must be one of {PER}, got {per!r}")
        if per == "loss_term" and method != "output_space":
            raise ValueError("per='loss_term' needs method='output_space' (the default)")
        self.per = per
        self._term_kind = term_kind(objective.loss_fn) if per == "loss_term" else None
        super().__init__(
            objective,
            params,
            chunk_size=chunk_size,
            cache=cache,
            jvp=jvp,
            max_memory=max_memory,
            calibrate=calibrate,
            timer=timer,
        )
        self.method = method
        self.method_used = method
        self.fallback_reason: str | None = None
        self.cache_bytes = cache_bytes
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        self._cache_ok = (
            objective.num_examples * objective.num_params * itemsize * self._copies() <= cache_bytes
        )
        self._separable_checked = False
        if method == "per_example":
            self._keep_batches = self._cache_ok  # the per-example gradients, kept while they fit

    def _copies(self) -> int:
        return 1

    def _scale(self) -> float:
        return 1.0 / self.objective.num_examples if self.objective.reduction == "mean" else 1.0

    # ------------------------------------------------------------------ output space
    def _target_sets(self, k: int, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``[S, B, ...]`` the label sets of batch ``k`` (here the data's own labels, ``S = 1``)."""
        return y.unsqueeze(0)

    def _check_separable(self, out: torch.Tensor, x: Any, y: torch.Tensor, bufs) -> None:
        B = int(y.shape[0])
        if out.ndim == 0 or out.shape[0] != B:
            raise _NotSeparable(
                f"the model output has shape {tuple(out.shape)}, not one row per example ([{B}, ...])"
            )
        obj = self.objective
        full = self._full(self._theta)
        eps = torch.finfo(out.dtype).eps if out.is_floating_point() else 1e-7
        tol = min(1e-2, 1e3 * eps) * max(1.0, float(out.abs().max()))
        with torch.no_grad():
            for i in sorted({0, B - 1}):
                alone = obj.call(full, bufs, _map_inputs(x, lambda t, i=i: t[i : i + 1]))
                if alone.shape != out[i : i + 1].shape or float((alone - out[i : i + 1]).abs().max()) > tol:
                    raise _NotSeparable(
                        f"row {i} of the batch output differs from the output of example {i} alone "
                        "(the forward couples the examples of a batch)"
                    )

    def _output_matrix(self, k, out, x, y, bufs):
        if not self._separable_checked:
            self._check_separable(out, x, y, bufs)
            self._separable_checked = True
        R = output_gradients(self.objective.loss_fn, out, self._target_sets(k, y, out))
        if self.per == "example":
            return outer_apply(R, self._scale()), "per_example_output_gradients"
        # one sum-reduced gradient per loss term, g = m r for a mean (the example's loss divides by m),
        # weighted 1/(N m): (m^2 / (N m)) r r^T = (m / N) r r^T per term
        m = terms_per_example(self._term_kind, out.shape[1:])
        scale = m / self.objective.num_examples if self.objective.reduction == "mean" else 1.0
        return term_outer_apply(R[0], out, self._term_kind, scale), "per_loss_term_output_gradients"

    def _batch_weight(self, w: float) -> float:
        return 1.0  # c is applied in output space

    # ------------------------------------------------------------------ per example
    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """``[B', p]`` rows ``g_n`` of batch ``k`` (``B' = B`` here, ``S B`` for the MC Fisher)."""
        return self._per_example_gradients(x, y, bufs)

    def _per_example_gradients(self, x, y, bufs, loss_fn: Any = None) -> torch.Tensor:
        """``[B, p]`` per-example gradients of ``loss_fn(f(x_n), y_n)`` (default: the objective's)."""
        obj = self.objective
        loss_fn = obj.loss_fn if loss_fn is None else loss_fn

        def li(sel, xi, yi):
            xb = _map_inputs(xi, lambda t: t.unsqueeze(0))
            return loss_fn(obj.call(self._full(sel), bufs, xb), yi.unsqueeze(0))

        B, rec = int(y.shape[0]), self.record
        if rec.pe_vmap:
            try:
                g = vmap(func_grad(li), in_dims=(None, 0, 0), chunk_size=self.chunk_size)(self._theta, x, y)
                return self._join(g, B)
            except Exception as err:  # noqa: BLE001 - unsupported by vmap: loop over examples
                rec.pe_vmap, rec.pe_vmap_error = False, short_error(err)
        rows = []
        for i in range(B):
            xi = _map_inputs(x, lambda t, i=i: t[i])
            rows.append(
                self._join({n: t.unsqueeze(0) for n, t in func_grad(li)(self._theta, xi, y[i]).items()}, 1)
            )
        return torch.cat(rows)

    def _per_example(self, lin, V: torch.Tensor) -> torch.Tensor:
        """The per-example product of one batch: ``c G_b^T (G_b V)`` (``G_b`` kept while they fit)."""
        G = lin.grads if lin.grads is not None else self._batch_gradients(lin.k, lin.x, lin.y, lin.bufs)
        if self._cache_ok:
            lin.grads = G
        return (G.T @ (G @ V)).mul_(self._scale() / self._copies())

    # ------------------------------------------------------------------ products
    def _choose(self, k: int) -> str | None:
        return "per_example" if self.method_used == "per_example" else super()._choose(k)

    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        if self.method_used == "output_space":
            try:
                return super()._matmat(V)
            except _NotSeparable as err:
                if self.per == "loss_term":
                    raise ValueError(
                        f"per='loss_term' needs a model whose output rows are its examples' ({err}); use "
                        "per='example'"
                    ) from None
                self.method_used, self.fallback_reason = "per_example", str(err)
                self._kept, self._keep_batches = None, self._cache_ok
        return super()._matmat(V)

    def _path_key(self, k: int) -> str:
        return f"{self.method_used}/{super()._path_key(k)}"

    def _extra_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "per": self.per,
            "method": self.method,
            "method_used": self.method_used,
            "fallback_reason": self.fallback_reason,
            "chunk_size": self.chunk_size,
        }
        if self.method_used == "output_space":
            cfg.update(super()._extra_config())
        else:
            cfg.update({"cache_bytes": self.cache_bytes, "vmap": self.record.pe_vmap})
        return cfg


# --------------------------------------------------------------------------------------------
class FisherOperator(EmpiricalFisherOperator):
    r"""Monte-Carlo Fisher of the loss's own likelihood (Martens 2020, Sec. 9.2).

    ``F = (a/S) sum_n sum_{s<S} J_n^T u_ns u_ns^T J_n`` with ``u_ns = d(-log p(yhat_ns | f_n)) / d f_n``
    summed over the example's loss terms, ``yhat_ns ~ p(. | f_n)`` and ``a = 1/(N m)`` (mean
    reduction, ``m`` loss terms per example) or ``1`` (sum): the likelihood ``p`` is the one whose
    negative log is the loss (:mod:`landscape.curvature.likelihoods`: categorical for cross-entropy,
    ``N(f, 1/2)`` for MSE, Bernoulli for BCE-with-logits), so ``E[F] = G``, the generalised
    Gauss-Newton matrix of the same loss and reduction, for every output shape (``[B, C]``,
    sequence outputs ``[B, C, L, ...]`` with one label per position, any number of MSE or BCE
    outputs).

    The labels are drawn once, at construction, from the model's predictive distribution at the
    operator's point (:func:`~landscape.curvature.likelihoods.sample_targets`; batches are visited in
    order, one generator seeded with ``seed``), so the operator is a fixed symmetric PSD matrix; the
    objective refuses data whose passes differ, so every later pass pairs each example with its own
    labels.  In output space (default) the ``S`` draws enter only ``Lambda_n = (a/S) sum_s u_ns
    u_ns^T``: one ``jvp`` and one ``vjp`` per product whatever ``S``; ``method="per_example"`` forms
    ``S B`` per-example gradients of the summed negative log-likelihood per batch.

    ``likelihood=`` overrides the inference from the loss (e.g. ``"categorical"`` for a
    cross-entropy with label smoothing); ``E[F] = G`` then holds only if the loss is that negative
    log-likelihood.
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
        method: str = "output_space",
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "auto",
        cache_bytes: int = 2**28,
        max_memory: int | float | str | None = None,
        calibrate: bool | str = "auto",
        timer: Any = None,
    ) -> None:
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        self.samples = samples
        self.seed = seed
        self.likelihood = check_likelihood(
            likelihood if likelihood is not None else infer_likelihood(objective.loss_fn)
        )
        self._terms = 1
        super().__init__(
            objective,
            params,
            method=method,
            chunk_size=chunk_size,
            cache=cache,
            jvp=jvp,
            cache_bytes=cache_bytes,
            max_memory=max_memory,
            calibrate=calibrate,
            timer=timer,
        )
        self.sampled_targets = self._sample()

    def _copies(self) -> int:
        return self.samples

    def _scale(self) -> float:
        return fisher_term_scale(self.objective.reduction, self.objective.num_examples, self._terms)

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
            for x, _, _ in obj.batches():
                f = obj.call(full, bufs, x)
                self._terms = terms_per_example(self.likelihood, f.shape[1:])
                t = sample_targets(f, self.likelihood, self.samples, gen)
                dtype = torch.long if self.likelihood == "categorical" else obj.dtype
                out.append(t.to(device=obj.device, dtype=dtype))
        return out

    def _target_sets(self, k: int, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``[S, B, ...]``: the labels drawn for batch ``k`` (class indices, or shaped like the output)."""
        return self.sampled_targets[k]

    def _output_matrix(self, k, out, x, y, bufs):
        if not self._separable_checked:
            self._check_separable(out, x, y, bufs)
            self._separable_checked = True
        U = nll_output_gradients(out, self._target_sets(k, y, out), self.likelihood)
        return outer_apply(U, self._scale()), f"{self.likelihood}_nll_output_gradients"

    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """Per-example gradients of the summed negative log-likelihood for all ``S`` label draws at
        once (inputs repeated ``S`` times)."""
        S = self.samples
        t = self._target_sets(k, y, y)
        xs = _map_inputs(x, lambda a: a.repeat(S, *([1] * (a.ndim - 1))))
        flat_t = t.reshape(S * t.shape[1], *t.shape[2:])
        return self._per_example_gradients(xs, flat_t, bufs, loss_fn=nll_sum(self.likelihood))

    def _extra_config(self) -> dict[str, Any]:
        return {
            **super()._extra_config(),
            "samples": self.samples,
            "seed": self.seed,
            "likelihood": self.likelihood,
            "terms_per_example": self._terms,
        }


def empirical_fisher(
    objective: Objective,
    *,
    params: Any = None,
    method: str = "output_space",
    chunk_size: int | None = 32,
    cache: bool | str = "auto",
    jvp: str = "auto",
    cache_bytes: int = 2**28,
    per: str = "example",
    max_memory: int | float | str | None = None,
    calibrate: bool | str = "auto",
) -> EmpiricalFisherOperator:
    """The empirical Fisher ``c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum) as an operator
    (``method="output_space"``: one jvp + one vjp per product; ``"per_example"``: cached gradients;
    ``per="loss_term"``: curvlinops' convention, see :class:`EmpiricalFisherOperator`;
    ``max_memory``: blocks split into chunks within this budget, :mod:`landscape.curvature.memory`;
    ``jvp``, ``calibrate``: the ``J V`` path, as for :func:`~landscape.curvature.ggn.ggn`)."""
    return EmpiricalFisherOperator(
        objective,
        params,
        method=method,
        chunk_size=chunk_size,
        cache=cache,
        jvp=jvp,
        cache_bytes=cache_bytes,
        per=per,
        max_memory=max_memory,
        calibrate=calibrate,
    )


def fisher(
    objective: Objective,
    samples: int = 1,
    seed: int = 0,
    *,
    params: Any = None,
    likelihood: str | None = None,
    method: str = "output_space",
    chunk_size: int | None = 32,
    cache: bool | str = "auto",
    jvp: str = "auto",
    cache_bytes: int = 2**28,
    max_memory: int | float | str | None = None,
    calibrate: bool | str = "auto",
) -> FisherOperator:
    """Monte-Carlo Fisher of the loss's own likelihood with ``samples`` labels per example drawn
    (``seed``) from the predictive; ``E[F]`` is the GGN (:class:`FisherOperator`; ``max_memory``:
    blocks split into chunks within this budget, :mod:`landscape.curvature.memory`; ``jvp``,
    ``calibrate``: the ``J V`` path, as for :func:`~landscape.curvature.ggn.ggn`)."""
    return FisherOperator(
        objective,
        params,
        samples=samples,
        seed=seed,
        likelihood=likelihood,
        method=method,
        chunk_size=chunk_size,
        cache=cache,
        jvp=jvp,
        cache_bytes=cache_bytes,
        max_memory=max_memory,
        calibrate=calibrate,
    )
