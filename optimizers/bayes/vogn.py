"""VOGN: variational online Gauss-Newton (Khan et al. 2018; Osawa et al. 2019, Alg. 1).

Mean-field Gaussian variational learning whose precision is an exponential average of squared
*per-example* gradients (a diagonal Gauss-Newton estimate).  The update, its derivation and where it
differs from the paper and the authors' code are in ``docs/methods/optimizers.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from landscape.checks import check_range
from optimizers.per_example import PerExampleGradients, batched_backward_moments
from optimizers.posterior import (
    DiagonalGaussianPosterior,
    check_nonneg,
    check_num_data,
    check_positive,
    resolve_generator,
)
from optimizers.state import GeneratorStateMixin

__all__ = ["VOGN", "batchnorm_parameters", "per_example_gradient_moments"]


def _check_betas(name: str, betas: Any) -> None:
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"{name} must be two numbers (beta1, beta2), got {betas!r}")
    check_range(f"{name}[0]", betas[0], 0.0, 1.0, high_open=True)
    check_range(f"{name}[1]", betas[1], 0.0, 1.0, low_open=True)


def batchnorm_parameters(model: nn.Module) -> list[torch.Tensor]:
    """The weights and biases of ``model``'s BatchNorm layers: every ``torch.nn.modules.batchnorm._BatchNorm``
    (``BatchNorm1d/2d/3d``, their lazy forms, ``SyncBatchNorm``); not GroupNorm, LayerNorm or InstanceNorm
    (the layers torchsso's ``non_reg_for_bn`` exempts are ``nn.BatchNorm1d/2d/3d``)."""
    return [p for m in model.modules() if isinstance(m, _BatchNorm) for p in m.parameters(recurse=False)]


def _batchnorm_leaves(losses: torch.Tensor) -> list[torch.Tensor]:
    """Leaf tensors that enter a batch-norm operation of ``losses``' autograd graph as its weight or
    bias, directly or through one dtype cast (autocast)."""
    found: dict[int, torch.Tensor] = {}
    seen: set[int] = set()
    stack = [losses.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        nexts = [f for f, _ in node.next_functions]
        stack.extend(nexts)
        if "BatchNorm" not in type(node).__name__:
            continue
        for f in nexts[1:3]:  # (input, weight, bias, ...)
            if f is not None and type(f).__name__.startswith("ToCopy"):
                f = f.next_functions[0][0] if f.next_functions else None
            var = getattr(f, "variable", None)
            if var is not None:
                found[id(var)] = var
    return list(found.values())


def per_example_gradient_moments(
    losses: torch.Tensor,
    params: list[torch.Tensor],
    chunk_size: int | None = None,
    state: dict[str, Any] | None = None,
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """``(sum_i g_i, sum_i g_i * g_i)`` per parameter, ``g_i = d losses[i] / d param``, by batched
    backward passes over the rows of the per-example Jacobian (the model-free path; VOGN uses
    :class:`optimizers.per_example.PerExampleGradients`, one backward pass where the layers allow it):
    :func:`optimizers.per_example.batched_backward_moments`.  A parameter the losses do not depend on
    gives ``None``."""
    mom = batched_backward_moments(losses, params, chunk_size, state)
    return mom.sum, mom.sum_sq


class VOGN(DiagonalGaussianPosterior, GeneratorStateMixin, torch.optim.Optimizer):
    r"""VOGN: mean-field Gaussian ``q = N(mu, diag(sigma^2))`` learned by natural-gradient VI.

    The model's parameters hold the mean ``mu``; per parameter the optimizer keeps the momentum
    ``m = 0`` and the scaled precision ``s = s_init``.  With ``delta~ = tau * prior_precision / N``
    (``tau`` = ``tempering``) and ``gamma`` = ``damping``, one step is (Osawa et al. 2019, Alg. 1, as
    the authors' ``torchsso`` code runs it: ``VIOptimizer`` with raw momentum and a diagonal
    ``Cov`` curvature; Khan et al. 2018, Sec. 3, for the natural-gradient derivation)::

        sigma = sqrt(tau / (N (s + delta~ + gamma)))
        for k = 1..K (mc_samples):
            theta_k = mu + sigma * z_k,  z_k ~ N(0, I)            # written into the parameters
            g_ik = grad of example i's loss at theta_k           # per-example gradients
            g_k = mean_i g_ik,   h_k = mean_i g_ik^2             # gradient, diagonal GGN estimate
        g, h = means over k
        m  <- beta1 m + (g + delta~ mu)                          # momentum, no (1 - beta1) factor
        s  <- (1 - beta2) s + beta2 h                            # beta2 weighs the NEW estimate
        mu <- mu - lr m / (s + delta~ + gamma)

    The posterior precision is ``N (s + delta~ + gamma) / tau``.  Noise is drawn with
    ``self.generator``, sample by sample, parameter by parameter in ``param_groups`` order,
    ``torch.randn(p.shape, generator, dtype=p.dtype, device=p.device)``.

    **BatchNorm parameters** (``non_reg_for_bn=True``, the default, as the official configuration's
    ``"non_reg_for_bn": true``; torchsso ``SecondOrderOptimizer`` / ``VIOptimizer``): the weights and
    biases of BatchNorm layers get no prior and no noise.  For them ``delta~ = 0`` in the momentum and
    in the step (``m <- beta1 m + g``, ``mu <- mu - lr m / (s + gamma)``) and ``sigma = 0`` (the samples,
    :meth:`sample` and the model average use the mean; their ``z`` is still drawn, so the other
    parameters' noise is the same either way); their ``s`` is updated like every parameter's.  VOGN
    finds them through ``model=`` (:func:`batchnorm_parameters`: ``_BatchNorm`` layers; GroupNorm and
    LayerNorm are regularised as in the official code); without the model, put them in a param group
    marked ``non_reg=True`` (a group so marked is treated this way whatever ``non_reg_for_bn``).  With
    ``non_reg_for_bn`` on, the first step looks for the parameters that enter a batch-norm operation
    of the losses' graph and raises if one of them is not exempt.

    **Closure contract (differs from the other optimizers):** the closure runs the forward pass
    and returns the *per-example* losses, a 1-D tensor ``[B]`` attached to the graph, e.g.
    ``lambda: F.cross_entropy(model(x), y, reduction="none")``; it does not call ``backward``.
    The optimizer differentiates every entry with :class:`optimizers.per_example.PerExampleGradients`:
    given ``model=``, from the layers' inputs and output gradients of one backward pass (as the
    authors' torchsso code does for ``Linear`` / ``Conv2d``; ``Conv1d``, ``LayerNorm``, ``GroupNorm``,
    eval-mode BatchNorm and ``Embedding`` too), else (no model, another parametrised layer, a train-mode
    BatchNorm whose batch statistics couple the examples) by batched backward passes over the
    per-example Jacobian; ``self.per_example.config()`` records which and why.  After the step
    ``p.grad`` holds ``g``.

    Args:
        params: parameters or param groups (``lr``, ``betas``, ``prior_precision``, ``damping`` and
            ``non_reg``, a bool: no prior and no noise for the group, may be set per group).
        lr: step size alpha (official CIFAR-10 ResNet-18 setting 1e-4).
        num_data: ``N`` (times the data-augmentation factor rho if one is used, Osawa et al.
            Sec. 3.1; official CIFAR-10 setting rho = 10).
        betas: ``(beta1, beta2)``: momentum and the weight of the new curvature estimate; default
            ``(0.9, 0.999)`` (official configurations).
        prior_precision: ``delta`` of the prior ``N(0, I / delta)``; default 50 (official CIFAR-10
            prior variance 0.02).
        damping: ``gamma``, default 1e-3 (official CIFAR-10 setting).
        tempering: ``tau`` (1: the Bayesian posterior; < 1: a cold posterior).
        s_init: initial ``s``, default 1.0.
        mc_samples: ``K``, weight samples per step (each one closure call, so a step costs ``K``
            forward and per-example backward passes); default 5, the official CIFAR-10/100 ResNet-18
            ``"num_mc_samples": 5``.  That value is per process: the official run has 8 processes in
            8 MC groups, each drawing its own 5 samples for its own 32 examples (40 draws per global
            batch of 256); here the ``K`` draws are shared by the whole batch.
        chunk_size: rows of the per-example Jacobian formed at once by the batched backward (``None``:
            the whole batch).
        seed, generator: randomness (see :func:`optimizers.posterior.resolve_generator`).
        model: the ``nn.Module`` whose parameters ``params`` are; ``non_reg_for_bn`` needs it to find
            the BatchNorm parameters (the experiment runner passes it).
        non_reg_for_bn: BatchNorm weights and biases get no prior and no noise (see above); default
            True, the official configuration (torchsso's own default is False).
        per_example: ``"auto"`` (the layers' one-backward form where the model allows it),
            ``"layers"`` (raise if it does not) or ``"batched_backward"`` (the Jacobian rows, always).

    ``self.last``: ``loss`` (mean over examples and samples), ``grad_norm`` (``||g||``),
    ``noise_norm`` (mean over samples of ``||theta_k - mu||``), ``s_min/s_mean/s_max`` (after the
    update), ``posterior_std_mean``.  Prediction: :meth:`posterior_std`, :meth:`sample`,
    :meth:`bayesian_model_average`.
    """

    _group_keys = ("lr", "betas", "prior_precision", "damping")

    def __init__(
        self,
        params: Any,
        lr: float,
        num_data: int,
        betas: tuple[float, float] = (0.9, 0.999),  # official configurations
        prior_precision: float = 50.0,  # official CIFAR-10 setting (prior variance 0.02)
        damping: float = 1e-3,  # official CIFAR-10 setting
        tempering: float = 1.0,
        s_init: float = 1.0,
        mc_samples: int = 5,  # official CIFAR-10 ResNet-18 setting (per process)
        chunk_size: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        *,
        model: nn.Module | None = None,
        non_reg_for_bn: bool = True,  # official CIFAR-10 ResNet-18 setting
        per_example: str = "auto",
    ) -> None:
        check_nonneg("lr", lr)
        check_num_data(num_data)
        _check_betas("betas", betas)
        check_nonneg("prior_precision", prior_precision)
        check_nonneg("damping", damping)
        check_positive("tempering", tempering)
        check_nonneg("s_init", s_init)
        check_positive("mc_samples", mc_samples, integer=True)
        if chunk_size is not None:
            check_positive("chunk_size", chunk_size, integer=True)
        if per_example not in ("auto", "layers", "batched_backward"):
            raise ValueError(
                f"per_example must be 'auto', 'layers' or 'batched_backward', got {per_example!r}"
            )
        if not isinstance(non_reg_for_bn, bool):
            raise ValueError(f"non_reg_for_bn must be True or False, got {non_reg_for_bn!r}")
        if model is not None and not isinstance(model, nn.Module):
            raise ValueError(
                f"model must be the torch.nn.Module whose parameters VOGN optimizes, got "
                f"{type(model).__name__}; pass model=net (or leave it out)"
            )
        if s_init + damping + prior_precision == 0:
            raise ValueError(
                "s_init, damping and prior_precision are all 0: the initial posterior variance is "
                "infinite; make one of them positive (e.g. damping=1e-3)"
            )
        defaults = dict(
            lr=lr, betas=tuple(betas), prior_precision=prior_precision, damping=damping, non_reg=False
        )
        super().__init__(params, defaults)
        self.non_reg_for_bn = non_reg_for_bn
        self._bn_ids: set[int] = set()
        if model is not None:
            own = {id(p) for p in model.parameters()}
            foreign = sum(id(p) not in own for g in self.param_groups for p in g["params"])
            if foreign:
                raise ValueError(
                    f"VOGN: {foreign} of the optimized parameters are not parameters of model=; pass the "
                    "module whose parameters VOGN optimizes (e.g. VOGN(net.parameters(), ..., model=net))"
                )
            if non_reg_for_bn:
                self._bn_ids = {id(p) for p in batchnorm_parameters(model)}
        self._bn_graph_checked = not non_reg_for_bn
        self.num_data = int(num_data)
        self.tempering = float(tempering)
        self.s_init = float(s_init)
        self.mc_samples = int(mc_samples)
        self.chunk_size = chunk_size
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.config = dict(
            lr=lr,
            num_data=num_data,
            betas=tuple(betas),
            prior_precision=prior_precision,
            damping=damping,
            tempering=tempering,
            s_init=s_init,
            mc_samples=mc_samples,
            chunk_size=chunk_size,
            seed=self.seed,
            non_reg_for_bn=non_reg_for_bn,
            per_example=per_example,
        )
        self._grad_state: dict[str, Any] = {}
        self._model = model
        #: the per-example gradient engine of the optimized parameters (built at the first step, again
        #: if the parameters change); ``per_example.config()``: the method and why
        self.per_example: PerExampleGradients | None = None
        self.last: dict[str, Any] = {}

    # ----------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; its hyperparameters (given or defaulted) are checked like the constructor's."""
        super().add_param_group(param_group)
        group, i = self.param_groups[-1], len(self.param_groups) - 1
        for key in ("lr", "prior_precision", "damping"):
            check_nonneg(f"{key} (param group {i})", group[key])
        _check_betas(f"betas (param group {i})", group["betas"])
        if not isinstance(group["non_reg"], bool):
            raise ValueError(
                f"non_reg (param group {i}) must be True (no prior, no noise: BatchNorm parameters) or "
                f"False, got {group['non_reg']!r}"
            )

    def _params(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _s(self, p: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        if "s" not in st:
            st["s"] = torch.full_like(p, self.s_init, memory_format=torch.preserve_format)
            st["momentum"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] = 0
        return st["s"]

    def _exempt(self, group: dict[str, Any], p: torch.Tensor) -> bool:
        """No prior and no noise: a ``non_reg`` group, or a BatchNorm parameter of ``model=``."""
        return bool(group.get("non_reg", False)) or id(p) in self._bn_ids

    def _delta(self, group: dict[str, Any], p: torch.Tensor | None = None) -> float:
        """``delta~ = tau * prior_precision / N`` (Osawa et al. 2019, Sec. 3); 0 for an exempt ``p``."""
        if p is not None and self._exempt(group, p):
            return 0.0
        return self.tempering * group["prior_precision"] / self.num_data

    def _check_batchnorm(self, losses: torch.Tensor) -> None:
        """Once: every optimized parameter that is a batch-norm weight or bias must be exempt."""
        mine = {id(p): (g, p) for g, p in self._params()}
        bad = [p for p in _batchnorm_leaves(losses) if id(p) in mine and not self._exempt(*mine[id(p)])]
        if bad:
            shapes = ", ".join(str(tuple(p.shape)) for p in bad[:4])
            raise ValueError(
                f"VOGN: {len(bad)} optimized parameter(s) (shapes {shapes}) are BatchNorm weights or biases, "
                "but VOGN does not know them, and non_reg_for_bn=True (the official setting) exempts them "
                "from the prior and the noise; pass the model (VOGN(..., model=net)), or put them in a "
                "param group with non_reg=True, or set non_reg_for_bn=False to treat them like the rest"
            )
        self._bn_graph_checked = True

    def precision(self) -> dict[torch.Tensor, torch.Tensor]:
        """The scaled precision ``s`` of every parameter (``s_init`` before the first step)."""
        return {p: self._s(p).detach().clone() for _, p in self._params()}

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``sqrt(tau / (N (s + delta~ + gamma)))`` for every parameter (0 for the exempt ones)."""
        out = {}
        for group, p in self._params():
            if self._exempt(group, p):
                out[p] = torch.zeros_like(p, memory_format=torch.preserve_format).detach()
                continue
            denom = self.num_data * (self._s(p).detach() + self._delta(group) + group["damping"])
            out[p] = torch.sqrt(self.tempering / denom)
        return out

    # ----------------------------------------------------------------------------------------
    def _losses(self, closure: Callable[[], Any]) -> torch.Tensor:
        with torch.enable_grad():
            losses = closure()
        if not isinstance(losses, torch.Tensor) or losses.ndim != 1 or losses.shape[0] == 0:
            got = (
                f"shape {tuple(losses.shape)}" if isinstance(losses, torch.Tensor) else type(losses).__name__
            )
            raise ValueError(
                f"VOGN: the closure must return the per-example losses, a 1-D tensor [B] with B >= 1, "
                f"got {got}; e.g. `return F.cross_entropy(model(x), y, reduction='none')` (no backward)"
            )
        if not losses.requires_grad:
            raise ValueError(
                "VOGN: the per-example losses returned by the closure are not attached to the autograd "
                "graph; do not compute them under torch.no_grad() or detach them"
            )
        return losses

    def _engine(self, params: list[torch.Tensor]) -> PerExampleGradients:
        eng = self.per_example
        if (
            eng is None
            or len(eng.params) != len(params)
            or any(a is not b for a, b in zip(eng.params, params))
        ):
            eng = PerExampleGradients(
                params,
                self._model,
                method=self.config["per_example"],
                chunk_size=self.chunk_size,
                state=self._grad_state,
            )
            self.per_example = eng
        return eng

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One VOGN step (``mc_samples`` closure calls).  Returns the mean per-example loss."""
        if closure is None or not callable(closure):
            raise ValueError(
                "VOGN.step needs a closure that runs the forward pass and returns the per-example "
                "losses [B], e.g. `lambda: F.cross_entropy(model(x), y, reduction='none')`"
            )
        pairs = self._params()
        params = [p for _, p in pairs]
        s_list = [self._s(p) for p in params]
        std_map = self.posterior_std()
        stds = [std_map[p] for p in params]
        exempt = [self._exempt(g, p) for g, p in pairs]
        engine = self._engine(params)
        g_acc: list[torch.Tensor | None] = [None] * len(params)
        h_acc: list[torch.Tensor | None] = [None] * len(params)
        losses_mean, noise_norm = [], 0.0
        for _ in range(self.mc_samples):
            saved = [p.detach().clone() for p in params]
            try:
                sq = params[0].new_zeros(()) if params else torch.zeros(())
                for p, std, ex in zip(params, stds, exempt):
                    e = torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)
                    if ex:  # drawn all the same: the other parameters' noise does not depend on it
                        continue
                    e.mul_(std)
                    sq = sq + e.square().sum()
                    p.add_(e)
                noise_norm = noise_norm + sq.sqrt()  # 0-d tensor: no host read per step
                with engine.capture():
                    losses = self._losses(closure)
                if not self._bn_graph_checked:
                    self._check_batchnorm(losses)
                with torch.enable_grad():
                    mom = engine.moments(losses)
                g_sum, h_sum = mom.sum, mom.sum_sq
            finally:
                for p, old in zip(params, saved):
                    p.copy_(old)
            B = losses.shape[0]
            losses_mean.append(losses.detach().mean())
            for j in range(len(params)):
                if g_sum[j] is None:
                    continue
                g_acc[j] = g_sum[j] / B if g_acc[j] is None else g_acc[j] + g_sum[j] / B
                h_acc[j] = h_sum[j] / B if h_acc[j] is None else h_acc[j] + h_sum[j] / B
            del losses
        K = self.mc_samples
        g_sq = params[0].new_zeros(()) if params else torch.zeros(())
        for j, ((group, p), s) in enumerate(zip(pairs, s_list)):
            if g_acc[j] is None:
                continue
            st = self.state[p]
            beta1, beta2 = group["betas"]
            delta = self._delta(group, p)
            g, h = g_acc[j] / K, h_acc[j] / K
            g_sq = g_sq + g.square().sum()
            st["momentum"].mul_(beta1).add_(g + delta * p)
            s.mul_(1.0 - beta2).add_(h, alpha=beta2)
            p.addcdiv_(st["momentum"], s + delta + group["damping"], value=-group["lr"])
            st["step"] += 1
            p.grad = g
        loss, self.last = self._step_summary(
            losses_mean, "s", s_list, grad_norm=g_sq.sqrt(), noise_norm=noise_norm / K
        )
        return loss

    # ----------------------------------------------------------------------------------------
