"""One API for every sharpness measure of the literature (``docs/methods/sharpness.md``).

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
directional, perturbation_robustness, tracer, kfac_trace, kfac_lambda_max, ekfac_trace,
ekfac_lambda_max. See each function in ``landscape.sharpness`` for
the formula, its source and the options.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from landscape.results import Result, normal_ci
from landscape.sharpness import average_case, curvature_based, flatness, kronecker_based, worst_case
from landscape.sharpness.common import Ctx

__all__ = ["MEASURES", "SharpnessResult", "sharpness"]

_FUNCTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "lambda_max": curvature_based.lambda_max,
    "hessian_trace": curvature_based.hessian_trace,
    "fisher_trace": curvature_based.fisher_trace,
    "ggn_trace": curvature_based.ggn_trace,
    "gradient_norm": curvature_based.gradient_norm,
    "worst_case": worst_case.worst_case,
    "fisher_worst_case": worst_case.fisher_worst_case,
    "average_case": average_case.average_case,
    "keskar": worst_case.keskar,
    "pacbayes_flatness": flatness.pacbayes_flatness,
    "sharpness_flatness": flatness.sharpness_flatness,
    "directional": average_case.directional,
    "perturbation_robustness": worst_case.perturbation_robustness,
    "tracer": curvature_based.tracer,
    "kfac_trace": kronecker_based.kfac_trace,
    "kfac_lambda_max": kronecker_based.kfac_lambda_max,
    "ekfac_trace": kronecker_based.ekfac_trace,
    "ekfac_lambda_max": kronecker_based.ekfac_lambda_max,
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
        **options: the measure's hyperparameters (see ``landscape.sharpness``); unknown names raise.

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
