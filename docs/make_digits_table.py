"""The README's 8-epoch digits miniature (SGD vs SAM vs bSAM, 3 seeds) as JSON.

    python docs/make_digits_table.py [--out docs/figures] [--runs DIR]   # ~20 s on 2 CPU cores

Runs the README's two commands (``configs/digits_sam_vs_sgd.toml`` with clean labels and with
``name=digits_label_noise_40 data.label_noise=0.4``) into ``--runs`` (default: a temporary
directory, removed afterwards; finished runs there are reused) and writes what
``python -m experiments table RUN_DIR --format json`` gives for each (mean, sample standard
deviation (ddof 1) and per-seed values of every metric, per method) to ``<out>/digits_miniature.json``
under ``settings.clean`` and ``settings.label_noise_40``, without the run directories' paths.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments.table import aggregate, collect_runs  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402

CONFIG = "configs/digits_sam_vs_sgd.toml"
#: setting -> (run name, extra overrides): the README's command and its label-noise variant
SETTINGS = {
    "clean": ("digits_sam_vs_sgd", []),
    "label_noise_40": ("digits_label_noise_40", ["name=digits_label_noise_40", "data.label_noise=0.4"]),
}


def run_setting(runs: Path, overrides: list[str]) -> None:
    cmd = [sys.executable, "-m", "experiments", "run", CONFIG, *overrides, f"out_dir={runs}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def table(run_dir: Path) -> dict[str, Any]:
    """Per method: the aggregate entry of ``experiments table`` (no directory paths)."""
    out = {}
    for e in aggregate(collect_runs([run_dir])):
        out[e["group"]] = {k: v for k, v in e.items() if k not in ("dirs", "group")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/figures", help="directory of digits_miniature.json")
    ap.add_argument("--runs", default=None, help="run directory to keep (default: a temporary one)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(args.runs or tmp).resolve()
        settings = {}
        for key, (name, overrides) in SETTINGS.items():
            run_setting(runs, overrides)
            command = " ".join(["python -m experiments run", CONFIG, *overrides])
            settings[key] = {"command": command, "methods": table(runs / name)}
    payload = {
        "config": CONFIG,
        "note": "mean and sample standard deviation (ddof 1) over the seeds, per method",
        "settings": settings,
        "environment": {"python": platform.python_version(), "platform": platform.platform()},
    }
    out = Path(args.out) / "digits_miniature.json"
    atomic_write_json(out, payload)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
