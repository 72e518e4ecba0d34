"""VariationalSAM at ``sigma_lr = 0.01``: how far one step throws ``sigma``, and ``||eps||`` with it.

    python docs/make_vsam_sigma_growth.py [--out docs/figures/vsam_sigma_growth.json]   # ~3.5 min, 1 thread

The numbers behind the paragraph "Step size scales with rho^2/p" of ``docs/methods/optimizers.md``
and the ``sigma_lr`` comment of ``configs/vsam_cifar10_wrn.toml``. ``VariationalSAM`` starts at
``sigma_0 = rho / sqrt(p)``; one step ``sigma <- |sigma - sigma_lr dJ/dsigma|`` with
``dJ/dsigma = sqrt(p) sigma g^2 / sqrt(g' Sigma g) + kl_weight (sigma / (N s0^2) - 1 / (N sigma))``
multiplies ``sigma`` by ``1 + sigma_lr p / (N rho^2)`` through the entropy term ``-1/(N sigma)``, and
the data term can overshoot zero (``|.|`` reflects it upwards).

* ``wrn28_10`` (part A): the config's model (``model.name`` / ``model.kwargs``, ``p = 36,479,194``) on
  the CPU in float32, training mode, one random CIFAR-shaped batch of ``--batch`` (inputs standard
  normal ``[b, 3, 32, 32]``, labels uniform in 0..9, both from a ``torch.Generator`` seeded with
  ``--seed``), the config's label-smoothed cross-entropy; ``VariationalSAM(rho = 0.05, sigma_lr =
  0.01, prior_std = 1, kl_weight = 1)`` over SGD with the config's lr, momentum and weight decay, for
  ``N = 50,000, 2,500, 500`` (budgets 1, 0.05, 0.01 of the config). Two steps on the same batch, each
  ``N`` from the same seeded initial weights. Per ``N``: ``sigma`` after step 1 read from the
  optimizer state (mean, min, max, in units of ``sigma_0``; ``last["sigma_mean"]`` of step 1 is the
  same tensor's mean, recorded beside it), the predicted entropy factor ``1 + sigma_lr p / (N rho^2)``
  (and with the prior term, ``- sigma_lr kl_weight / (N s0^2)``), the share of coordinates above that
  factor (only a reflected coordinate can exceed it), and ``||eps||`` of both steps
  (``last["eps_norm"]``: step 2's is built from the ``sigma`` step 1 produced), with the losses.
* ``digits_wrn10_1`` (part B): the config shrunk as ``tests/test_vsam_config.py`` shrinks it (a
  WRN-10-1, ``p = 77,562``, on the 1,438 training digits, 10 epochs of 12 steps, seed 0), built
  through the runner's own path (``experiments.config.load_config`` with overrides,
  ``experiments.runner.plan_runs``, ``experiments.train.Trainer`` on the CPU), with ``sigma_lr = 0.01``
  and variants (``VARIANTS``: float64, no label smoothing, no weight decay, a constant learning rate,
  ``kl_weight = 0``), each its own run from the same seed, and the config's SAM as the reference.
  Every step's ``opt.last`` is recorded by a step post-hook; per run: ``p``, ``sigma_0``, the largest
  ``sigma_max / sigma_0`` and ``eps_norm`` over the steps (and where), the per-epoch training losses
  beside ``ln 10`` (chance), the per-step traces, and a divergence if the runner stopped the run.
  Those largest values are set by single reflections (a coordinate whose data term overshoots zero
  by far) and move with the rounding: with two threads instead of one the ``base`` run's largest
  ``sigma`` came out about five times larger (the losses stay near ``ln 10`` either way), so the page
  quotes the means and the losses, not the maxima.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import sys
import tempfile
import time
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
from landscape.models import count_parameters, model_factory  # noqa: E402
from optimizers import VariationalSAM  # noqa: E402

CONFIG = ROOT / "configs" / "vsam_cifar10_wrn.toml"
SIGMA_LR = 0.01  # paper App. D's "0.01", read as a rate on sigma: the value that diverged
PRIOR_STD = KL_WEIGHT = 1.0
NUM_DATA = (50_000, 2_500, 500)  # the config at budget 1, 0.05, 0.01
#: the config shrunk to a WRN-10-1 on the digits (tests/test_vsam_config.py's TINY)
TINY = [
    "data.name=digits-image",
    "data.augmentation=none",
    "model.name=wrn",
    "model.kwargs={depth = 10, widen_factor = 1, in_channels = 1, num_classes = 10}",
    "budget=1",
    "seeds=[0]",
    "device=cpu",
    "precision=float32",
    "train.epochs=10",
    "evaluation.every=0",
    "progress=false",
]
#: part B: name -> (method, overrides on top of TINY)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "base": ("vsam", []),
    "float64": ("vsam", ["precision=float64"]),
    "no_label_smoothing": ("vsam", ["train.label_smoothing=0.0"]),
    "no_weight_decay": ("vsam", ["train.optimizer_defaults.weight_decay=0.0"]),
    "constant_lr": ("vsam", ["train.schedule=constant"]),
    "kl_weight_0": ("vsam", ["methods.vsam.hyperparameters.kl_weight=0.0"]),
    "sam": ("sam", []),
}
TRACE_KEYS = ("loss", "loss_perturbed", "grad_norm", "eps_norm", "sigma_mean", "sigma_min", "sigma_max")
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def _sigma(opt: VariationalSAM, params: list[torch.Tensor]) -> torch.Tensor:
    """``sigma`` of every coordinate, from the optimizer state, flattened in ``params`` order."""
    return torch.cat([opt.state[q]["sigma"].reshape(-1) for q in params])


# ---- part A: WRN-28-10, two steps -----------------------------------------------------------
def wrn28_10(cfg: dict[str, Any], batch: int, seed: int) -> dict[str, Any]:
    (vsam,) = [m for m in cfg["methods"] if m["name"] == "vsam"]
    rho = float(vsam["hyperparameters"]["rho"])
    t = cfg["train"]
    base_kwargs = {"lr": t["lr"], **t["optimizer_defaults"]}
    model = model_factory(cfg["model"]["name"], seed=seed, **cfg["model"]["kwargs"]).train()
    params = [q for q in model.parameters() if q.requires_grad]
    p = count_parameters(model)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=t["label_smoothing"])

    def closure() -> torch.Tensor:
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss

    sigma_0 = rho / math.sqrt(p)
    out: dict[str, Any] = {
        "model": cfg["model"]["name"],
        "model_kwargs": dict(cfg["model"]["kwargs"]),
        "p": p,
        "rho": rho,
        "sigma_lr": SIGMA_LR,
        "prior_std": PRIOR_STD,
        "kl_weight": KL_WEIGHT,
        "base_optimizer": "SGD",
        "base_kwargs": base_kwargs,
        "label_smoothing": t["label_smoothing"],
        "batch": batch,
        "dtype": "float32",
        "mode": "train",
        "sigma_0": sigma_0,
        "sigma_lr_rule": SIGMA_LR * rho**2 / p,
        "num_data": {},
    }
    for n in NUM_DATA:
        t_n = time.perf_counter()
        model.load_state_dict(init)
        model.zero_grad(set_to_none=True)
        opt = VariationalSAM(
            model.parameters(),
            torch.optim.SGD,
            rho=rho,
            num_data=n,
            prior_std=PRIOR_STD,
            sigma_lr=SIGMA_LR,
            kl_weight=KL_WEIGHT,
            seed=seed,
            model=model,
            **base_kwargs,
        )
        s_init = _sigma(opt, params)
        assert torch.allclose(s_init, torch.full_like(s_init, sigma_0), rtol=1e-6, atol=0)
        opt.step(closure)
        last1 = {k: float(v) for k, v in opt.last.items() if k in TRACE_KEYS}
        s1 = _sigma(opt, params) / sigma_0  # the sigma step 1 produced, which step 2's eps is built from
        entropy = 1 + SIGMA_LR * p / (n * rho**2)
        with_prior = entropy - SIGMA_LR * KL_WEIGHT / (n * PRIOR_STD**2)
        row: dict[str, Any] = {
            "predicted_entropy_factor": entropy,
            "predicted_factor_with_prior": with_prior,
            "step1_sigma_mean_over_sigma_0": float(s1.double().mean()),
            "step1_sigma_min_over_sigma_0": float(s1.min()),
            "step1_sigma_max_over_sigma_0": float(s1.max()),
            "step1_sigma_median_over_sigma_0": float(s1.median()),
            "step1_fraction_above_factor": float((s1 > with_prior * (1 + 1e-4)).double().mean()),
            "step1_last_sigma_mean_over_sigma_0": last1["sigma_mean"] / sigma_0,
            "step1_last_sigma_max_over_sigma_0": last1["sigma_max"] / sigma_0,
            "step1_eps_norm": last1["eps_norm"],
            "step1_loss": last1["loss"],
            "step1_loss_perturbed": last1["loss_perturbed"],
            "step1_grad_norm": last1["grad_norm"],
        }
        del s1, s_init
        log(
            f"wrn28-10 N={n}: step 1 mean sigma/sigma_0 {row['step1_sigma_mean_over_sigma_0']:.1f} "
            f"(predicted {entropy:.1f}), max {row['step1_sigma_max_over_sigma_0']:.4g}, "
            f"||eps|| {row['step1_eps_norm']:.4g}"
        )
        opt.step(closure)
        last2 = {k: float(v) for k, v in opt.last.items() if k in TRACE_KEYS}
        row.update(
            step2_eps_norm=last2["eps_norm"],
            step2_eps_norm_over_rho=last2["eps_norm"] / rho,
            step2_loss=last2["loss"],
            step2_loss_perturbed=last2["loss_perturbed"],
            step2_grad_norm=last2["grad_norm"],
            step2_sigma_mean_over_sigma_0=last2["sigma_mean"] / sigma_0,
            step2_sigma_max_over_sigma_0=last2["sigma_max"] / sigma_0,
            seconds=time.perf_counter() - t_n,
        )
        out["num_data"][str(n)] = row
        log(
            f"wrn28-10 N={n}: step 2 ||eps|| {row['step2_eps_norm']:.4g}, loss at w+eps "
            f"{row['step2_loss_perturbed']:.4g} ({row['seconds']:.0f} s)"
        )
        del opt
    return out


# ---- part B: WRN-10-1 on the digits, the runner's training ------------------------------------
def trainer_for(method: str, overrides: list[str], out_dir: Path, seed: int) -> Trainer:
    """The run of ``method`` that ``experiments run`` plans for the shrunk config, its ``Trainer`` on
    the CPU in this process (what ``tests/runner_helpers.py`` builds)."""
    cfg = load_config(CONFIG, [*TINY, f"seeds=[{seed}]", *overrides, f"out_dir={out_dir}"])
    run = next(r for r in plan_runs(cfg) if r.method == method)
    return Trainer(
        run.cfg,
        run.run_dir,
        seed=run.seed,
        device=torch.device("cpu"),
        ctx=DistContext(),
        fingerprint="vsam_sigma_growth",
    )


def digits_run(name: str, method: str, overrides: list[str], seed: int) -> dict[str, Any]:
    if method == "vsam":
        overrides = [f"methods.vsam.hyperparameters.sigma_lr={SIGMA_LR!r}", *overrides]
    t_run = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vsam_sigma_growth_") as tmp:
        trainer = trainer_for(method, overrides, Path(tmp), seed)
        opt, params = trainer.opt, trainer.params
        group = {
            k: v
            for k, v in opt.param_groups[0].items()
            if k != "params" and isinstance(v, (int, float, str, bool))
        }
        p = sum(q.numel() for q in params)
        sigma_0 = float(_sigma(opt, params)[0]) if method == "vsam" else None
        records: list[dict[str, float]] = []
        opt.register_step_post_hook(
            lambda o, args, kwargs: records.append(
                {k: float(v) for k, v in o.last.items() if not isinstance(v, str)}
            )
        )
        diverged = None
        try:
            trainer.fit()
        except Diverged as exc:
            diverged = {"message": str(exc), **dataclasses.asdict(exc.record)}
        losses = [row["train_loss"] for row in trainer.history]
        row: dict[str, Any] = {
            "method": method,
            "overrides": overrides,
            "precision": trainer.precision,
            "schedule": trainer.cfg["train"]["schedule"],
            "label_smoothing": trainer.loss_fn.label_smoothing,
            "param_group": group,
            "p": p,
            "num_data": trainer.n,
            "steps": len(records),
            "steps_per_epoch": trainer.steps_per_epoch,
            "diverged": diverged,
            "train_loss": losses,
            "ln_10": math.log(10),
        }
    eps = [r["eps_norm"] for r in records]
    row["max_eps_norm"] = max(eps)
    row["max_eps_norm_step"] = eps.index(row["max_eps_norm"]) + 1
    if sigma_0 is not None:
        smax = [r["sigma_max"] / sigma_0 for r in records]
        row["sigma_0"] = sigma_0
        row["max_sigma_max_over_sigma_0"] = max(smax)
        row["max_sigma_max_step"] = smax.index(max(smax)) + 1
        row["last_sigma_mean_over_sigma_0"] = records[-1]["sigma_mean"] / sigma_0
    row["trace"] = {k: [r[k] for r in records] for k in TRACE_KEYS if records and k in records[0]}
    row["seconds"] = time.perf_counter() - t_run
    msg = f"digits {name}: {row['seconds']:.0f} s, max ||eps|| {row['max_eps_norm']:.4g}"
    if sigma_0 is not None:
        msg += f", max sigma/sigma_0 {row['max_sigma_max_over_sigma_0']:.4g}"
    msg += ", losses " + " ".join(f"{v:.3f}" for v in losses)
    log(msg + (f"; DIVERGED: {diverged['message']}" if diverged else ""))
    if row["seconds"] > 60:
        log(f"digits {name}: took {row['seconds']:.0f} s (> 60 s)")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "vsam_sigma_growth.json")
    ap.add_argument("--batch", type=int, default=8, help="part A: the random CIFAR-shaped batch")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # one thread: the rounding does not depend on the thread count
    cfg = load_config(CONFIG)
    log(f"part A: {cfg['model']['name']} {cfg['model']['kwargs']}, N = {NUM_DATA}")
    part_a = wrn28_10(cfg, args.batch, args.seed)
    part_b: dict[str, Any] = {}
    for name, (method, overrides) in VARIANTS.items():
        log(f"part B: {name}")
        part_b[name] = digits_run(name, method, overrides, args.seed)
    payload = {
        "config": {
            "command": "python docs/make_vsam_sigma_growth.py",
            "config_file": str(CONFIG.relative_to(ROOT)),
            "seed": args.seed,
            "batch": args.batch,
            "sigma_lr": SIGMA_LR,
            "num_data": list(NUM_DATA),
            "digits_overrides": TINY,
            "threads": torch.get_num_threads(),
            "device": "cpu",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "wall_seconds": time.perf_counter() - T0,
        },
        "wrn28_10": part_a,
        "digits_wrn10_1": part_b,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, payload)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
