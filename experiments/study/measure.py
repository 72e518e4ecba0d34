"""Measuring one trained member of a study: train / test / OOD error and loss, the generalisation
gaps and every configured sharpness measure (:func:`landscape.sharpness_report`) on the shared
sharpness subset (Jiang et al. 2020, Sec. 3: the gap is test minus training error)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import landscape as ls
from experiments.data import RunData
from experiments.study.config import model_id

__all__ = ["error_and_loss", "measure_member"]


def error_and_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Top-1 error and mean cross-entropy of ``model`` on ``(x, y)`` in eval mode without gradients;
    the model's train/eval mode is restored."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
            loss = float(nn.functional.cross_entropy(out, y))
            err = float((out.argmax(-1) != y).double().mean())
    finally:
        model.train(was)
    return err, loss


def measure_member(
    point: dict[str, Any],
    cfg: dict[str, Any],
    model: nn.Module,
    data: RunData,
    subset: tuple[torch.Tensor, torch.Tensor],
    history: list[dict[str, Any]],
    *,
    device: torch.device,
    progress: bool = False,
) -> dict[str, Any]:
    """The table row of one member and its sharpness rows: ``{"row", "measures"}``.

    ``data`` is the member's run data (its training set of ``n_train`` examples and the test set),
    ``subset`` the shared sharpness subset. The OOD set is the test set with Gaussian input noise of
    standard deviation ``ood_noise`` (a covariate shift) drawn from a generator seeded with
    ``sampling_seed + 1`` (the study's, not a population's: the same for every member of every
    population).
    """
    dtype = next(model.parameters()).dtype
    x, y = data.x_train.to(device=device, dtype=dtype), data.y_train.to(device)
    xt, yt = data.x_test.to(dtype=dtype), data.y_test.to(device)
    row: dict[str, Any] = {"id": model_id(point), **point}
    row["train_error"], row["train_loss"] = error_and_loss(model, x, y)
    row["test_error"], row["test_loss"] = error_and_loss(model, xt.to(device), yt)
    row["gap_error"] = row["test_error"] - row["train_error"]
    row["gap_loss"] = row["test_loss"] - row["train_loss"]
    if cfg["ood_noise"] > 0:
        g = torch.Generator().manual_seed(cfg["sampling_seed"] + 1)
        noisy = xt + cfg["ood_noise"] * torch.randn(xt.shape, generator=g, dtype=xt.dtype)
        row["ood_error"], row["ood_loss"] = error_and_loss(model, noisy.to(device), yt)
    row["final_epoch_loss"] = float(history[-1]["train_loss"]) if history else math.nan
    sdtype = torch.float64 if cfg["sharpness_dtype"] == "float64" else torch.float32
    xs, ys = subset
    obj = ls.Objective(
        model, nn.CrossEntropyLoss(), (xs.to(device), ys.to(device)), dtype=sdtype, device=device
    )
    specs = [(m["measure"], m["options"]) for m in cfg["measures"]]
    report = ls.sharpness_report(obj, specs, progress=progress)
    measures: dict[str, Any] = {}
    for m, r in zip(cfg["measures"], report.rows):
        row[m["name"]] = r.value
        measures[m["name"]] = {
            "measure": r.measure,
            "value": r.value,
            "stderr": r.stderr,
            "seconds": r.seconds,
            "config": r.config,
        }
    return {"row": row, "measures": measures}
