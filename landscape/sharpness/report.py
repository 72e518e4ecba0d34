"""Many sharpness measures of one objective as one table (:func:`sharpness_report`), CSV/JSON out."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tqdm.auto import tqdm

from landscape.io import atomic_write_json, atomic_write_text, to_jsonable
from landscape.results import Result
from landscape.sharpness.api import _FUNCTIONS, MEASURES, SharpnessResult, sharpness

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
            atomic_write_text(path, text)
        return text

    def to_json(self, path: Any = None) -> str:
        """Every row with its full configuration and extras as JSON; written atomically to ``path``."""
        d = self.to_dict()
        if path is not None:
            atomic_write_json(path, d)
        return json.dumps(to_jsonable(d), indent=2)

    @classmethod
    def _from_fields(cls, kwargs: dict[str, Any]) -> SharpnessReport:
        """Rows come back as :class:`SharpnessResult` objects, each checked like any result."""
        rows = [
            r if isinstance(r, SharpnessResult) else SharpnessResult.from_dict(r)
            for r in kwargs.get("rows", [])
        ]
        return cls(**{**kwargs, "rows": rows})


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
    # progress: an overall bar over the measures (its estimate from those done), each measure's
    # own bars below it
    bar = tqdm(specs, desc="measures", unit="measure", disable=not progress, smoothing=0.0)
    rows = []
    for name, opts in bar:
        bar.set_postfix_str(name)
        rows.append(sharpness(obj, name, progress=progress, **opts))
    return SharpnessReport(
        config={"objective": obj.config(), "measures": [[n, o] for n, o in specs]},
        seconds=time.perf_counter() - t0,
        rows=rows,
    )
