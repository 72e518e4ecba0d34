"""Cached Hessian products as one graph or as sub-graphs (``graph_chunks``), by graph size, on CPU.

``graph_chunks="auto"`` splits a cached graph into sub-graphs over the examples on CPU (smaller
working sets, a lower peak; :mod:`landscape.curvature.graph_split`), but every sub-graph costs its
own backward pass.  This measures one product ``H v`` with the graph kept whole (``1``), split in
2 and 4, and as ``"auto"`` decides, for tanh MLPs and a small CNN whose saved tensors range from
well under a megabyte to tens of megabytes, and records the saved bytes of one sub-graph of 4 that
the ``"auto"`` rule compares with its threshold.  Timings interleave the settings round by round
(median over rounds), so that machine load affects all alike.

    python benchmarks/bench_graph_chunks.py [--quick] [--threads 1] [--rounds 15]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks._runner import add_ratios, base_argparser, report  # noqa: E402
from landscape.curvature.base import saved_tensor_bytes  # noqa: E402
from landscape.models import MLP  # noqa: E402

SETTINGS = ("auto", 1, 2, 4)


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.Tanh(), nn.Conv2d(8, 8, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(8 * 8 * 8, 10),
    )  # fmt: skip


def _cases(quick: bool) -> list[tuple[str, nn.Module, int, tuple[int, ...]]]:
    cases = [
        ("mlp 64-32-32-10", MLP([64, 32, 32, 10], "tanh"), 500, (64,)),
        ("mlp 64-32-32-10", MLP([64, 32, 32, 10], "tanh"), 1797, (64,)),
        ("mlp 64-128-128-10", MLP([64, 128, 128, 10], "tanh"), 500, (64,)),
        ("mlp 64-128-128-10", MLP([64, 128, 128, 10], "tanh"), 1797, (64,)),
        ("cnn 8x8", _cnn(), 256, (1, 8, 8)),
        ("cnn 8x8", _cnn(), 1797, (1, 8, 8)),
        ("mlp 64-512-512-10", MLP([64, 512, 512, 10], "tanh"), 1797, (64,)),
    ]
    return cases[:3] if quick else cases


def _subgraph_mb(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """MB that autograd saves for the gradient graph of the first quarter of the batch (weights
    included): what the ``"auto"`` rule measures on its first sub-graph of 4."""
    q = max(1, x.shape[0] // 4)
    with torch.enable_grad(), saved_tensor_bytes() as saved:
        loss = nn.functional.cross_entropy(model(x[:q]), y[:q])
        torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    return sum(saved.values()) / 2**20


def main() -> None:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or 1)
    rounds = 3 if args.quick else args.rounds
    rows = []
    for name, model, n, shape in _cases(args.quick):
        g = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        model = model.double()
        x = torch.randn(n, *shape, generator=g, dtype=torch.float64)
        y = torch.randint(0, 10, (n,), generator=g)
        obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y))
        ops = {s: ls.hessian(obj, graph_chunks=s) for s in SETTINGS}
        v = torch.randn(obj.num_params, 1, generator=g, dtype=torch.float64)
        ref = ops[1] @ v
        for op in ops.values():  # builds the cached graphs; the products agree to rounding
            torch.testing.assert_close(op @ v, ref, rtol=1e-10, atol=1e-12)
        times: dict = {s: [] for s in SETTINGS}
        for _ in range(rounds):
            for s, op in ops.items():
                t0 = time.perf_counter()
                op @ v
                times[s].append(time.perf_counter() - t0)
        mb = _subgraph_mb(model, x, y)
        for s in SETTINGS:
            cfg = ops[s].config()
            rows.append(
                {
                    "case": f"{name}, {n} examples",
                    "params": obj.num_params,
                    "subgraph_of_4_mb": mb,
                    "graph_chunks": str(s),
                    "chunks_used": cfg["graph_chunks_used"],
                    "product_ms": 1e3 * statistics.median(times[s]),
                    "reason": (cfg["graph_chunks_reason"] or "")[:60],
                }
            )
    add_ratios(rows, "product_ms", lambda r: r["graph_chunks"] == "1", group="case")
    report(
        "graph_chunks_cpu",
        rows,
        config={"rounds": rounds, "threads": torch.get_num_threads(), "quick": args.quick},
        out_dir=args.out,
    )


if __name__ == "__main__":
    main()
