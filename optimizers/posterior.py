"""Shared utilities for optimizers that carry a diagonal-Gaussian posterior ``q = N(mean, diag(std^2))``.

Used by :class:`optimizers.MFVI`, :class:`optimizers.BayesianSAM` and the SAM family's
``VariationalSAM``.  The API is deliberately small:

``DiagonalGaussianPosterior`` (mixin for a ``torch.optim.Optimizer``)
    A subclass implements ``posterior_std() -> dict[Parameter, Tensor]``: the standard deviation
    of every parameter it manages (same shape as the parameter).  The posterior *mean* is always
    the parameter's current value (all these optimizers keep the mean in the model between steps).
    The mixin then provides

    * ``posterior_mean() -> dict[Parameter, Tensor]`` (detached clones),
    * ``sample(generator=None)``: a context manager that sets every managed parameter to
      ``mean + std * z``, ``z ~ N(0, I)`` drawn with ``generator`` (default: the optimizer's own
      ``self.generator`` if it has one), and restores the means **bit-exactly** on exit, also when
      the body raises.  Noise is drawn parameter by parameter in ``param_groups`` order with
      ``torch.randn(p.shape, generator=..., dtype=p.dtype, device=p.device)``,
    * ``bayesian_model_average(model, inputs, samples=32, generator=None, include_mean=False)``.

``bayesian_model_average(posterior, model, inputs, samples=32, generator=None, include_mean=False)``
    Monte-Carlo predictive ``p(y|x) ~ 1/S sum_s softmax(f(x; w_s))`` with ``w_s ~ q`` (Blundell et
    al. 2015, eq. 5; bSAM paper Sec. 4: 32 samples, optionally with the mean prediction added as an
    extra member).  Multi-class logits ``[B, C]`` are averaged after a softmax; a single logit
    (``[B]`` or ``[B, 1]``) after a sigmoid (probability of class 1, same shape as the output).
    The model is run in eval mode under ``torch.no_grad()``; its parameters, buffers, ``.grad`` and
    train/eval mode are left exactly as they were.

``check_nonneg``, ``check_positive``, ``check_num_data``, ``check_closure_loss``
    Validation helpers with error messages that name the argument and the fix (the first two are
    :mod:`landscape.checks`').

``resolve_generator(seed, generator, device)``
    The generator convention of this package: an explicit ``generator`` wins; else a new one on
    ``device`` seeded with ``seed`` (``seed=None`` draws a seed from torch's global RNG, so
    ``torch.manual_seed`` makes runs reproducible).  Returns ``(generator, seed)``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from landscape.checks import check_nonnegative, check_positive, check_seed

__all__ = ["DiagonalGaussianPosterior", "bayesian_model_average", "resolve_generator", "probabilities"]


# the argument checks are landscape.checks' (one set for the whole project); the short names below
# are kept for the modules of this package
check_nonneg = check_nonnegative


def check_num_data(num_data: Any) -> None:
    """Raise unless ``num_data`` (the training-set size N) is an integer ``> 0`` (not a bool/float)."""
    try:
        check_positive("num_data (the training-set size N)", num_data, integer=True)
    except ValueError as exc:  # ArgumentTypeError is a ValueError too
        raise type(exc)(f"{exc}; pass the number of training examples, e.g. num_data=len(dataset)") from None


def check_closure_loss(loss: Any, who: str) -> torch.Tensor:
    """The closure contract: it must return the loss tensor."""
    if loss is None:
        raise ValueError(
            f"{who}: the closure returned None; it must zero the grads, run forward and backward and "
            "`return loss`"
        )
    if not isinstance(loss, torch.Tensor):
        loss = torch.as_tensor(loss)
    return loss


def resolve_generator(
    seed: int | None, generator: torch.Generator | None, device: torch.device | str | None = None
) -> tuple[torch.Generator, int | None]:
    """Return ``(generator, seed)`` following the package convention (see module docstring)."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator, seed
    check_seed(seed, allow_generator=False)
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())
    seed = int(seed)
    gen = torch.Generator(device=torch.device(device) if device is not None else "cpu")
    gen.manual_seed(seed)
    return gen, seed


def probabilities(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim for ``[..., C>1]`` logits, sigmoid for one logit (``[B]``/``[B, 1]``)."""
    if logits.dim() == 1 or logits.shape[-1] == 1:
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


def _forward(model: nn.Module, inputs: Any) -> torch.Tensor:
    out = model(inputs)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model(inputs) must return a logits tensor, got {type(out).__name__}")
    return out


class DiagonalGaussianPosterior:
    """Mixin: posterior sampling and model averaging for a diagonal Gaussian around the parameters."""

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def posterior_mean(self) -> dict[torch.Tensor, torch.Tensor]:
        """Posterior means: detached clones of the managed parameters."""
        return {p: p.detach().clone() for p in self.posterior_std()}

    def _sample_generator(self, generator: torch.Generator | None) -> torch.Generator | None:
        if generator is not None:
            return generator
        return getattr(self, "generator", None)

    @contextlib.contextmanager
    def sample(self, generator: torch.Generator | None = None) -> Iterator[dict[torch.Tensor, torch.Tensor]]:
        """Temporarily set the parameters to ``w ~ N(mean, diag(std^2))``; restore bit-exactly on exit.

        Yields the dict ``param -> noise`` (``std * z``) that was added.
        """
        stds = self.posterior_std()
        gen = self._sample_generator(generator)
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        noise: dict[torch.Tensor, torch.Tensor] = {}
        try:
            with torch.no_grad():
                for p, std in stds.items():
                    z = torch.randn(p.shape, generator=gen, dtype=p.dtype, device=p.device)
                    saved.append((p, p.detach().clone()))
                    noise[p] = std * z
                    p.add_(noise[p])
            yield noise
        finally:
            with torch.no_grad():
                for p, old in saved:
                    p.copy_(old)

    def _step_summary(
        self,
        losses: list[torch.Tensor],
        name: str,
        values: list[torch.Tensor],
        std: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **norms: float | torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The mean step loss and the ``self.last`` summary of a step (IVON, VOGN, bSAM).

        ``last = {loss, **norms, {name}_min, {name}_mean, {name}_max, posterior_std_mean}`` with the
        min/mean/max over every entry of the per-parameter ``values`` (``h`` or ``s``) and the mean
        of the posterior standard deviations: ``std(all values)`` if given, else
        :meth:`posterior_std`'s.  Without parameters the statistics are those of ``ones(1)``.
        """
        flat = torch.cat([v.reshape(-1) for v in values]) if values else torch.ones(1)
        if std is not None:
            sd = std(flat)
        else:
            sd = torch.cat([v.reshape(-1) for v in self.posterior_std().values()]) if values else flat
        loss = torch.stack(losses).mean()
        last = dict(  # 0-d tensors on the parameters' device: read (float()) only when needed
            loss=loss,
            **norms,
            **{f"{name}_min": flat.min(), f"{name}_mean": flat.mean()},
            **{f"{name}_max": flat.max(), "posterior_std_mean": sd.mean()},
        )
        return loss, last

    def bayesian_model_average(
        self,
        model: nn.Module,
        inputs: Any,
        samples: int = 32,
        generator: torch.Generator | None = None,
        include_mean: bool = False,
    ) -> torch.Tensor:
        """Monte-Carlo predictive probabilities; see :func:`bayesian_model_average`."""
        return bayesian_model_average(self, model, inputs, samples, generator, include_mean)


def bayesian_model_average(
    posterior: DiagonalGaussianPosterior,
    model: nn.Module,
    inputs: Any,
    samples: int = 32,
    generator: torch.Generator | None = None,
    include_mean: bool = False,
) -> torch.Tensor:
    """Average predictive probabilities over ``samples`` posterior draws (plus the mean if asked).

    ``p(y|x) = 1/S' sum_s probs(f(x; w_s))``, ``w_s ~ N(mean, diag(std^2))``, ``S' = samples +
    include_mean``.  ``probs`` is a softmax for ``[B, C]`` logits and a sigmoid for one logit.
    Default of 32 samples from the bSAM paper (Moellenhoff & Khan 2023, Sec. 4).
    """
    if not isinstance(posterior, DiagonalGaussianPosterior):
        raise TypeError(
            "posterior must be an optimizer with a diagonal-Gaussian posterior (MFVI, BayesianSAM, ...)"
        )
    check_nonnegative("samples", samples, integer=True)
    if samples == 0 and not include_mean:
        raise ValueError("samples must be > 0 unless include_mean=True (nothing to average otherwise)")
    was_training = {m: m.training for m in model.modules()}
    total: torch.Tensor | None = None
    count = 0
    try:
        model.eval()
        with torch.no_grad():
            if include_mean:
                total = probabilities(_forward(model, inputs)).clone()
                count += 1
            for _ in range(samples):
                with posterior.sample(generator):
                    probs = probabilities(_forward(model, inputs))
                total = probs.clone() if total is None else total + probs
                count += 1
    finally:
        for m, mode in was_training.items():
            m.training = mode
    assert total is not None
    return total / count


# --------------------------------------------------------------------------------------------
# averaging predictions over sampled weights (SWAG, F-SGLD)
# --------------------------------------------------------------------------------------------
def _forward(model: nn.Module, inputs: Any) -> torch.Tensor:
    out = model(inputs)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model(inputs) must return a logits tensor, got {type(out).__name__}")
    return out


@contextlib.contextmanager
def _weights_set_to(params: list[torch.Tensor], flat: torch.Tensor) -> Iterator[None]:
    """Temporarily write a flat vector into ``params``; restore the old values bit-exactly."""
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        yield
    finally:
        with torch.no_grad():
            for p, old in zip(params, saved):
                p.copy_(old)


def _ensemble_average(
    model: nn.Module, inputs: Any, weight_sets: Iterator[Callable[[], Any]]
) -> torch.Tensor:
    was_training = {m: m.training for m in model.modules()}
    total, count = None, 0
    try:
        model.eval()
        with torch.no_grad():
            for ctx in weight_sets:
                with ctx():
                    probs = probabilities(_forward(model, inputs))
                total = probs.clone() if total is None else total + probs
                count += 1
    finally:
        for m, mode in was_training.items():
            m.training = mode
    if total is None:
        raise ValueError("no ensemble members: collect some weights first")
    return total / count
