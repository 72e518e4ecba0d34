"""README figure: loss surfaces of a digits MLP trained with SGD and with SAM, same init and data.

    python docs/make_surface_figure.py [--out docs/figures/surface_sgd_vs_sam.png] [--grid 41]

Both networks (64-128-10 tanh MLP, scikit-learn digits train split) start from the same weights
and see the same minibatches; SAM (Foret et al. 2021) uses rho=0.2 around the same SGD base
optimizer. Each panel shows the loss increase ``L(theta* + x d1 + y d2) - L(theta*)`` on the
training set (shared contour levels) with filter-normalised
Gaussian directions (Li et al. 2018, seeds 0 and 1), so the two panels share a scale: x=1 moves
every filter by its own norm. The right panel shows 1-D slices along d1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from landscape.data import load_digits  # noqa: E402
from landscape.io import atomic_savefig  # noqa: E402
from landscape.models import MLP, train  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "figures" / "surface_sgd_vs_sam.png")
    p.add_argument("--grid", type=int, default=41)
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--rho", type=float, default=0.2)
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from optimizers import SAM

    xtr, ytr = load_digits("train")
    xte, yte = load_digits("test")
    loss_fn = nn.CrossEntropyLoss()
    torch.manual_seed(0)
    init = MLP([64, 128, 10], "tanh")
    factories = {
        "SGD": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
        f"SAM (rho={args.rho})": lambda ps: SAM(ps, torch.optim.SGD, rho=args.rho, lr=0.05, momentum=0.9),
    }
    coords = [np.linspace(-1, 1, args.grid), np.linspace(-1, 1, args.grid)]
    results = {}
    for name, factory in factories.items():
        model = MLP([64, 128, 10], "tanh")
        model.load_state_dict(init.state_dict())
        train(model, (xtr, ytr), factory, epochs=args.epochs, batch_size=64, seed=0)
        obj = ls.Objective(model, loss_fn, (xtr, ytr))
        d1 = ls.directions.random(obj, "filter", seed=0)
        d2 = ls.directions.random(obj, "filter", seed=1)
        s = ls.surface(obj, [d1, d2], coords, progress=True, data_info={"data": "digits train"})
        line = ls.surface(obj, [d1], [np.linspace(-1.5, 1.5, 61)])
        test = ls.Objective(model, loss_fn, (xte, yte)).evaluate()
        results[name] = (s, line, test)
        print(
            f"{name}: train loss {s.loss[args.grid // 2, args.grid // 2]:.4f}, "
            f"test acc {test['accuracy']:.4f}, "
            f"loss at x=+-1 (d1): {line.loss[[10, 50]].round(3)}, mean surface loss {s.loss.mean():.3f}"
        )

    levels = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    for ax, (name, (s, _, test)) in zip(axes, results.items()):
        X, Y = np.meshgrid(s.xs, s.ys, indexing="ij")
        centre = s.loss[len(s.xs) // 2, len(s.ys) // 2]
        rise = np.maximum(s.loss - centre, 1e-6)
        cs = ax.contourf(
            X,
            Y,
            rise,
            levels=[1e-6, *levels, 1e3],
            cmap="viridis",
            norm=matplotlib.colors.BoundaryNorm([1e-6, *levels, 1e3], 256),
        )
        lines = ax.contour(X, Y, rise, levels=levels, colors="k", linewidths=0.5)
        ax.clabel(lines, fontsize=6, fmt="%g")
        ax.plot(0, 0, "r*", ms=10)
        ax.set_title(f"{name}\ntrain loss {centre:.4f}, test accuracy {test['accuracy']:.3f}", fontsize=10)
        ax.set_xlabel("x (filter-normalised d1)")
        ax.set_ylabel("y (filter-normalised d2)")
        ax.set_aspect("equal")
    fig.colorbar(cs, ax=axes[:2], label="training loss increase over the centre", shrink=0.9, ticks=levels)
    ax = axes[2]
    for name, (_, line, _) in results.items():
        ax.semilogy(line.xs, line.loss, label=name)
    ax.set_xlabel("x along d1")
    ax.set_ylabel("training loss")
    ax.set_title("1-D slice through the minimum")
    ax.legend()
    atomic_savefig(args.out, fig, dpi=110, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
