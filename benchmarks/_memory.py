"""Peak memory of one curvature product method, for ``bench_products.py``.

CPU: each method runs in its own process (``bench_products.py --one METHOD``).  After the model,
the data and the probe are set up, the method's library is imported and torch's autograd /
``torch.func`` machinery has run once on a toy (one-time initialisation is not the method's
memory), free heap is returned to the OS (``malloc_trim``) and the peak RSS is reset
(``/proc/self/clear_refs``); the peak (``VmHWM``) minus the RSS at that moment covers building the
method's operator and two products.  Where ``clear_refs`` is not writable it is ``ru_maxrss`` minus
the RSS after setup.  The child runs with ``MALLOC_MMAP_THRESHOLD_`` fixed (glibc: blocks from
128 KiB on are mapped and unmapped on free, with no adaptive threshold), so the RSS follows the
live tensors instead of heap that glibc keeps after a free; every method runs alike.  The
measurement is repeated (``--memory-repeats``, interleaved over methods) and the median reported.

CUDA: ``torch.cuda.max_memory_allocated`` over building the method and two products, in the
benchmark's process (``--cuda-memory process`` for child processes).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MMAP_THRESHOLD = 131072  # glibc's default initial threshold, made fixed


def short(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


def status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def warm_machinery(lib: str) -> None:
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
    torch.func.jvp(lambda t: (t**3).sum(), (w.detach(),), (torch.ones(3),))


def child(method: str, lib: str, build: Callable, setup: Callable[[], tuple], device: str) -> None:
    """In the child process: peak memory of one method (prints one ``RESULT_JSON`` line)."""
    pr, v, obj = setup()
    warm_machinery(lib)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    base_kb = status_kb("VmRSS") or 0
    try:
        Path("/proc/self/clear_refs").write_text("5")
        how = "VmHWM - VmRSS after setup (peak reset via /proc/self/clear_refs)"
    except OSError:
        how = "ru_maxrss - VmRSS after setup (peak not resettable: includes setup peaks)"
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        how += f", MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}"
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    out: dict[str, Any] = {"method": method, "how": how}
    try:
        product, _ = build(pr, v, obj)
        product()
        product()
        if cuda:
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 - report, do not crash the parent
        out["error"] = short(err)
    peak_kb = (
        status_kb("VmHWM") if "clear_refs" in how else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    )
    out["peak_rss_mb"] = max(0, (peak_kb or 0) - base_kb) / 1024
    if cuda:
        out["peak_cuda_mb"] = (torch.cuda.max_memory_allocated() - cuda_base) / 2**20
    print("RESULT_JSON " + json.dumps(out))


def in_child(script: Path, argv: list[str], timeout: float) -> dict[str, Any]:
    """Run ``script --one ...`` (``argv``) in a fresh process and return its ``RESULT_JSON``."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    try:
        res = subprocess.run(
            [sys.executable, str(script), *argv], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"memory run timed out after {timeout} s"}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            return json.loads(line[len("RESULT_JSON ") :])
    tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"memory run failed: {tail[0][:200]}"}


def cuda_inprocess(build: Callable, pr, v, obj) -> dict[str, Any]:
    """``torch.cuda.max_memory_allocated`` over building a method and two products, minus the
    allocation before (exact for the caching allocator; nothing else of the run is alive then)."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out: dict[str, Any] = {"how": "torch.cuda.max_memory_allocated - allocated before (same process)"}
    try:
        product, info = build(pr, v, obj)
        product()
        product()
        torch.cuda.synchronize()
        del product, info
    except Exception as err:  # noqa: BLE001
        out["error"] = short(err)
    out["peak_cuda_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return out
