"""A network-scale GGN trace: KFAC's (deterministic, one pass) against Hutchinson's at equal accuracy.

ResNet-20 (CIFAR-shaped, one batch) and the 2-layer transformer of ``benchmarks/_models.py`` (one
batch of token sequences), float32, mean cross-entropy, eval mode, the parameters of every
``Conv2d``/``Linear`` the forward calls as a module (as ``kfac_vs_curvlinops.py``: BatchNorm,
LayerNorm, embeddings and ``nn.MultiheadAttention``'s projections are left out), in one run:

* ``exact``: EKFAC's trace (``ls.ekfac(obj).trace()``), which is the exact ``Tr G`` of these
  parameters (an orthonormal basis with the exact second moments on its diagonal, George et al.
  2018; ``tests/test_sharpness_kfac.py`` checks it against the dense GGN);
* ``kfac``: ``ls.kfac(obj, kfac_approx=...).trace()`` (Martens & Grosse 2015) for "expand" and
  "reduce" (Eschenhagen et al. 2023), its relative error ``eps`` against ``exact``;
* ``hutchinson``: Rademacher probes on ``ls.ggn(obj)`` (Hutchinson 1990): ``--probes`` single-probe
  values ``v^T G v`` give their standard deviation ``sigma`` and the time per product; the number of
  products whose standard error ``sigma / sqrt(n)`` equals KFAC's error is
  ``n = ceil((sigma / (eps * exact))^2)`` and its cost ``n`` times the time per product.

Timed: the minimum of ``--repeat`` runs after one untimed run.  ``hutchinson_over_kfac`` is the
cost ratio at equal accuracy (> 1: KFAC is cheaper); ``exact_over_kfac`` the EKFAC trace's cost over
KFAC-expand's.

    python benchmarks/kfac_trace_vs_hutchinson.py [--quick] [--threads 2] [--batch-size 32]
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks._models import make_problem  # noqa: E402
from benchmarks._runner import base_argparser, report  # noqa: E402


def _factorised_params(model: nn.Module, x: torch.Tensor) -> list[str]:
    """Parameters of the ``Linear``/``Conv2d`` modules the forward calls as modules."""
    called: list[str] = []
    hooks = [
        m.register_forward_hook(lambda mod, i, o, n=n: called.append(n))
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    keep = tuple(f"{n}." for n in dict.fromkeys(called))
    return [n for n, _ in model.named_parameters() if n.startswith(keep)]


def _min_time(fn, repeat: int):
    out = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def _rows(name: str, args) -> list[dict]:
    prob = make_problem(name, quick=args.quick, batch_size=args.batch_size)
    names = _factorised_params(prob.model, prob.x)
    obj = ls.Objective(prob.model, prob.loss_fn, [(prob.x, prob.y)], params=names)
    t_exact, exact = _min_time(lambda: float(ls.ekfac(obj).trace()), args.repeat)
    G = ls.ggn(obj)
    gen = torch.Generator().manual_seed(args.seed)
    V = (torch.randint(0, 2, (obj.num_params, args.probes), generator=gen) * 2 - 1).to(obj.dtype)
    G @ V[:, :1]  # untimed: first-call setup
    t0 = time.perf_counter()
    values = torch.cat([(V[:, i : i + 1] * (G @ V[:, i : i + 1])).sum(0) for i in range(args.probes)])
    t_product = (time.perf_counter() - t0) / args.probes
    sigma = float(values.double().std())
    common = {"model": name, "params": obj.num_params, "batch": len(prob.y)}
    rows = [{**common, "method": "exact (ekfac)", "trace": exact, "rel_error": 0.0, "seconds": t_exact}]
    for approx in ("expand", "reduce"):
        t_kfac, kfac = _min_time(lambda a=approx: float(ls.kfac(obj, kfac_approx=a).trace()), args.repeat)
        eps = abs(kfac - exact) / abs(exact)
        n_equal = max(1, math.ceil((sigma / (eps * abs(exact))) ** 2))
        t_hutch = n_equal * t_product
        rows.append(
            {**common, "method": f"kfac ({approx})", "trace": kfac, "rel_error": eps, "seconds": t_kfac}
        )
        rows.append(
            {
                **common,
                "method": f"hutchinson at kfac ({approx})'s error",
                "trace": float(values.double().mean()),
                "probe_std": sigma,
                "pilot_probes": args.probes,
                "products_for_kfac_error": n_equal,
                "seconds_per_product": t_product,
                "rel_error": eps,
                "seconds": t_hutch,
                "hutchinson_over_kfac": t_hutch / t_kfac,
            }
        )
    rows[0]["exact_over_kfac"] = t_exact / rows[1]["seconds"]
    for r in rows:
        print(r)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet20", "transformer"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--probes", type=int, default=20, help="pilot Hutchinson probes")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device != "cpu":
        raise SystemExit("this benchmark runs on the CPU (--device cpu)")
    rows = [r for m in args.models for r in _rows(m, args)]
    cfg = {k: getattr(args, k) for k in ("models", "batch_size", "probes", "repeat", "seed", "quick")}
    name = "kfac_trace_vs_hutchinson" + ("_quick" if args.quick else "")
    cols = [
        "model", "params", "method", "trace", "rel_error", "seconds", "products_for_kfac_error",
        "hutchinson_over_kfac", "exact_over_kfac",
    ]  # fmt: skip
    report(name, rows, cfg, cols, out_dir=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
