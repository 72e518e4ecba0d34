"""``python -m landscape sharpness ...``: a sharpness report of a model on a data set."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

from landscape.cli_common import (
    DATA_HELP,
    UsageError,
    add_debug_option,
    check_device,
    check_outputs,
    check_path,
    load_data,
    positive_int,
)
from landscape.cli_models import add_model_options, load_model, parse_model_args
from landscape.objective import Objective
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
            raise UsageError(
                f"--set expects MEASURE.OPTION=VALUE, got {item!r}", "write e.g. --set worst_case.rho=0.1"
            )
        out.setdefault(measure, {})[name] = _parse_value(value)
    return out


_LOSSES = {
    "cross_entropy": lambda: torch.nn.CrossEntropyLoss(),
    "mse": lambda: torch.nn.MSELoss(),
    "bce_with_logits": lambda: torch.nn.BCEWithLogitsLoss(),
}


def _run_cli(args: argparse.Namespace) -> int:

    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    bad = [m for m in measures if m not in _FUNCTIONS]
    if bad or not measures:
        raise UsageError(
            f"unknown measure(s) {bad}" if bad else "--measures is empty",
            f"choose from {', '.join(MEASURES)} (comma-separated)",
        )
    options = _parse_options(args.set or [])
    stray = sorted(set(options) - set(measures))
    if stray:
        raise UsageError(
            f"--set names measure(s) {stray} that are not in --measures",
            "add them to --measures or drop the --set",
        )
    model_args = parse_model_args(args.model_arg, args.model_kwargs)
    check_device(args.device)
    check_path(args.out, "--out")
    check_path(args.csv, "--csv")
    check_outputs(
        {"--out": args.out, "--csv": args.csv}, [("--state-dict", args.state_dict)] if args.state_dict else []
    )
    model, model_args = load_model(args.model, model_args, args.state_dict)
    x, y = load_data(args.data, args.split, args.limit, default_split="train")
    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    data = [
        (x[i : i + args.batch_size], y[i : i + args.batch_size]) for i in range(0, len(y), args.batch_size)
    ]
    obj = Objective(model, _LOSSES[args.loss](), data, mode=args.mode, dtype=dtype, device=args.device)
    try:
        report = sharpness_report(obj, [(m, options.get(m, {})) for m in measures], progress=args.progress)
    except (TypeError, ValueError) as exc:  # an option or value of --set the measure refuses
        text = str(exc)
        if any(text.startswith(f"{m}: unknown option") for m in options):
            raise UsageError(f"--set: {text}", "set only the options listed") from None
        given = [
            (m, k, v) for m, opts in options.items() for k, v in opts.items() if text.startswith(f"{k} ")
        ]
        if not given:
            raise
        m, k, v = given[0]
        raise UsageError(
            f"--set {m}.{k}={json.dumps(v)}: {text}", f"give {m}.{k} a value it accepts"
        ) from None
    report.config["cli"] = {k: v for k, v in vars(args).items() if k != "func"}
    report.config["model_args"] = model_args
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
            "Measure a saved model: --model (a registered name or module:function) and --model-arg "
            "build it, --state-dict loads the weights, --data picks the data (digits, digits:test, "
            "mnist:DIR, ...). Prints the table and writes JSON (--out) and CSV (--csv). Errors end in "
            "one 'error:' line (exit status 2 for usage, 1 otherwise); --debug shows the traceback."
        ),
    )
    add_model_options(p)
    p.add_argument("--data", default="digits", help=DATA_HELP)
    p.add_argument(
        "--split",
        default=None,
        choices=("train", "test", "all"),
        help="which part of --data (default: train)",
    )
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N examples")
    p.add_argument(
        "--loss",
        default="cross_entropy",
        choices=sorted(_LOSSES),
        help="the loss whose sharpness is measured (default: cross_entropy, mean over the examples)",
    )
    p.add_argument(
        "--measures",
        default="lambda_max,hessian_trace,gradient_norm,worst_case,average_case",
        help=f"comma-separated measures, from: {', '.join(MEASURES)} (default: %(default)s)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="MEASURE.OPTION=VALUE",
        help="a measure option, repeatable (values parsed as JSON): --set worst_case.rho=0.1",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=512,
        help="examples per forward pass; the measures use all of --data (default: 512)",
    )
    p.add_argument(
        "--dtype",
        default="float64",
        choices=("float32", "float64"),
        help="precision of the model (default: float64)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: the model's)")
    p.add_argument(
        "--mode",
        default="eval",
        choices=("eval", "train"),
        help="the model's mode while measuring: eval (BatchNorm running statistics, no dropout) or "
        "train (default: eval)",
    )
    p.add_argument("--out", default=None, help="JSON file (written atomically)")
    p.add_argument("--csv", default=None, help="CSV file (written atomically)")
    p.add_argument("--progress", action="store_true", help="show a progress bar per measure")
    add_debug_option(p)
    p.set_defaults(func=_run_cli)
