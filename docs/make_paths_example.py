"""The README's paths example: the loss barrier of the straight line between two minima and of a
trained quadratic Bezier curve (``landscape.interpolate``, ``landscape.fit_curve``,
``landscape.evaluate_path``; Garipov et al. 2018, Entezari et al. 2022).

    python docs/make_paths_example.py [--out docs/figures]   # a few seconds on one CPU thread

Data: two noisy concentric rings in the plane (200 points, radius 1: class 0, radius 2: class 1,
Gaussian noise 0.1, seed 0). Models: two tanh MLPs 2-8-2 in float64 from seeds 0 and 1, each
trained full-batch with Adam (lr 0.05, 400 steps). The line is evaluated at 21 evenly spaced points;
the Bezier curve's bend is trained with Adam (lr 0.05, 600 steps, seed 0) and evaluated at 21
points. Barrier: ``PathResult.barrier``, the largest excess of the loss over the chord between the
end losses. Writes ``paths_rings.json`` (both ``PathResult``s and the settings) to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402

SETTINGS: dict[str, Any] = {
    "data": {"points": 200, "radii": [1.0, 2.0], "noise": 0.1, "seed": 0},
    "model": {"sizes": [2, 8, 2], "activation": "tanh", "dtype": "float64", "seeds": [0, 1]},
    "train": {"optimizer": "adam", "lr": 0.05, "steps": 400, "batch": "full"},
    "line": {"n_points": 21},
    "bezier": {"optimizer": "adam", "lr": 0.05, "steps": 600, "seed": 0, "n_points": 21},
}


def rings(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two noisy concentric rings (radius 1: class 0, radius 2: class 1), float64."""
    g = torch.Generator().manual_seed(seed)
    r = torch.where(torch.arange(n) % 2 == 0, 1.0, 2.0).double()
    ang = torch.rand(n, generator=g, dtype=torch.float64) * 2 * math.pi
    x = torch.stack([r * ang.cos(), r * ang.sin()], 1)
    x = x + SETTINGS["data"]["noise"] * torch.randn(n, 2, generator=g, dtype=torch.float64)
    return x, (torch.arange(n) % 2).long()


def trained_mlp(seed: int, data: tuple[torch.Tensor, torch.Tensor]) -> nn.Module:
    m, t = SETTINGS["model"], SETTINGS["train"]
    model = ls.models.model_factory(
        "mlp", sizes=m["sizes"], activation=m["activation"], seed=seed, dtype=torch.float64
    )
    opt = torch.optim.Adam(model.parameters(), lr=t["lr"])
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(t["steps"]):
        opt.zero_grad()
        loss_fn(model(data[0]), data[1]).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures", help="directory of paths_rings.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    d = SETTINGS["data"]
    data = rings(d["points"], d["seed"])
    a, b = (trained_mlp(seed, data) for seed in SETTINGS["model"]["seeds"])
    loss_fn = nn.CrossEntropyLoss()
    line = ls.interpolate(a, b, loss_fn, data, n_points=SETTINGS["line"]["n_points"])
    bz = SETTINGS["bezier"]
    curve = ls.fit_curve(a, b, loss_fn, data, kind="bezier", steps=bz["steps"], lr=bz["lr"], seed=bz["seed"])
    bezier = ls.evaluate_path(curve, n_points=bz["n_points"])
    out = Path(args.out) / "paths_rings.json"
    payload = {
        "settings": SETTINGS,
        "line": line.to_dict(),
        "bezier": bezier.to_dict(),
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
    }
    atomic_write_json(out, payload)
    print(f"line barrier {line.barrier:.4f}, Bezier barrier {bezier.barrier:.4f}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
