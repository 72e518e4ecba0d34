"""The README's CPU commands run as written (issue 26): the digits experiment and its table, copied
verbatim from the README's "Experiments" block, in a scratch directory holding the configs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands(prefix: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [ln.split("  #")[0].strip() for block in blocks for ln in block.splitlines()]
    return [ln for ln in lines if ln.startswith(prefix)]


@pytest.mark.slow
def test_digits_experiment_and_table_run_as_written(tmp_path):
    run, table = (
        _readme_commands("python -m experiments run configs/digits_sam_vs_sgd.toml")[0],
        next(c for c in _readme_commands("python -m experiments table runs/digits_sam_vs_sgd")),
    )
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (run, table):
        argv = [sys.executable if a == "python" else a for a in shlex.split(cmd)]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (cmd, done.stderr[-2000:])
    assert (tmp_path / "t.png").stat().st_size > 10_000  # the --plot of the table command
    for method in ("sgd", "sam", "bsam"):
        assert f"| {method}" in done.stdout  # the markdown table lists every method of the config
