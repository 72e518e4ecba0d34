"""``python -m landscape surface ...``: the loss surface of a saved model on a data set.

The output ``--out`` is locked (``OUT.lock``) while a run writes it, and only ever replaced by a
complete surface (atomically): an existing ``--out`` survives a run that fails or is stopped.
Ctrl-C and SIGTERM save the points finished so far in ``OUT.partial`` beside it (with a completion
mask; :func:`landscape.surface.surface` saves its ``checkpoint`` file on ``KeyboardInterrupt``), and
``--resume`` continues from there (or from ``--out`` itself); a run that completes writes ``--out``
and removes ``OUT.partial``. The figure and exports (``--plot``, ``--html``, ``--vtk``) are written
atomically too.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["Surface", "surface", "add_cli"]


from landscape.cli_common import (
    DATA_HELP,
    CliError,
    OneOrTwo,
    Terminated,
    UsageError,
    add_debug_option,
    check_device,
    check_figure,
    check_outputs,
    check_path,
    finite_float,
    load_data,
    nonnegative_int,
    output_lock,
    positive_int,
)
from landscape.cli_models import add_model_options, load_model, parse_model_args
from landscape.io import atomic_savefig
from landscape.objective import Objective
from landscape.surface.grid import _BN_POLICIES, _STRATEGIES, surface
from landscape.surface.result import Surface, load_surface


def _check_args(args: argparse.Namespace) -> None:
    """Cross-option checks argparse cannot express; all are usage errors (status 2)."""
    if args.dims == 1 and len(args.grid) == 2:
        raise UsageError("--grid NX NY gives two axes but --dims is 1", "write --grid N, or --dims 2")
    if args.dims == 1 and args.yrange is not None:
        raise UsageError("--yrange needs a second axis but --dims is 1", "drop --yrange, or use --dims 2")
    for option, lo_hi in (("--range", args.range), ("--yrange", args.yrange)):
        if lo_hi is not None and not lo_hi[0] < lo_hi[1]:
            raise UsageError(
                f"{option} {lo_hi[0]:g} {lo_hi[1]:g} is empty or reversed",
                f"write {option} LO HI with LO < HI",
            )
    check_figure(args.plot, "--plot")
    for option in ("out", "html", "vtk"):
        check_path(getattr(args, option), f"--{option}")
    outputs = {f"--{option}": getattr(args, option) for option in ("out", "html", "vtk", "plot")}
    check_outputs(outputs, [("--state-dict", args.state_dict)] if args.state_dict else [])
    check_device(args.device)


def partial_path(out: str | os.PathLike) -> Path:
    """``OUT.partial``: where an unfinished run of ``--out OUT`` keeps its progress (``--out`` itself
    is only ever replaced by a complete surface)."""
    return Path(f"{os.fspath(out)}.partial")


def _stamp(path: Path) -> tuple[int, int] | None:
    """``(inode, mtime in ns)`` of ``path`` (``None`` if missing): a file saved anew differs."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _interrupted(exc: KeyboardInterrupt, out: str, total: int, before: tuple[int, int] | None) -> CliError:
    """The error of a run stopped by Ctrl-C / SIGTERM, counting the points this run saved in
    ``OUT.partial`` (``before``: its :func:`_stamp` when the run began; a leftover is not counted)."""
    how = "terminated by SIGTERM" if isinstance(exc, Terminated) else "interrupted (Ctrl-C)"
    status = 143 if isinstance(exc, Terminated) else 130
    partial, done = partial_path(out), 0
    if partial.exists() and _stamp(partial) != before:
        try:
            done = int(np.count_nonzero(load_surface(partial).mask))
        except Exception:  # noqa: BLE001 - an unreadable leftover counts as nothing saved
            done = 0
    kept = f"; {out} is unchanged" if Path(out).exists() else ""
    if done:
        return CliError(
            f"{how}; {done} of {total} grid points are saved in {partial}{kept}",
            "run the same command with --resume to compute the rest",
            status,
        )
    return CliError(
        f"{how} before any grid point was finished; nothing saved{kept}", "run the command again", status
    )


def _run_cli(args: argparse.Namespace) -> int:
    import contextlib

    import torch.distributed as dist

    from landscape import directions as dmod
    from landscape.data import batches

    _check_args(args)
    model_args = parse_model_args(args.model_arg, args.model_kwargs)
    started_dist = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="gloo")
        started_dist = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        lock = output_lock(args.out, force=args.force) if rank == 0 else contextlib.nullcontext()
        with lock:
            dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
            model, model_args = load_model(args.model, model_args, args.state_dict)
            model = model.to(dtype)
            x, y = load_data(args.data, args.split, args.limit, default_split="all")
            data = batches(x.to(dtype), y, args.batch_size)
            obj = Objective(model, nn.CrossEntropyLoss(), data, device=args.device)
            nx, ny = args.grid[0], args.grid[-1]
            xr = args.range
            yr = args.yrange or args.range
            d1 = dmod.random(obj, args.normalization, seed=args.seed)
            dirs, coords = [d1], [np.linspace(xr[0], xr[1], nx)]
            if args.dims == 2:
                dirs.append(dmod.random(obj, args.normalization, seed=args.seed + 1))
                coords.append(np.linspace(yr[0], yr[1], ny))
            # the progress goes to OUT.partial (one process: every minute and on Ctrl-C / SIGTERM),
            # never to --out, which keeps the previous complete surface until the new one is done;
            # --resume continues OUT.partial, else --out; a fresh run reads neither
            partial = partial_path(args.out)
            before = _stamp(partial)
            resume = None
            if args.resume:
                resume = next((p for p in (partial, Path(args.out)) if p.exists()), None)
            try:
                s = surface(
                    obj,
                    dirs,
                    coords,
                    bn_policy=args.bn_policy,
                    strategy=args.strategy,
                    progress=not args.quiet and rank == 0,
                    resume=resume,
                    checkpoint=partial,
                    data_info={
                        "spec": args.data,
                        "split": args.split,
                        "limit": args.limit,
                        "batch_size": args.batch_size,
                    },
                )
            except KeyboardInterrupt as exc:
                total = int(np.prod([len(c) for c in coords]))
                raise _interrupted(exc, args.out, total, before) from None
            if rank == 0:
                s.config["state_dict"] = str(args.state_dict) if args.state_dict else None
                s.config["model_spec"] = args.model
                s.config["model_args"] = model_args
                s.save(args.out)
                partial.unlink(missing_ok=True)  # superseded by the complete surface
                print(f"wrote {args.out}: {s!r}")
                print(f"loss min {np.nanmin(s.loss):.6g} max {np.nanmax(s.loss):.6g}; {s.seconds:.3g} s")
                _exports(s, args)
    finally:
        if started_dist:
            dist.destroy_process_group()
    return 0


def _exports(s: Surface, args: argparse.Namespace) -> None:
    if args.html:
        s.to_html(args.html, include_plotlyjs=True)  # Plotly embedded: the file works offline
        print(f"wrote {args.html}")
    if args.vtk:
        s.to_vtk(args.vtk)
        print(f"wrote {args.vtk}")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        ax = s.plot()
        atomic_savefig(args.plot, ax.figure, dpi=120, bbox_inches="tight")
        print(f"wrote {args.plot}")


def add_cli(subparsers: Any) -> None:
    """Register ``python -m landscape surface``."""
    p = subparsers.add_parser(
        "surface",
        help="loss surface of a saved model along random filter-normalised directions",
        description=(
            "Evaluate a 1-D/2-D loss surface of a model on a data set and write a self-describing .npz. "
            "An existing --out is replaced only by a complete surface. Ctrl-C or SIGTERM keep the finished "
            "points in OUT.partial; --resume continues. Under torchrun "
            "the grid points are split across the ranks (gloo) and gathered. Errors end in one "
            "'error:' line (exit status 2 for usage, 1 otherwise); --debug shows the traceback."
        ),
    )
    add_model_options(p)
    p.add_argument(
        "--data",
        default="digits",
        help=DATA_HELP,
    )
    p.add_argument("--split", default=None, choices=("train", "test", "all"), help="default: all")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N examples")
    p.add_argument(
        "--batch-size", type=positive_int, default=2048, help="examples per forward pass (default: 2048)"
    )
    p.add_argument(
        "--grid", type=positive_int, nargs="+", action=OneOrTwo, default=[51], metavar="N",
        help="points per axis: N, or NX NY (default: 51)",
    )  # fmt: skip
    p.add_argument(
        "--range",
        type=finite_float,
        nargs=2,
        default=[-1.0, 1.0],
        metavar=("LO", "HI"),
        help="coordinates along direction 1, in units of the normalised direction (default: -1 1)",
    )
    p.add_argument(
        "--yrange",
        type=finite_float,
        nargs=2,
        default=None,
        metavar=("LO", "HI"),
        help="coordinates along direction 2 (default: --range)",
    )
    p.add_argument("--dims", type=int, choices=(1, 2), default=2, help="1-D line or 2-D plane (default: 2)")
    p.add_argument(
        "--normalization",
        default="filter",
        choices=("filter", "layer", "weight", "model"),
        help="how the random directions are scaled to the weights (default: filter, Li et al. 2018)",
    )
    p.add_argument(
        "--seed", type=nonnegative_int, default=0, help="seed of direction 1 (direction 2 uses seed+1)"
    )
    p.add_argument(
        "--bn-policy",
        default=None,
        choices=_BN_POLICIES,
        help="BatchNorm statistics at each point: eval (the stored running statistics), train (batch "
        "statistics) or recompute (re-estimated on the data at every point) (default: eval)",
    )
    p.add_argument(
        "--strategy",
        default="auto",
        choices=_STRATEGIES,
        help="how the points are evaluated; every strategy gives the same numbers (default: auto, "
        "the fastest that applies)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "float64"),
        help="precision of the model (default: float32)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the model's)")
    p.add_argument(
        "--out",
        required=True,
        help="output .npz, replaced only by a complete surface (an interrupted run keeps its points "
        "in OUT.partial)",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the points of OUT.partial (or of a partial --out)"
    )
    p.add_argument("--force", action="store_true", help="write --out even if another run holds OUT.lock")
    p.add_argument("--plot", default=None, help="also write a matplotlib figure (png/pdf)")
    p.add_argument(
        "--html", default=None, help="also write a Plotly HTML file (plotly.js embedded, works offline)"
    )
    p.add_argument("--vtk", default=None, help="also write a legacy VTK file for ParaView")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_debug_option(p)
    p.set_defaults(func=_run_cli)
