"""Why G-TRACER at its defaults diverges on the label-noise miniature, step by step, and the bound.

    python docs/make_gtracer_divergence.py [--out docs/figures/gtracer_divergence.json]  # ~1 min
    python docs/make_gtracer_divergence.py --seeds-table    # + 12 runs of 60 epochs, ~3 min more

The run is the label-noise miniature's (``configs/miniatures/label_noise.toml``: tanh MLP
64-128-128-10, batch 32, learning rate 0.05, momentum 0.9, SGD-TRACER at the defaults
``rho = 1e-6``, ``delta = 1e-8``, ``beta = 0.01``) at 40 % flipped labels, seed 1: the run the
miniature records as diverged. It is trained here by the runner's own ``Trainer`` in this process,
so its divergence record is the miniature's (``divergence`` below; ``docs/figures/
miniature_results.json`` keeps the miniature's), and every step is looked into:

* ``g``, the batch gradient, by a hook on the gradient's accumulation into ``.grad`` (the closure's
  ``backward``; the Hessian-vector product's ``autograd.grad`` does not accumulate);
* ``f_bar`` as the step found it (a copy taken by a step pre-hook; the first step initialises it
  with ``g^2``), so ``v = g / (f_bar + delta)`` exactly as the step formed it;
* the step's own ``last`` record: the loss, the penalty ``T``, ``||g||`` and the correction
  ``||2 rho H v||``.

Per step the script keeps those numbers and where ``||v||^2`` sits: the share of the first layer's
weights grouped by input pixel (the 128 weights of pixel ``i`` take ``v[:, i]``), the largest share
and its pixel. At the first step whose correction exceeds ten times ``||g||`` (the optimizer's
warning), the first that exceeds a hundred times, and the largest, it keeps that step, the one
before, and for the pixel that carries most of ``||v||^2`` how many training images have it on
(above its smallest value, a raw 0: the images are standardised per pixel), its standardised
values where it is on and off, and ``f_bar`` and ``|g|`` on its weights.

Then the same run with ``max_correction_ratio = 1`` (``||2 rho H v|| <= ||g||``) for the config's 60
epochs: how many steps the bound acted on, the median correction ratio and the final test accuracy.

``--seeds-table [PATH]`` (about 3 min more on 2 cores; ``docs/figures/gtracer_seeds_table.json``)
runs, for the 3 seeds and both noise levels of the
miniature (40 %, 60 %), the bound ``c = 1`` and the former defaults ``rho = 1e-3``, ``delta = 1e-2``
without it (the damped regime): the final test accuracy, the steps whose ratio exceeded 10 (an
unbounded run warns there) and the steps the bound acted on.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.config import load_config  # noqa: E402
from experiments.divergence import Diverged  # noqa: E402
from experiments.parallel import DistContext  # noqa: E402
from experiments.runner import plan_runs  # noqa: E402
from experiments.train import Trainer  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402
from optimizers.bayes.tracer import WARN_RATIO  # noqa: E402

CONFIG = ROOT / "configs" / "miniatures" / "label_noise.toml"
VARIANT, METHOD, SEED = "label_noise=0.4", "sgd_tracer", 1
#: the bound (the paper configs' setting) and the former defaults, in the runner's override syntax
BOUND = f"methods.{METHOD}.hyperparameters.max_correction_ratio=1.0"
FORMER = [f"methods.{METHOD}.hyperparameters.rho=1e-3", f"methods.{METHOD}.hyperparameters.delta=1e-2"]
#: the optimizer's first warning (``optimizers.bayes.tracer.WARN_RATIO``) and the ratio this script
#: calls a blow-up: a correction a hundred times the gradient
WARN, BLOWUP = WARN_RATIO, 100.0


def trainer(tmp: Path, overrides: list[str], seed: int = SEED, variant: str = VARIANT) -> Trainer:
    """The miniature's SGD-TRACER run (40 % noise, seed 1 unless told) with ``overrides``, on the CPU."""
    cfg = load_config(CONFIG, [f"seeds=[{seed}]", f"out_dir={tmp}", "progress=false", *overrides])
    (run,) = [r for r in plan_runs(cfg) if r.method == METHOD and r.variant == variant]
    return Trainer(
        run.cfg, run.run_dir, seed=seed, device=torch.device("cpu"), ctx=DistContext(), fingerprint="docs"
    )


#: the fields of the optimizer's ``last`` record that the script keeps per step
LAST_KEYS = (
    "step",
    "loss",
    "penalty",
    "grad_norm",
    "correction_norm",
    "correction_ratio",
    "correction_scale",
)


def last_row(opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {k: opt.last[k] for k in LAST_KEYS}


class StepRecorder:
    """Per-step records of a TRACER optimizer: ``last``, and ``v = g / (f_bar + delta)`` as formed."""

    def __init__(self, tr: Trainer) -> None:
        self.opt, self.params = tr.inner, tr.params
        self.first = next(m for m in tr.model.modules() if isinstance(m, nn.Linear)).weight
        self.grads: dict[torch.Tensor, torch.Tensor] = {}
        self.fbars: dict[torch.Tensor, torch.Tensor] = {}
        self.steps: list[dict[str, Any]] = []
        self.pixel_state: list[tuple[torch.Tensor, torch.Tensor]] = []  # per step: f_bar, |g| there
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad)
        self.opt.register_step_pre_hook(self._before)
        self.opt.register_step_post_hook(self._after)

    def _grad(self, p: torch.Tensor) -> None:
        self.grads[p] = p.grad.detach().clone()

    def _before(self, opt, args, kwargs) -> None:
        self.grads.clear()
        self.fbars = {p: opt.state[p]["f_bar"].clone() for p in self.params if "f_bar" in opt.state[p]}

    def _after(self, opt, args, kwargs) -> None:
        group = opt.param_groups[0]
        total, per_pixel = 0.0, None
        for p in self.params:
            g = self.grads[p].double()
            fb = self.fbars[p].double() if p in self.fbars else g.square()  # the first step's f_bar
            v2 = (g / (fb + group["delta"])).square()
            total += float(v2.sum())
            if p is self.first:  # the first layer's weight is (out, pixels)
                per_pixel = v2.sum(0)
                self.pixel_state.append((fb, g.abs()))
        share, pixel = (per_pixel / total).max(0)
        self.steps.append(
            {
                **last_row(opt),
                "v_norm": math.sqrt(total),
                # the perturbation of the SAM reading, g + 2 rho H v ~ grad L(w + 2 rho v)
                "perturbation_norm": 2 * group["rho"] * math.sqrt(total),
                "top_pixel": int(pixel),
                "top_pixel_share": float(share),
            }
        )


def at_step(tr: Trainer, rec: StepRecorder, step: int) -> dict[str, Any]:
    """Step ``step`` (counted from 1), the step before it, and the pixel whose first-layer weights
    carry most of that step's ``||v||^2``: in how many training images it is on, its standardised
    values, and ``f_bar`` (as the step found it) and ``|g|`` on its 128 weights."""
    row = rec.steps[step - 1]
    pixel = row["top_pixel"]
    col = tr.x_train[:, pixel].double()
    off = float(col.min())
    on = col > off
    fb, g = rec.pixel_state[step - 1]
    return {
        **row,
        "before": rec.steps[step - 2] if step > 1 else None,
        "penalty_jump": row["penalty"] / rec.steps[step - 2]["penalty"] if step > 1 else None,
        "next_loss": rec.steps[step]["loss"] if step < len(rec.steps) else None,
        "pixel": {
            "index": pixel,
            "row_col": [pixel // 8, pixel % 8],
            "images_on": int(on.sum()),
            "value_on_max": float(col[on].max()) if bool(on.any()) else None,
            "value_off": off,
            "fbar_mean": float(fb[:, pixel].mean()),
            "fbar_max": float(fb[:, pixel].max()),
            "abs_grad_max": float(g[:, pixel].max()),
        },
    }


def unbounded(tmp: Path) -> dict[str, Any]:
    tr = trainer(tmp / "unbounded", [])
    rec = StepRecorder(tr)
    record = None
    with warnings.catch_warnings(record=True) as caught:  # the optimizer's warnings, kept as steps
        warnings.simplefilter("always", RuntimeWarning)
        try:
            tr.fit()
        except Diverged as exc:
            record = exc.record
    warned_steps = [
        int(m.group(1)) for w in caught if (m := re.search(r"Tracer step (\d+): the TRACER", str(w.message)))
    ]
    steps = rec.steps
    ratios = [s["correction_ratio"] for s in steps]
    warned = next(s["step"] for s in steps if s["correction_ratio"] > WARN)
    blowup = next(s["step"] for s in steps if s["correction_ratio"] > BLOWUP)
    largest = max(steps, key=lambda s: s["correction_ratio"])["step"]
    return {
        "steps_taken": len(steps),
        "divergence": None if record is None else record.to_dict(),
        "n_train": tr.n,
        "warned_steps": warned_steps,
        "median_ratio_before_blowup": statistics.median(ratios[: blowup - 1]),
        "first_ratio_above_warn": at_step(tr, rec, warned),
        "first_ratio_above_blowup": at_step(tr, rec, blowup),
        "largest_ratio": at_step(tr, rec, largest),
        "largest_loss": max(s["loss"] for s in steps),
        "per_step": steps,
    }


def bounded(tmp: Path, overrides: list[str], seed: int = SEED, variant: str = VARIANT) -> dict[str, Any]:
    """A run that trains (the bound, or other constants): its correction ratios and accuracy."""
    tr = trainer(tmp, overrides, seed, variant)
    rows: list[dict[str, Any]] = []  # ``last`` alone: the steps' v is not looked into here
    tr.inner.register_step_post_hook(lambda opt, args, kwargs: rows.append(last_row(opt)))
    tr.fit()
    ratios = [s["correction_ratio"] for s in rows]
    return {
        "overrides": overrides,
        "seed": seed,
        "variant": variant,
        "epochs": len(tr.history),
        "steps": len(rows),
        "steps_bounded": sum(s["correction_scale"] < 1 for s in rows),
        "median_ratio": statistics.median(ratios),
        "largest_ratio": max(ratios),
        "steps_above_warn": sum(r > WARN for r in ratios),
        "final_test_accuracy": tr.history[-1]["test_accuracy"],
        "train_loss_per_epoch": [r["train_loss"] for r in tr.history],
    }


def _table_run(job: tuple[str, list[str], int, str]) -> dict[str, Any]:
    setting, overrides, seed, variant = job
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        row = bounded(Path(tmp), overrides, seed, variant)
    row.pop("train_loss_per_epoch")
    return {"setting": setting, **row}


def seeds_table(workers: int) -> list[dict[str, Any]]:
    """The bound and the former defaults (unbounded) on every seed and noise level of the miniature."""
    jobs = [
        (setting, overrides, seed, variant)
        for setting, overrides in (("bound_c1", [BOUND]), ("former_defaults", FORMER))
        for variant in ("label_noise=0.4", "label_noise=0.6")
        for seed in (0, 1, 2)
    ]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return pool.map(_table_run, jobs)


def environment() -> dict[str, Any]:
    return {
        "config": str(CONFIG.relative_to(ROOT)),
        "method": METHOD,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": 1,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "gtracer_divergence.json")
    ap.add_argument(
        "--seeds-table",
        type=Path,
        nargs="?",
        const=ROOT / "docs" / "figures" / "gtracer_seeds_table.json",
        default=None,
        metavar="PATH",
        help="also run the bound and the former defaults on all 3 seeds x 2 noise levels (12 runs, "
        "~3 min on 2 cores) into PATH (default docs/figures/gtracer_seeds_table.json)",
    )
    ap.add_argument("--workers", type=int, default=2, help="processes for --seeds-table")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        loose = unbounded(Path(tmp))
        print(f"unbounded: {loose['steps_taken']} steps ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        bound = bounded(Path(tmp) / "bounded", [BOUND])
        print(f"bounded: {bound['steps']} steps ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    out = {
        "config": {
            **environment(),
            "variant": VARIANT,
            "seed": SEED,
            "warn_ratio": WARN,
            "blowup_ratio": BLOWUP,
        },
        "unbounded": loose,
        "bounded": bound,
        "seconds": time.perf_counter() - t0,
    }
    atomic_write_json(args.out, out)
    print(f"wrote {args.out}")
    if args.seeds_table is not None:
        t1 = time.perf_counter()
        runs = seeds_table(args.workers)
        table = {
            "config": {**environment(), "bound": BOUND, "former_defaults": FORMER, "workers": args.workers},
            "runs": runs,
            "seconds": time.perf_counter() - t1,
        }
        atomic_write_json(args.seeds_table, table)
        print(f"wrote {args.seeds_table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
