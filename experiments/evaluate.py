"""Evaluation of a trained run: predictive metrics (``landscape.metrics``), Bayesian model averages,
SWA, CIFAR-10-C and the sharpness of the final solution (``landscape.sharpness_report``).

Every evaluation runs the model in eval mode without gradients and leaves it as it was (mode,
parameters, buffers). Probabilities are computed in float64 from the logits.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from experiments.data import CIFAR10C_GROUPS, RunData, _subset, corruption_limit, corruption_root

__all__ = ["evaluate_run", "predict_probs", "sharpness_measures"]

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


def predict_probs(model: nn.Module, x: torch.Tensor, batch_size: int, device: torch.device) -> torch.Tensor:
    """Softmax probabilities ``[N, C]`` (float64, CPU) of ``model`` on ``x``, in batches, eval mode."""
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


def _bma_probs(
    opt: Any,
    model: nn.Module,
    x: torch.Tensor,
    cfg: dict[str, Any],
    seed: int,
    device: torch.device,
    swag: dict[str, Any],
) -> torch.Tensor:
    """Bayesian model average ``1/S sum_s softmax(f(x; w_s))`` in batches; every batch sees the same
    ``S`` weight samples (the generator is re-seeded per batch)."""
    fn = opt.bayesian_model_average
    params = inspect.signature(fn).parameters
    dtype = next(model.parameters()).dtype
    bs = cfg["evaluation"]["batch_size"]
    out = []
    for i in range(0, len(x), bs):
        kw: dict[str, Any] = {}
        if "samples" in params:
            kw["samples"] = swag["samples"] if swag else cfg["evaluation"]["bma_samples"]
        if "generator" in params:
            kw["generator"] = torch.Generator(device=device).manual_seed(seed)
        if "scale" in params and swag:
            kw["scale"] = swag["scale"]
        probs = fn(model, x[i : i + bs].to(device=device, dtype=dtype), **kw)
        out.append(probs.double().cpu())
    return torch.cat(out)


def _evaluate(
    probs: torch.Tensor, y: torch.Tensor, probs_ood: torch.Tensor | None, n_bins: int
) -> dict[str, Any]:
    from landscape import metrics

    return metrics.evaluate(probs, y, probs_ood=probs_ood, n_bins=n_bins)


def sharpness_measures(cfg: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(label, measure, options)`` of every sharpness measure the config names."""
    from landscape.sharpness import MEASURES

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
    import landscape as ls

    specs = sharpness_measures(cfg)
    if not specs:
        return {}
    k = min(cfg["evaluation"]["sharpness_subset"], len(data.y_train))
    idx = _subset(len(data.y_train), k)
    dtype = next(model.parameters()).dtype
    subset = (data.x_train[idx].to(device=device, dtype=dtype), data.y_train[idx].to(device))
    obj = ls.Objective(model, nn.CrossEntropyLoss(), subset, mode="eval")
    report = ls.sharpness_report(obj, [(m, o) for _, m, o in specs], progress=progress)
    rows = {}
    for (label, measure, opts), row in zip(specs, report.rows):
        rows[label] = {
            "measure": measure,
            "value": row.value,
            "stderr": row.stderr,
            "options": opts,
            "seconds": row.seconds,
        }
    return {"subset": k, "rows": rows}


def _corruptions(
    model: nn.Module,
    opt: Any,
    data: RunData,
    cfg: dict[str, Any],
    seed: int,
    device: torch.device,
    swag: dict[str, Any],
    progress: bool,
) -> dict[str, Any]:
    e = cfg["evaluation"]
    from landscape.data import CIFAR10C_ALL_CORRUPTIONS, load_cifar10c

    names = list(e["corruption_names"]) or list(CIFAR10C_ALL_CORRUPTIONS)
    root = corruption_root(e["corruptions"])
    normalize = cfg["data"]["kwargs"].get("normalize", True)
    limit = corruption_limit(float(cfg["budget"]), cfg["data"]["limit_test"])
    use_bma = e["corruption_bma"] and hasattr(opt, "bayesian_model_average")
    dtype = next(model.parameters()).dtype
    table: dict[str, dict[str, Any]] = {}
    todo = [(c, s) for c in names for s in e["severities"]]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="CIFAR-10-C", unit="set", leave=False)
    for c, s in todo:
        x, y = load_cifar10c(root, c, s, dtype=dtype, normalize=normalize, limit=limit)
        probs = (
            _bma_probs(opt, model, x, cfg, seed, device, swag)
            if use_bma
            else predict_probs(model, x, e["batch_size"], device)
        )
        ev = _evaluate(probs, y, None, e["n_bins"])
        table.setdefault(c, {})[str(s)] = {k: ev[k] for k in ("accuracy", "nll", "ece", "brier")}
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    summary: dict[str, float] = {}
    for metric in ("accuracy", "nll", "ece", "brier"):
        allv = [v[metric] for c in table for v in table[c].values()]
        summary[f"c10c_{metric}"] = sum(allv) / len(allv)
        for group, members in CIFAR10C_GROUPS.items():
            vals = [v[metric] for c in members if c in table for v in table[c].values()]
            if vals:
                summary[f"c10c_{group}_{metric}"] = sum(vals) / len(vals)
    return {"per_corruption": table, "summary": summary, "limit": limit, "bma": use_bma}


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
    OOD set, ``bma_*`` for optimizers with a posterior (``bayesian_model_average``), ``swa_*`` for
    SWAG, ``c10c_*`` with CIFAR-10-C and ``sharpness_<measure>``. ``details`` holds every metric of
    every evaluation, the CIFAR-10-C table per corruption and severity and the sharpness rows.
    """
    from optimizers import SWAG

    e = cfg["evaluation"]
    swag = cfg["methods"][0]["swag"]
    keys = list(e["metrics"])
    if data.x_ood is not None:
        keys += ["auroc_ood_maxprob", "auroc_ood_entropy"]
    details: dict[str, Any] = {}

    def one(probs_fn) -> dict[str, Any]:
        probs = probs_fn(data.x_test)
        ood = probs_fn(data.x_ood) if data.x_ood is not None else None
        return _evaluate(probs, data.y_test, ood, e["n_bins"])

    details["point"] = one(lambda x: predict_probs(model, x, e["batch_size"], device))
    unknown = [k for k in e["metrics"] if k not in details["point"]]
    if unknown:
        raise ValueError(
            f"unknown metric(s) {unknown} in evaluation.metrics; known: {sorted(details['point'])}"
        )
    metrics: dict[str, Any] = {k: details["point"][k] for k in keys}
    if isinstance(opt, SWAG) and opt.n_collected > 0:
        with opt.swa():
            details["swa"] = one(lambda x: predict_probs(model, x, e["batch_size"], device))
        metrics.update({f"swa_{k}": details["swa"][k] for k in keys})
    if hasattr(opt, "bayesian_model_average") and (not isinstance(opt, SWAG) or opt.n_collected > 1):
        try:
            details["bma"] = one(lambda x: _bma_probs(opt, model, x, cfg, seed, device, swag))
        except ValueError as exc:  # e.g. F-SGLD before its burn-in ended: no samples to average
            details["bma_skipped"] = str(exc)
        else:
            metrics.update({f"bma_{k}": details["bma"][k] for k in keys})
    if e["corruptions"]:
        details["corruptions"] = _corruptions(model, opt, data, cfg, seed, device, swag, progress)
        metrics.update(details["corruptions"]["summary"])
    details["sharpness"] = _sharpness(model, data, cfg, device, progress)
    for label, row in details["sharpness"].get("rows", {}).items():
        metrics[f"sharpness_{label}"] = row["value"]
    return metrics, details
