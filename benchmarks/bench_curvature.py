"""Top-1 / top-5 eigenvalues and the trace of a Hessian: landscape vs PyHessian 0.1, vs exact values.

Tanh MLP on the 1,797 scikit-learn digits (inputs / 16), mean cross-entropy, float64, one batch,
briefly trained (Adam, fixed seed) so that the spectrum is that of a fitted network:
64-64-64-10 (8,970 parameters, the anchor of the curvature benchmarks) or, with ``--quick``, 64-32-10
(2,410 parameters).  Exact eigenvalues and trace come from the dense Hessian of
``tests/references.py`` (independent ``torch.func`` code) and ``torch.linalg.eigvalsh``.

PyHessian is used as documented (``hessian(model, criterion, data=(x, y), cuda=False)``,
``eigenvalues(top_n=k)``, ``trace()`` with their default tolerances); its HVPs are counted by
wrapping ``pyhessian.hessian.hessian_vector_product``.  Ours: ``ls.eigenvalues`` (thick-restart
Lanczos, residual tolerance ``tol``, true-residual check included in the count), ``ls.power_iteration``
and ``ls.trace`` (auto, stops on the 95 % error bar at rtol 1e-3 or 100 matvecs).  Wall times are the
median of ``--repeat`` runs; ``per_hvp_ms`` is the median time of one HVP (PyHessian: its cached
graph; ours: ``ls.hessian(obj).matvec``), interleaved round by round.

    python benchmarks/bench_curvature.py [--quick] [--threads 2]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks._runner import add_ratios, base_argparser, report  # noqa: E402
from tests import references as ref  # noqa: E402


def _data_and_model(quick: bool, dev: torch.device):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float64, device=dev) / 16.0
    y = torch.tensor(d.target, device=dev)
    sizes = (64, 32, 10) if quick else (64, 64, 64, 10)
    model = ref.make_mlp(sizes, activation="tanh", seed=0).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(100):  # a fitted network, deterministically
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    return model.eval(), x, y


def _rel_err(est, exact) -> float:
    est = torch.as_tensor(est, dtype=torch.float64).flatten()
    exact = torch.as_tensor(exact, dtype=torch.float64).flatten()
    return float(((est - exact).abs() / exact.abs()).max())


def main() -> None:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-6, help="residual tolerance of ls.eigenvalues")
    args = ap.parse_args()
    torch.set_num_threads(args.threads or 2)
    dev = torch.device(args.device)
    model, x, y = _data_and_model(args.quick, dev)
    crit = nn.CrossEntropyLoss()
    p = sum(q.numel() for q in model.parameters())
    print(f"model {[m for m in model]} with {p} parameters; computing the dense Hessian ...", flush=True)
    t0 = time.perf_counter()
    H = ref.dense_hessian(model, crit, [(x, y)])
    exact = torch.linalg.eigvalsh(H.cpu())
    dense_s = time.perf_counter() - t0
    by_mag = exact[torch.argsort(exact.abs(), descending=True)]
    exact_trace = float(exact.sum())
    del H
    print(f"dense Hessian + eigvalsh: {dense_s:.1f} s; top-5 {by_mag[:5].tolist()}, trace {exact_trace:.6g}")

    import pyhessian  # noqa: F401  (the package __init__ shadows the module name with the class)

    ph_mod = sys.modules["pyhessian.hessian"]

    counter = {"n": 0}
    raw_hvp = ph_mod.hessian_vector_product

    def counted(gradsH, params, v):
        counter["n"] += 1
        return raw_hvp(gradsH, params, v)

    ph_mod.hessian_vector_product = counted
    ph_model = copy.deepcopy(model)  # PyHessian writes .grad with create_graph=True
    old_default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # PyHessian draws its probes in the default dtype
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ph = ph_mod.hessian(ph_model, crit, data=(x, y), cuda=dev.type == "cuda")

    obj = ls.Objective(model, crit, (x, y))
    H_op = ls.hessian(obj)
    rows = []

    def run(task, method, fn, extract):
        times, out = [], None
        for r in range(args.repeat):
            counter["n"] = 0
            torch.manual_seed(r)
            t = time.perf_counter()
            out = fn(r)
            times.append(time.perf_counter() - t)
        hvps, value, err, extra = extract(out)
        row = {
            "task": task,
            "method": method,
            "hvps": hvps,
            "seconds": statistics.median(times),
            "rel_err": err,
        }
        row.update(extra)
        rows.append(row)
        print(row, flush=True)

    for k in (1, 5):
        task = f"top-{k}"
        run(
            task,
            "pyhessian",
            lambda r, k=k: ph.eigenvalues(top_n=k),
            lambda out, k=k: (
                counter["n"],
                out[0],
                _rel_err(sorted(out[0], key=abs, reverse=True), by_mag[:k]),
                {},
            ),
        )
        run(
            task,
            f"ours lanczos tol={args.tol:g}",
            lambda r, k=k: ls.eigenvalues(H_op, k=k, which="largest_magnitude", tol=args.tol, seed=r),
            lambda out, k=k: (
                out.matvecs,
                out.values,
                _rel_err(out.values, by_mag[:k]),
                {"converged": all(out.converged), "max_residual": float(out.residuals.max())},
            ),
        )
        run(
            task,
            "ours lanczos tol=1e-3",
            lambda r, k=k: ls.eigenvalues(H_op, k=k, which="largest_magnitude", tol=1e-3, seed=r),
            lambda out, k=k: (
                out.matvecs,
                out.values,
                _rel_err(out.values, by_mag[:k]),
                {"converged": all(out.converged), "max_residual": float(out.residuals.max())},
            ),
        )
        run(
            task,
            "ours power iteration tol=1e-3",
            lambda r, k=k: ls.power_iteration(H_op, k=k, tol=1e-3, seed=r, max_matvecs=100 * k),
            lambda out, k=k: (
                out.matvecs,
                out.values,
                _rel_err(out.values, by_mag[:k]),
                {"converged": all(out.converged), "max_residual": float(out.residuals.max())},
            ),
        )
        sp = H_op.to_scipy()

        def eigsh(r, k=k, sp=sp):
            import numpy as np
            from scipy.sparse.linalg import eigsh as _eigsh

            before = H_op.matvecs
            v0 = np.random.default_rng(r).standard_normal(p)
            vals = _eigsh(sp, k=k, which="LM", tol=1e-6, v0=v0, return_eigenvectors=False)
            return vals, H_op.matvecs - before

        run(
            task,
            "scipy eigsh tol=1e-6",
            eigsh,
            lambda out, k=k: (
                out[1],
                out[0],
                _rel_err(sorted(out[0], key=abs, reverse=True), by_mag[:k]),
                {},
            ),
        )

    run(
        "trace",
        "pyhessian",
        lambda r: ph.trace(),
        lambda out: (
            counter["n"],
            sum(out) / len(out),
            abs(sum(out) / len(out) - exact_trace) / abs(exact_trace),
            {},
        ),
    )
    for method in ("auto", "hutchinson"):
        run(
            "trace",
            f"ours {method} rtol=1e-3",
            lambda r, method=method: ls.trace(H_op, method=method, rtol=1e-3, max_matvecs=100, seed=r),
            lambda out: (
                out.matvecs,
                out.value,
                abs(out.value - exact_trace) / abs(exact_trace),
                {
                    "stderr_rel": out.stderr / abs(exact_trace),
                    "ci_covers": out.ci()[0] <= exact_trace <= out.ci()[1],
                    "chosen": out.method,
                },
            ),
        )

    # per-HVP time: interleaved rounds, median
    from pyhessian.utils import hessian_vector_product

    v_ph = [torch.randn_like(q) for q in ph.params]
    v = torch.randn(p, dtype=torch.float64, device=dev)
    V10 = torch.randn(p, 10, dtype=torch.float64, device=dev)
    fns = {
        "pyhessian": (1, lambda: hessian_vector_product(ph.gradsH, ph.params, v_ph)),
        "ours matvec": (1, lambda: H_op.matvec(v)),
        "ours matmat(10)/10": (10, lambda: H_op.matmat(V10)),
    }
    times = {name: [] for name in fns}
    for _ in range(3 if args.quick else 10):
        for name, (ncols, fn) in fns.items():
            fn()
            t = time.perf_counter()
            for _ in range(5):
                fn()
            times[name].append((time.perf_counter() - t) / (5 * ncols))
    torch.set_default_dtype(old_default)
    per_hvp = {name: 1e3 * statistics.median(ts) for name, ts in times.items()}
    for r in rows:
        key = "pyhessian" if r["method"] == "pyhessian" else "ours matvec"
        r["per_hvp_ms"] = per_hvp[key]
    for name, ms in per_hvp.items():
        rows.append({"task": "per-HVP", "method": name, "per_hvp_ms": ms})
    add_ratios(rows, "hvps", lambda r: r["method"] == "pyhessian", group="task")
    add_ratios(rows, "seconds", lambda r: r["method"] == "pyhessian", group="task")
    add_ratios(rows, "rel_err", lambda r: r["method"] == "pyhessian", group="task")
    add_ratios(rows, "per_hvp_ms", lambda r: r["method"] == "pyhessian", group="task")
    ph_mod.hessian_vector_product = raw_hvp
    cols = [
        "task",
        "method",
        "hvps",
        "hvps_ratio",
        "seconds",
        "seconds_ratio",
        "rel_err",
        "rel_err_ratio",
        "converged",
        "stderr_rel",
        "ci_covers",
        "per_hvp_ms",
        "per_hvp_ms_ratio",
    ]
    report(
        "curvature_quick" if args.quick else "curvature",
        rows,
        config={
            "model": "tanh MLP " + ("64-32-10" if args.quick else "64-64-64-10"),
            "params": p,
            "data": "sklearn digits, 1797 examples, one batch",
            "dtype": "float64",
            "repeat": args.repeat,
            "threads": torch.get_num_threads(),
            "exact_top5_by_magnitude": by_mag[:5].tolist(),
            "exact_trace": exact_trace,
            "dense_hessian_seconds": dense_s,
        },
        columns=cols,
        out_dir=args.out,
    )


if __name__ == "__main__":
    main()
