"""The papers' figures that come from trained runs, made from run directories
(``python -m experiments figure NAME RUN_DIR ... --out DIR``, ``sharpscape figures NAME --runs DIR``).

* ``fsam_fig4``: Fisher-SAM (Kim et al. 2022) Fig. 4 / Sec. 5.4: accuracy (and loss) after the
  adversarial parameter perturbation ``theta + alpha grad/||grad||`` (Sun et al. 2021) against the
  strength ``alpha``, one curve per method (the paper: SGD, SAM, FSAM; ResNet-34, CIFAR-10,
  ``alpha`` from 0.1 to 5.0). From the ``perturbation_robustness`` sharpness measure
  (:func:`landscape.sharpness.worst_case.perturbation_robustness`) that the runner evaluated on
  ``evaluation.sharpness_subset`` training examples; mean and standard error over seeds.
* ``flatbnn_fig1``: flat-seeking BNNs (Nguyen et al. 2023) Fig. 1: loss landscapes of models
  *sampled* from each run's SWAG posterior (the paper: SWAG against F-SWAG, PreResNet-164,
  CIFAR-100, two / four samples each). ``samples`` weight vectors are drawn per run with
  :meth:`optimizers.SWAG.sample` from a generator seeded with ``seed``; around each, the training
  loss on ``subset`` examples on a ``grid x grid`` plane spanned by two filter-normalised random
  directions (Li et al. 2018, Sec. 4; :func:`landscape.surface.directions.random`, seeds
  ``direction_seed`` and ``direction_seed + 1``), every panel on the same axes and colour scale.
* ``flatbnn_fig2``: flat-seeking BNNs Fig. 2: reliability diagrams in 20 bins (accuracy and the
  gap to the mean confidence per bin, the identity as the dashed line), one panel per method, of
  the model-average predictions (``predictive="auto"``: ``bma`` when the runs have one, else the
  point prediction); the bins of several seeds are pooled.

Each figure writes ``<out>/<name>.png`` and ``<out>/<name>.json`` (the plotted numbers, the runs
and the options that made them), atomically. A run lacking what a figure needs raises a
ValueError naming the configuration key to turn on.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from experiments.trained_run import FinishedRun, find_runs, restore_trainer
from landscape.io import atomic_write, atomic_write_json

__all__ = ["FIGURES", "fig1_data", "fig2_data", "fig4_data", "make_figure"]

ROBUSTNESS = "perturbation_robustness"


# --------------------------------------------------------------------------- shared helpers
def _groups(runs: list[FinishedRun]) -> dict[str, list[FinishedRun]]:
    """Runs by label (``method`` or ``variant/method``), in the order first given."""
    out: dict[str, list[FinishedRun]] = {}
    for r in runs:
        out.setdefault(r.label, []).append(r)
    return out


def _mean_stderr(rows: list[list[float]]) -> tuple[list[float], list[float | None]]:
    """Per-position mean and standard error (sample std / sqrt(n), ddof 1; None for one seed)."""
    a = np.asarray(rows, dtype=np.float64)
    mean = a.mean(axis=0)
    if len(rows) < 2:
        return mean.tolist(), [None] * a.shape[1]
    return mean.tolist(), (a.std(axis=0, ddof=1) / math.sqrt(len(rows))).tolist()


def _run_record(r: FinishedRun) -> dict[str, Any]:
    return {"run_dir": str(r.run_dir), "method": r.method, "seed": r.seed, "variant": r.variant,
            "fingerprint": r.results.get("fingerprint", "")}  # fmt: skip


# --------------------------------------------------------------------------- FSAM Fig. 4
def fig4_data(runs: list[FinishedRun], *, measure: str | None = None) -> dict[str, Any]:
    """The numbers of FSAM Fig. 4: per method the adversarial accuracy and loss at every ``alpha``
    (mean and standard error over seeds), the unperturbed ones and the Gaussian-noise comparison."""
    curves = []
    for label, group in _groups(runs).items():
        extras = []
        for r in group:
            rows = r.details.get("sharpness", {}).get("rows", {})
            name = measure or next((k for k, v in rows.items() if v.get("measure") == ROBUSTNESS), None)
            if name is None or name not in rows:
                raise ValueError(
                    f"{r.run_dir} has no {measure or ROBUSTNESS!r} sharpness row — add "
                    f'"{ROBUSTNESS}" to evaluation.sharpness (its alphas in evaluation.sharpness_options.'
                    f"{ROBUSTNESS}.alphas, the paper's 0.1 .. 5.0 by default) and run it in a new out_dir"
                )
            extra = rows[name].get("extra")
            if not extra or "adversarial_accuracy" not in extra:
                raise ValueError(
                    f"{r.run_dir}: the {name!r} row of results.json has no curve (extra.adversarial_"
                    f"accuracy) — evaluation.sharpness must name the {ROBUSTNESS} measure, and runs "
                    "evaluated before the runner kept the curves must be run again in a new out_dir"
                )
            extras.append(extra)
        alphas = extras[0]["alphas"]
        if any(e["alphas"] != alphas for e in extras):
            raise ValueError(
                f"the seeds of {label!r} used different alphas — give runs of one "
                f"evaluation.sharpness_options.{ROBUSTNESS}.alphas"
            )
        acc, acc_se = _mean_stderr([e["adversarial_accuracy"] for e in extras])
        loss, loss_se = _mean_stderr([e["adversarial_loss"] for e in extras])
        curves.append(
            {
                "label": label,
                "runs": [_run_record(r) for r in group],
                "alphas": list(alphas),
                "adversarial_accuracy": acc,
                "adversarial_accuracy_stderr": acc_se,
                "adversarial_loss": loss,
                "adversarial_loss_stderr": loss_se,
                "accuracy_unperturbed": float(np.mean([e["accuracy"] for e in extras])),
                "loss_unperturbed": float(np.mean([e["loss"] for e in extras])),
                "noise_accuracy": _mean_stderr([e["noise_accuracy"] for e in extras])[0]
                if all(None not in e["noise_accuracy"] for e in extras)
                else None,
                "per_seed_adversarial_accuracy": [e["adversarial_accuracy"] for e in extras],
                "evaluated_on": f"{group[0].details['sharpness'].get('subset')} training examples "
                "(evaluation.sharpness_subset), eval mode",
            }
        )
    return {"figure": "fsam_fig4", "curves": curves}


def _plot_fig4(data: dict[str, Any], fig: Any) -> None:
    ax_acc, ax_loss = fig.subplots(1, 2)
    for c in data["curves"]:
        for ax, key in ((ax_acc, "adversarial_accuracy"), (ax_loss, "adversarial_loss")):
            y = np.asarray(c[key])
            line = ax.plot(c["alphas"], y, marker="o", label=c["label"])[0]
            se = c[f"{key}_stderr"]
            if se[0] is not None:
                ax.fill_between(
                    c["alphas"], y - np.asarray(se), y + np.asarray(se), alpha=0.2, color=line.get_color()
                )
    ax_acc.set(xlabel="perturbation strength alpha", ylabel="accuracy", title="adversarial perturbation")
    ax_loss.set(xlabel="perturbation strength alpha", ylabel="loss", title="loss after the perturbation")
    ax_acc.legend()


# --------------------------------------------------------------------------- flat-BNN Fig. 2
def fig2_data(runs: list[FinishedRun], *, predictive: str = "auto") -> dict[str, Any]:
    """The numbers of flat-BNN Fig. 2: per method the reliability bins of the chosen predictive
    (the seeds' bins pooled: counts summed, confidence and accuracy count-weighted)."""
    if predictive not in ("auto", "bma", "point", "swa"):
        raise ValueError(f"predictive must be auto, bma, point or swa, got {predictive!r}")
    panels = []
    for label, group in _groups(runs).items():
        rel = []
        for r in group:
            if "reliability" not in r.details:
                raise ValueError(
                    f"{r.run_dir}: results.json has no reliability diagrams (details.reliability): it was "
                    "evaluated before the runner kept them — run it again in a new out_dir"
                )
            rel.append(r.details["reliability"])
        which = predictive
        if which == "auto":
            which = "bma" if all("bma" in x for x in rel) else "point"
        for r, x in zip(group, rel):
            if which not in x:
                fix = {
                    "bma": "a method with a posterior: a swag table (methods.<name>.swag = { rank = 20 }) "
                    "or another Bayesian method",
                    "swa": "a swag table on the method (methods.<name>.swag)",
                }.get(which, "a finished evaluation")
                raise ValueError(f"{r.run_dir} has no {which!r} predictions — it needs {fix}")
        bins = [x[which] for x in rel]
        if any(b["n_bins"] != bins[0]["n_bins"] for b in bins):
            raise ValueError(
                f"the seeds of {label!r} used different evaluation.n_bins — give runs of one value"
            )
        count = np.sum([b["count"] for b in bins], axis=0).astype(np.float64)

        def pooled(
            key: str, bins: list[dict[str, Any]] = bins, count: np.ndarray = count
        ) -> list[float | None]:
            s = np.sum(
                [[0.0 if v is None else v * n for v, n in zip(b[key], b["count"])] for b in bins], axis=0
            )
            return [None if n == 0 else float(v / n) for v, n in zip(s, count)]

        conf, acc = pooled("confidence"), pooled("accuracy")
        gap = [None if c is None else c - a for c, a in zip(conf, acc)]
        full = count > 0
        ece = float(np.sum(count[full] / count.sum() * np.abs(np.array([g for g in gap if g is not None]))))
        panels.append(
            {
                "label": label,
                "predictive": which,
                "runs": [_run_record(r) for r in group],
                "n_bins": bins[0]["n_bins"],
                "lower": bins[0]["lower"],
                "upper": bins[0]["upper"],
                "count": count.astype(int).tolist(),
                "confidence": conf,
                "accuracy": acc,
                "gap": gap,
                "ece": ece,
            }
        )
    return {"figure": "flatbnn_fig2", "panels": panels}


def _plot_fig2(data: dict[str, Any], fig: Any) -> None:
    axes = np.atleast_1d(fig.subplots(1, len(data["panels"]), sharey=True))
    for ax, p in zip(axes, data["panels"]):
        lo, up = np.asarray(p["lower"]), np.asarray(p["upper"])
        mid, width = (lo + up) / 2, up - lo
        acc = np.array([np.nan if a is None else a for a in p["accuracy"]])
        conf = np.array([np.nan if c is None else c for c in p["confidence"]])
        ax.bar(mid, np.nan_to_num(acc), width=width, edgecolor="black", color="tab:blue", label="accuracy")
        ax.bar(mid, np.nan_to_num(conf - acc), bottom=np.nan_to_num(acc), width=width, color="tab:red",
               alpha=0.35, edgecolor="tab:red", hatch="//", label="gap (confidence - accuracy)")  # fmt: skip
        ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", title=f"{p['label']} ({p['predictive']})")
        ax.text(0.04, 0.9, f"ECE {p['ece']:.4f}", transform=ax.transAxes)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(loc="lower right", fontsize="small")


# --------------------------------------------------------------------------- flat-BNN Fig. 1
def _flat(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def fig1_data(
    runs: list[FinishedRun],
    *,
    samples: int = 2,
    grid: int = 11,
    span: float = 1.0,
    subset: int = 256,
    seed: int = 0,
    direction_seed: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """The numbers of flat-BNN Fig. 1: for every run, ``samples`` models drawn from its SWAG
    posterior (generator seeded with ``seed``, the run's ``swag.scale`` and ``convention``) and the
    training loss on a ``grid x grid`` plane around each (coordinates ``linspace(-span, span,
    grid)`` along two filter-normalised random directions). ``grid`` must be odd, so the centre,
    the sampled model itself, is a grid point."""
    import landscape as ls
    from experiments.data import SUBSET_SEED
    from landscape.surface import directions as surface_directions
    from landscape.surface.grid import surface
    from optimizers import SWAG
    from optimizers.bayes.swag import has_batchnorm

    for name, v, least in (("samples", samples, 1), ("grid", grid, 3), ("subset", subset, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")
    if grid % 2 == 0:
        raise ValueError(
            f"grid must be odd so that the sampled model is the centre point, got {grid}; use {grid + 1}"
        )
    if not (isinstance(span, (int, float)) and math.isfinite(span) and span > 0):
        raise ValueError(f"span must be a finite number > 0, got {span!r}")
    device = torch.device(device)
    coords = np.linspace(-span, span, grid)
    panels = []
    for r in runs:
        if not r.cfg["methods"][0]["swag"]:
            raise ValueError(
                f"{r.run_dir} ({r.method}) has no SWAG posterior — give runs of a method with a swag table "
                '(methods.<name>.swag = { rank = 20, start_epoch = ... }; F-SWAG: optimizer = "sam" with one)'
            )
    total = len(runs) * samples
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total * grid * grid, desc="flatbnn_fig1 surfaces", unit="point")
    t0 = time.perf_counter()
    for r in runs:
        swag_cfg = r.cfg["methods"][0]["swag"]
        trainer = restore_trainer(r, device)
        opt = trainer.opt
        if not isinstance(opt, SWAG) or opt.n_collected < 2:
            got = getattr(opt, "n_collected", 0)
            raise ValueError(
                f"{r.run_dir}: the SWAG posterior collected {got} weight vector(s), a sample needs 2 — lower "
                f"methods.{r.method}.swag.start_epoch below train.epochs ({r.cfg['train']['epochs']})"
            )
        model = trainer.model
        x_all, y_all = trainer.x_train, trainer.y_train
        k = min(subset, len(y_all))
        idx = (
            torch.randperm(len(y_all), generator=torch.Generator().manual_seed(SUBSET_SEED))[:k].sort().values
        )
        data = (x_all[idx], y_all[idx])
        bs = r.cfg["evaluation"]["batch_size"]
        bn = [x_all[i : i + bs] for i in range(0, len(x_all), bs)] if has_batchnorm(model) else None
        gen = torch.Generator(device=opt.mean.device).manual_seed(seed)
        scale = float(swag_cfg["scale"])
        params = [p for g in opt.param_groups for p in g["params"]]
        mean = opt.mean
        for s in range(samples):
            with opt.sample(gen, scale, model=model, bn_data=bn):
                w = _flat(params)
                obj = ls.Objective(model, nn.CrossEntropyLoss(), data, mode="eval")
                dirs = [surface_directions.random(obj, "filter", seed=direction_seed + i) for i in range(2)]
                surf = surface(obj, dirs, [coords, coords], metrics=("loss",))
                centre = float(obj.loss())
            if bar is not None:
                bar.update(grid * grid)
            w64 = w.detach().to("cpu", torch.float64)
            panels.append(
                {
                    "label": r.label,
                    "run": _run_record(r),
                    "sample": s,
                    "loss": np.asarray(surf.loss).tolist(),
                    "centre_loss": centre,
                    "weights_norm": float(w64.norm()),
                    "distance_to_mean": float((w64 - mean.detach().to("cpu", torch.float64)).norm()),
                    "weights_sha256": hashlib.sha256(w64.numpy().tobytes()).hexdigest(),
                    "swag": {
                        "scale": scale,
                        "convention": opt.convention,
                        "rank": opt.rank,
                        "n_collected": opt.n_collected,
                        "diag_only": bool(opt.diag_only),
                    },  # fmt: skip
                    "subset_size": k,
                    "subset_indices": idx.tolist(),
                }
            )
    if bar is not None:
        bar.close()
    return {
        "figure": "flatbnn_fig1",
        "coords": coords.tolist(),
        "panels": panels,
        "seconds": time.perf_counter() - t0,
        "directions": {
            "kind": "random",
            "normalization": "filter",
            "ignore_1d": True,
            "seeds": [direction_seed, direction_seed + 1],
        },  # fmt: skip
        "data": f"the training loss on min(subset, n_train) = subset_size examples ({subset} asked), "
        "eval mode (BatchNorm statistics recomputed on the training inputs for every sample)",
    }


def _plot_fig1(data: dict[str, Any], fig: Any) -> None:
    panels = data["panels"]
    labels = list(dict.fromkeys(p["run"]["run_dir"] for p in panels))
    per_row = max(sum(p["run"]["run_dir"] == lab for p in panels) for lab in labels)
    axes = np.asarray(fig.subplots(len(labels), per_row, squeeze=False))
    c = np.asarray(data["coords"])
    allv = np.concatenate([np.asarray(p["loss"], dtype=np.float64).ravel() for p in panels])
    lo, hi = float(np.nanmin(allv)), float(np.nanmax(allv))
    levels = np.linspace(lo, hi if hi > lo else lo + 1e-12, 21)  # one colour scale for every panel
    cs = None
    for i, lab in enumerate(labels):
        mine = [p for p in panels if p["run"]["run_dir"] == lab]
        for j in range(per_row):
            ax = axes[i, j]
            if j >= len(mine):
                ax.axis("off")
                continue
            p = mine[j]
            cs = ax.contourf(c, c, np.asarray(p["loss"]).T, levels=levels, cmap="viridis")
            ax.plot(0, 0, "w*", markersize=8)
            ax.set(title=f"{p['label']} (seed {p['run']['seed']}), sample {p['sample']}", aspect="equal")
    if cs is not None:
        fig.colorbar(cs, ax=axes.ravel().tolist(), label="training loss")


# --------------------------------------------------------------------------- one entry point
#: name -> (numbers from runs, plot, figure size, the paper's caption in short)
FIGURES: dict[str, tuple[Callable[..., dict[str, Any]], Callable[[dict[str, Any], Any], None], str]] = {
    "fsam_fig4": (
        fig4_data,
        _plot_fig4,
        "Fisher-SAM (Kim et al. 2022) Fig. 4: adversarial parameter perturbation",
    ),
    "flatbnn_fig1": (
        fig1_data,
        _plot_fig1,
        "Flat-seeking BNNs (Nguyen et al. 2023) Fig. 1: landscapes of SWAG samples",
    ),
    "flatbnn_fig2": (
        fig2_data,
        _plot_fig2,
        "Flat-seeking BNNs (Nguyen et al. 2023) Fig. 2: reliability diagrams",
    ),
}


def make_figure(
    name: str, run_paths: Sequence[str | Path], out_dir: str | Path, **options: Any
) -> tuple[Path, Path]:
    """Make figure ``name`` from the runs in ``run_paths``; writes ``<out_dir>/<name>.png`` and
    ``.json`` atomically and returns their paths. ``options`` go to the figure's data function."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    compute, plot, caption = FIGURES[name]
    runs = find_runs(list(run_paths))
    data = compute(runs, **options)
    out_dir = Path(out_dir)
    png, js = out_dir / f"{name}.png", out_dir / f"{name}.json"
    shown = {k: (str(v) if isinstance(v, torch.device) else v) for k, v in options.items() if k != "progress"}
    data["config"] = {"figure": name, "caption": caption, "options": shown,
                      "runs": [str(r.run_dir) for r in runs]}  # fmt: skip
    from matplotlib.figure import Figure  # no pyplot: no backend, no global state

    n = len(data.get("panels") or data.get("curves") or [1])
    fig = Figure(figsize=(4.2 * (2 if name == "fsam_fig4" else min(n, 4)) + 1, 4.2), layout="constrained")
    if name == "flatbnn_fig1":
        rows = len({p["run"]["run_dir"] for p in data["panels"]})
        cols = max(1, len(data["panels"]) // max(rows, 1))
        fig.set_size_inches(3.8 * cols + 1.2, 3.6 * rows)
    plot(data, fig)
    fig.suptitle(caption, fontsize="medium")
    atomic_write(png, lambda p: fig.savefig(p, format="png", dpi=120))
    atomic_write_json(js, data)
    return png, js
