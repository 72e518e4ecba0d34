"""What an optimizer's closure must do, and the closures the trainer builds for it.

Most optimizers of the suite take the closure "zero the gradients, forward, backward, return the
loss" (``closure(chunk)`` for a sub-batch of m-sharpness). An optimizer whose contract differs
says so in a :class:`Contract`: a class attribute ``closure_contract`` (looked up along the class's
MRO), or, for classes that do not declare one, an entry of :data:`CONTRACTS` made with
:func:`register_contract` (VOGN, FlatSGVB). The trainer reads the contract; it never branches on
optimizer names.

* ``closure = "backward"``: the usual closure. With Bayesian layers
  (:func:`optimizers.convert_to_bayesian`) its loss is the negative ELBO per datum
  ``nll + kl_weight * KL(q || p) / N`` (Blundell et al. 2015, eq. 2, Sec. 3.4), unless the optimizer
  ``adds_kl`` itself (FlatSGVB, Nguyen et al. 2023, eq. 7), when the closure returns the NLL only.
* ``closure = "per_example_losses"``: the closure runs the forward pass and returns the ``[B]``
  per-example losses attached to the graph, without ``backward`` (VOGN, Osawa et al. 2019, Alg. 1:
  the optimizer differentiates every example itself). Such an optimizer cannot be combined with fp16
  loss scaling or with data parallelism (its gradient moments are formed inside ``step``), and the
  examples must not interact (no BatchNorm in training mode): ``independent_examples``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from experiments.amp import autocast_context
from experiments.config import ConfigError
from experiments.parallel import DistContext
from optimizers import VOGN, BayesianSAM, FlatSGVB
from optimizers.amp import LossScaler
from optimizers.perturbation import PerturbationOptimizer

__all__ = ["CONTRACTS", "ClosureFactory", "Contract", "contract_of", "register_contract"]

_CLOSURES = ("backward", "per_example_losses")


@dataclass(frozen=True)
class Contract:
    """The closure an optimizer needs and what it can be combined with (see the module docstring)."""

    closure: str = "backward"
    adds_kl: bool = False
    needs_bayesian_layers: bool = False
    independent_examples: bool = False
    loss_scaling: bool = True
    data_parallel: bool = True

    def __post_init__(self) -> None:
        if self.closure not in _CLOSURES:
            raise ValueError(f"Contract.closure must be one of {list(_CLOSURES)}, got {self.closure!r}")


#: Contracts of optimizer classes that do not declare ``closure_contract`` themselves.
CONTRACTS: dict[type, Contract] = {}


def register_contract(cls: type, contract: Contract) -> None:
    """Record the closure contract of ``cls`` (and its subclasses)."""
    if not isinstance(cls, type) or not isinstance(contract, Contract):
        raise TypeError("register_contract(cls, contract) takes a class and a Contract")
    CONTRACTS[cls] = contract


def _register_suite() -> None:
    per_example = Contract(
        closure="per_example_losses", independent_examples=True, loss_scaling=False, data_parallel=False
    )
    CONTRACTS.setdefault(VOGN, per_example)
    CONTRACTS.setdefault(FlatSGVB, Contract(adds_kl=True, needs_bayesian_layers=True))


def contract_of(fn: Any) -> Contract:
    """The :class:`Contract` of an optimizer class (or of an instance's class); functions building
    an optimizer (``f_swag``, ``f_mc_dropout``) and undeclared classes get the default."""
    if not CONTRACTS:
        _register_suite()
    cls = fn if isinstance(fn, type) else type(fn)
    for klass in cls.__mro__:
        declared = klass.__dict__.get("closure_contract")
        if isinstance(declared, Contract):
            return declared
        if klass in CONTRACTS:
            return CONTRACTS[klass]
    return Contract()


def pass_detector(ctx: DistContext, inner: Any, method_name: str) -> tuple[Callable[[], bool] | None, Any]:
    """For ``perturbation = "local"``: a function telling whether the closure call is the pass at
    ``w`` (not all-reduced) of a two-pass method, and a ``reset()`` for the start of each step."""
    if not (ctx.data_parallel and ctx.perturbation == "local"):
        return None, None
    if isinstance(inner, PerturbationOptimizer) and inner.passes == 2:
        return (lambda: not inner.perturbed), None
    if isinstance(inner, BayesianSAM):
        calls = [0]

        def parity() -> bool:
            first = calls[0] % 2 == 0
            calls[0] += 1
            return first

        def reset() -> None:
            calls[0] = 0

        return parity, reset
    raise ConfigError(
        f'distributed.perturbation = "local" applies to two-pass SAM-family optimizers (SAM, ASAM, '
        f"FisherSAM, VariationalSAM, BayesianSAM, FlatSGVB); method {method_name!r} uses "
        f"{type(inner).__name__}"
    )


class ClosureFactory:
    """Builds the closure of one optimizer step on a batch, following the optimizer's contract.

    ``kl``: ``None``, or ``(kl_divergence_fn, kl_weight, N)`` to add ``kl_weight * KL / N`` to the
    loss (Bayesian layers, an optimizer that does not add the KL itself). ``bn_sync``: the
    synchronised BatchNorm state (:class:`experiments.sync_batchnorm.BatchNormSync`) whose weight
    each sub-batch sets. See :mod:`experiments.parallel` for the data-parallel weights.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        inner: Any,
        contract: Contract,
        loss_fn: nn.Module,
        params: list[torch.Tensor],
        precision: str,
        device: torch.device,
        ctx: DistContext,
        method_name: str,
        create_graph: bool = False,
        kl: tuple[Callable[[nn.Module], torch.Tensor], float, int] | None = None,
        bn_sync: Any = None,
        forward: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        self.model, self.inner, self.contract, self.loss_fn = model, inner, contract, loss_fn
        self.forward = model if forward is None else forward  # e.g. torch.compile(model)
        self.params, self.precision, self.device = params, precision, device
        self.ctx, self.create_graph, self.kl, self.bn_sync = ctx, create_graph, kl, bn_sync
        self.first_pass, self._reset = pass_detector(ctx, inner, method_name)
        self.per_example_fn = nn.CrossEntropyLoss(reduction="none", label_smoothing=loss_fn.label_smoothing)

    def chunk_weights(self, n_global: int, m: int) -> list[float]:
        """``n_local,k / n_global,k`` for each sub-batch ``k`` of the closure (``m`` sub-batches);
        computed once per ``(n_global, m)`` (the same for every step of a run)."""
        cache = self.__dict__.setdefault("_chunk_weight_cache", {})
        if (n_global, m) not in cache:
            cache[(n_global, m)] = self._chunk_weights(n_global, m)
        return cache[(n_global, m)]

    def _chunk_weights(self, n_global: int, m: int) -> list[float]:
        ctx = self.ctx
        shards = torch.tensor_split(torch.arange(n_global), ctx.world if ctx.data_parallel else 1)
        sizes = [[len(c) for c in torch.tensor_split(s, m)] for s in shards]
        mine = sizes[ctx.rank if ctx.data_parallel else 0]
        totals = [sum(col) for col in zip(*sizes)]
        return [a / b if b else 0.0 for a, b in zip(mine, totals)]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.precision in ("float32", "float64"):  # no autocast context to enter per pass
            return self.forward(x)
        with autocast_context(self.precision, self.device):
            out = self.forward(x)
        return out.float() if out.dtype in (torch.float16, torch.bfloat16) else out

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, n_global: int, scaler: LossScaler
    ) -> Callable[..., torch.Tensor]:
        """The closure for the local batch ``(x, y)`` of a global batch of ``n_global`` examples,
        its loss scaled by ``scaler`` (``fp16``; unscaled inside the closure)."""
        if self._reset is not None:
            self._reset()
        if self.contract.closure == "per_example_losses":
            return lambda: self.per_example_fn(self._logits(x), y)
        m = int(getattr(self.inner, "m", 1))
        xs, ys = ((x,), (y,)) if m == 1 else (torch.tensor_split(x, m), torch.tensor_split(y, m))
        weights = self.chunk_weights(n_global, m)
        ctx = self.ctx

        def closure(chunk: int | None = None) -> torch.Tensor:
            k = 0 if chunk is None else chunk
            xb, yb = (x, y) if chunk is None else (xs[k], ys[k])
            for p in self.params:
                p.grad = None
            if self.bn_sync is not None:
                self.bn_sync.weight = weights[k]
            loss = self.loss_fn(self._logits(xb), yb)
            if self.kl is not None:
                kl_fn, kl_weight, n = self.kl
                loss = loss + kl_weight * kl_fn(self.model) / n
            scaler.scale_loss(loss).backward(create_graph=self.create_graph)
            scaler.unscale_(self.params)
            if ctx.data_parallel:
                local_first = self.first_pass is not None and self.first_pass()
                if not local_first:
                    ctx.reduce_grads(self.params, weights[k])
                    return ctx.reduce_value(loss, weights[k])
            return loss.detach()

        # what optimizers.m_sharpness needs to vectorise the m sub-batches (m-sharpness)
        closure.model, closure.loss_fn, closure.x_chunks, closure.y_chunks = self.model, self.loss_fn, xs, ys
        cache = self.__dict__.setdefault("_unavailable_cache", {})  # the same for every step of a run
        if scaler.enabled not in cache:
            cache[scaler.enabled] = self._batched_unavailable(scaler)
        closure.batched_unavailable = cache[scaler.enabled]
        return closure

    def _batched_unavailable(self, scaler: LossScaler) -> str | None:
        """Why the optimizer must run this closure's sub-batches one by one (``None``: it may not);
        depends on the run's settings only (cached per ``scaler.enabled``)."""
        if self.precision not in ("float32", "float64"):
            return f"precision {self.precision} (autocast / fp16 loss scaling run in the closure)"
        reasons = {
            "fp16 loss scaling": scaler.enabled,
            "KL term in the closure": self.kl is not None,
            "synchronised BatchNorm": self.bn_sync is not None,
            "data parallel": self.ctx.data_parallel,
            "create_graph": self.create_graph,
        }
        return next((why for why, on in reasons.items() if on), None)


def check_sub_batches(m: int, n: int, batch_size: int, drop_last: bool, method: str, world: int = 1) -> None:
    """m-sharpness splits every batch (each rank's share of it under data parallelism, ``world``
    ranks) into ``m`` sub-batches: each needs an example (an empty one has a NaN mean loss, which
    the divergence check would report as the method diverging)."""
    if m <= 1:
        return
    ranks = "" if world == 1 else f" on each of {world} ranks"
    if batch_size // world < m:
        raise ConfigError(
            f"method {method!r} splits each batch{ranks} into m = {m} sub-batches, but train.batch_size = "
            f"{batch_size} leaves some of them empty; use a batch size of at least {m * world} or a smaller m"
        )
    rest = n % batch_size
    if not drop_last and 0 < rest and rest // world < m:
        raise ConfigError(
            f"the last batch of each epoch has {rest} examples ({n} training examples, batch size "
            f"{batch_size}), too few for the m = {m} sub-batches{ranks} of method {method!r}; set "
            "train.drop_last = true, or a batch size that leaves at least m examples per rank in the "
            "last batch"
        )
