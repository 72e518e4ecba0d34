"""Empirical Fisher (Kunstner et al. 2019, eq. 3) and Monte-Carlo Fisher (Martens 2020, Sec. 9.2).

Both are ``c sum_n sum_s g_ns g_ns^T`` (one label per example for the empirical Fisher, ``S`` sampled
labels for the Monte-Carlo Fisher, divided by ``S``) with ``g_ns`` the gradient of the loss of
example ``n`` alone.  By the chain rule ``g_ns = J_n^T r_ns`` with ``J_n`` the Jacobian of example
``n``'s output and ``r_ns = d l(f_n, y_ns) / d f_n`` its output gradient, so

    ``F v = c sum_n J_n^T Lambda_n (J_n v)``,  ``Lambda_n = (1/S) sum_s r_ns r_ns^T``

(Kunstner et al. 2019, Sec. 3; Martens 2020, Sec. 9.2), i.e. a generalised Gauss-Newton product
with the output-space matrix ``Lambda`` in place of the output Hessian.  ``method="output_space"``
(default) computes it with one ``jvp`` and one backward pass of the batch forward per product
(:class:`~landscape.curvature.ggn.OutputSpaceOperator`), keeping only the ``r_ns`` (output-sized)
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

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import grad as func_grad
from torch.func import vmap

from landscape.curvature.ggn import OutputSpaceOperator, _short_error
from landscape.inputs import _map_inputs
from landscape.objective import Objective

METHODS = ("output_space", "per_example")


class _NotSeparable(Exception):
    """The batch output is not one row per example computed from that example alone."""


def output_gradients(loss_fn: Any, out: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[S, B, O]``: ``r_sn = d loss_fn(f_n, t_sn) / d f_n`` for outputs ``out`` (``[B, ...]``,
    ``O`` entries per example) and ``S`` target sets ``targets`` (``[S, B, ...]``), each example's
    loss evaluated alone (``loss_fn(f_n[None], t_sn[None])``, same reduction)."""
    S, B = int(targets.shape[0]), int(out.shape[0])

    def li(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return loss_fn(o.unsqueeze(0), t.unsqueeze(0))

    g = func_grad(li)
    outs = out.unsqueeze(0).expand(S, *out.shape).reshape(S * B, *out.shape[1:])
    ts = targets.reshape(S * B, *targets.shape[2:])
    try:
        r = vmap(g)(outs, ts)
    except Exception:  # noqa: BLE001 - a loss without batching rules: one example at a time
        r = torch.stack([g(outs[i], ts[i]) for i in range(S * B)])
    return r.reshape(S, B, -1)


def _outer_apply(R: torch.Tensor, scale: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """``U -> (scale / S) sum_s r_s (r_s^T U_n)`` per example ``n`` (``R``: ``[S, B, O]``, ``U``:
    ``[k, B, ...]``)."""
    S, B = R.shape[0], R.shape[1]
    if S == 1:
        r = R[0]

        def apply_one(U: torch.Tensor) -> torch.Tensor:
            Uf = U.reshape(U.shape[0], B, -1)
            coef = (Uf * r).sum(dim=2, keepdim=True)
            return (coef * (scale * r)).reshape(U.shape)

        return apply_one

    def apply(U: torch.Tensor) -> torch.Tensor:
        coef = torch.einsum("kbo,sbo->ksb", U.reshape(U.shape[0], B, -1), R)
        return (scale / S * torch.einsum("ksb,sbo->kbo", coef, R)).reshape(U.shape)

    return apply


# --------------------------------------------------------------------------------------------
class EmpiricalFisherOperator(OutputSpaceOperator):
    """Empirical Fisher ``F = c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum; Kunstner et al. 2019).

    ``g_n`` is the gradient of ``loss_fn`` on example ``n`` alone.  ``method="output_space"``
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
        jvp: output space: ``"forward"``, ``"linearize"`` or ``"double_vjp"`` (as for the GGN).
        cache_bytes: per example: keep the per-example gradients while they fit in this many bytes.
    """

    name = "empirical_fisher"
    _uses_per_example = True

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        method: str = "output_space",
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "forward",
        cache_bytes: int = 2**28,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        super().__init__(objective, params, chunk_size=chunk_size, cache=cache, jvp=jvp)
        self.method = method
        self.method_used = method
        self.fallback_reason: str | None = None
        self.cache_bytes = cache_bytes
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        self._cache_ok = (
            objective.num_examples * objective.num_params * itemsize * self._copies() <= cache_bytes
        )
        self._cache: list[torch.Tensor] | None = None
        self._pe_state: dict[str, Any] = {}
        self._separable_checked = False

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
                alone = obj._call(full, bufs, _map_inputs(x, lambda t, i=i: t[i : i + 1]))
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
        return _outer_apply(R, self._scale()), "per_example_output_gradients"

    def _batch_weight(self, w: float) -> float:
        return 1.0  # c is applied in output space

    # ------------------------------------------------------------------ per example
    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """``[B', p]`` rows ``g_n`` of batch ``k`` (``B' = B`` here, ``S B`` for the MC Fisher)."""
        return self._per_example_gradients(x, y, bufs)

    def _per_example_gradients(self, x, y, bufs) -> torch.Tensor:
        """``[B, p]`` per-example gradients of ``loss_fn(f(x_n), y_n)``."""
        obj = self.objective

        def li(sel, xi, yi):
            xb = _map_inputs(xi, lambda t: t.unsqueeze(0))
            return obj.loss_fn(obj._call(self._full(sel), bufs, xb), yi.unsqueeze(0))

        B = int(y.shape[0])
        if self._pe_state.get("vmap", True):
            try:
                g = vmap(func_grad(li), in_dims=(None, 0, 0), chunk_size=self.chunk_size)(self._theta, x, y)
                return self._join(g, B)
            except Exception as err:  # noqa: BLE001 - unsupported by vmap: loop over examples
                self._pe_state["vmap"] = False
                self._pe_state["vmap_error"] = _short_error(err)
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

    def _per_example_matmat(self, V: torch.Tensor) -> torch.Tensor:
        out = None
        for G in self._gradient_blocks():
            part = G.T @ (G @ V)
            out = part if out is None else out.add_(part)
        return out * (self._scale() / self._copies())

    # ------------------------------------------------------------------ products
    def _matmat(self, V: torch.Tensor) -> torch.Tensor:
        if self.method_used == "output_space":
            try:
                return super()._matmat(V)
            except _NotSeparable as err:
                self.method_used, self.fallback_reason = "per_example", str(err)
                self._linearised = None
        return self._per_example_matmat(V)

    def _extra_config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "method": self.method,
            "method_used": self.method_used,
            "fallback_reason": self.fallback_reason,
            "chunk_size": self.chunk_size,
        }
        if self.method_used == "output_space":
            cfg.update(super()._extra_config())
        else:
            cfg.update({"cache_bytes": self.cache_bytes, "vmap": self._pe_state.get("vmap", True)})
        return cfg


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
    times with the sampled labels, divided by ``S`` (sum) or with ``N S`` examples (mean).  In output
    space (default) the ``S`` draws enter only ``Lambda_n = (1/S) sum_s r_ns r_ns^T``: one ``jvp`` and
    one ``vjp`` per product whatever ``S``; ``method="per_example"`` forms ``S B`` per-example
    gradients per batch.

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
        method: str = "output_space",
        chunk_size: int | None = 32,
        cache: bool | str = "auto",
        jvp: str = "forward",
        cache_bytes: int = 2**28,
    ) -> None:
        if not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        self.samples = samples
        self.seed = seed
        self.likelihood = likelihood if likelihood is not None else _infer_likelihood(objective.loss_fn)
        if self.likelihood not in _LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {_LIKELIHOODS}, got {self.likelihood!r}")
        super().__init__(
            objective,
            params,
            method=method,
            chunk_size=chunk_size,
            cache=cache,
            jvp=jvp,
            cache_bytes=cache_bytes,
        )
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

    def _target_sets(self, k: int, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``[S, B, ...]``: the labels drawn for batch ``k`` (shaped like the data's labels)."""
        t = self.sampled_targets[k]
        if self.likelihood != "categorical" and t.shape[2:] != y.shape[1:]:
            t = t.reshape(self.samples, y.shape[0], *y.shape[1:])
        return t

    def _batch_gradients(self, k: int, x, y: torch.Tensor, bufs) -> torch.Tensor:
        """Per-example gradients for all ``S`` label draws at once: inputs repeated ``S`` times."""
        S = self.samples
        t = self._target_sets(k, y, y)
        xs = _map_inputs(x, lambda a: a.repeat(S, *([1] * (a.ndim - 1))))
        return self._per_example_gradients(xs, t.reshape(S * t.shape[1], *t.shape[2:]), bufs)

    def _extra_config(self) -> dict[str, Any]:
        return {
            **super()._extra_config(),
            "samples": self.samples,
            "seed": self.seed,
            "likelihood": self.likelihood,
        }


def empirical_fisher(
    objective: Objective,
    *,
    params: Any = None,
    method: str = "output_space",
    chunk_size: int | None = 32,
    cache: bool | str = "auto",
    jvp: str = "forward",
    cache_bytes: int = 2**28,
) -> EmpiricalFisherOperator:
    """The empirical Fisher ``c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum) as an operator
    (``method="output_space"``: one jvp + one vjp per product; ``"per_example"``: cached gradients)."""
    return EmpiricalFisherOperator(
        objective,
        params,
        method=method,
        chunk_size=chunk_size,
        cache=cache,
        jvp=jvp,
        cache_bytes=cache_bytes,
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
    jvp: str = "forward",
    cache_bytes: int = 2**28,
) -> FisherOperator:
    """Monte-Carlo Fisher with ``samples`` labels per example drawn (``seed``) from the predictive."""
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
    )
