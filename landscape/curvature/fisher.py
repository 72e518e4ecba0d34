"""Empirical Fisher (Kunstner et al. 2019, eq. 3) and Monte-Carlo Fisher (Martens 2020, Sec. 9.2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import grad as func_grad
from torch.func import vmap

from landscape.curvature.base import CurvatureOperator
from landscape.inputs import _map_inputs
from landscape.objective import Objective


# --------------------------------------------------------------------------------------------
class EmpiricalFisherOperator(CurvatureOperator):
    """Empirical Fisher ``F = c sum_n g_n g_n^T`` (``c = 1/N`` mean, ``1`` sum; Kunstner et al. 2019).

    ``g_n`` is the gradient of ``loss_fn`` on example ``n`` alone, computed for a whole batch at once
    with ``vmap`` over examples; ``F V = c sum_b G_b^T (G_b V)`` with ``G_b`` the ``[B, p]`` matrix of
    per-example gradients.  The ``G_b`` are kept between calls while they fit in ``cache_bytes``.
    BatchNorm must be in eval mode (per-example gradients of batch statistics are not defined) and
    the forward deterministic: both are refused at construction with a ValueError.
    """

    name = "empirical_fisher"
    _per_example = True

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
