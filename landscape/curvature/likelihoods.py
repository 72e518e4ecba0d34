"""The likelihood whose negative log is the loss: inference from the loss, label sampling and the
output gradients of its negative log-likelihood (the Monte-Carlo Fisher's ingredients).

The Fisher of a model trained with loss ``l`` is the Fisher of the predictive distribution
``p(y | f)`` with ``-log p(y | f) = l(f, y) + const`` (Martens 2020, "New insights and perspectives on
the natural gradient method", Sec. 9.2).  For the three losses with such a ``p``:

=====================  ===============  =================================================
loss (``reduction``)   ``likelihood``   ``p(y | f)`` per loss term
=====================  ===============  =================================================
``CrossEntropyLoss``   categorical      ``softmax(f)_y``, one term per position of the output's
                                        extra dimensions (class dimension 1)
``MSELoss``            gaussian         ``N(y | f, 1/2)`` per output entry, since
                                        ``(f - y)^2 = -log N(y | f, 1/2) + const``
``BCEWithLogitsLoss``  bernoulli        ``Bernoulli(y | sigmoid(f))`` per output entry
=====================  ===============  =================================================

With ``u = d(-log p(yhat | f)) / d f`` for ``yhat ~ p(. | f)`` the identity ``E[u u^T] = d^2 (-log p)
/ d f^2`` (the output Hessian of the loss) makes the Monte-Carlo Fisher an unbiased estimate of the
generalised Gauss-Newton matrix of the same loss and reduction:
``E[F] = G = a sum_n J_n^T H_n J_n`` with ``a = 1`` for ``reduction="sum"`` and ``a = 1/(N m)`` for
``"mean"``, ``m`` the number of loss terms per example that the mean divides by
(:func:`terms_per_example`: positions for cross-entropy, output entries for MSE and BCE).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = [
    "LIKELIHOODS",
    "GAUSSIAN_VARIANCE",
    "check_likelihood",
    "fisher_term_scale",
    "infer_likelihood",
    "nll_output_gradients",
    "nll_sum",
    "sample_targets",
    "terms_per_example",
]

LIKELIHOODS = ("categorical", "gaussian", "bernoulli")
#: the variance of the Gaussian whose negative log-likelihood is the squared error ``(f - y)^2``
GAUSSIAN_VARIANCE = 0.5


def infer_likelihood(loss_fn: Any) -> str:
    """The likelihood of ``loss_fn`` (table in the module docstring); a ValueError for a loss that is
    not a plain negative log-likelihood (class weights, label smoothing, ``pos_weight``)."""
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
        if isinstance(loss_fn, nn.BCEWithLogitsLoss) and (
            loss_fn.weight is not None or loss_fn.pos_weight is not None
        ):
            raise ValueError(
                "the Monte-Carlo Fisher needs a plain negative log-likelihood: BCEWithLogitsLoss with "
                "weight or pos_weight is not one; pass likelihood='bernoulli' to force it"
            )
        return "bernoulli"
    raise ValueError(
        f"cannot infer the predictive distribution of loss {type(loss_fn).__name__}; pass "
        f"likelihood= one of {LIKELIHOODS} (CrossEntropyLoss, MSELoss and BCEWithLogitsLoss are detected)"
    )


def check_likelihood(likelihood: Any) -> str:
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    return likelihood


def terms_per_example(likelihood: str, example_shape: tuple[int, ...] | torch.Size) -> int:
    """``m``: the loss terms of one example whose output has shape ``example_shape`` (without the
    batch dimension), i.e. what a mean reduction divides by per example: the positions
    ``prod(example_shape[1:])`` for a categorical (class dimension first), every entry for the
    others."""
    shape = tuple(example_shape)
    if likelihood == "categorical":
        if not shape:
            raise ValueError("categorical outputs need a class dimension: [B, C, ...], got [B]")
        return math.prod(shape[1:])
    return math.prod(shape)


def _class_last(out: torch.Tensor) -> torch.Tensor:
    return out.movedim(1, -1) if out.ndim > 2 else out


def sample_targets(
    outputs: torch.Tensor, likelihood: str, samples: int, generator: torch.Generator
) -> torch.Tensor:
    """Draw ``samples`` label sets ``[S, *targets_shape]`` from ``p(. | outputs)`` (module docstring).

    The draw is on CPU in float64 with ``generator`` (reproducible across devices):

    * ``"categorical"``: outputs ``[B, C, *extra]``; one class per example and position from
      ``softmax`` over dimension 1 (``torch.multinomial``), labels ``[S, B, *extra]`` (int64);
    * ``"gaussian"``: ``outputs + sqrt(1/2) z`` (the variance of the MSE's likelihood);
    * ``"bernoulli"``: ``torch.bernoulli(sigmoid(outputs))``.
    """
    check_likelihood(likelihood)
    out = outputs.detach().to("cpu", torch.float64)
    if likelihood == "categorical":
        if out.ndim < 2:
            raise ValueError(
                f"categorical sampling needs outputs of shape [B, C, ...] (classes in dimension 1), got "
                f"{tuple(out.shape)}"
            )
        logits = _class_last(out)
        probs = torch.softmax(logits.reshape(-1, logits.shape[-1]), dim=1)
        drawn = torch.multinomial(probs, samples, replacement=True, generator=generator)  # [B*L, S]
        return drawn.T.reshape(samples, *logits.shape[:-1]).contiguous()
    if likelihood == "gaussian":
        noise = torch.randn((samples, *out.shape), generator=generator, dtype=torch.float64)
        return out.unsqueeze(0) + math.sqrt(GAUSSIAN_VARIANCE) * noise
    probs = torch.sigmoid(out)
    return torch.bernoulli(probs.unsqueeze(0).expand(samples, *out.shape).contiguous(), generator=generator)


def nll_output_gradients(outputs: torch.Tensor, targets: torch.Tensor, likelihood: str) -> torch.Tensor:
    """``[S, B, O]``: ``u_sn = d(-log p(t_sn | f_n)) / d f_n`` summed over the example's loss terms, for
    outputs ``[B, ...]`` (``O`` entries per example) and label sets ``targets`` ``[S, B, ...]``: the
    closed forms ``softmax(f) - onehot(t)`` (categorical, per position), ``2 (f - t)`` (gaussian,
    variance 1/2) and ``sigmoid(f) - t`` (bernoulli)."""
    check_likelihood(likelihood)
    S, B = int(targets.shape[0]), int(outputs.shape[0])
    f = outputs.unsqueeze(0)
    if likelihood == "categorical":
        p = torch.softmax(f, dim=2)
        onehot = nn.functional.one_hot(targets.long(), num_classes=outputs.shape[1]).to(p.dtype)
        u = p - (onehot.movedim(-1, 2) if outputs.ndim > 2 else onehot)
    elif likelihood == "gaussian":
        u = 2.0 * (f - targets.to(f.dtype))
    else:
        u = torch.sigmoid(f) - targets.to(f.dtype)
    return u.reshape(S, B, -1)


def nll_sum(likelihood: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``nll(f, t)``: the negative log-likelihood summed over all loss terms (up to a constant); its
    gradient in ``f`` is :func:`nll_output_gradients`."""
    check_likelihood(likelihood)
    if likelihood == "categorical":
        return lambda f, t: nn.functional.cross_entropy(f, t.long(), reduction="sum")
    if likelihood == "gaussian":
        return lambda f, t: nn.functional.mse_loss(f, t.to(f.dtype), reduction="sum")
    return lambda f, t: nn.functional.binary_cross_entropy_with_logits(f, t.to(f.dtype), reduction="sum")


def fisher_term_scale(reduction: str, num_examples: int, terms: int) -> float:
    """``a``: the factor of ``sum_n J_n^T u_n u_n^T J_n`` that makes ``E[F] = G`` (``1/(N m)`` for a mean,
    ``1`` for a sum; module docstring)."""
    return 1.0 / (num_examples * terms) if reduction == "mean" else 1.0
