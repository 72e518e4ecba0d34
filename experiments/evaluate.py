"""Evaluation of a trained run: predictive metrics (``landscape.metrics``), Bayesian model averages,
SWA, CIFAR-10-C and the sharpness of the final solution (``landscape.sharpness_report``).

Every evaluation runs the model in eval mode without gradients and leaves it as it was (mode,
parameters, buffers). Probabilities are computed in float64 from the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import landscape as ls
from experiments.data import CIFAR10C_GROUPS, RunData, _subset, corruption_limit, corruption_root
from experiments.divergence import check_predictions
from experiments.ensembles import (
    Members,
    bma_with_method,
    ensemble_probs,
    mc_dropout_probs,
    point_context,
    predict_probs,
    sample_contexts,
)
from experiments.laplace_fit import fit_laplace, laplace_probs, laplace_summary
from landscape import metrics
from landscape.data import CIFAR10C_ALL_CORRUPTIONS, load_cifar10c
from landscape.data.batching import inputs_to
from landscape.sharpness import MEASURES
from optimizers import SWAG
from optimizers.bayes.swag import has_batchnorm

__all__ = ["check_metric_names", "evaluate_run", "sharpness_measures"]

#: Default options of the sharpness measures a config names (label -> (measure, options)).
SHARPNESS_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "lambda_max": ("lambda_max", {"tol": 1e-3, "smallest": False, "max_matvecs": 100}),
    "hessian_trace": ("hessian_trace", {"method": "hutchpp", "max_matvecs": 60}),
    "gradient_norm": ("gradient_norm", {}),
    # SAM's worst case (Foret et al. 2021, eq. 1) and its adaptive version (Kwon et al. 2021, eq. 8;
    # rho 0.5 as their CIFAR-10 setting), Auto-PGD
    "worst_case": ("worst_case", {"rho": 0.05, "iterations": 20}),
    "worst_case_adaptive": ("worst_case", {"rho": 0.5, "adaptive": True, "eta": 0.01, "iterations": 20}),
    "average_case": ("average_case", {}),
}


def _evaluate(
    probs: torch.Tensor, y: torch.Tensor, probs_ood: torch.Tensor | None, n_bins: int, what: str = ""
) -> dict[str, Any]:
    """The metrics of ``probs``; non-finite probabilities raise
    :class:`experiments.divergence.Diverged` (the run diverged) naming ``what`` was predicted."""
    check_predictions(probs, what or "evaluation set")
    check_predictions(probs_ood, f"{what or 'evaluation'}, OOD set")
    return metrics.evaluate(probs, y, probs_ood=probs_ood, n_bins=n_bins)


def reliability_bins(probs: torch.Tensor, y: torch.Tensor, n_bins: int) -> dict[str, Any]:
    """The equal-width reliability diagram of ``probs`` (:func:`landscape.metrics.calibration_curve`,
    Guo et al. 2017 Sec. 2; 20 bins in the flat-BNN paper's Fig. 2) as lists: ``lower``, ``upper``,
    ``confidence`` and ``accuracy`` (``None`` in an empty bin) and ``count`` per bin."""
    curve = metrics.calibration_curve(probs, y, n_bins=n_bins)

    def listed(t: torch.Tensor) -> list[float | None]:
        return [None if v != v else float(v) for v in t.tolist()]  # NaN (empty bin) -> None

    return {
        "n_bins": n_bins,
        "lower": listed(curve.lower),
        "upper": listed(curve.upper),
        "confidence": listed(curve.confidence),
        "accuracy": listed(curve.accuracy),
        "count": [int(c) for c in curve.count.tolist()],
    }


def check_metric_names(cfg: dict[str, Any]) -> None:
    """``ValueError`` unless every name of ``evaluation.metrics`` is a key of
    :func:`landscape.metrics.evaluate` (:data:`landscape.metrics.METRIC_NAMES`; the OOD ones need
    ``evaluation.ood``), checked before any training."""
    known = metrics.METRIC_NAMES + (metrics.OOD_METRIC_NAMES if cfg["evaluation"]["ood"] else ())
    unknown = [k for k in cfg["evaluation"]["metrics"] if k not in known]
    if unknown:
        raise ValueError(
            f"unknown metric(s) {unknown} in evaluation.metrics; known: {', '.join(known)}"
            + ("" if cfg["evaluation"]["ood"] else " (and, with evaluation.ood set, the OOD ones)")
        )


def sharpness_measures(cfg: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, measure, options)`` of every sharpness measure the config names."""
    out = []
    extra = cfg["evaluation"]["sharpness_options"]
    for label in cfg["evaluation"]["sharpness"]:
        if label in SHARPNESS_DEFAULTS:
            measure, opts = SHARPNESS_DEFAULTS[label]
        elif label in MEASURES:
            measure, opts = label, {}
        else:
            known = sorted(set(SHARPNESS_DEFAULTS) | set(MEASURES))
            raise ValueError(
                f"unknown sharpness measure {label!r} in evaluation.sharpness; known: {', '.join(known)}"
            )
        opts = {**opts, **extra.get(label, {})}
        out.append((label, measure, opts))
    return out


def _sharpness(
    model: nn.Module, data: RunData, cfg: dict[str, Any], device: torch.device, progress: bool
) -> dict[str, Any]:
    specs = sharpness_measures(cfg)
    if not specs:
        return {}
    k = min(cfg["evaluation"]["sharpness_subset"], len(data.y_train))
    idx = _subset(len(data.y_train), k)
    dtype = next(model.parameters()).dtype
    subset = (inputs_to(data.x_train[idx], device, dtype), data.y_train[idx].to(device))
    obj = ls.Objective(model, nn.CrossEntropyLoss(), subset, mode="eval")
    with point_context(model):  # Bayesian layers: the sharpness of the mean network
        report = ls.sharpness_report(obj, [(m, o) for _, m, o in specs], progress=progress)
    rows = {}
    for (label, measure, opts), row in zip(specs, report.rows):
        rows[label] = {
            "measure": measure,
            "value": row.value,
            "stderr": row.stderr,
            "options": opts,
            "seconds": row.seconds,
            # the measure's curves and side numbers (e.g. perturbation_robustness's accuracy at
            # every alpha, FSAM paper Fig. 4), kept for experiments.paper_figures
            "extra": row.extra,
        }
    return {"subset": k, "rows": rows}


class _Batches:
    """Re-iterable device batches of the training inputs (``bn_data`` of SWAG's BatchNorm update)."""

    def __init__(self, x: torch.Tensor, batch_size: int, device: torch.device, dtype: torch.dtype) -> None:
        self.x, self.bs, self.device, self.dtype = x, batch_size, device, dtype

    def __iter__(self):
        for i in range(0, len(self.x), self.bs):
            yield inputs_to(self.x[i : i + self.bs], self.device, self.dtype)


def _corruption_sets(
    cfg: dict[str, Any], dtype: torch.dtype, labels: dict[str, torch.Tensor]
) -> dict[str, Callable]:
    """``"c10c/<corruption>/<severity>" -> loader`` of the configured CIFAR-10-C sets; each loader
    stores the set's labels in ``labels``."""
    e = cfg["evaluation"]
    if not e["corruptions"]:
        return {}
    root = corruption_root(e["corruptions"])
    normalize = cfg["data"]["kwargs"].get("normalize", True)
    limit = corruption_limit(float(cfg["budget"]), cfg["data"]["limit_test"])
    sets = {}
    for c in list(e["corruption_names"]) or list(CIFAR10C_ALL_CORRUPTIONS):
        for s in e["severities"]:
            name = f"c10c/{c}/{s}"

            def load(c=c, s=s, name=name) -> torch.Tensor:
                x, y = load_cifar10c(root, c, s, dtype=dtype, normalize=normalize, limit=limit)
                labels[name] = y
                return x

            sets[name] = load
    return sets


def _corruption_table(
    probs: dict[str, torch.Tensor], labels: dict[str, torch.Tensor], n_bins: int
) -> dict[str, Any]:
    """Metrics per corruption and severity, their means over everything and per group."""
    table: dict[str, dict[str, Any]] = {}
    for name, p in probs.items():
        _, c, s = name.split("/")
        ev = _evaluate(p, labels[name], None, n_bins, name)
        table.setdefault(c, {})[s] = {k: ev[k] for k in ("accuracy", "nll", "ece", "brier")}
    summary: dict[str, float] = {}
    for metric in ("accuracy", "nll", "ece", "brier"):
        allv = [v[metric] for c in table for v in table[c].values()]
        summary[f"c10c_{metric}"] = sum(allv) / len(allv)
        for group, members in CIFAR10C_GROUPS.items():
            vals = [v[metric] for c in members if c in table for v in table[c].values()]
            if vals:
                summary[f"c10c_{group}_{metric}"] = sum(vals) / len(vals)
    return {"per_corruption": table, "summary": summary}


def evaluate_run(
    model: nn.Module,
    opt: Any,
    data: RunData,
    cfg: dict[str, Any],
    *,
    seed: int,
    device: torch.device,
    progress: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Evaluate a trained run; returns ``(metrics, details)``.

    ``metrics`` is the flat row for tables: the configured point metrics, ``auroc_ood_*`` with an
    OOD set, ``bma_*`` for methods with a posterior (:mod:`experiments.ensembles`), ``swa_*`` for
    SWAG (and, with ``swag.evaluate``, ``swag_*`` / ``swag_diag_*``: the model average over the
    low-rank-plus-diagonal and over the diagonal posterior of the one run, ``bma_*`` being the first
    listed one's), ``c10c_*`` with CIFAR-10-C (from the model average when ``corruption_bma`` and the method
    has one) and ``sharpness_<measure>``. ``details`` holds every metric of every evaluation, the
    CIFAR-10-C table per corruption and severity, the sharpness rows (with each measure's ``extra``:
    curves such as ``perturbation_robustness``'s), ``reliability`` (the ``n_bins`` reliability
    diagram of the test predictions of ``point``, ``swa`` and ``bma``: :func:`reliability_bins`) and,
    with ``evaluation.save_predictions``, ``predictions`` (those test probabilities and ``labels``,
    which the runner moves to ``predictions.npz``). SWAG's samples and SWA
    solution get BatchNorm statistics recomputed on the training inputs.

    The model average (``bma_*``) of a method with an ``mc_dropout`` table is the MC-Dropout
    predictive with its ``samples``; of a deep ensemble (``opt`` a :class:`Members`) the members'
    average, the point metrics being member 0's and ``details["members"]`` every member's; of a
    model with Bayesian layers ``evaluation.bma_samples`` weight samples, its point metrics (and
    sharpness) those of the mean network; of a method with a ``laplace`` table the predictive of the
    Laplace posterior fitted around the trained weights (:mod:`experiments.laplace_fit`), the fit
    recorded in ``details["laplace"]``.
    """
    e = cfg["evaluation"]
    bs = e["batch_size"]
    swag = cfg["methods"][0]["swag"]
    dtype = next(model.parameters()).dtype
    keys = list(e["metrics"]) + (["auroc_ood_maxprob", "auroc_ood_entropy"] if data.x_ood is not None else [])
    sets: dict[str, Callable[[], torch.Tensor]] = {"test": lambda: data.x_test}
    if data.x_ood is not None:
        sets["ood"] = lambda: data.x_ood
    labels: dict[str, torch.Tensor] = {}
    corr = _corruption_sets(cfg, dtype, labels)
    bn = _Batches(data.x_train, bs, device, dtype) if has_batchnorm(model) else None
    details: dict[str, Any] = {}

    reliability: dict[str, Any] = {}
    predictions: dict[str, torch.Tensor] = {}

    def scored(probs: dict[str, torch.Tensor], what: str, key: str = "") -> dict[str, Any]:
        out = _evaluate(probs["test"], data.y_test, probs.get("ood"), e["n_bins"], what)
        if key:  # the reliability diagram (always, a few numbers) and the probabilities (on request)
            reliability[key] = reliability_bins(probs["test"], data.y_test, e["n_bins"])
            if e.get("save_predictions", False):
                predictions[key] = probs["test"].detach().cpu()
        return out

    point = {k: predict_probs(model, get(), bs, device) for k, get in sets.items()}
    details["point"] = scored(point, "point prediction", "point")
    unknown = [k for k in e["metrics"] if k not in details["point"]]
    if unknown:
        raise ValueError(
            f"unknown metric(s) {unknown} in evaluation.metrics; known: {sorted(details['point'])}"
        )
    metrics: dict[str, Any] = {k: details["point"][k] for k in keys}
    if isinstance(opt, SWAG) and opt.n_collected > 0:
        with opt.swa(model=model, bn_data=bn):
            details["swa"] = scored(
                {k: predict_probs(model, get(), bs, device) for k, get in sets.items()}, "SWA solution", "swa"
            )
        metrics.update({f"swa_{k}": details["swa"][k] for k in keys})
    samples = swag["samples"] if swag else e["bma_samples"]
    scale = swag["scale"] if swag else 1.0
    posteriors = list(swag.get("evaluate", [])) if swag else []
    first = {"swag": False, "swag_diag": True}[posteriors[0]] if posteriors else None
    contexts = sample_contexts(
        opt, model, samples=samples, scale=scale, seed=seed, device=device, bn_data=bn, diag_only=first
    )
    bma_sets = {**sets, **(corr if e["corruption_bma"] else {})}
    bma: dict[str, torch.Tensor] = {}
    dropout = cfg["methods"][0].get("mc_dropout")
    lap = cfg["methods"][0].get("laplace")
    if isinstance(opt, Members):
        details["members"] = []
        for seed_k, make in zip(opt.seeds, contexts or []):
            with make():
                probs_k = {k: predict_probs(model, get(), bs, device) for k, get in sets.items()}
            details["members"].append({"seed": seed_k, **scored(probs_k, f"ensemble member seed {seed_k}")})
    if lap:
        post = fit_laplace(
            model, data.x_train, data.y_train, lap, batch_size=bs, seed=seed, progress=progress
        )
        details["laplace"] = laplace_summary(post, lap)
        bma = {
            k: laplace_probs(post, model, get(), lap, batch_size=bs, seed=seed) for k, get in bma_sets.items()
        }
    elif dropout:
        bma = mc_dropout_probs(
            model,
            bma_sets,
            samples=dropout["samples"],
            seed=seed,
            batch_size=bs,
            device=device,
            progress=progress,
        )
    elif contexts:
        bma = ensemble_probs(contexts, model, bma_sets, bs, device, progress)
    elif hasattr(opt, "bayesian_model_average") and not isinstance(opt, SWAG):
        try:
            bma = {
                k: bma_with_method(
                    opt, model, get(), samples=samples, scale=scale, seed=seed, batch_size=bs, device=device
                )
                for k, get in bma_sets.items()
            }
        except ValueError as exc:  # e.g. no stored samples to average yet
            details["bma_skipped"] = str(exc)
    if bma:
        details["bma"] = scored(bma, "model average", "bma")
        metrics.update({f"bma_{k}": details["bma"][k] for k in keys})
        for name in posteriors:  # swag.evaluate: SWAG and SWAG-Diag from the one run
            if name == posteriors[0]:
                probs_p = {k: bma[k] for k in sets}
            else:
                ctx_p = sample_contexts(
                    opt, model, samples=samples, scale=scale, seed=seed, device=device, bn_data=bn,
                    diag_only=name == "swag_diag",
                )  # fmt: skip
                probs_p = ensemble_probs(ctx_p or [], model, sets, bs, device, progress)
            details[f"bma_{name}"] = scored(probs_p, f"model average ({name})")
            metrics.update({f"{name}_{k}": details[f"bma_{name}"][k] for k in keys})
    if corr:
        use_bma = e["corruption_bma"] and bool(bma)
        probs = (
            {k: bma[k] for k in corr}
            if use_bma
            else {k: predict_probs(model, get(), bs, device) for k, get in corr.items()}
        )
        details["corruptions"] = {
            **_corruption_table(probs, labels, e["n_bins"]),
            "bma": use_bma,
            "limit": corruption_limit(float(cfg["budget"]), cfg["data"]["limit_test"]),
        }
        metrics.update(details["corruptions"]["summary"])
    details["reliability"] = reliability
    if predictions:  # the runner writes them to predictions.npz (not into results.json)
        details["predictions"] = {**predictions, "labels": data.y_test.detach().cpu()}
    details["sharpness"] = _sharpness(model, data, cfg, device, progress)
    for label, row in details["sharpness"].get("rows", {}).items():
        metrics[f"sharpness_{label}"] = row["value"]
    return metrics, details
