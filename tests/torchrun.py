"""``torchrun`` for the data-parallel tests: two gloo ranks of ``python -m experiments run``.

gloo occasionally aborts a rank while the process exits, after the run has finished and written
its results ("terminate called without an active exception", exit -6, more often on a loaded
machine). Only that teardown abort is retried, once: the runner resumes the run directory, so the
second launch finds the runs complete; any other failure is reported as it is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun_experiments(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "experiments", *args]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0 and TEARDOWN_ABORT in proc.stderr:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    return proc
