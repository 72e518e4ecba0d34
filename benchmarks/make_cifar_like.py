"""Write a CIFAR-10-shaped data set in the real "python version" pickle format (random images).

The GPU benchmarks and ``python -m experiments run CONFIG --estimate`` read CIFAR-10 from a local
directory (``$SHARPSCAPE_DATA``); a machine without the data set (or without a network) gets files
of the same format, shapes and sizes: ``data_batch_1`` ... ``data_batch_5`` (10,000 images each by
default), ``test_batch`` and ``batches.meta``, each a pickled dict as in the original archive, read
by ``landscape.data.load_cifar10`` through its restricted unpickler.  Timings do not depend on the
pixel values; accuracies on these files mean nothing.

    python benchmarks/make_cifar_like.py OUT_DIR [--per-batch 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import numpy as np

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)
    os.replace(tmp, path)


def write_cifar10_like(out: str | os.PathLike, per_batch: int = 10_000, seed: int = 0) -> Path:
    """Five training batches and one test batch of ``per_batch`` random images each; returns ``out``."""
    if per_batch < 1:
        raise ValueError(f"per_batch must be >= 1, got {per_batch}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        filenames = [f"{name}_{i:05d}.png".encode() for i in range(per_batch)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": filenames}
        _write(out / name, batch)
    meta = {
        b"num_cases_per_batch": per_batch,
        b"label_names": [c.encode() for c in CLASSES],
        b"num_vis": 3072,
    }
    _write(out / "batches.meta", meta)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="directory to write the pickles to")
    ap.add_argument("--per-batch", type=int, default=10_000, help="images per batch file (10000)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        path = write_cifar10_like(args.out, args.per_batch, args.seed)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote 6 CIFAR-10-format batches of {args.per_batch} images to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
