"""51x51 loss surface of a ~9.6k-parameter tanh MLP (64-128-10) on the 1,797 scikit-learn digits:
``landscape.surface`` (every strategy) vs the ``loss-landscapes`` package in one run, plus the floor
(the same number of plain forward passes + loss over the data).

Values: ``loss_landscapes.planar_interpolation`` is given end points ``theta + steps*d1`` and
``theta + steps*d2`` built from OUR directions, so both evaluate the same points; we compare in
float64. Its grid has a quirk we account for: in even rows ``i`` the second coordinate is
``(j+1)/steps``, in odd rows ``j/steps`` (the serpentine walk is off by one on the way out).

The vmap strategy runs twice side by side: ``batch_points="auto"`` (the widest chunk whose measured
peak fits ``--max-memory``; default: half the free memory) and the old fixed 64, next to the plain
point loop. ``--precision`` evaluates every ``landscape.surface`` row in that precision (float32,
tf32, bf16); the error against full precision that the auto row records is copied into the JSON.

    python benchmarks/bench_surface.py [--quick] [--threads 1] [--device cpu|cuda]
        [--precision bf16] [--max-memory 2GiB]

Result file: ``bench_surface[_<device type> unless cpu][_quick][_<precision>].json``.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._runner import base_argparser, report  # noqa: E402
from landscape import directions as D  # noqa: E402
from landscape.data import load_digits  # noqa: E402
from landscape.models import MLP, train  # noqa: E402
from landscape.objective import Objective  # noqa: E402
from landscape.surface import surface  # noqa: E402


def trained_mlp(x, y, dtype) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MLP([64, 128, 10], "tanh")
    train(
        model, (x, y), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), epochs=15, batch_size=128, seed=0
    )
    return model.to(dtype)


def moved(model: nn.Module, d: dict, scale: float) -> nn.Module:
    m = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n in d:
                p.add_(scale * d[n].to(p.dtype))
    return m


def main() -> None:
    p = base_argparser(__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, default=51)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--precision", choices=["float32", "tf32", "bf16"], default=None)
    p.add_argument("--max-memory", default=None, help="budget of batch_points='auto' (e.g. 2GiB, 50%%)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = 11 if args.quick else args.grid
    repeat = 1 if args.quick else args.repeat
    dev = torch.device(args.device)
    import loss_landscapes as ll
    import loss_landscapes.metrics as llm

    x, y = load_digits("all", dtype=torch.float32)
    model = trained_mlp(x, y, torch.float32)
    loss_fn = nn.CrossEntropyLoss()
    nparams = sum(p.numel() for p in model.parameters())

    # --------------------------------------------------------------- value agreement (float64)
    m64 = copy.deepcopy(model).double()
    x64 = x.double()
    obj64 = Objective(m64, loss_fn, (x64, y))
    d1, d2 = D.random(obj64, "filter", seed=0), D.random(obj64, "filter", seed=1)
    steps = n
    ll_vals = ll.planar_interpolation(
        m64, moved(m64, d1, 1.0), moved(m64, d2, 1.0), llm.Loss(loss_fn, x64, y), steps=steps,
        deepcopy_model=True,
    )  # fmt: skip
    ours = surface(obj64, [d1, d2], [np.arange(steps) / steps, np.arange(steps + 1) / steps])
    expect = np.stack([ours.loss[i, 1:] if i % 2 == 0 else ours.loss[i, :-1] for i in range(steps)])
    max_diff = float(np.max(np.abs(expect - ll_vals)))
    centre_exact = ours.loss[0, 0] == float(obj64.loss())
    print(f"float64 values vs loss-landscapes planar_interpolation: max |diff| = {max_diff:.3g}")

    # --------------------------------------------------------------- timings (float32)
    xd, yd = x.to(dev), y.to(dev)
    model = model.to(dev)
    obj = Objective(model, loss_fn, (xd, yd))
    e1, e2 = D.random(obj, "filter", seed=0), D.random(obj, "filter", seed=1)
    coords = [np.linspace(-1, 1, n), np.linspace(-1, 1, n)]
    metric = llm.Loss(loss_fn, xd, yd)

    def run_ll():
        return ll.random_plane(
            model, metric, distance=1, steps=n, normalization="filter", deepcopy_model=True
        )

    def floor():
        with torch.no_grad():
            for _ in range(n * n):
                float(loss_fn(model(xd), yd))

    methods = {
        "loss-landscapes random_plane": run_ll,
        "floor: plain forward passes": floor,
    }
    prec, budget = args.precision, args.max_memory
    if budget is not None and budget.replace(".", "", 1).isdigit():  # bytes or a fraction
        budget = float(budget) if "." in budget else int(budget)
    last: dict[str, object] = {}

    def run_surface(key: str, **kw):
        last[key] = surface(obj, [e1, e2], coords, metrics=("loss",), precision=prec, **kw)

    rows_for = {
        "vmap batch_points=auto": dict(strategy="vmap", batch_points="auto", max_memory=budget),
        "vmap batch_points=64": dict(strategy="vmap", batch_points=64),
        "loop": dict(strategy="loop"),
    }
    if dev.type == "cpu":
        rows_for["linear_first_layer"] = dict(strategy="linear_first_layer", batch_points=128)
    for key, kw in rows_for.items():
        methods[f"landscape.surface {key}"] = lambda key=key, kw=kw: run_surface(key, **kw)
    methods["landscape.surface auto (loss+accuracy)"] = lambda: surface(obj, [e1, e2], coords, precision=prec)
    times: dict[str, list[float]] = {k: [] for k in methods}
    cpu: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(repeat):  # interleaved rounds: load changes hit every method alike
        for name, fn in methods.items():
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
        print(
            f"round {r + 1}/{repeat}: "
            + ", ".join(f"{k.split(' ', 1)[-1]} {v[-1]:.3g}s" for k, v in times.items())
        )
    auto = surface(obj, [e1, e2], coords, precision=prec)
    rows = []
    base = min(times["loss-landscapes random_plane"])
    base_cpu = min(cpu["loss-landscapes random_plane"])
    for name, ts in times.items():
        rows.append(
            {
                "method": name,
                "min_s": min(ts),
                "median_s": float(np.median(ts)),
                "vs_loss_landscapes": min(ts) / base,
                "cpu_s": min(cpu[name]),  # process CPU time: robust to other load on a shared machine
                "cpu_vs_loss_landscapes": min(cpu[name]) / base_cpu,
                "ms_per_point": 1e3 * min(ts) / (n * n),
            }
        )
    loop_s = min(times["landscape.surface loop"])
    for row in rows:  # the point loop is the anchor of the vmap rows (issue 27)
        row["vs_point_loop"] = row["min_s"] / loop_s
    vmap_auto, vmap_64 = last["vmap batch_points=auto"], last["vmap batch_points=64"]
    same = bool(np.array_equal(vmap_auto.loss, vmap_64.loss))
    print(f"vmap auto vs 64: values bit-identical: {same}; {vmap_auto.config['batch_points']['reason']}")
    config = {
        "grid": [n, n],
        "model": "MLP 64-128-10 tanh",
        "num_params": nparams,
        "num_examples": len(y),
        "dtype": "float32",
        "precision": prec,
        "max_memory": args.max_memory,
        "vmap_auto_batch_points": vmap_auto.config["batch_points"],
        "vmap_auto_equals_vmap_64_bitwise": same,
        "precision_report": vmap_auto.config["precision"],
        "device": str(dev),
        "auto_strategy": auto.strategy,
        "repeat": repeat,
        "float64_max_abs_diff_vs_loss_landscapes": max_diff,
        "centre_equals_obj_loss_exactly": bool(centre_exact),
    }
    name = "bench_surface" + ("" if dev.type == "cpu" else f"_{dev.type}")
    name += ("_quick" if args.quick else "") + (f"_{prec}" if prec else "")
    report(name, rows, config, out_dir=args.out)


if __name__ == "__main__":
    main()
