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

Memory: each method runs in its own process (``--one METHOD``): after the model, the data and the
probe are set up and the method's library is imported and torch's autograd / ``torch.func``
machinery has run once on a toy (one-time initialisation is not the method's memory), free heap
is returned to the OS (``malloc_trim``) and the peak RSS is reset (``/proc/self/clear_refs``);
the peak (``VmHWM``) minus the RSS at that moment covers building the method's operator and two
products.  Where ``clear_refs`` is not writable it is ``ru_maxrss`` minus the RSS after setup.

On CUDA the peak is ``torch.cuda.max_memory_allocated`` over building the method and two products,
in this process (``--cuda-memory process`` for child processes).  On a machine shared with other
jobs use ``--threads 1``: with more threads than free cores, torch's thread pool waits on
descheduled workers and timings degrade by an order of magnitude, unevenly across methods.

    python benchmarks/bench_products.py [--quick] [--models resnet20,mlp] [--device cpu|cuda]
        [--dtype float32|float64] [--repeats 5] [--threads 1] [--no-compile] [--no-memory]
        [--no-spectra] [--methods ggn,gradient] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks import _peers as peers  # noqa: E402
from benchmarks._models import MODELS, Problem, make_problem  # noqa: E402
from benchmarks._runner import RESULTS_DIR, format_table, machine_info, sync  # noqa: E402
from landscape.curvature.compiled import compile_operator  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402

PEERS = ("pyhessian", "curvlinops", "eigenthings")
REFERENCE = {
    "hessian": "landscape double_backward",
    "ggn": "landscape ggn forward",
    "ef": "landscape empirical_fisher",
    "mc": "landscape fisher (MC, 1 sample)",
}


# ------------------------------------------------------------------------------------ our methods
def _ours_hessian(engine: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.hessian(obj, engine=engine)
        return (lambda: op @ v), {"object": op}

    return build


def _ours_ggn(jvp: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        op = ls.ggn(obj, jvp=jvp)
        return (lambda: op @ v), {"object": op}

    return build


def _ours_compiled(kind: str):
    def build(pr: Problem, v: torch.Tensor, obj):
        eager = ls.hessian(obj, engine="forward_over_reverse") if kind == "hessian" else ls.ggn(obj)
        op = compile_operator(eager)
        cfg = op.config()
        info = {"object": op, "compile_s": cfg["compile_seconds"]}
        if not cfg["compiled"]:
            info["note"] = f"eager fallback: {cfg['compile_error']}"
        return (lambda: op @ v), info

    return build


def _ours_ef(pr: Problem, v: torch.Tensor, obj):
    op = ls.empirical_fisher(obj)
    return (lambda: op @ v), {"object": op}


def _ours_mc(pr: Problem, v: torch.Tensor, obj):
    op = ls.fisher(obj, samples=1, seed=0)
    return (lambda: op @ v), {"object": op}


def _peer(build):
    return lambda pr, v, obj: build(pr, v)


# name -> (product type, library, builder(problem, v, objective) -> (product, info))
METHODS: dict[str, tuple[str, str, Any]] = {
    "gradient": ("gradient", "torch", _peer(peers.gradient)),
    "landscape auto": ("hessian", "landscape", _ours_hessian("auto")),
    "landscape double_backward": ("hessian", "landscape", _ours_hessian("double_backward")),
    "landscape forward_over_reverse": ("hessian", "landscape", _ours_hessian("forward_over_reverse")),
    "landscape compiled hessian": ("hessian", "landscape", _ours_compiled("hessian")),
    "pyhessian": ("hessian", "pyhessian", _peer(peers.pyhessian)),
    "curvlinops HessianLinearOperator": ("hessian", "curvlinops", _peer(peers.curvlinops("hessian"))),
    "eigenthings HessianOperator": ("hessian", "eigenthings", _peer(peers.eigenthings("hessian"))),
    "landscape ggn forward": ("ggn", "landscape", _ours_ggn("forward")),
    "landscape ggn linearize": ("ggn", "landscape", _ours_ggn("linearize")),
    "landscape compiled ggn": ("ggn", "landscape", _ours_compiled("ggn")),
    "floor jvp+H+cached vjp": ("ggn", "floor", _peer(peers.ggn_floor)),
    "curvlinops GGNLinearOperator": ("ggn", "curvlinops", _peer(peers.curvlinops("ggn"))),
    "eigenthings GGNOperator": ("ggn", "eigenthings", _peer(peers.eigenthings("ggn"))),
    "landscape empirical_fisher": ("ef", "landscape", _ours_ef),
    "curvlinops EFLinearOperator": ("ef", "curvlinops", _peer(peers.curvlinops("ef"))),
    "eigenthings EmpiricalFisherOperator": ("ef", "eigenthings", _peer(peers.eigenthings("ef"))),
    "landscape fisher (MC, 1 sample)": ("mc", "landscape", _ours_mc),
    "curvlinops FisherMCLinearOperator": ("mc", "curvlinops", _peer(peers.curvlinops("mc", seed=0))),
}


def _short(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


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


def _cuda_memory_inprocess(args, pr: Problem, v: torch.Tensor, obj, method: str) -> dict[str, Any]:
    """``torch.cuda.max_memory_allocated`` over building ``method`` and two products, minus the
    allocation before (exact for the caching allocator; nothing else of the run is alive then)."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out: dict[str, Any] = {"how": "torch.cuda.max_memory_allocated - allocated before (same process)"}
    try:
        product, info = METHODS[method][2](pr, v, obj)
        product()
        product()
        torch.cuda.synchronize()
        del product, info
    except Exception as err:  # noqa: BLE001
        out["error"] = _short(err)
    out["peak_cuda_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out


# ------------------------------------------------------------------------------------ memory
def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _warm_machinery(lib: str) -> None:
    """Import the method's library and run autograd, double backward and torch.func once on a toy,
    so that one-time initialisation (imports, thread pools, kernel registries) is not counted."""
    import importlib

    for mod in {
        "pyhessian": ["pyhessian"],
        "curvlinops": ["curvlinops"],
        "eigenthings": ["hessian_eigenthings"],
    }.get(lib, []):
        importlib.import_module(mod)
    w = torch.ones(3, requires_grad=True)
    (g,) = torch.autograd.grad((w**3).sum(), w, create_graph=True)
    torch.autograd.grad(g.sum(), w)
    f = torch.func.grad(lambda t: (t**3).sum())
    torch.func.vmap(lambda u: torch.func.jvp(f, (w.detach(),), (u,))[1])(torch.eye(3))


def _one(args) -> None:
    """Child process: peak memory of one method (prints one JSON line)."""
    import ctypes
    import resource

    (name,) = args.models
    pr, v, obj = _setup(args, name)
    _, lib, build = METHODS[args.one]
    _warm_machinery(lib)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    base_kb = _status_kb("VmRSS") or 0
    try:
        Path("/proc/self/clear_refs").write_text("5")
        how = "VmHWM - VmRSS after setup (peak reset via /proc/self/clear_refs)"
    except OSError:
        how = "ru_maxrss - VmRSS after setup (peak not resettable: includes setup peaks)"
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    out: dict[str, Any] = {"method": args.one, "how": how}
    try:
        product, _ = build(pr, v, obj)
        product()
        product()
        sync(args.device)
    except Exception as err:  # noqa: BLE001 - report, do not crash the parent
        out["error"] = _short(err)
    peak_kb = (
        _status_kb("VmHWM") if "clear_refs" in how else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    )
    out["peak_rss_mb"] = max(0, (peak_kb or 0) - base_kb) / 1024
    if cuda:
        out["peak_cuda_mb"] = (torch.cuda.max_memory_allocated() - cuda_base) / 2**20
    print("RESULT_JSON " + json.dumps(out))


def _memory(args, name: str, method: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--one",
        method,
        "--models",
        name,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
        "--threads",
        str(torch.get_num_threads()),
    ]
    if args.quick:
        cmd.append("--quick")
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.memory_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"memory run timed out after {args.memory_timeout} s"}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            return json.loads(line[len("RESULT_JSON ") :])
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"memory run failed: {tail[0][:200]}"}


# ------------------------------------------------------------------------------------ one model
def bench_model(args, name: str) -> tuple[list[dict], dict]:
    pr, v, obj = _setup(args, name)
    p = obj.num_params
    print(f"\n## {name}: {pr.info['arch']}, {p:,} parameters, batch {pr.info['batch_size']}", flush=True)
    rows: dict[str, dict] = {}
    fns: dict[str, Any] = {}
    results: dict[str, torch.Tensor] = {}
    for m in _selected(args):
        kind, lib, build = METHODS[m]
        row = {"model": name, "params": p, "product": kind, "method": m, "library": lib}
        t0 = time.perf_counter()
        try:
            product, info = build(pr, v, obj)
            row["build_s"] = time.perf_counter() - t0
            results[m] = product().detach()
            sync(args.device)
            fns[m] = product
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
    # correctness: every product against landscape's
    for m, row in rows.items():
        ref = REFERENCE.get(row["product"])
        if ref is None or m not in results or ref not in results:
            continue
        a, b = results[m].to(torch.float64), results[ref].to(torch.float64)
        row["rel_err"] = float((a - b).norm() / b.norm()) if float(b.norm()) > 0 else float((a - b).norm())
    inprocess = args.memory and torch.device(args.device).type == "cuda" and args.cuda_memory == "inprocess"
    if inprocess:
        fns.clear()  # free every built operator before measuring one at a time
    if args.memory:
        for m, row in rows.items():
            if "compiled" in m:
                row["mem_note"] = "not measured (compile in a child process)"
                continue
            mem = _cuda_memory_inprocess(args, pr, v, obj, m) if inprocess else _memory(args, name, m)
            row["peak_mb"] = mem.get("peak_rss_mb")
            if "peak_cuda_mb" in mem:
                row["peak_cuda_mb"] = mem["peak_cuda_mb"]
            if "error" in mem:
                row.setdefault("error", mem["error"])
            row["mem_how"] = mem.get("how")
            print(f"  memory {m:40s} {row.get('peak_mb')} MB {mem.get('error', '')}", flush=True)
    _ratios(list(rows.values()))
    spectra, reference = ([], {})
    if args.spectra:
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
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
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
        "peak_mb",
        "mem_x_best_peer",
        "compile_s",
        "error",
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
    print("\n" + _markdown(rows))
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
