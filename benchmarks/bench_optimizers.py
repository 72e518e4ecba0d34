"""Per-step time of every optimizer in ``optimizers`` relative to its base optimizer, in one run.

Model: an MLP 64-256-256-10 (tanh) on the scikit-learn digits, mini-batches of 128, float32.
Every optimizer runs the same number of steps on the same batches from the same initial weights;
the table reports the median wall time per step and two ratios:

* ``vs_base``: step time / step time of the plain base optimizer (SGD with momentum, or Adam).
  Two-pass methods (SAM family, bSAM) should be close to 2x, one-pass methods (RandomSAM, MFVI)
  close to 1x; G-TRACER needs a double backward (``exact``) or a second gradient (``fd``).
* ``vs_ref_sam``: step time / step time of ``ReferenceSAM`` below, a straightforward two-pass SAM
  (per-parameter loops, ``first_step``/``second_step``) written here as the anchor for the
  overhead of the shared machinery in ``optimizers.perturbation`` (bit-exact restore, m-sharpness,
  diagnostics in ``opt.last``).

``min_*`` columns use the fastest of the interleaved repeats (robust on a shared, loaded machine).
Optimizers are imported from ``optimizers`` by name; names that do not exist (yet) are skipped.

    python benchmarks/bench_optimizers.py [--quick] [--device cuda:0] [--threads 2]
"""

from __future__ import annotations

import copy
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import optimizers  # noqa: E402
from benchmarks._runner import add_ratios, base_argparser, report, time_call  # noqa: E402


class ReferenceSAM(torch.optim.Optimizer):
    """A plain SAM (Foret et al. 2021) for the timing anchor: ascend, re-evaluate, descend."""

    def __init__(self, params, base_optimizer, rho: float = 0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base.param_groups

    @torch.no_grad()
    def first_step(self):
        sq = 0.0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    sq = sq + p.grad.pow(2).sum()
        norm = torch.sqrt(sq) + 1e-12
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                e = p.grad * (group["rho"] / norm)
                p.add_(e)
                self.state[p]["e"] = e

    @torch.no_grad()
    def second_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if "e" in self.state[p]:
                    p.sub_(self.state[p].pop("e"))
        self.base.step()

    def step(self, closure):
        with torch.enable_grad():
            loss = closure()
        self.first_step()
        with torch.enable_grad():
            closure()
        self.second_step()
        return loss


def _data(device: torch.device, batch: int, n_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32, device=device)
    y = torch.tensor(d.target, dtype=torch.long, device=device)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g).to(device)
    x, y = x[perm], y[perm]
    return [(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(n_batches)]


def _model(device: torch.device, width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 10)
    ).to(device)


def _configs(num_data: int) -> list[dict[str, Any]]:
    """(name, base label, passes, factory(params, model), create_graph)."""
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
    adam = dict(lr=1e-3)
    S, A = torch.optim.SGD, torch.optim.Adam
    cfg: list[dict[str, Any]] = [
        dict(name="SGD", base="SGD", passes=1, make=lambda ps, m: S(ps, **sgd), is_base=True),
        dict(name="Adam", base="Adam", passes=1, make=lambda ps, m: A(ps, **adam), is_base=True),
        dict(name="ReferenceSAM", base="SGD", passes=2, make=lambda ps, m: ReferenceSAM(ps, S, **sgd)),
    ]

    def add(name, base, passes, factory, **extra):
        cls = getattr(optimizers, name.split(" ")[0], None)
        if cls is None:
            print(f"(skipping {name}: not in optimizers)")
            return
        cfg.append(dict(name=name, base=base, passes=passes, make=lambda ps, m: factory(cls, ps, m), **extra))

    add("SAM", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.05, **sgd))
    add("SAM (model=, BN bypass)", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.05, model=m, **sgd))
    add("SAM (m=4)", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.05, m=4, **sgd), chunks=4)
    add("SAM (Adam)", "Adam", 2, lambda c, ps, m: c(ps, A, rho=0.05, **adam))
    add("ASAM", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.5, eta=0.01, **sgd))
    add("FisherSAM", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.1, eta=1.0, **sgd))
    add("RandomSAM", "SGD", 1, lambda c, ps, m: c(ps, S, rho=0.05, seed=0, **sgd))
    add("MixSAM", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.05, seed=0, **sgd))
    add("VariationalSAM", "SGD", 2, lambda c, ps, m: c(ps, S, rho=0.05, num_data=num_data, seed=0, **sgd))
    add("MFVI", "Adam", 1, lambda c, ps, m: c(ps, lr=1e-3, num_data=num_data, base_optimizer=A, seed=0))
    add("BayesianSAM", "Adam", 2, lambda c, ps, m: c(ps, lr=1e-3, num_data=num_data, seed=0))
    add(
        "SGDTracer (exact)", "SGD", 1, lambda c, ps, m: c(ps, hvp="exact", **sgd), create_graph=True
    )  # one pass + double backward
    add("SGDTracer (fd)", "SGD", 2, lambda c, ps, m: c(ps, hvp="finite_difference", **sgd))
    add("AdamTracer (exact)", "Adam", 1, lambda c, ps, m: c(ps, hvp="exact", **adam), create_graph=True)
    return cfg


def _closure(opt, model, x, y, create_graph: bool, chunks: int):
    def closure(chunk=None):
        opt.zero_grad()
        if chunk is None:
            xc, yc = x, y
        else:
            xc, yc = torch.tensor_split(x, chunks)[chunk], torch.tensor_split(y, chunks)[chunk]
        loss = F.cross_entropy(model(xc), yc)
        loss.backward(create_graph=create_graph)
        return loss.detach()

    return closure


def main(argv: list[str] | None = None) -> None:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=None, help="steps per timed repeat")
    ap.add_argument("--width", type=int, default=256, help="hidden width of the MLP")
    args = ap.parse_args(argv)
    # G-TRACER's exact mode needs backward(create_graph=True); torch warns about the grad cycle
    warnings.filterwarnings("ignore", message="Using backward\\(\\) with create_graph=True")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    steps = args.steps or (5 if args.quick else 10)
    repeat = 3 if args.quick else 15
    batches = _data(device, 128, steps)
    model0 = _model(device, args.width)
    configs = _configs(num_data=1797)
    runs = []
    for c in configs:
        model = copy.deepcopy(model0)
        opt = c["make"](list(model.parameters()), model)
        create_graph = c.get("create_graph", False)
        chunks = c.get("chunks", 1)

        def run(opt=opt, model=model, create_graph=create_graph, chunks=chunks):
            for x, y in batches:
                opt.step(_closure(opt, model, x, y, create_graph, chunks))

        time_call(run, repeat=1, warmup=1, device=device)  # warm-up (allocations, lazy state)
        runs.append(run)
    # interleaved repeats: every optimizer is timed once per round, so that load drifts on a
    # shared machine affect all of them alike
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(repeat):
        for i, run in enumerate(runs):
            times[i].append(time_call(run, repeat=1, warmup=0, device=device)["median_s"])
    rows = []
    for c, ts in zip(configs, times):
        rows.append(
            {
                "optimizer": c["name"],
                "base": c["base"],
                "passes": c["passes"],
                "step_ms": 1e3 * statistics.median(ts) / steps,
                "min_step_ms": 1e3 * min(ts) / steps,
                "is_base": c.get("is_base", False),
                "is_ref": c["name"] == "ReferenceSAM",
            }
        )
    add_ratios(rows, "step_ms", baseline=lambda r: r["is_base"], group="base", name="vs_base")
    add_ratios(rows, "step_ms", baseline=lambda r: r["is_ref"], group="base", name="vs_ref_sam")
    # ratios of the fastest repeat: the robust estimate on a loaded, shared machine
    add_ratios(rows, "min_step_ms", baseline=lambda r: r["is_base"], group="base", name="min_vs_base")
    add_ratios(rows, "min_step_ms", baseline=lambda r: r["is_ref"], group="base", name="min_vs_ref_sam")
    config = {
        "model": f"MLP 64-{args.width}-{args.width}-10 tanh, float32",
        "data": "sklearn digits, batch 128",
        "steps_per_repeat": steps,
        "repeat": repeat,
        "device": str(device),
    }
    report(
        "bench_optimizers",
        rows,
        config=config,
        columns=[
            "optimizer",
            "base",
            "passes",
            "step_ms",
            "vs_base",
            "vs_ref_sam",
            "min_step_ms",
            "min_vs_base",
            "min_vs_ref_sam",
        ],
        out_dir=args.out,
    )


if __name__ == "__main__":
    main()
