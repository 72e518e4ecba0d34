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
* :class:`optimizers.FlatSGLD`: the stored iterates;
* Bayesian layers (:func:`optimizers.convert_to_bayesian`; SGVB, SGVB-LRT, F-SGVB): a weight sample
  ``w = mu + softplus(rho) * eps`` per layer, ``eps`` drawn from the evaluation generator layer by
  layer in ``modules()`` order, weight before bias (Blundell et al. 2015, eq. 5; for SGVB-LRT too:
  the local reparameterisation is a training estimator, the posterior is the same Gaussian over
  the weights);
* a deep ensemble (:class:`Members`): the members' weights and buffers, one after the other
  (Lakshminarayanan et al. 2017, Sec. 2.4).

The point prediction of a model with Bayesian layers is its mean network (``use_mean``). The
MC-Dropout predictive (:func:`mc_dropout_probs`) is computed per input set with torch's global RNG
forked and seeded: masks differ from example to example, so there is no weight sample to share.

Any other optimizer with ``bayesian_model_average`` is called batch by batch with a generator
re-seeded for every batch (the same samples for every batch).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from landscape.data.batching import inputs_to
from optimizers import SWAG, FlatSGLD
from optimizers.bayes.mc_dropout import dropout_modules, seeded_global_rng
from optimizers.bayes.sgvb import bayes_layers, use_mean
from optimizers.bayes.swag import has_batchnorm
from optimizers.posterior import DiagonalGaussianPosterior

__all__ = [
    "Members",
    "bma_with_method",
    "ensemble_probs",
    "mc_dropout_probs",
    "point_context",
    "predict_probs",
    "sample_contexts",
]

Context = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclass
class Members:
    """The trained members of a deep ensemble: ``states[k]`` is member ``k``'s ``state_dict`` (on the
    CPU), ``seeds[k]`` its seed; their model average replaces each state in turn."""

    states: list[dict[str, torch.Tensor]]
    seeds: list[int]


def point_context(model: nn.Module) -> contextlib.AbstractContextManager[Any]:
    """The mean network of a model with Bayesian layers; a null context otherwise."""
    return use_mean(model) if bayes_layers(model) else contextlib.nullcontext()


def predict_probs(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax probabilities ``[N, C]`` (float64, CPU) of ``model`` on ``x``, in batches, eval mode
    (the mean network of Bayesian layers); the train/eval mode of every module is restored."""
    was = {m: m.training for m in model.modules()}
    dtype = next(model.parameters()).dtype
    out = []
    try:
        model.eval()
        with torch.no_grad(), point_context(model):
            for i in range(0, len(x), batch_size):
                logits = model(inputs_to(x[i : i + batch_size], device, dtype))
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


@contextlib.contextmanager
def _state_set(model: nn.Module, state: dict[str, torch.Tensor]) -> Iterator[None]:
    """``model`` holds ``state`` (parameters and buffers) inside the block; restored bit-exactly."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        model.load_state_dict(state)
        yield
    finally:
        model.load_state_dict(saved)


@contextlib.contextmanager
def _bayes_sample(model: nn.Module, gen: torch.Generator) -> Iterator[None]:
    """The Bayesian layers of ``model`` compute with one weight sample ``mu + softplus(rho) * eps``
    inside the block (the means are restored bit-exactly)."""
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for layer in bayes_layers(model):
                for mu, rho in layer.mean_std_pairs():
                    eps = torch.randn(mu.shape, generator=gen, dtype=mu.dtype, device=mu.device)
                    saved.append((mu, mu.detach().clone()))
                    mu.copy_(mu + torch.nn.functional.softplus(rho) * eps)
        with use_mean(model):
            yield
    finally:
        with torch.no_grad():
            for mu, old in saved:
                mu.copy_(old)


def sample_contexts(
    opt: Any,
    model: nn.Module,
    *,
    samples: int,
    scale: float,
    seed: int,
    device: torch.device,
    bn_data: Any = None,
    diag_only: bool | None = None,
) -> list[Context] | None:
    """One context manager factory per posterior sample (see the module docstring); ``None`` for
    an optimizer without a posterior of a known kind. ``diag_only`` (SWAG only): ``True`` samples the
    diagonal part of the posterior (SWAG-Diag), ``False`` the low rank plus diagonal one (SWAG),
    ``None`` the one the SWAG was built with."""
    if isinstance(opt, Members):
        return [lambda s=s: _state_set(model, s) for s in opt.states]

    gen = torch.Generator(device=device).manual_seed(seed)
    if isinstance(opt, SWAG):
        if opt.n_collected < 2:
            return None
        bn = bn_data if has_batchnorm(model) else None
        return [lambda: opt.sample(gen, scale, diag_only=diag_only, model=model, bn_data=bn)] * samples
    if isinstance(opt, DiagonalGaussianPosterior):
        return [lambda: opt.sample(gen)] * samples
    if isinstance(opt, FlatSGLD):
        params = [p for g in opt.param_groups for p in g["params"]]
        return [lambda s=s: _params_set(params, list(s)) for s in opt.samples] or None
    if bayes_layers(model):
        return [lambda: _bayes_sample(model, gen)] * samples
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
        probs = fn(model, inputs_to(x[i : i + batch_size], device, dtype), **kw)
        out.append(probs.double().cpu())
    return torch.cat(out)


def mc_dropout_probs(
    model: nn.Module,
    sets: dict[str, Callable[[], torch.Tensor]],
    *,
    samples: int,
    seed: int,
    batch_size: int,
    device: torch.device,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """MC-Dropout predictive ``1/S sum_s softmax(f(x; M_s * W))`` (Gal & Ghahramani 2016, eq. 8) of
    every input set: all modules in eval mode except the dropout modules (BatchNorm uses its running
    statistics); for each set torch's global RNG is forked and seeded with ``seed``
    (:func:`optimizers.bayes.mc_dropout.seeded_global_rng`) and the ``S`` passes run sample by
    sample, batch by batch inside a pass. The caller's RNG state and every module's mode are
    restored."""
    drops = dropout_modules(model)
    if not drops:
        raise ValueError("mc_dropout_probs: the model has no dropout module; set model.kwargs.dropout > 0")
    was = {m: m.training for m in model.modules()}
    dtype = next(model.parameters()).dtype
    out: dict[str, torch.Tensor] = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=samples * len(sets), desc="MC-Dropout", unit="pass", leave=False)
    try:
        model.eval()
        for m in drops:
            m.train()
        for name, get in sets.items():
            x = get()
            total: torch.Tensor | None = None
            with torch.no_grad(), seeded_global_rng(seed, device.type):
                for _ in range(samples):
                    parts = []
                    for i in range(0, len(x), batch_size):
                        logits = model(inputs_to(x[i : i + batch_size], device, dtype))
                        parts.append(torch.softmax(logits.double(), dim=1).cpu())
                    probs = torch.cat(parts)
                    total = probs if total is None else total + probs
                    if bar is not None:
                        bar.update(1)
            assert total is not None
            out[name] = total / samples
    finally:
        for m, mode in was.items():
            m.training = mode
        if bar is not None:
            bar.close()
    return out
