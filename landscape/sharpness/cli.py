"""``python -m landscape sharpness ...``: a sharpness report of a model on a data set."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from landscape.sharpness.api import _FUNCTIONS, MEASURES
from landscape.sharpness.report import sharpness_report


# --------------------------------------------------------------------------------------------
# command line: python -m landscape sharpness ...
# --------------------------------------------------------------------------------------------
def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"inf": math.inf, "none": None}.get(text.lower(), text)


def _parse_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, value = item.partition("=")
        measure, dot, name = key.partition(".")
        if not eq or not dot or not name:
            raise ValueError(f"--set expects MEASURE.OPTION=VALUE (e.g. worst_case.rho=0.1), got {item!r}")
        out.setdefault(measure, {})[name] = _parse_value(value)
    return out


def _load_model(spec: str, state_dict: str | None) -> torch.nn.Module:
    import importlib

    module_name, colon, fn_name = spec.partition(":")
    if not colon or not module_name or not fn_name:
        raise ValueError(f"--model expects module:function (a factory returning an nn.Module), got {spec!r}")
    factory = getattr(importlib.import_module(module_name), fn_name, None)
    if factory is None:
        raise ValueError(f"module {module_name!r} has no attribute {fn_name!r}")
    model = factory()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{spec} returned {type(model).__name__}, not an nn.Module")
    if state_dict:
        model.load_state_dict(torch.load(state_dict, map_location="cpu", weights_only=True))
    return model


def _load_data(spec: str, split: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``digits``, ``digits:test`` (split shorthand), ``digits-image``, ``mnist:DIR``, ... through
    :func:`landscape.data.load_dataset`."""
    from landscape.data import load_dataset

    name, _, rest = spec.partition(":")
    if name.lower() in ("digits", "digits-image") and rest in ("train", "test", "all"):
        if split is not None and split != rest:
            raise ValueError(f"--data {spec} and --split {split} disagree; give the split once")
        spec, split = name, rest
    return load_dataset(spec, split or "train")


_LOSSES = {
    "cross_entropy": lambda: torch.nn.CrossEntropyLoss(),
    "mse": lambda: torch.nn.MSELoss(),
    "bce_with_logits": lambda: torch.nn.BCEWithLogitsLoss(),
}


def _run_cli(args: argparse.Namespace) -> int:
    from landscape.objective import Objective

    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    bad = [m for m in measures if m not in _FUNCTIONS]
    if bad:
        raise SystemExit(f"unknown measure(s) {bad}; available: {', '.join(MEASURES)}")
    options = _parse_options(args.set or [])
    stray = sorted(set(options) - set(measures))
    if stray:
        raise SystemExit(f"--set names measure(s) {stray} that are not in --measures")
    model = _load_model(args.model, args.state_dict)
    x, y = _load_data(args.data, args.split)
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    data = [
        (x[i : i + args.batch_size], y[i : i + args.batch_size]) for i in range(0, len(y), args.batch_size)
    ]
    obj = Objective(model, _LOSSES[args.loss](), data, mode=args.mode, dtype=dtype, device=args.device)
    report = sharpness_report(obj, [(m, options.get(m, {})) for m in measures], progress=args.progress)
    report.config["cli"] = {k: v for k, v in vars(args).items() if k != "func"}
    print(report)
    if args.out:
        report.to_json(args.out)
    if args.csv:
        report.to_csv(args.csv)
    return 0


def add_cli(subparsers: Any) -> None:
    """Register ``python -m landscape sharpness``."""
    p = subparsers.add_parser(
        "sharpness",
        help="measure the sharpness of a saved model on a data set",
        description=(
            "Measure a saved model: --model module:function builds it, --state-dict loads the "
            "weights, --data picks the data (digits, digits:test, mnist:DIR, ...). Prints the table "
            "and writes JSON (--out) and CSV (--csv)."
        ),
    )
    p.add_argument("--model", required=True, help="module:function returning an nn.Module")
    p.add_argument("--state-dict", default=None, help="a torch.save'd state dict to load")
    p.add_argument("--data", default="digits", help="digits[:train|test|all], digits-image, mnist:DIR, ...")
    p.add_argument("--split", default=None, choices=("train", "test", "all"))
    p.add_argument("--limit", type=int, default=None, help="use only the first N examples")
    p.add_argument("--loss", default="cross_entropy", choices=sorted(_LOSSES))
    p.add_argument("--measures", default="lambda_max,hessian_trace,gradient_norm,worst_case,average_case")
    p.add_argument(
        "--set",
        action="append",
        metavar="MEASURE.OPTION=VALUE",
        help="a measure option, repeatable (values parsed as JSON): --set worst_case.rho=0.1",
    )
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--dtype", default="float64", choices=("float32", "float64"))
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the model's)")
    p.add_argument("--mode", default="eval", choices=("eval", "train"))
    p.add_argument("--out", default=None, help="JSON file (written atomically)")
    p.add_argument("--csv", default=None, help="CSV file (written atomically)")
    p.add_argument("--progress", action="store_true")
    p.set_defaults(func=_run_cli)
