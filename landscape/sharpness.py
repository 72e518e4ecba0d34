"""One API for every sharpness measure of the literature (``specs/sharpness.md``).

::

    r = ls.sharpness(obj, "worst_case", rho=0.05, p=2, adaptive=True, solver="apgd")
    r.value, r.stderr, r.ci(0.95), r.config, r.evaluations, r.seconds, r.extra
    table = ls.sharpness_report(obj, ["lambda_max", ("worst_case", {"rho": 0.1}), "average_case"])
    print(table); table.to_csv("sharpness.csv"); table.to_json("sharpness.json")

Every measure evaluates through the :class:`landscape.Objective` (its data: the whole data set or
one batch; its dtype and device) at the objective's current parameters, inside ``obj.guard()``:
the caller's model (parameters, buffers, ``.grad``, train/eval mode) is bit-identical afterwards,
also when a measure raises. Perturbations are ``delta = c * u`` with a per-parameter scale ``c``
(``1``; ``|w| + eta`` with ``adaptive=True``; a diagonal Fisher ``f^{-1/2}`` with
``scale="fisher"``). Monte-Carlo measures use antithetic pairs and report a standard error (a
standard deviation of the estimate, never a variance). ``evaluations`` counts passes over the
objective's data: ``loss`` (forward), ``gradient`` (forward + backward; one pass of per-example
gradients counts as one) and ``hvp`` (curvature matrix-vector products).

Measures (``MEASURES``): lambda_max, hessian_trace, fisher_trace, ggn_trace, gradient_norm,
worst_case, fisher_worst_case, average_case, keskar, pacbayes_flatness, sharpness_flatness,
directional, perturbation_robustness, tracer. See each function in ``landscape._measures`` for
the formula, its source and the options.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from landscape._io import atomic_write, atomic_write_json, to_jsonable
from landscape._measures import curvature, flatness, perturb
from landscape._measures._common import Ctx
from landscape.results import Result, normal_ci

__all__ = ["MEASURES", "SharpnessResult", "SharpnessReport", "sharpness", "sharpness_report", "add_cli"]

_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "lambda_max": curvature.lambda_max,
    "hessian_trace": curvature.hessian_trace,
    "fisher_trace": curvature.fisher_trace,
    "ggn_trace": curvature.ggn_trace,
    "gradient_norm": curvature.gradient_norm,
    "worst_case": perturb.worst_case,
    "fisher_worst_case": perturb.fisher_worst_case,
    "average_case": perturb.average_case,
    "keskar": perturb.keskar,
    "pacbayes_flatness": flatness.pacbayes_flatness,
    "sharpness_flatness": flatness.sharpness_flatness,
    "directional": perturb.directional,
    "perturbation_robustness": perturb.perturbation_robustness,
    "tracer": curvature.tracer,
}

#: Names of every available measure, in the order of the specification table.
MEASURES: tuple[str, ...] = tuple(_FUNCTIONS)


@dataclass
class SharpnessResult(Result):
    """One sharpness measurement.

    Attributes:
        measure: the measure's name (one of ``MEASURES``).
        value: the number (for curves, a summary; the curve is in ``extra``).
        stderr: standard error of ``value`` (a standard deviation) for Monte-Carlo measures, else
            ``None``.
        evaluations: ``{"loss": ..., "gradient": ..., "hvp": ...}`` passes over the data.
        extra: measure-specific outputs (curves, smallest eigenvalue, magnitude-aware variants, ...).
        config: every option (defaults included), the seed, the objective's ``config()`` (model,
            data size, parameter selection, dtype/device) and its BatchNorm / mode policy.
        seconds: wall-clock time.
    """

    measure: str = ""
    value: float = math.nan
    stderr: float | None = None
    evaluations: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    kind: ClassVar[str] = "sharpness"

    def ci(self, level: float = 0.95) -> tuple[float, float]:
        """Normal confidence interval ``value +- z stderr``; only for stochastic measures."""
        if self.stderr is None:
            raise ValueError(f"measure {self.measure!r} is deterministic here (stderr is None): no interval")
        return normal_ci(self.value, self.stderr, level)

    def __repr__(self) -> str:
        err = "" if self.stderr is None else f" +- {self.stderr:.3g}"
        return f"SharpnessResult({self.measure}={self.value:.6g}{err}, evaluations={self.evaluations})"


def _check_objective(obj: Any) -> None:
    needed = ("flat_params", "loss", "loss_and_gradient", "guard", "batches", "unflatten", "config")
    if not all(hasattr(obj, n) for n in needed):
        raise TypeError(
            f"sharpness needs a landscape.Objective, got {type(obj).__name__}; build one with "
            "ls.Objective(model, loss_fn, data)"
        )


def _mode_policy(obj: Any) -> str:
    if obj.mode == "eval":
        return "eval mode: BatchNorm uses its running statistics, dropout off"
    return "train mode: BatchNorm uses batch statistics; running statistics updated in copies only"


def sharpness(obj: Any, measure: str, *, progress: bool = False, **options: Any) -> SharpnessResult:
    """Measure the sharpness of ``obj`` at its current parameters.

    Args:
        obj: a :class:`landscape.Objective` (model, loss, data, parameter selection, dtype, device).
        measure: one of :data:`MEASURES`.
        progress: tqdm bars for the long loops (Monte-Carlo samples, bisections, sub-batches).
        **options: the measure's hyperparameters (see ``landscape._measures``); unknown names raise.

    Returns:
        :class:`SharpnessResult`.
    """
    _check_objective(obj)
    if not isinstance(measure, str) or measure not in _FUNCTIONS:
        raise ValueError(f"unknown measure {measure!r}; available: {', '.join(MEASURES)}")
    fn = _FUNCTIONS[measure]
    import inspect

    allowed = [
        n
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and not n.startswith("_")
    ]
    unknown = sorted(set(options) - set(allowed))
    if unknown and not any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()
    ):
        raise TypeError(f"{measure}: unknown option(s) {unknown}; accepted: {allowed}")
    t0 = time.perf_counter()
    with obj.guard():
        ctx = Ctx(obj, progress=progress)
        out = fn(ctx, **options)
    seconds = time.perf_counter() - t0
    config = {
        "measure": measure,
        **out["config"],
        "objective": obj.config(),
        "bn_policy": _mode_policy(obj),
    }
    return SharpnessResult(
        config=config,
        seconds=seconds,
        measure=measure,
        value=float(out["value"]),
        stderr=None if out["stderr"] is None else float(out["stderr"]),
        evaluations=dict(ctx.counts),
        extra=out.get("extra", {}),
    )


# --------------------------------------------------------------------------------------------
# report: many measures as one table
# --------------------------------------------------------------------------------------------
_CSV_COLUMNS = (
    "measure",
    "value",
    "stderr",
    "loss_evals",
    "gradient_evals",
    "hvp_evals",
    "seconds",
    "options",
)


def _options_text(r: SharpnessResult) -> str:
    skip = {"measure", "objective", "bn_policy"}
    parts = []
    for k, v in r.config.items():
        if k in skip or v is None:
            continue
        if isinstance(v, float):
            v = f"{v:g}"
        elif isinstance(v, (list, tuple)) and len(v) > 4:
            v = f"[{len(v)} values]"
        parts.append(f"{k}={v}")
    return " ".join(parts)


@dataclass
class SharpnessReport(Result):
    """Several :class:`SharpnessResult` rows; ``str()`` is a plain-text table."""

    rows: list[SharpnessResult] = field(default_factory=list)

    kind: ClassVar[str] = "sharpness_report"

    def __post_init__(self) -> None:
        self.rows = [SharpnessResult.from_dict(r) if isinstance(r, dict) else r for r in self.rows]

    def __getitem__(self, measure: str) -> SharpnessResult:
        for r in self.rows:
            if r.measure == measure:
                return r
        raise KeyError(f"no row for measure {measure!r}; rows: {[r.measure for r in self.rows]}")

    def table_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "measure": r.measure,
                "value": r.value,
                "stderr": r.stderr,
                "loss_evals": r.evaluations.get("loss", 0),
                "gradient_evals": r.evaluations.get("gradient", 0),
                "hvp_evals": r.evaluations.get("hvp", 0),
                "seconds": r.seconds,
                "options": _options_text(r),
            }
            for r in self.rows
        ]

    def __str__(self) -> str:
        head = ["measure", "value", "stderr", "loss/grad/hvp", "seconds", "options"]
        lines = []
        for t in self.table_rows():
            lines.append(
                [
                    t["measure"],
                    f"{t['value']:.6g}",
                    "-" if t["stderr"] is None else f"{t['stderr']:.2g}",
                    f"{t['loss_evals']}/{t['gradient_evals']}/{t['hvp_evals']}",
                    f"{t['seconds']:.2f}",
                    t["options"],
                ]
            )
        widths = [
            max(len(h), *(len(row[i]) for row in lines)) if lines else len(h) for i, h in enumerate(head)
        ]
        fmt = lambda row: "  ".join(
            c.ljust(w) if i in (0, 5) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        )  # noqa: E501
        out = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in lines]
        return "\n".join(line.rstrip() for line in out)

    def to_csv(self, path: Any = None) -> str:
        """The table as CSV text; written atomically to ``path`` when given."""
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=_CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        for t in self.table_rows():
            writer.writerow(
                {k: ("" if v is None else repr(v) if isinstance(v, float) else v) for k, v in t.items()}
            )
        text = buf.getvalue()
        if path is not None:
            atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))
        return text

    def to_json(self, path: Any = None) -> str:
        """Every row with its full configuration and extras as JSON; written atomically to ``path``."""
        d = self.to_dict()
        if path is not None:
            atomic_write_json(path, d)
        return json.dumps(to_jsonable(d), indent=2)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SharpnessReport:
        rows = [SharpnessResult.from_dict(r) for r in d.get("rows", [])]
        return cls(config=d.get("config", {}), seconds=d.get("seconds", 0.0), rows=rows)


MeasureSpec = str | tuple[str, dict[str, Any]]


def sharpness_report(
    obj: Any,
    measures: Iterable[MeasureSpec] = (
        "lambda_max",
        "hessian_trace",
        "gradient_norm",
        "worst_case",
        "average_case",
    ),
    *,
    progress: bool = False,
) -> SharpnessReport:
    """Run several measures on ``obj``: ``measures`` are names or ``(name, options)`` pairs (the same
    name may appear several times with different options)."""
    specs: list[tuple[str, dict[str, Any]]] = []
    for m in measures:
        if isinstance(m, str):
            specs.append((m, {}))
        elif (
            isinstance(m, (tuple, list)) and len(m) == 2 and isinstance(m[0], str) and isinstance(m[1], dict)
        ):
            specs.append((m[0], dict(m[1])))
        else:
            raise TypeError(f"each measure must be a name or a (name, options) pair, got {m!r}")
    if not specs:
        raise ValueError("measures is empty: name at least one of " + ", ".join(MEASURES))
    for name, _ in specs:
        if name not in _FUNCTIONS:
            raise ValueError(f"unknown measure {name!r}; available: {', '.join(MEASURES)}")
    t0 = time.perf_counter()
    rows = [sharpness(obj, name, progress=progress, **opts) for name, opts in specs]
    return SharpnessReport(
        config={"objective": obj.config(), "measures": [[n, o] for n, o in specs]},
        seconds=time.perf_counter() - t0,
        rows=rows,
    )


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
