"""Shared benchmark runner: timing, machine description, a printed table and a JSON file.

A benchmark builds a list of row dicts (one per method/configuration, with the anchor in the same
run) and calls :func:`report`, which adds ratio columns against a named baseline row, prints a
fixed-width table and writes ``benchmarks/results/<name>.json`` atomically together with the
machine, torch version and the time of the run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from landscape.io import atomic_write_json  # noqa: E402

RESULTS_DIR = ROOT / "results"


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def sync(device: str | torch.device | None = None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], repeat: int = 5, warmup: int = 1, device=None) -> dict[str, float]:
    """Median/min wall time of ``fn()`` over ``repeat`` runs after ``warmup`` untimed runs."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeat": repeat}


def add_ratios(
    rows: list[dict[str, Any]],
    key: str,
    baseline: Callable[[dict], bool],
    group: str | None = None,
    name: str | None = None,
) -> None:
    """Add ``<name or key>_ratio`` = row[key] / baseline_row[key], per ``group`` value if given."""
    col = name or f"{key}_ratio"
    groups: dict[Any, list[dict]] = {}
    for r in rows:
        groups.setdefault(r.get(group) if group else None, []).append(r)
    for members in groups.values():
        base = [r for r in members if baseline(r)]
        if not base or not base[0].get(key):
            continue
        for r in members:
            if r.get(key) is not None:
                r[col] = r[key] / base[0][key]


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    columns = list(columns or dict.fromkeys(k for r in rows for k in r))

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if (abs(v) < 1e-3 or abs(v) >= 1e4) and v != 0 else f"{v:.4g}"
        return "" if v is None else str(v)

    cells = [[fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = " | ".join(c.ljust(w) for c, w in zip(columns, widths))
    sep = "-|-".join("-" * w for w in widths)
    body = "\n".join(" | ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells)
    return f"{line}\n{sep}\n{body}"


def report(
    name: str,
    rows: list[dict[str, Any]],
    config: dict[str, Any] | None = None,
    columns: Sequence[str] | None = None,
    out_dir: Path | None = None,
) -> Path:
    """Print the table and write ``<out_dir>/<name>.json`` with machine info and configuration."""
    print(f"\n== {name} ==")
    print(format_table(rows, columns))
    payload = {
        "benchmark": name,
        "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "config": config or {},
        "rows": rows,
    }
    path = (out_dir or RESULTS_DIR) / f"{name}.json"
    atomic_write_json(path, payload)
    print(f"wrote {path}")
    return path


def base_argparser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for the JSON result")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    return p
