"""MC-Dropout (Gal & Ghahramani 2016) and F-MC-Dropout (Nguyen et al. 2023).

MC-Dropout trains a network with dropout as usual and predicts by Bayesian model averaging over
``S`` stochastic forward passes with dropout kept on (Gal & Ghahramani 2016, "Dropout as a Bayesian
approximation", Sec. 3, eq. 8, MC dropout):

    p(y | x) ~ 1/S sum_s softmax(f(x; M_s * W)),     M_s the dropout masks of pass s.

BatchNorm layers stay in eval mode (running statistics) during these passes; only the dropout
modules are switched to train.

F-MC-Dropout (Nguyen et al. 2023, "Flat seeking Bayesian neural networks", Sec. 3.3 and Tables 1-2)
trains the same network with the SAM gradient ``grad L(w + rho g / ||g||)`` instead of the gradient:
:func:`f_mc_dropout` builds the :class:`optimizers.SAM` optimizer.  Two ways to feed it a batch:

* any closure, e.g. :func:`landscape.models.train`'s: each pass draws fresh dropout masks (what a
  generic SAM loop does, and the authors' code);
* :func:`mc_dropout_closure`: the pass at ``w + eps`` reuses the masks of the pass at ``w``, so the
  ascent and the descent see the same sampled network ``M * W``, the literal reading of the
  sharpness-aware objective ``E_{theta ~ q}[max_{||theta' - theta|| <= rho} L(theta')]`` (paper
  eq. 6), in which the maximisation is around one sample ``theta``.

Reproducibility: dropout draws from torch's *global* RNG, so the seeded helpers here fork it
(:func:`torch.random.fork_rng`), seed it, and restore it on exit: the caller's RNG streams are left
exactly as they were.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.dropout import _DropoutNd

from landscape.checks import check_positive, check_seed
from optimizers.posterior import probabilities
from optimizers.sam.sam import SAM

__all__ = [
    "dropout_modules",
    "f_mc_dropout",
    "mc_dropout_closure",
    "mc_dropout_predict",
    "seeded_global_rng",
]

_SEED_RANGE = 2**62


def dropout_modules(model: nn.Module) -> list[nn.Module]:
    """Every dropout module of ``model`` (``nn.Dropout``, ``Dropout1d/2d/3d``, ``AlphaDropout``, ...)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return [m for m in model.modules() if isinstance(m, _DropoutNd)]


def _accelerator_type(model: nn.Module | None, inputs: Any = None) -> str | None:
    tensors: list[torch.Tensor] = []
    if model is not None:
        tensors += list(model.parameters()) + list(model.buffers())
    if isinstance(inputs, torch.Tensor):
        tensors.append(inputs)
    for t in tensors:
        if t.device.type not in ("cpu", "meta"):
            return t.device.type
    return None


@contextlib.contextmanager
def seeded_global_rng(seed: int, device_type: str | None = None) -> Iterator[None]:
    """Fork torch's global RNGs, seed them with ``seed``, and restore them bit-exactly on exit.

    The CPU generator is always forked; the generators of ``device_type`` (e.g. ``"cuda"``) too when
    given, and CUDA's whenever CUDA is already initialised (so that code creating CUDA tensors inside
    the block is reproducible as well).
    """
    check_seed(seed, allow_generator=False)
    if seed is None:
        raise ValueError("seeded_global_rng needs an integer seed, got None")
    kind = device_type if device_type not in (None, "cpu") else None
    if kind is None and torch.cuda.is_available() and torch.cuda.is_initialized():
        kind = "cuda"
    devices: list[int] = []
    if kind is not None:
        mod = torch.get_device_module(kind)
        devices = list(range(mod.device_count()))
    with torch.random.fork_rng(devices=devices, device_type=kind or "cpu"):
        torch.default_generator.manual_seed(int(seed))
        if devices:
            torch.get_device_module(kind).manual_seed_all(int(seed))
        yield


def _resolve_seed(seed: int | None, generator: torch.Generator | None) -> int:
    """An explicit generator wins (one draw from it); else ``seed``; else one draw from torch's RNG."""
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return int(torch.randint(0, _SEED_RANGE, (1,), generator=generator, device=generator.device).item())
    check_seed(seed, allow_generator=False)
    if seed is None:
        return int(torch.randint(0, _SEED_RANGE, (1,)).item())
    return int(seed)


def mc_dropout_predict(
    model: nn.Module,
    inputs: Any,
    samples: int = 30,  # the flat-seeking paper's ensembles use 30 samples (Sec. 4.2)
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """MC-Dropout predictive probabilities ``1/S sum_s probs(f(x; M_s * W))`` (Gal & Ghahramani 2016, eq. 8).

    The model runs under ``torch.no_grad()`` with every module in eval mode except the dropout
    modules, which are in train mode (BatchNorm uses its running statistics).  ``probs`` is a
    softmax for ``[B, C]`` logits and a sigmoid for one logit.  The masks are drawn from torch's
    global RNG forked and seeded with ``seed`` (or with one draw from ``generator``; with neither, a
    seed drawn from torch's RNG): the same seed gives the same masks, pass after pass in forward
    order, and the caller's RNG state is left unchanged.  Every module's ``training`` flag, the
    parameters, buffers and ``.grad`` are left exactly as they were, also when the forward raises.

    Raises ``ValueError`` if the model has no dropout module (the passes would all be equal).
    """
    drops = dropout_modules(model)
    if not drops:
        raise ValueError(
            "mc_dropout_predict: the model has no dropout module (nn.Dropout, nn.Dropout2d, ...); "
            "MC-Dropout needs dropout layers, add them to the model or predict deterministically"
        )
    check_positive("samples", samples, integer=True)
    step_seed = _resolve_seed(seed, generator)
    flags = {m: m.training for m in model.modules()}
    total: torch.Tensor | None = None
    try:
        model.eval()
        for m in drops:
            m.training = True
        with torch.no_grad(), seeded_global_rng(step_seed, _accelerator_type(model, inputs)):
            for _ in range(int(samples)):
                out = model(inputs)
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"model(inputs) must return a logits tensor, got {type(out).__name__}")
                probs = probabilities(out)
                total = probs.clone() if total is None else total + probs
    finally:
        for m, flag in flags.items():
            m.training = flag
    assert total is not None
    return total / int(samples)


def f_mc_dropout(
    params: Any,
    base_optimizer: Any = torch.optim.SGD,
    rho: float = 0.05,  # the paper's CIFAR-10 setting (0.1 for CIFAR-100)
    *,
    model: nn.Module | None = None,
    m: int = 1,
    **base_kwargs: Any,
) -> SAM:
    """F-MC-Dropout: the :class:`optimizers.SAM` optimizer for a network with dropout (Nguyen et al. 2023).

    Train with it exactly as with SAM (dropout on, through any closure or
    :func:`mc_dropout_closure`), then predict with :func:`mc_dropout_predict`.  ``model=`` lets SAM
    keep BatchNorm statistics out of the perturbed pass.
    """
    return SAM(params, base_optimizer, rho, model=model, m=m, **base_kwargs)


def mc_dropout_closure(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    m: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> Callable[..., torch.Tensor]:
    """Closure ``closure(chunk=None)`` whose perturbed pass reuses the dropout masks of the first pass.

    Every call runs ``loss_fn(model(x), y)`` inside :func:`seeded_global_rng` with a per-pass seed:
    a call with ``optimizer.perturbed`` false (the pass at ``w``, or every call of an optimizer
    without that attribute) draws a new seed from the closure's generator (seeded with ``seed``,
    or ``generator``) and remembers it for its chunk; a call with ``optimizer.perturbed`` true (the
    pass at ``w + eps`` of SAM and its relatives) reuses it, so both passes sample the same masks.
    The model should be in train mode (dropout on).  ``chunk``/``m`` follow
    :func:`optimizers.make_closure`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(_resolve_seed(seed, None))
    elif not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    m_ = int(m if m is not None else getattr(optimizer, "m", 1))
    if m_ < 1:
        raise ValueError(f"m must be >= 1, got {m_}")
    x_chunks, y_chunks = torch.tensor_split(inputs, m_), torch.tensor_split(targets, m_)
    seeds: dict[int | None, int] = {}
    kind = _accelerator_type(model, inputs)

    def closure(chunk: int | None = None) -> torch.Tensor:
        if getattr(optimizer, "perturbed", False):
            if chunk not in seeds:
                raise RuntimeError(
                    "mc_dropout_closure: the perturbed pass ran before the pass at w for this chunk"
                )
        else:
            seeds[chunk] = _resolve_seed(None, generator)
        x, y = (inputs, targets) if chunk is None else (x_chunks[chunk], y_chunks[chunk])
        optimizer.zero_grad()
        with seeded_global_rng(seeds[chunk], kind):
            loss = loss_fn(model(x), y)
            loss.backward()
        return loss.detach()

    return closure
