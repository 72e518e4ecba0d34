"""Per-epoch logs of a run: ``log.jsonl`` and ``log.csv`` (rewritten atomically from the history
after every epoch, so they always match the last checkpoint) and TensorBoard event files when
``torch.utils.tensorboard`` and the ``tensorboard`` package are importable."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from landscape.io import atomic_write_text, to_jsonable

__all__ = ["EpochLogger"]


def _columns(history: list[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for row in history:
        for k in row:
            if k not in cols:
                cols.append(k)
    return cols


class EpochLogger:
    """Writes the history of a run; ``tensorboard=False`` (or a missing package) skips event files."""

    def __init__(self, run_dir: Path, *, tensorboard: bool = True, start_epoch: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.writer = None
        if tensorboard:
            try:
                import tensorboard  # noqa: F401
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                pass
            else:  # purge_step drops events of epochs that are redone after a resume
                self.writer = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=start_epoch + 1)

    def write(self, history: list[dict[str, Any]]) -> None:
        rows = to_jsonable(history)
        atomic_write_text(self.run_dir / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=_columns(rows), lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})
        atomic_write_text(self.run_dir / "log.csv", buf.getvalue())
        if self.writer is not None and rows:
            last = rows[-1]
            for k, v in last.items():
                if (
                    k != "epoch"
                    and isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and math.isfinite(v)
                ):
                    self.writer.add_scalar(k, v, last["epoch"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
