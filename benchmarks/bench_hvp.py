"""Per-HVP time of ``landscape.hessian`` engines vs PyHessian's cached-graph double backward.

Tanh MLP 64-32-10 (2,410 parameters) on the 1,797 scikit-learn digits, one batch, mean CE loss.
PyHessian's HVP is called exactly as its power iteration does:
``hessian_vector_product(ph.gradsH, ph.params, v)`` on the graph cached at construction.
Timings interleave the methods round by round (median over rounds) so that machine load affects
all of them alike.  On a GPU the figure of merit is the HVP time and peak memory relative to one
gradient (spec target: <= 2.5x).

    python benchmarks/bench_hvp.py [--quick] [--threads 1] [--device cpu|cuda] [--dtype float32]
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks._runner import base_argparser, report, sync  # noqa: E402


def main() -> None:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads or 1)
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=dtype, device=dev) / 16.0
    y = torch.tensor(d.target, device=dev)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).to(dev, dtype)
    crit = nn.CrossEntropyLoss()
    rounds = 3 if args.quick else args.rounds
    reps = 5 if args.quick else 30

    fns = {}
    try:
        from pyhessian import hessian as PyHessian
        from pyhessian.utils import hessian_vector_product

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ph = PyHessian(model, crit, data=(x, y), cuda=dev.type == "cuda")
        v_ph = [torch.randn_like(q) for q in ph.params]
        fns["pyhessian (cached double backward)"] = (
            1,
            lambda: hessian_vector_product(ph.gradsH, ph.params, v_ph),
        )
    except ImportError:  # pragma: no cover - optional anchor
        ph = None
    for p in model.parameters():
        p.grad = None

    obj = ls.Objective(model, crit, (x, y))
    p = obj.num_params
    vec = torch.randn(p, dtype=dtype, device=dev)
    V = torch.randn(p, 16, dtype=dtype, device=dev)
    ops = {e: ls.hessian(obj, engine=e) for e in ("auto", "double_backward", "forward_over_reverse")}
    for e, op in ops.items():
        fns[f"landscape {e} (k=1)"] = (1, lambda op=op: op @ vec)
    for e, op in ops.items():
        fns[f"landscape {e} (k=16, per probe)"] = (16, lambda op=op: op @ V)
    fns["landscape gradient"] = (1, obj.gradient)

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _, f in fns.values():
        f()
        f()
    for _ in range(rounds):
        for k, (div, f) in fns.items():
            n = max(1, reps // div)
            sync(dev)
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            sync(dev)
            times[k].append((time.perf_counter() - t0) / n / div)

    base = statistics.median(times[next(iter(times))]) if ph is not None else None
    grad_t = statistics.median(times["landscape gradient"])
    rows = []
    for k, ts in times.items():
        m = statistics.median(ts)
        rows.append(
            {
                "method": k,
                "ms_per_hvp": 1e3 * m,
                "vs_pyhessian": (m / base) if base else None,
                "vs_gradient": m / grad_t,
            }
        )
    if dev.type == "cuda":
        for name, fn in [("gradient", obj.gradient), ("hvp auto", lambda: ops["auto"] @ vec)]:
            torch.cuda.reset_peak_memory_stats(dev)
            start = torch.cuda.memory_allocated(dev)
            fn()
            sync(dev)
            rows.append(
                {
                    "method": f"peak memory {name} (MB)",
                    "ms_per_hvp": (torch.cuda.max_memory_allocated(dev) - start) / 2**20,
                }
            )
    report(
        "bench_hvp",
        rows,
        config={
            "model": "MLP 64-32-10 tanh",
            "params": p,
            "N": len(y),
            "dtype": args.dtype,
            "device": str(dev),
            "rounds": rounds,
            "engine_auto": ops["auto"].engine_used,
        },
        out_dir=args.out,
    )


if __name__ == "__main__":
    main()
