"""Curvature products on networks people run: time and peak memory relative to one gradient, against
PyHessian, curvlinops and hessian-eigenthings, and the spectra they feed at equal matvec budgets.

Products (one batch, mean cross-entropy, one probe ``v``), each checked against ``landscape``:

* Hessian-vector: ``landscape.hessian`` (engines auto / double_backward / forward_over_reverse, and
  ``compile_operator``), PyHessian ``hessian_vector_product`` on its cached graph, curvlinops
  ``HessianLinearOperator``, hessian-eigenthings ``HessianOperator``;
* GGN-vector: ``landscape.ggn`` (jvp forward / linearize, compiled), curvlinops ``GGNLinearOperator``,
  hessian-eigenthings ``GGNOperator``, and the plain floor (``jvp`` + closed-form output Hessian +
  cached ``vjp``, ``benchmarks/_peers.py``);
* Fisher: ``landscape.empirical_fisher`` / ``landscape.fisher`` (MC, 1 sample) vs curvlinops
  ``EFLinearOperator`` / ``FisherMCLinearOperator`` (and hessian-eigenthings' empirical Fisher).

Timing: every method is built, run once (its result is kept for the check), then all methods run
one after the other, ``--repeats`` rounds (interleaved, so that machine load hits all alike); the
median of the rounds is reported, and its ratio to the median of one plain gradient
(``torch.autograd.grad`` of the batch loss) and to the fastest peer of the same product.  Compile
time of the compiled operators is excluded and reported separately.

Memory (``benchmarks/_memory.py``): on CPU the peak RSS of each method in its own process over
building it and two products, glibc's mmap threshold fixed so that freed tensors leave the RSS,
``--memory-repeats`` times interleaved over the methods, median reported; on CUDA
``torch.cuda.max_memory_allocated`` in this process (``--cuda-memory process`` for child processes).
On a machine shared with other jobs use ``--threads 1``: with more threads than free cores, torch's
thread pool waits on descheduled workers and timings degrade by an order of magnitude, unevenly
across methods.

The targets (``benchmarks/_summary.py``: GGN vs curvlinops and the floor, HVP vs PyHessian, every
product's peak memory within ``1.2x`` the best peer's, compiled equal to eager) are checked on the
rows, written to the JSON as ``summary`` and printed.

    python benchmarks/bench_products.py [--quick] [--models resnet20,mlp] [--device cpu|cuda]
        [--dtype float32|float64] [--repeats 5] [--threads 1] [--no-compile] [--no-memory]
        [--no-spectra] [--methods ggn,gradient] [--batch-size 32] [--memory-repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks import _memory as memory  # noqa: E402
from benchmarks import _peers as peers  # noqa: E402
from benchmarks import _summary  # noqa: E402
from benchmarks._models import MODELS, Problem, make_problem  # noqa: E402
from benchmarks._runner import RESULTS_DIR, format_table, machine_info, sync  # noqa: E402
from landscape.curvature.compiled import compile_operator  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402

PEERS = _summary.PEERS
REFERENCE = {
    "hessian": "landscape double_backward",
    "ggn": "landscape ggn forward",
    "ef": "landscape empirical_fisher",
    "mc": "landscape fisher (MC, 1 sample)",
}
# library of a method row -> the module it imports; a row whose module is missing is skipped with a note
PEER_MODULES = {"pyhessian": "pyhessian", "curvlinops": "curvlinops", "eigenthings": "hessian_eigenthings"}
INSTALL_HINT = "bash benchmarks/install_peers.sh"


# ------------------------------------------------------------------------------------ our methods
def _ours_hessian(engine: str, **kw: Any):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.hessian(obj, engine=engine, **kw)
        return (lambda: op @ v), {"object": op}

    return build


def _ours_ggn(jvp: str, **kw: Any):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.ggn(obj, jvp=jvp, **kw)
        return (lambda: op @ v), {"object": op}

    return build


def _ours_compiled(kind: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        eager = ls.hessian(obj, engine="forward_over_reverse") if kind == "hessian" else ls.ggn(obj)
        op = compile_operator(eager)
        cfg = op.config()
        info = {"object": op, "compile_s": cfg["compile_seconds"], "eager": eager}
        if not cfg["compiled"]:
            info["note"] = f"eager fallback: {cfg['compile_error']}"
        return (lambda: op @ v), info

    return build


def _ours_ef(method: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.empirical_fisher(obj, method=method)
        return (lambda: op @ v), {"object": op}

    return build


def _ours_mc(method: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.fisher(obj, samples=1, seed=0, method=method)
        return (lambda: op @ v), {"object": op}

    return build


def _peer(build):
    return lambda pr, v, obj: build(pr, v)


# name -> (product type, library, builder(problem, v, objective) -> (product, info))
METHODS: dict[str, tuple[str, str, Any]] = {
    "gradient": ("gradient", "torch", _peer(peers.gradient)),
    "landscape auto": ("hessian", "landscape", _ours_hessian("auto")),
    "landscape double_backward": ("hessian", "landscape", _ours_hessian("double_backward")),
    "landscape double_backward uncached": (
        "hessian",
        "landscape",
        _ours_hessian("double_backward", cache_graph=False),
    ),
    "landscape forward_over_reverse": ("hessian", "landscape", _ours_hessian("forward_over_reverse")),
    "landscape compiled hessian": ("hessian", "landscape", _ours_compiled("hessian")),
    "pyhessian": ("hessian", "pyhessian", _peer(peers.pyhessian)),
    "curvlinops HessianLinearOperator": ("hessian", "curvlinops", _peer(peers.curvlinops("hessian"))),
    "eigenthings HessianOperator": ("hessian", "eigenthings", _peer(peers.eigenthings("hessian"))),
    "landscape ggn forward": ("ggn", "landscape", _ours_ggn("forward")),
    "landscape ggn cached": ("ggn", "landscape", _ours_ggn("forward", cache=True)),
    "landscape ggn linearize": ("ggn", "landscape", _ours_ggn("linearize")),
    "landscape compiled ggn": ("ggn", "landscape", _ours_compiled("ggn")),
    "floor jvp+H+cached vjp": ("ggn", "floor", _peer(peers.ggn_floor)),
    "curvlinops GGNLinearOperator": ("ggn", "curvlinops", _peer(peers.curvlinops("ggn"))),
    "eigenthings GGNOperator": ("ggn", "eigenthings", _peer(peers.eigenthings("ggn"))),
    "landscape empirical_fisher": ("ef", "landscape", _ours_ef("output_space")),
    "landscape empirical_fisher per_example": ("ef", "landscape", _ours_ef("per_example")),
    "curvlinops EFLinearOperator": ("ef", "curvlinops", _peer(peers.curvlinops("ef"))),
    "eigenthings EmpiricalFisherOperator": ("ef", "eigenthings", _peer(peers.eigenthings("ef"))),
    "landscape fisher (MC, 1 sample)": ("mc", "landscape", _ours_mc("output_space")),
    "landscape fisher (MC, 1 sample) per_example": ("mc", "landscape", _ours_mc("per_example")),
    "curvlinops FisherMCLinearOperator": ("mc", "curvlinops", _peer(peers.curvlinops("mc", seed=0))),
}


_short = memory.short


def _setup(args, name: str) -> tuple[Problem, torch.Tensor, Any]:
    pr = make_problem(
        name,
        quick=args.quick,
        batch_size=args.batch_size,
        dtype=getattr(torch, args.dtype),
        device=args.device,
        seed=args.seed,
    )
    obj = ls.Objective(pr.model, pr.loss_fn, (pr.x, pr.y))
    gen = torch.Generator().manual_seed(args.seed + 1)
    v = torch.randn(obj.num_params, generator=gen, dtype=torch.float64).to(
        args.device, getattr(torch, args.dtype)
    )
    return pr, v, obj


def _selected(args) -> list[str]:
    chosen = [m for m in METHODS if args.compile or "compiled" not in m]
    if args.methods:
        keys = [k.strip() for k in args.methods.split(",") if k.strip()]
        chosen = [m for m in chosen if m == "gradient" or any(k in m for k in keys)]
    return chosen


def _one(args) -> None:
    """Child process: peak memory of one method (prints one JSON line)."""
    (name,) = args.models
    _, lib, build = METHODS[args.one]
    memory.child(args.one, lib, build, lambda: _setup(args, name), args.device)


def _memory(args, name: str, method: str) -> dict[str, Any]:
    argv = ["--one", method, "--models", name, "--device", args.device, "--dtype", args.dtype]
    argv += ["--seed", str(args.seed), "--threads", str(torch.get_num_threads())]
    if args.quick:
        argv.append("--quick")
    if args.batch_size:
        argv += ["--batch-size", str(args.batch_size)]
    return memory.in_child(Path(__file__).resolve(), argv, args.memory_timeout)


def _measure_memory(args, name: str, rows: dict[str, dict], pr, v, obj, inprocess: bool) -> None:
    """Peak memory of every row's method, ``--memory-repeats`` rounds interleaved, median kept."""
    todo = [m for m in rows if "compiled" not in m and "skipped" not in rows[m]]
    for m in rows:
        if "compiled" in m:
            rows[m]["mem_note"] = "not measured (compile in a child process)"
    runs: dict[str, list[dict]] = {m: [] for m in todo}
    for rep in range(1 if inprocess else args.memory_repeats):
        for m in todo:
            mem = memory.cuda_inprocess(METHODS[m][2], pr, v, obj) if inprocess else _memory(args, name, m)
            runs[m].append(mem)
            print(
                f"  memory {rep + 1} {m:40s} {mem.get('peak_rss_mb')} MB {mem.get('error', '')}", flush=True
            )
    for m, mems in runs.items():
        row = rows[m]
        for key, out in (("peak_rss_mb", "peak_mb"), ("peak_cuda_mb", "peak_cuda_mb")):
            vals = [x[key] for x in mems if x.get(key) is not None and "error" not in x]
            if vals:
                row[out] = statistics.median(vals)
                row[out + "_runs"] = vals
        errors = [x["error"] for x in mems if "error" in x]
        if errors:
            row.setdefault("error", errors[0])
        row["mem_how"] = mems[0].get("how")


def _compiled_vs_eager_float64(args, name: str, methods: list[str]) -> dict[str, float]:
    """The compiled operators rebuilt in float64 on the same model and data, against their eager
    operator: is the compiled product the same function (float32 differences are rounding)?"""
    pr, v, obj = _setup(argparse.Namespace(**{**vars(args), "dtype": "float64"}), name)
    out = {}
    for m in methods:
        try:
            product, info = METHODS[m][2](pr, v, obj)
            got, want = product().detach(), (info["eager"] @ v).detach()
            out[m] = float((got - want).norm() / want.norm())
        except Exception as err:  # noqa: BLE001 - reported as missing
            print(f"  float64 check of {m} failed: {_short(err)}", flush=True)
    return out


# ------------------------------------------------------------------------------------ one model
def bench_model(args, name: str) -> tuple[list[dict], dict]:
    pr, v, obj = _setup(args, name)
    p = obj.num_params
    print(f"\n## {name}: {pr.info['arch']}, {p:,} parameters, batch {pr.info['batch_size']}", flush=True)
    rows: dict[str, dict] = {}
    fns: dict[str, Any] = {}
    results: dict[str, torch.Tensor] = {}
    infos: dict[str, dict] = {}
    for m in _selected(args):
        kind, lib, build = METHODS[m]
        row = {"model": name, "params": p, "product": kind, "method": m, "library": lib}
        module = PEER_MODULES.get(lib)
        if module is not None and not _installed(module):
            row["skipped"] = f"peer package {module!r} not installed ({INSTALL_HINT})"
            rows[m] = row
            print(f"  skipped {m:38s} {row['skipped']}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            product, info = build(pr, v, obj)
            row["build_s"] = time.perf_counter() - t0
            results[m] = product().detach()
            sync(args.device)
            fns[m] = product
            infos[m] = info
            row.update({k: val for k, val in info.items() if k in ("compile_s", "note")})
        except Exception as err:  # noqa: BLE001 - a method that fails is a result
            row["error"] = _short(err)
        rows[m] = row
        print(f"  built {m:40s} {row.get('build_s', 0):7.2f}s {row.get('error', '')}", flush=True)
    times: dict[str, list[float]] = {m: [] for m in fns}
    for r in range(args.repeats):
        for m, fn in fns.items():
            sync(args.device)
            t0 = time.perf_counter()
            fn()
            sync(args.device)
            times[m].append(time.perf_counter() - t0)
        print(f"  round {r + 1}/{args.repeats} done", flush=True)
    for m, ts in times.items():
        rows[m]["ms"] = 1e3 * statistics.median(ts)
        rows[m]["ms_runs"] = [1e3 * t for t in ts]
    # correctness: every product against landscape's
    for m, row in rows.items():
        ref = REFERENCE.get(row["product"])
        if ref is None or m not in results or ref not in results:
            continue
        a, b = results[m].to(torch.float64), results[ref].to(torch.float64)
        row["rel_err"] = float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float((a - b).norm())
    for m, row in rows.items():  # compiled products against their own eager operator
        eager = infos.get(m, {}).get("eager")
        if eager is not None and m in results:
            want = (eager @ v).detach().to(torch.float64)
            row["rel_err_eager"] = float((results[m].to(torch.float64) - want).norm() / want.norm())
    infos.clear()
    if any("compiled" in m and m in results for m in rows) and args.dtype != "float64":
        for m, rel in _compiled_vs_eager_float64(args, name, [m for m in rows if "compiled" in m]).items():
            rows[m]["rel_err_eager_float64"] = rel
    inprocess = args.memory and torch.device(args.device).type == "cuda" and args.cuda_memory == "inprocess"
    if inprocess:
        fns.clear()  # free every built operator before measuring one at a time
    if args.memory:
        _measure_memory(args, name, rows, pr, v, obj, inprocess)
    _ratios(list(rows.values()))
    spectra, reference = ([], {})
    missing = [m for m in PEER_MODULES.values() if not _installed(m)]
    if args.spectra and missing:
        print(f"  spectra skipped: peer package(s) {missing} not installed ({INSTALL_HINT})")
        reference = {"skipped": f"missing peers: {', '.join(missing)}"}
    elif args.spectra:
        budgets = {"eig1": args.eig1, "eig5": args.eig5, "trace": args.trace_budget}
        spectra, reference = peers.spectra(
            pr, obj, budgets=budgets, ref_matvecs=args.ref_matvecs, seed=args.seed
        )
        for s in spectra:
            s["model"] = name
    return list(rows.values()), {
        "problem": {"name": name, "params": p, **pr.info},
        "spectra": spectra,
        "spectra_reference": reference,
    }


def _ratios(rows: list[dict]) -> None:
    grad = next((r for r in rows if r["product"] == "gradient"), {})
    for r in rows:
        same = [q for q in rows if q["product"] == r["product"] and q["library"] in PEERS]
        for key, out_grad, out_peer in (
            ("ms", "x_gradient", "x_best_peer"),
            ("peak_mb", "mem_x_gradient", "mem_x_best_peer"),
            ("peak_cuda_mb", "cuda_mem_x_gradient", "cuda_mem_x_best_peer"),
        ):
            if r.get(key) is None:
                continue
            if grad.get(key):
                r[out_grad] = r[key] / grad[key]
            best = [q[key] for q in same if q.get(key) is not None and "error" not in q]
            if best and min(best) > 0:
                r[out_peer] = r[key] / min(best)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules
        return False


# ------------------------------------------------------------------------------------ main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny models, for a smoke run")
    ap.add_argument("--models", default=None, help=f"comma-separated subset of {','.join(MODELS)}")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (median)")
    ap.add_argument("--batch-size", type=int, default=None, help="override every model's batch size")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="skip compile_operator rows")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory processes")
    ap.add_argument("--no-spectra", dest="spectra", action="store_false", help="skip eigenvalues/trace")
    ap.add_argument("--memory-timeout", type=float, default=1800.0)
    ap.add_argument("--memory-repeats", type=int, default=3, help="memory processes per method (median)")
    ap.add_argument(
        "--cuda-memory",
        choices=["process", "inprocess"],
        default="inprocess",
        help="on CUDA: max_memory_allocated in this process (default) or child processes",
    )
    ap.add_argument("--methods", default=None, help="comma-separated substrings selecting methods")
    ap.add_argument(
        "--eig1", type=int, default=None, help="matvec budget for the top eigenvalue (20; quick 10)"
    )
    ap.add_argument(
        "--eig5", type=int, default=None, help="matvec budget for the top-5 eigenvalues (50; quick 20)"
    )
    ap.add_argument(
        "--trace-budget", type=int, default=None, help="matvec budget for the trace (40; quick 10)"
    )
    ap.add_argument(
        "--ref-matvecs", type=int, default=None, help="matvecs of the reference runs (400; quick 100)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS_DIR)
    ap.add_argument("--name", default=None, help="result file name (default products_<device>[_quick])")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:  # tiny budgets for a smoke run, unless given
        for key, small in (("eig1", 10), ("eig5", 20), ("trace_budget", 10), ("ref_matvecs", 100)):
            if getattr(args, key) is None:
                setattr(args, key, small)
    for key, full in (("eig1", 20), ("eig5", 50), ("trace_budget", 40), ("ref_matvecs", 400)):
        if getattr(args, key) is None:
            setattr(args, key, full)
    args.models = [m.strip() for m in (args.models or ",".join(MODELS)).split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {','.join(MODELS)}")
    if args.repeats < 1 or args.memory_repeats < 1:
        ap.error("--repeats and --memory-repeats must be >= 1")
    if args.one is not None and (args.one not in METHODS or len(args.models) != 1):
        ap.error(f"--one takes one of {list(METHODS)} and exactly one --models entry")
    return args


def _markdown(rows: list[dict]) -> str:
    cols = [
        "model",
        "product",
        "method",
        "ms",
        "x_gradient",
        "x_best_peer",
        "rel_err",
        "rel_err_eager",
        "rel_err_eager_float64",
        "peak_mb",
        "mem_x_best_peer",
        "compile_s",
        "error",
        "skipped",
    ]
    if any("peak_cuda_mb" in r for r in rows):
        cols[8:8] = ["peak_cuda_mb", "cuda_mem_x_best_peer"]
    body = format_table(rows, [c for c in cols if any(c in r for r in rows)])
    lines = body.splitlines()
    return "\n".join("| " + ln + " |" for ln in lines)


def main(argv: list[str] | None = None) -> Path | None:
    args = parse(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        if args.one is not None:
            _one(args)
            return None
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args) -> Path:
    rows: list[dict] = []
    problems, spectra, references = [], [], {}
    for name in args.models:
        r, extra = bench_model(args, name)
        rows += r
        problems.append(extra["problem"])
        spectra += extra["spectra"]
        references[name] = extra["spectra_reference"]
    machine = machine_info()
    machine["loadavg_1_5_15"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    name = args.name or f"products_{torch.device(args.device).type}{'_quick' if args.quick else ''}"
    payload = {
        "benchmark": name,
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "one"},
        "problems": problems,
        "rows": rows,
        "spectra": spectra,
        "spectra_reference": references,
    }
    payload["summary"] = _summary.summarize(rows)
    print("\n" + _markdown(rows))
    print("\n" + _summary.markdown(payload["summary"]))
    if spectra:
        print(
            "\n"
            + "\n".join(
                "| " + ln + " |"
                for ln in format_table(
                    spectra, ["model", "task", "method", "budget", "matvecs", "seconds", "rel_error", "error"]
                ).splitlines()
            )
        )
    path = atomic_write_json(args.out / f"{name}.json", payload)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    main()
