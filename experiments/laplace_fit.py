"""A post-hoc Laplace posterior of a trained run: the ``laplace`` table of a method.

``laplace = { kind = "kron", prior_precision = "optimize", predictive = "glm", link = "probit",
samples = 32 }`` (:data:`experiments.config.METHOD_TABLES`) makes the runner, after training, fit a
Laplace approximation around the trained weights on the training set (the labels trained on) and
evaluate its predictive as the run's model average (the ``bma_*`` metrics; ``details["laplace"]``
records the fit):

* ``kind``: ``"kron"`` (:class:`optimizers.KronLaplace`, the KFAC GGN of every ``nn.Linear`` /
  ``nn.Conv2d`` layer; the other parameters, e.g. of normalisation layers, stay at their trained
  values) or ``"diag"`` (:class:`optimizers.DiagLaplace`, the exact GGN diagonal of all weights);
* ``prior_precision``: a number ``delta > 0``, or ``"optimize"``: the maximiser of the Laplace log
  marginal likelihood (MacKay 1992; Immer et al. 2021; laplace-torch's ``optimize_prior_precision(
  method="marglik")``, solved exactly here), or ``"optimize_layerwise"``: one maximiser per
  parameter tensor (per Kronecker block for ``"kron"``; laplace-torch's per-layer prior,
  ``prior_structure="layerwise"``);
* ``predictive``: ``"glm"``, the linearised predictive (Immer, Korzepa & Bauer 2021) with ``link``
  ``"probit"`` (MacKay 1992) or ``"mc"`` (``samples`` draws in function space); or ``"mc"``,
  ``samples`` weight vectors drawn from the posterior and the network's softmax averaged (the same
  draws for every batch: one seeded generator per batch, seeded with the run's seed).

The posterior is computed in float64 (the curvature's eigenvalues and the evidence are sums over all
weights), the probabilities are returned in float64 on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from experiments.config import LAPLACE_PRIOR_FITS
from optimizers.bayes.laplace import DiagLaplace, KronLaplace

__all__ = ["fit_laplace", "laplace_probs", "laplace_summary"]

#: examples per vectorised Jacobian block (memory ``chunk C P`` floats per block)
_JACOBIAN_CHUNK = 16


def _kron_params(model: nn.Module) -> list[str]:
    """The names of the ``nn.Linear`` / ``nn.Conv2d`` parameters (those KFAC has a form for)."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            names += [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]
    if not names:
        raise ValueError(
            'laplace.kind = "kron" needs nn.Linear or nn.Conv2d layers; the model has none: use kind = "diag"'
        )
    return names


def fit_laplace(
    model: nn.Module,
    x_train: torch.Tensor,
    y_train: torch.Tensor,
    table: dict[str, Any],
    *,
    batch_size: int,
    seed: int,
    progress: bool = False,
) -> DiagLaplace | KronLaplace:
    """The Laplace posterior of ``table`` (module docstring) around ``model``'s weights, fitted on
    ``(x_train, y_train)`` in batches of ``batch_size``, its prior precision set or optimised."""
    device = next(model.parameters()).device
    data = [
        (x_train[i : i + batch_size], y_train[i : i + batch_size]) for i in range(0, len(x_train), batch_size)
    ]
    common = dict(
        dtype=torch.float64, device=device, seed=seed, progress=progress, chunk_size=_JACOBIAN_CHUNK
    )
    prior = table["prior_precision"]
    delta = 1.0 if prior in LAPLACE_PRIOR_FITS else float(prior)
    if table["kind"] == "kron":
        post: DiagLaplace | KronLaplace = KronLaplace(
            model, nn.CrossEntropyLoss(), data, delta, params=_kron_params(model), **common
        )
    else:
        post = DiagLaplace(model, nn.CrossEntropyLoss(), data, delta, **common)
    if prior in LAPLACE_PRIOR_FITS:
        post.optimize_prior_precision(layerwise=prior == "optimize_layerwise")
    return post


def laplace_probs(
    post: DiagLaplace | KronLaplace,
    model: nn.Module,
    x: torch.Tensor,
    table: dict[str, Any],
    *,
    batch_size: int,
    seed: int,
) -> torch.Tensor:
    """``[N, C]`` predictive probabilities (float64, CPU) of the posterior on ``x``, in batches."""
    out = []
    for i in range(0, len(x), batch_size):
        xb = x[i : i + batch_size]
        if table["predictive"] == "glm":
            p = post.predictive(xb, link=table["link"], samples=table["samples"], seed=seed)
        elif isinstance(post, KronLaplace):
            p = post.predictive(xb, pred_type="mc", samples=table["samples"], seed=seed)
        else:
            device = next(model.parameters()).device
            gen = torch.Generator(device=device).manual_seed(seed)
            p = post.bayesian_model_average(model, xb.to(device), samples=table["samples"], generator=gen)
        out.append(p.detach().to(device="cpu", dtype=torch.float64))
    return torch.cat(out)


def laplace_summary(post: DiagLaplace | KronLaplace, table: dict[str, Any]) -> dict[str, Any]:
    """What ``details["laplace"]`` records: the table, the prior precision used and the evidence."""
    used = post.prior_precision
    return {
        **table,
        "prior_precision_used": used.tolist() if isinstance(used, torch.Tensor) else used,
        "prior_groups": post.prior_groups,
        "log_marginal_likelihood": post.log_marginal_likelihood(),
        "num_params": post.num_params,
    }
