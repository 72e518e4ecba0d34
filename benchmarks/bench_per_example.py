"""Per-example gradient moments (:mod:`optimizers.per_example`) against BackPACK, side by side.

The same quantities from one backward pass each: the gradient, the sum of squared per-example
gradients and the per-example gradient norms (BackPACK: ``extend`` the model and the loss, then one
backward with ``BatchL2Grad`` and ``SumGradSquared``; here: ``PerExampleGradients(..., verify=False)``).
Model: ResNet-20 (:func:`resnet20`) in eval mode
(its BatchNorm layers on running statistics, so the examples do not interact and both compute exact
per-example quantities), CIFAR-shaped random inputs, cross-entropy with "sum" reduction, one CPU
thread by default.  Before timing, the two are checked to agree (relative 1e-4 in float32).  Rounds
alternate the two; the median per method and the ratio (``ours_x_backpack``, target <= 1) go to
``benchmarks/results/per_example_<model>_<device>.json``.

    python benchmarks/bench_per_example.py [--quick] [--batch-size 128] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._runner import base_argparser, machine_info, sync  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402


def resnet20(num_classes: int = 10) -> nn.Sequential:
    """ResNet-20 for CIFAR (He et al. 2016, Sec. 4.2: 3 stages of 3 basic blocks, 16/32/64 channels)
    with option-B projection shortcuts (1x1 conv + BN, as ``cifar_resnet(20, shortcut="B")`` of the
    model zoo), written as a chain with BackPACK's ``Parallel`` for the residual sums (its converter
    fails on the zoo's module on torch 2.13); both methods run this same module."""
    from backpack.custom_module.branching import Parallel

    def block(cin: int, cout: int, stride: int) -> nn.Module:
        main = nn.Sequential(
            nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        short: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        return nn.Sequential(Parallel(main, short), nn.ReLU())

    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    return nn.Sequential(*layers)


def _eval_with_statistics(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Eval mode with non-trivial running statistics and affine parameters in every BatchNorm."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen))
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=gen))
    return model.eval()


def ours(model, x, y, params):
    from optimizers.per_example import PerExampleGradients

    engine = PerExampleGradients(params, model, verify=False)
    if engine.method != "layers":
        raise RuntimeError(f"the layer rules do not cover the model: {engine.reason}")

    def run():
        with engine.capture():
            losses = nn.functional.cross_entropy(model(x), y, reduction="none")
        mom = engine.moments(losses)
        return mom.sum, mom.sum_sq, mom.norms.square()

    return run


def backpack_run(model, x, y, params):
    from backpack import backpack, extend
    from backpack.extensions import BatchL2Grad, SumGradSquared

    bmodel = extend(model)
    loss_fn = extend(nn.CrossEntropyLoss(reduction="sum"))
    bparams = [p for p in bmodel.parameters() if p.requires_grad]

    def run():
        for p in bparams:
            p.grad = None
        with backpack(BatchL2Grad(), SumGradSquared()):
            loss_fn(bmodel(x), y).backward()
        return (
            [p.grad for p in bparams],
            [p.sum_grad_squared for p in bparams],
            sum(p.batch_l2 for p in bparams),
        )

    return run


def main(argv=None) -> Path:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20", choices=["resnet20"])
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or 1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> Path:
    t0 = time.perf_counter()
    dev = torch.device(args.device)
    B = 16 if args.quick else args.batch_size
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(B, 3, 32, 32, generator=g).to(dev)
    y = torch.randint(0, 10, (B,), generator=g).to(dev)
    torch.manual_seed(args.seed)
    model = _eval_with_statistics(resnet20(10), g).to(dev)
    params = [p for p in model.parameters() if p.requires_grad]
    runs = {"per_example": ours(model, x, y, params)}
    # BackPACK's extend() leaves hooks on the model: its own copy with the same weights
    bp_model = _eval_with_statistics(resnet20(10), g).to(dev)
    bp_model.load_state_dict(model.state_dict())
    runs["backpack"] = backpack_run(bp_model, x, y, None)
    a, b = runs["per_example"](), runs["backpack"]()
    errs = []
    for u, v in zip([*a[0], *a[1], a[2]], [*b[0], *b[1], b[2]]):
        errs.append(float((u - v).abs().max() / v.abs().max().clamp_min(1e-30)))
    max_rel = max(errs)
    if max_rel > 1e-4:
        raise RuntimeError(f"per-example moments and BackPACK disagree: max relative error {max_rel:.2e}")
    times: dict[str, list[float]] = {k: [] for k in runs}
    reps = 1 if args.quick else 3
    for _ in range(args.rounds):
        for k, fn in runs.items():
            sync(args.device)
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            sync(args.device)
            times[k].append(1e3 * (time.perf_counter() - t) / reps)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [{"method": k, "ms": med[k], "ms_runs": times[k]} for k in runs]
    ratio = med["per_example"] / med["backpack"]
    payload = {
        "benchmark": f"per_example_{args.model}_{dev.type}{'_quick' if args.quick else ''}",
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "batch": B},
        "quantities": ["gradient", "sum of squared per-example gradients", "per-example gradient norms"],
        "max_relative_difference": max_rel,
        "rows": rows,
        "ours_x_backpack": ratio,
        "summary": {"target": "per_example_le_1.0x_backpack", "ratio": ratio, "pass": ratio <= 1.0},
        "seconds": time.perf_counter() - t0,
    }
    for r in rows:
        print(f"{r['method']:>12}: {r['ms']:.1f} ms")
    print(f"ours / BackPACK = {ratio:.3f} (max relative difference {max_rel:.1e})")
    path = atomic_write_json(Path(args.out) / f"{payload['benchmark']}.json", payload)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
