"""What the "Network landscape" page says about its numbers, computed from them: the Hessian
spectrum's table and caption (which estimator ran, whether its stopping rule was met or its budget
ran out, with the achieved relative error; which Lanczos pairs did not converge), the sharpness
measures (how each perturbs the weights, and what that means for comparing them) and the heading
of the surface panels (which axes and colour scale they share). No Streamlit here.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "MEASURE_OPTIONS",
    "SHARPNESS_COLUMNS",
    "RHO_MEASURES",
    "TRACE_OPTIONS",
    "cell",
    "measure_explanation",
    "sharpness_measures",
    "sharpness_notes",
    "spectrum_caption",
    "spectrum_rows",
    "surface_heading",
    "trace_agreement",
    "trace_cell",
]

#: the Hessian trace on this page, in the spectrum and in the sharpness table alike
#: (``landscape.trace``'s "auto": Hutchinson, or XTrace for a decaying spectrum)
TRACE_OPTIONS: dict[str, Any] = {"method": "auto", "rtol": 1e-3, "max_matvecs": 100, "seed": 0}

#: measure -> the options the page runs it with (``rho`` replaced by the sidebar's)
MEASURE_OPTIONS: dict[str, dict[str, Any]] = {
    "lambda_max": {},
    "hessian_trace": dict(TRACE_OPTIONS),
    "gradient_norm": {},
    "worst_case": {"rho": 0.05, "solver": "one_step"},
    "average_case": {"rho": 0.05},
    # KFAC of the GGN, exact from its factors (Martens & Grosse 2015); the ResNet's BatchNorm
    # parameters have no Kronecker form and are left out
    "kfac_trace": {"other_params": "skip"},
    "kfac_lambda_max": {"other_params": "skip"},
}
#: the measures whose options take the radius ``rho``
RHO_MEASURES = frozenset({"worst_case", "average_case"})

#: column widths of the sharpness table (Streamlit ``column_config``): every column on screen
SHARPNESS_COLUMNS: dict[str, dict[str, Any]] = {
    "optimizer": {"width": "small"},
    "measure": {"width": "medium"},
    "value": {"width": "small"},
    "stderr": {"width": "small"},
    "options": {"width": "large"},
}

_METHOD_NAMES = {"hutchinson": "Hutchinson", "xtrace": "XTrace", "hutchpp": "Hutch++", "exact": "exact"}


def cell(v: Any, fmt: str = ".4g") -> str:
    """A table cell: a number in ``fmt``, "—" for a missing or non-finite one."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def sharpness_measures(names: list[str] | None = None, rho: float = 0.05) -> list[tuple[str, dict[str, Any]]]:
    """The page's measures (all by default) with ``rho`` for the radius-based ones."""
    names = list(MEASURE_OPTIONS) if names is None else list(names)
    bad = [n for n in names if n not in MEASURE_OPTIONS]
    if bad:
        raise ValueError(f"unknown sharpness measure(s) {bad}; choose from {list(MEASURE_OPTIONS)}")
    if not (rho > 0 and math.isfinite(rho)):
        raise ValueError(f"rho must be a positive number, got {rho}")
    return [
        (n, {**MEASURE_OPTIONS[n], "rho": float(rho)} if n in RHO_MEASURES else dict(MEASURE_OPTIONS[n]))
        for n in names
    ]


def measure_explanation(name: str, options: dict[str, Any], n_params: int) -> str:
    """What a measure of the page computes and how it perturbs the weights ``w`` (``n_params`` of
    them), with its radius and the norm of its perturbation."""
    rho = float(options.get("rho", math.nan))
    if name == "lambda_max":
        return "largest Hessian eigenvalue (Lanczos, relative residual ≤ 1e-6); no perturbation"
    if name == "hessian_trace":
        return (
            "sum of the Hessian eigenvalues (landscape.trace, auto: Hutchinson or XTrace, stops at a 95 % "
            f"half-width ≤ {100 * options.get('rtol', 1e-3):g} % or {options.get('max_matvecs', 100)} "
            "products; the spectrum's estimator and probes); no perturbation"
        )
    if name == "gradient_norm":
        return "‖∇L(w)‖₂ at the trained weights; no perturbation"
    if name in ("kfac_trace", "kfac_lambda_max"):
        what = "trace" if name == "kfac_trace" else "largest eigenvalue"
        return (
            f"{what} of KFAC, the GGN approximated block-diagonal across layers and as a Kronecker "
            "product within each (Martens & Grosse 2015), exact from its factors (one pass over the "
            "data; Linear/Conv2d weights only, BatchNorm left out); no perturbation"
        )
    if name == "worst_case":
        return (
            f"max L(w + δ) − L(w) over the ball ‖δ‖₂ ≤ ρ = {rho:g} (whole weight vector, not normalised; "
            "one SAM ascent step to the ball's surface, a lower bound of the maximum)"
        )
    if name == "average_case":
        radius = rho * math.sqrt(n_params)
        return (
            f"E L(w + δ) − L(w) with δ ~ N(0, ρ² I): ρ = {rho:g} is the standard deviation of each of "
            f"the {n_params} weights, so ‖δ‖₂ ≈ ρ √p = {radius:.3g}, {math.sqrt(n_params):.0f}× the "
            "worst case's radius (100 antithetic pairs, mean ± standard error)"
        )
    return "see landscape.sharpness"


def sharpness_notes(rows: list[dict[str, Any]], n_params: int, split: str) -> list[str]:
    """Sentences under the sharpness table, from its rows: why the average case can exceed the worst
    case at the same ρ, and which error bars are exact (no Monte Carlo)."""
    notes = []
    by = {(r["optimizer"], r["measure"]): r for r in rows}
    ratios = []
    for (opt, m), r in by.items():
        if m == "worst_case" and (opt, "average_case") in by:
            w, a = float(r["value"]), float(by[(opt, "average_case")]["value"])
            if w > 0 and math.isfinite(a):
                ratios.append(f"{opt} {a / w:.3g}×")
    if ratios:
        notes.append(
            f"average_case / worst_case: {', '.join(ratios)}. They are not two estimates of one "
            f"quantity: the worst case searches the ball of radius ρ, the average case draws δ with "
            f"radius about ρ √p (p = {n_params} weights, √p = {math.sqrt(n_params):.0f}), so the "
            "average can exceed the worst case at the same ρ."
        )
    exact = sorted({r["measure"] for r in rows if r["stderr"] == "—"})
    if exact:
        notes.append(
            f"No standard error (—) for {', '.join(exact)}: deterministic on the {split} data "
            "(Lanczos to its tolerance, a gradient, one ascent step, KFAC's factors)."
        )
    return notes


def trace_cell(value: float, stderr: float) -> str:
    """``"11.1 ± 0.13 (1.1 %)"``: the estimate, its standard error and the relative error."""
    rel = f" ({100 * stderr / abs(value):.2g} %)" if value and math.isfinite(stderr) else ""
    return f"{value:.4g} ± {stderr:.2g}{rel}"


def _convergence(sp: dict[str, Any]) -> str:
    """Which Lanczos pairs did not converge (with residual and tolerance), or "all converged"."""
    bad = [
        f"λ{i + 1} (residual {r:.2g})"
        for i, (ok, r) in enumerate(zip(sp["converged"], sp["residuals"]))
        if not ok
    ]
    if not sp["smallest_converged"]:
        bad.append(f"smallest (residual {sp['smallest_residual']:.2g} > {sp['smallest_tolerance']:.2g})")
    n = len(sp["converged"]) + 1
    if not bad:
        return f"all {n} converged"
    return "not converged: " + ", ".join(bad) + f" after {sp['lanczos_matvecs']} products"


def _trace_header(spectra: dict[str, dict[str, Any]]) -> str:
    methods = {_METHOD_NAMES.get(sp["trace_method"], sp["trace_method"]) for sp in spectra.values()}
    return f"trace ({methods.pop()})" if len(methods) == 1 else "trace (estimator per row)"


def spectrum_rows(spectra: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per optimizer: top and smallest eigenvalues (a negative one marked), which Lanczos
    pairs did not converge, the trace with its standard error and relative error, and whether its
    stopping rule was met."""
    header = _trace_header(spectra)
    rows = []
    for n, sp in spectra.items():
        low = sp["smallest"]
        trace = trace_cell(sp["hutchinson_trace"], sp["hutchinson_stderr"])
        if header == "trace (estimator per row)":
            trace += f" [{_METHOD_NAMES.get(sp['trace_method'], sp['trace_method'])}]"
        rows.append(
            {
                "optimizer": n,
                "top eigenvalues": ", ".join(f"{v:.4g}" for v in sp["eigenvalues"]),
                "smallest eigenvalue": f"{low:.4g}" + ("  ⚠ negative" if low < 0 else ""),
                "Lanczos": _convergence(sp),
                header: trace,
                "trace stopping rule": "met" if sp["trace_converged"] else "budget spent",
            }
        )
    return rows


def _trace_sentence(name: str, sp: dict[str, Any]) -> str:
    rel = 100 * sp["hutchinson_stderr"] / abs(sp["hutchinson_trace"])
    level = f"{100 * sp['trace_level']:g} %"
    if sp["trace_converged"]:
        return f"{name}: rule met after {sp['trace_matvecs']} products (relative standard error {rel:.2g} %)"
    return (
        f"{name}: the budget of {sp['trace_budget']} products ran out before the rule was met; the "
        f"relative standard error reached is {rel:.2g} % (the {level} half-width "
        f"{100 * sp['trace_halfwidth'] / abs(sp['hutchinson_trace']):.2g} %)"
    )


def spectrum_caption(spectra: dict[str, dict[str, Any]]) -> str:
    """The spectrum section's caption, from what each estimator did."""
    any_sp = next(iter(spectra.values()))
    methods = sorted({_METHOD_NAMES.get(sp["trace_method"], sp["trace_method"]) for sp in spectra.values()})
    parts = [
        f"Trace: `landscape.trace` (auto; here {' and '.join(methods)}), stopping when the "
        f"{100 * any_sp['trace_level']:g} % confidence half-width is at most "
        f"{100 * any_sp['trace_rtol']:g} % of the value or after {any_sp['trace_budget']} Hessian-vector "
        "products. " + "; ".join(_trace_sentence(n, sp) for n, sp in spectra.items()) + "."
    ]
    slq = "; ".join(
        f"{n} {sp['trace']:.4g} ± {sp['trace_stderr']:.2g} "
        f"({sp['trace_stderr'] / max(sp['hutchinson_stderr'], 1e-300):.2g}× the standard error above)"
        for n, sp in spectra.items()
    )
    parts.append(
        f"The density plot is stochastic Lanczos quadrature with only a few probe vectors "
        f"({any_sp['slq_runs']} runs of {any_sp['slq_steps']} steps); the trace it implies is {slq}, "
        "so the table's trace is the one to quote."
    )
    bad = [n for n, sp in spectra.items() if not (all(sp["converged"]) and sp["smallest_converged"])]
    if bad:
        parts.append(
            f"Lanczos did not converge for some eigenvalues of {', '.join(bad)} (the column names them): "
            "those values are approximate (a Ritz value lies between the extreme eigenvalues, so the "
            "smallest can only be above the true one)."
        )
    neg = [n for n, sp in spectra.items() if sp["smallest"] < 0]
    if neg:
        parts.append(
            f"Negative smallest eigenvalue for {', '.join(neg)}: not a minimum along that direction "
            "(a negative Ritz value proves a negative eigenvalue, converged or not)."
        )
    return " ".join(parts)


def surface_heading(kind: str, n_panels: int, span: float | None, shared_colours: bool) -> str:
    """The heading of the surface panels: which plane, whether the axes are the same, and what the
    colour scale allows comparing."""
    colours = "one colour scale for all panels (loss levels compare)" if shared_colours else ""
    if kind == "random":
        axes = (
            "the same coordinates [−1, 1]² along two filter-normalised random directions (seeds 0 and "
            "1, scaled to each model's filters, Li et al. 2018)"
        )
    elif span is None:
        axes = (
            "each panel in the PCA plane of its own optimizer's trajectory, over its own range: the "
            "axes and the directions differ between panels"
        )
    else:
        axes = (
            f"each panel in the PCA plane of its own optimizer's trajectory: the same axis range "
            f"±{span:.3g} (a Euclidean distance in weight space) in every panel, but the directions "
            "differ between optimizers"
        )
    what = "Loss surface around each solution" if n_panels > 1 else "Loss surface around the solution"
    return f"{what}: {axes}" + (f"; {colours}" if colours and n_panels > 1 else "")


def trace_agreement(
    rows: list[dict[str, Any]], spectra: dict[str, dict[str, Any]] | None, split: str
) -> str | None:
    """How the sharpness table's ``hessian_trace`` relates to the spectrum's trace, from both
    numbers: the same estimator, probes and data give the same value; test data another one."""
    traces = {r["optimizer"]: r for r in rows if r["measure"] == "hessian_trace"}
    if not traces or not spectra:
        return None
    common = [n for n in traces if n in spectra]
    if not common:
        return None
    if split != "train":
        return (
            f"hessian_trace here is on the {split} data; the spectrum's trace above is on the training "
            "data (same estimator and probes), so the two differ by design."
        )
    same, other = [], []
    for n in common:
        a, b = float(traces[n]["value"]), spectra[n]["hutchinson_trace"]
        (same if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else other).append(f"{n} {a:.4g} vs {b:.4g}")
    parts = []
    if same:
        parts.append(
            f"hessian_trace equals the spectrum's trace for {', '.join(s.split()[0] for s in same)} "
            "(same estimator, probes and training data)"
        )
    if other:
        parts.append(f"it differs for {', '.join(other)} (another operator evaluation order)")
    return "; ".join(parts) + "."
