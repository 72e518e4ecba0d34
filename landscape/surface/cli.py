"""``python -m landscape surface ...``: the loss surface of a saved model on a data set."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = ["Surface", "surface", "add_cli"]


from landscape.surface.grid import _BN_POLICIES, _STRATEGIES, surface
from landscape.surface.result import Surface


def _build_model(spec: str, kwargs: dict[str, Any]) -> nn.Module:
    import importlib

    from landscape.models import available_models, model_factory

    if ":" in spec:
        mod_name, _, fn_name = spec.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as exc:
            raise ValueError(f"--model {spec}: cannot import module {mod_name!r} ({exc})") from exc
        fn = getattr(mod, fn_name, None)
        if fn is None:
            raise ValueError(f"--model {spec}: module {mod_name!r} has no attribute {fn_name!r}")
        model = fn(**kwargs)
    elif spec in available_models():
        model = model_factory(spec, **kwargs)
    else:
        raise ValueError(f"--model must be module:function or one of {available_models()}, got {spec!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"--model {spec} returned {type(model).__name__}, not an nn.Module")
    return model


def _run_cli(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    from landscape import directions as dmod
    from landscape.data import batches, load_dataset
    from landscape.objective import Objective

    started_dist = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend="gloo")
        started_dist = True
    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
        model = _build_model(args.model, json.loads(args.model_kwargs) if args.model_kwargs else {})
        if args.state_dict:
            state = torch.load(args.state_dict, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
                state = state["state_dict"]
            model.load_state_dict(state)
        model = model.to(dtype)
        extra = {"limit": args.limit} if args.limit and not args.data.startswith("digits") else {}
        x, y = load_dataset(args.data, args.split, **extra)
        if args.limit:
            x, y = x[: args.limit], y[: args.limit]
        data = batches(x.to(dtype), y, args.batch_size)
        obj = Objective(model, nn.CrossEntropyLoss(), data, device=args.device)
        n = args.grid
        nx, ny = n[0], n[-1]
        xr = args.range
        yr = args.yrange or args.range
        d1 = dmod.random(obj, args.normalization, seed=args.seed)
        dirs, coords = [d1], [np.linspace(xr[0], xr[1], nx)]
        if args.dims == 2:
            dirs.append(dmod.random(obj, args.normalization, seed=args.seed + 1))
            coords.append(np.linspace(yr[0], yr[1], ny))
        s = surface(
            obj,
            dirs,
            coords,
            bn_policy=args.bn_policy,
            strategy=args.strategy,
            progress=not args.quiet and rank == 0,
            resume=args.out if args.resume else None,
            data_info={
                "spec": args.data,
                "split": args.split,
                "limit": args.limit,
                "batch_size": args.batch_size,
            },
        )
        if rank == 0:
            s.config["state_dict"] = str(args.state_dict) if args.state_dict else None
            s.config["model_spec"] = args.model
            s.save(args.out)
            print(f"wrote {args.out}: {s!r}")
            print(f"loss min {np.nanmin(s.loss):.6g} max {np.nanmax(s.loss):.6g}; {s.seconds:.3g} s")
            if args.html:
                s.to_html(args.html, include_plotlyjs="cdn")
                print(f"wrote {args.html}")
            if args.vtk:
                s.to_vtk(args.vtk)
                print(f"wrote {args.vtk}")
            if args.plot:
                import matplotlib

                matplotlib.use("Agg")
                ax = s.plot()
                ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
                print(f"wrote {args.plot}")
    finally:
        if started_dist:
            dist.destroy_process_group()
    return 0


def add_cli(subparsers: Any) -> None:
    """Register ``python -m landscape surface``."""
    p = subparsers.add_parser(
        "surface",
        help="loss surface of a saved model along random filter-normalised directions",
        description=(
            "Evaluate a 1-D/2-D loss surface of a model on a data set and write a self-describing .npz. "
            "Under torchrun the grid points are split across the ranks (gloo) and gathered."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="module:function returning an nn.Module, or a registered name (mlp, lenet5, resnet, ...)",
    )
    p.add_argument("--model-kwargs", default=None, help="JSON keyword arguments for the model constructor")
    p.add_argument("--state-dict", default=None, help="file saved with torch.save(model.state_dict())")
    p.add_argument(
        "--data", default="digits", help="digits | digits-image | mnist:DIR | fashion-mnist:DIR | cifar10:DIR"
    )
    p.add_argument("--split", default="all", choices=("train", "test", "all"))
    p.add_argument("--limit", type=int, default=None, help="use only the first N examples")
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--grid", type=int, nargs="+", default=[51], help="points per axis (one value, or NX NY)")
    p.add_argument("--range", type=float, nargs=2, default=[-1.0, 1.0], metavar=("LO", "HI"))
    p.add_argument("--yrange", type=float, nargs=2, default=None, metavar=("LO", "HI"))
    p.add_argument("--dims", type=int, choices=(1, 2), default=2)
    p.add_argument("--normalization", default="filter", choices=("filter", "layer", "weight", "model"))
    p.add_argument("--seed", type=int, default=0, help="seed of direction 1 (direction 2 uses seed+1)")
    p.add_argument("--bn-policy", default=None, choices=_BN_POLICIES)
    p.add_argument("--strategy", default="auto", choices=_STRATEGIES)
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the model's)")
    p.add_argument("--out", required=True, help="output .npz")
    p.add_argument("--resume", action="store_true", help="continue a partial --out file")
    p.add_argument("--plot", default=None, help="also write a matplotlib figure (png/pdf)")
    p.add_argument("--html", default=None, help="also write a Plotly HTML file")
    p.add_argument("--vtk", default=None, help="also write a legacy VTK file for ParaView")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_cli)
