"""Edge of stability: full-batch gradient descent sharpens until lambda_max = 2/lr, then stays there.

    python docs/make_eos_figure.py [--out docs/figures/edge_of_stability.png] [--steps 1500]

Setting (after Cohen et al., "Gradient descent on neural networks typically occurs at the edge of
stability", ICLR 2021, Fig. 1, which uses MSE on a 5k subset of CIFAR-10): the first 500 images of
the scikit-learn digits train split (standardised 8x8), one-hot targets, ``nn.MSELoss`` (mean over
examples and the 10 outputs), a 64-32-32-10 tanh MLP (PyTorch default init, seed 0; seeds 0-4
for the summaries over seeds), float64, plain ``torch.optim.SGD`` (no momentum) on the full batch
every step, for several learning rates.
``landscape.curvature.monitor.CurvatureMonitor`` measures lambda_max of the Hessian on the same
500 examples every 5 steps (warm-started Lanczos, at most 30 Hessian-vector products per check).
The figure shows lambda_max with 2/lr (dashed) and the training loss; ``edge_of_stability.json``
next to it holds the numbers (per-check lambda_max, per-step loss, summaries).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from landscape.curvature.monitor import CurvatureMonitor  # noqa: E402
from landscape.data import load_digits  # noqa: E402
from landscape.io import atomic_write, atomic_write_json  # noqa: E402
from landscape.models import MLP, train  # noqa: E402


def run(lr: float, steps: int, every: int, n: int = 500, seed: int = 0) -> dict:
    x, labels = load_digits("train", dtype=torch.float64)
    x, labels = x[:n], labels[:n]
    y = nn.functional.one_hot(labels, 10).to(torch.float64)
    torch.manual_seed(seed)
    model = MLP([64, 32, 32, 10], "tanh").to(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = CurvatureMonitor((x, y), nn.MSELoss(), every=every, optimizer=opt, max_matvecs=30)
    t0 = time.perf_counter()
    mon.check(model, 0)
    hist = train(model, (x, y), opt, epochs=steps, loss_fn=nn.MSELoss(), callback=mon)
    seconds = time.perf_counter() - t0
    st, lam = mon.result().series("lambda_max")
    loss = np.array(hist["loss"])
    thr = 2.0 / lr
    onset = int(st[np.argmax(lam >= 0.95 * thr)]) if (lam >= 0.95 * thr).any() else None
    last = st >= steps - 200
    summary = {
        "lr": lr,
        "threshold_2_over_lr": thr,
        "lambda_max_at_start": float(lam[0]),
        "lambda_max_peak": float(lam.max()),
        "first_step_lambda_max_ge_0.95_threshold": onset,
        "last_200_steps_lambda_max_min_mean_max": [
            float(lam[last].min()),
            float(lam[last].mean()),
            float(lam[last].max()),
        ],
        "last_200_steps_max_relative_deviation": float(np.abs(lam[last] / thr - 1).max()),
        "last_200_steps_mean_relative_deviation": float(lam[last].mean() / thr - 1),
        "loss_first_last": [float(loss[0]), float(loss[-1])],
        "loss_increases_total": int((np.diff(loss) > 0).sum()),
        "loss_increases_before_onset": None if onset is None else int((np.diff(loss[:onset]) > 0).sum()),
        "hessian_vector_products": mon.total_matvecs,
        "checks": len(mon.history),
        "seconds": seconds,
    }
    return {
        "summary": summary,
        "steps": st.tolist(),
        "lambda_max": lam.tolist(),
        "loss": loss.tolist(),
        "monitor": mon,
    }


def across_seeds(summaries: dict[float, list[dict]]) -> dict:
    """Per learning rate, over the seeds: the last 200 steps' largest and mean relative deviation of
    lambda_max from 2/lr (mean, sample standard deviation and the per-seed values)."""
    out = {"seeds": len(next(iter(summaries.values()))), "per_lr": []}
    for lr, rows in summaries.items():
        entry = {"lr": lr}
        for key in ("last_200_steps_max_relative_deviation", "last_200_steps_mean_relative_deviation"):
            values = np.array([r[key] for r in rows])
            entry[key] = {
                "mean": float(values.mean()),
                "std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
                "values": values.tolist(),
            }
        out["per_lr"].append(entry)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "figures" / "edge_of_stability.png")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--lrs", type=float, nargs="+", default=[1.5, 2.0, 3.0])
    p.add_argument(
        "--seeds",
        type=int,
        default=5,
        help="initialisations per learning rate (default 5): the figure draws seed 0; the summaries "
        "over seeds give the spread the claims quote",
    )
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    torch.set_num_threads(1)  # a few thousand parameters: one thread is fastest
    runs, seeds = {}, {}
    for lr in args.lrs:
        runs[lr] = run(lr, args.steps, args.every)
        print(runs[lr]["summary"], flush=True)
        seeds[lr] = [runs[lr]["summary"]] + [
            run(lr, args.steps, args.every, seed=s)["summary"] for s in range(1, args.seeds)
        ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, (lr, r) in enumerate(runs.items()):
        ax1.plot(r["steps"], r["lambda_max"], color=f"C{i}", lw=1.2, label=f"lr={lr:g}")
        ax1.axhline(2.0 / lr, color=f"C{i}", ls="--", lw=1)
        ax2.plot(np.arange(1, len(r["loss"]) + 1), r["loss"], color=f"C{i}", lw=1, label=f"lr={lr:g}")
    ax1.set_xlabel("step")
    ax1.set_ylabel(r"$\lambda_{max}$ of the training-loss Hessian")
    ax1.legend(fontsize=8)
    ax1.set_title("sharpness rises to 2/lr (dashed) and stays there")
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_ylabel("training loss (MSE)")
    ax2.set_title("the loss keeps decreasing, non-monotonically")
    ax2.legend(fontsize=8)
    fig.suptitle("Full-batch GD, tanh MLP, 500 digits, MSE: the edge of stability", fontsize=10)
    fig.tight_layout()
    atomic_write(args.out, lambda path: fig.savefig(path, dpi=130, format="png"))
    payload = {
        "setting": __doc__.split("Setting")[1].split("The figure")[0].strip(),
        "runs": [{k: v for k, v in r.items() if k != "monitor"} for r in runs.values()],
        "monitor_config": runs[args.lrs[0]]["monitor"].config(),
        # The dynamics at the edge are chaotic: a rounding difference (another machine, BLAS or
        # thread count) moves a run's last-200-step deviations as much as another seed does, so the
        # quoted numbers are means over seeds with their spread (docs/claim_list.py)
        "across_seeds": across_seeds(seeds),
    }
    atomic_write_json(args.out.with_suffix(".json"), payload)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
