"""AutoAugment (CIFAR-10 policy) on a batch: ours (``landscape.data.autoaugment``) vs kornia's
``kornia.augmentation.auto.AutoAugment("cifar10")``; our Cutout (``landscape.data.random_cutout``,
side 16) timed on its own (kornia has no Cutout of that definition).

Batch 256 x 3 x 32 x 32 float32 in [0, 1], milliseconds per batch (median of ``--repeat`` calls
after a warm-up). Kornia is installed without its dependencies (``pip install --no-deps kornia
kornia_rs``); without it only our rows are written. Not the same augmentation: kornia draws one
sub-policy per call for the whole batch and a magnitude inside each bin (see the module docstring
of ``landscape.data.autoaugment``); the time is the cost of each library's AutoAugment call.

    python benchmarks/bench_augment.py [--device cpu] [--threads 2]   -> results/augment_cpu.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._runner import add_ratios, base_argparser, report, time_call  # noqa: E402
from landscape.data import random_cutout  # noqa: E402
from landscape.data.autoaugment import autoaugment  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = base_argparser(__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    x = torch.rand(args.batch, 3, 32, 32, generator=torch.Generator().manual_seed(0)).to(dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    t = time_call(lambda: autoaugment(x, "cifar10", generator=gen), args.repeat, 2, dev)
    rows.append({"op": "autoaugment_cifar10", "impl": "ours", "ms_per_batch": 1e3 * t["median_s"]})
    t = time_call(lambda: random_cutout(x, 16, generator=gen), args.repeat, 2, dev)
    rows.append({"op": "cutout_16", "impl": "ours", "ms_per_batch": 1e3 * t["median_s"]})
    try:
        from kornia.augmentation.auto import AutoAugment as KorniaAutoAugment
    except ImportError:
        print("kornia not installed: our rows only")
    else:
        torch.manual_seed(0)
        k = KorniaAutoAugment("cifar10").to(dev)
        # one kornia call draws one sub-policy for the batch: average over many calls
        t = time_call(lambda: k(x), max(args.repeat, 50), 5, dev)
        rows.append({"op": "autoaugment_cifar10", "impl": "kornia", "ms_per_batch": 1e3 * t["median_s"]})
        import kornia

        kornia_version = kornia.__version__
    add_ratios(rows, "ms_per_batch", lambda r: r["impl"] == "ours", group="op", name="ratio_to_ours")
    report(
        f"augment_{dev.type}",
        rows,
        {
            "batch": [args.batch, 3, 32, 32],
            "repeat": args.repeat,
            "device": str(dev),
            "kornia": locals().get("kornia_version"),
        },
        out_dir=args.out,
    )


if __name__ == "__main__":
    main()
