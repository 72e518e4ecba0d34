"""Predictions of a trained run: the point prediction and Bayesian model averages (BMA) over several
input sets at once.

A BMA is ``p(y|x) ~ 1/S sum_s softmax(f(x; w_s))`` with ``w_s`` drawn from the method's posterior
(Blundell et al. 2015, eq. 5; Maddox et al. 2019, Sec. 4): the weights are set to sample ``s``
*once* and every input set (test, OOD, each CIFAR-10-C corruption) is predicted with it, in
batches, before the next sample is drawn, so all sets see the same ``S`` samples and a SWAG sample's
BatchNorm statistics are recomputed once per sample (``bn_data``, as Maddox et al. do) rather than
once per batch. Posteriors handled this way:

* :class:`optimizers.SWAG` (SWAG, SWAG-Diag, F-SWAG): ``opt.sample(generator, scale, model=,
  bn_data=)``;
* :class:`optimizers.DiagonalGaussianPosterior` (bSAM, VSAM, MFVI, IVON, ...): ``opt.sample(generator)``;
* :class:`optimizers.FlatSGLD`: the stored iterates.

Any other optimizer with ``bayesian_model_average`` is called batch by batch with a generator
re-seeded for every batch (the same samples for every batch).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["bma_with_method", "ensemble_probs", "predict_probs", "sample_contexts"]

Context = Callable[[], contextlib.AbstractContextManager[Any]]


def predict_probs(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax probabilities ``[N, C]`` (float64, CPU) of ``model`` on ``x``, in batches, eval mode;
    the train/eval mode of every module is restored."""
    was = {m: m.training for m in model.modules()}
    dtype = next(model.parameters()).dtype
    out = []
    try:
        model.eval()
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                logits = model(x[i : i + batch_size].to(device=device, dtype=dtype))
                out.append(torch.softmax(logits.double(), dim=1).cpu())
    finally:
        for m, mode in was.items():
            m.training = mode
    return torch.cat(out)


@contextlib.contextmanager
def _params_set(params: list[torch.Tensor], values: list[torch.Tensor]) -> Iterator[None]:
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p, v in zip(params, values):
                p.copy_(v)
        yield
    finally:
        with torch.no_grad():
            for p, old in zip(params, saved):
                p.copy_(old)


def sample_contexts(
    opt: Any,
    model: nn.Module,
    *,
    samples: int,
    scale: float,
    seed: int,
    device: torch.device,
    bn_data: Any = None,
) -> list[Context] | None:
    """One context manager factory per posterior sample (see the module docstring); ``None`` for
    an optimizer without a posterior of a known kind."""
    from optimizers import SWAG, FlatSGLD
    from optimizers.bayes.swag import has_batchnorm
    from optimizers.posterior import DiagonalGaussianPosterior

    gen = torch.Generator(device=device).manual_seed(seed)
    if isinstance(opt, SWAG):
        if opt.n_collected < 2:
            return None
        bn = bn_data if has_batchnorm(model) else None
        return [lambda: opt.sample(gen, scale, model=model, bn_data=bn)] * samples
    if isinstance(opt, DiagonalGaussianPosterior):
        return [lambda: opt.sample(gen)] * samples
    if isinstance(opt, FlatSGLD):
        params = [p for g in opt.param_groups for p in g["params"]]
        return [lambda s=s: _params_set(params, list(s)) for s in opt.samples] or None
    return None


def ensemble_probs(
    contexts: list[Context],
    model: nn.Module,
    sets: dict[str, Callable[[], torch.Tensor]],
    batch_size: int,
    device: torch.device,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Average predictive probabilities of every input set over the samples of ``contexts``
    (sample outer, sets inner; ``sets`` maps a name to a function returning the inputs)."""
    sums: dict[str, torch.Tensor] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(contexts), desc="model average", unit="sample", leave=False)
    for make in contexts:
        with make():
            for name, get in sets.items():
                p = predict_probs(model, get(), batch_size, device)
                sums[name] = p if name not in sums else sums[name] + p
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {k: v / len(contexts) for k, v in sums.items()}


def bma_with_method(
    opt: Any,
    model: nn.Module,
    x: torch.Tensor,
    *,
    samples: int,
    scale: float,
    seed: int,
    batch_size: int,
    device: torch.device,
) -> torch.Tensor:
    """``opt.bayesian_model_average`` batch by batch, the generator re-seeded for every batch."""
    fn = opt.bayesian_model_average
    params = inspect.signature(fn).parameters
    dtype = next(model.parameters()).dtype
    out = []
    for i in range(0, len(x), batch_size):
        kw: dict[str, Any] = {}
        if "samples" in params:
            kw["samples"] = samples
        if "generator" in params:
            kw["generator"] = torch.Generator(device=device).manual_seed(seed)
        if "scale" in params:
            kw["scale"] = scale
        probs = fn(model, x[i : i + batch_size].to(device=device, dtype=dtype), **kw)
        out.append(probs.double().cpu())
    return torch.cat(out)
