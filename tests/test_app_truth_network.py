"""Issue 29, network landscape (page 4): the captions say what the estimators did (the trace's
stopping rule met or its budget spent, with the relative error reached; which Lanczos pairs did not
converge), the sharpness table says how each measure perturbs the weights (why the average case can
exceed the worst case at one rho) and uses the spectrum's trace estimator, the long computations
report their progress without changing a number, and the surface panels share axes at equal
aspect without mirrored PCA planes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import network as nw  # noqa: E402
from dashboard import network_analyses as na  # noqa: E402
from dashboard import network_plots as npl  # noqa: E402
from dashboard import network_text as nt  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import landscape as ls  # noqa: E402


def _spectrum(**kw) -> dict:
    sp = {
        "smallest": -0.0139,
        "smallest_converged": True,
        "smallest_residual": 1e-8,
        "smallest_tolerance": 3e-7,
        "hutchinson_trace": 11.1,
        "hutchinson_stderr": 0.13,
        "trace_method": "hutchinson",
        "trace_converged": False,
        "trace_matvecs": 100,
        "trace_budget": 100,
        "trace_rtol": 1e-3,
        "trace_level": 0.95,
        "trace_halfwidth": 0.26,
        "eigenvalues": [0.335, 0.253],
        "residuals": [4e-8, 2e-3],
        "converged": [True, True],
        "lanczos_matvecs": 335,
        "trace": 11.02,
        "trace_stderr": 0.26,
        "slq_runs": 5,
        "slq_steps": 40,
    }
    return {**sp, **kw}


def test_trace_caption_says_budget_spent_with_the_error_reached():
    text = nt.spectrum_caption({"SGD": _spectrum()})
    assert "until its standard error is below 0.1 %" not in text
    assert "SGD: the budget of 100 products ran out before the rule was met" in text
    assert "relative standard error reached is 1.2 %" in text  # 0.13 / 11.1
    assert "95 % half-width 2.3 %" in text
    met = nt.spectrum_caption(
        {"SAM": _spectrum(trace_converged=True, trace_matvecs=60, hutchinson_stderr=0.004)}
    )
    assert "SAM: rule met after 60 products (relative standard error 0.036 %)" in met
    assert "ran out" not in met
    # the SLQ trace is compared with the numbers, not with a fixed "many times larger"
    assert "SGD 11.02 ± 0.26 (2× the standard error above)" in text and "few probe vectors" in text


def test_spectrum_rows_name_what_did_not_converge():
    rows = nt.spectrum_rows({"SGD": _spectrum(), "SAM": _spectrum()})
    assert rows[0]["Lanczos"] == "all 3 converged"
    assert (
        rows[0]["trace (Hutchinson)"] == "11.1 ± 0.13 (1.2 %)"
        and rows[0]["trace stopping rule"] == "budget spent"
    )
    bad = _spectrum(converged=[True, False], smallest_converged=False, smallest_residual=2e-4)
    row = nt.spectrum_rows({"SGD": bad})[0]
    assert (
        row["Lanczos"]
        == "not converged: λ2 (residual 0.002), smallest (residual 0.0002 > 3e-07) after 335 products"
    )
    caption = nt.spectrum_caption({"SGD": bad})
    assert "Lanczos did not converge for some eigenvalues of SGD" in caption
    mixed = nt.spectrum_rows({"SGD": _spectrum(), "SAM": _spectrum(trace_method="xtrace")})
    assert "trace (estimator per row)" in mixed[1] and mixed[1]["trace (estimator per row)"].endswith(
        "[XTrace]"
    )


def test_sharpness_explanations_and_ratio():
    text = nt.measure_explanation("average_case", {"rho": 0.05}, 2410)
    assert "ρ √p = 2.45" in text and "49× the worst case's radius" in text
    assert "‖δ‖₂ ≤ ρ = 0.05" in nt.measure_explanation("worst_case", {"rho": 0.05}, 2410)
    rows = [
        {"optimizer": "SGD", "measure": "worst_case", "value": 0.0011769, "stderr": "—"},
        {"optimizer": "SGD", "measure": "average_case", "value": 0.015459, "stderr": "0.00016"},
    ]
    (ratio, exact) = nt.sharpness_notes(rows, 2410, "train")
    assert ratio.startswith("average_case / worst_case: SGD 13.1×") and "√p = 49" in ratio
    assert exact.startswith("No standard error (—) for worst_case")
    spectra = {"SGD": _spectrum(hutchinson_trace=11.1)}
    same = [{"optimizer": "SGD", "measure": "hessian_trace", "value": 11.1, "stderr": "0.13"}]
    assert nt.trace_agreement(same, spectra, "train").startswith(
        "hessian_trace equals the spectrum's trace for SGD"
    )
    assert "on the test data" in nt.trace_agreement(same, spectra, "test")
    assert dict(nt.sharpness_measures(["hessian_trace"]))["hessian_trace"] == nt.TRACE_OPTIONS


def test_surface_headings():
    pca = nt.surface_heading("pca", 2, 7.27, shared_colours=True)
    assert "same axis range ±7.27" in pca and "directions differ between optimizers" in pca
    assert "one colour scale for all panels" in pca
    assert "[−1, 1]²" in nt.surface_heading("random", 3, None, shared_colours=True)
    assert "the axes and the directions differ" in nt.surface_heading("pca", 2, None, shared_colours=True)
    assert "colour scale" not in nt.surface_heading("random", 1, None, shared_colours=True)


@pytest.fixture(scope="module")
def two_runs():
    return [nw.train_network(n, epochs=1, hidden=8) for n in ("SGD", "SAM")]


def test_progress_does_not_change_the_numbers(two_runs):
    run = two_runs[0]
    seen = []
    sp = na.spectrum_of(run, k=2, runs=2, lanczos_steps=10, progress=lambda f, t: seen.append((f, t)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0) and len(seen) > 20
    assert any("smallest eigenvalue (Lanczos)" in t for _, t in seen)
    H = ls.hessian(nw.objective_of(run))
    top = ls.eigenvalues(H, k=2, which="largest", tol=1e-6, max_matvecs=300, seed=0)
    assert sp["eigenvalues"] == [float(v) for v in top.values]
    tr = ls.trace(ls.hessian(nw.objective_of(run)), **nt.TRACE_OPTIONS)
    assert sp["hutchinson_trace"] == float(tr.value) and sp["hutchinson_stderr"] == float(tr.stderr)
    assert sp["trace_converged"] == tr.converged and sp["trace_matvecs"] == tr.matvecs
    # the sharpness table's hessian_trace is the spectrum's estimate (same estimator and probes)
    steps = []
    rows = na.sharpness_rows({"SGD": run}, nt.sharpness_measures(["hessian_trace", "worst_case"]),
                             report=lambda f, t: steps.append((f, t)))  # fmt: skip
    assert steps == [(0.0, "hessian_trace of SGD"), (0.5, "worst_case of SGD")]
    assert rows[0]["value"] == sp["hutchinson_trace"] and "as run" in rows[0]
    # a surface in strips equals the surface in one call, point for point
    strips = []
    s, _ = na.surface_of(run, kind="random", resolution=9, progress=lambda f, t: strips.append(f))
    one, _ = na.surface_of(run, kind="random", resolution=9, strips=1)
    np.testing.assert_array_equal(s.loss, one.loss)
    np.testing.assert_array_equal(s.xs, one.xs)
    assert len(strips) == 4 and strips[-1] == 1.0 and s.evaluations == one.evaluations == 81


def test_pca_panels_share_axes_and_orientation(two_runs):
    span = na.pca_span(two_runs)
    for run in two_runs:
        dirs, path = na.pca_plane(run)
        assert path[0][0] <= 0 and path[0][1] <= 0  # the initialisation at negative coordinates
        np.testing.assert_allclose(path[-1], 0.0, atol=1e-12)
        norms = [math.sqrt(sum(float((t.double() ** 2).sum()) for t in d.values())) for d in dirs]
        np.testing.assert_allclose(norms, 1.0, rtol=1e-6)  # unit directions: coordinates are distances
        s, _ = na.surface_of(run, kind="pca", resolution=5, span=span)
        assert s.xs.min() == pytest.approx(-span) and s.ys.max() == pytest.approx(span)
        assert np.abs(path).max() * 1.25 <= span + 1e-6
    fig = npl.surface_figure(s, path, "t")
    assert fig.layout.yaxis.scaleanchor == "x" and fig.layout.yaxis.scaleratio == 1


def test_page_captions_from_the_numbers():
    at = AppTest.from_file(str(APP / "pages" / "4_Network_landscape.py"), default_timeout=600)
    state = {
        "net_optimizers": ["SGD"],
        "net_epochs": 1,
        "net_hidden": 8,
        "net_resolution": 11,
        "net_analyses": ["surface", "spectrum", "sharpness"],
        "net_sharp_measures": ["hessian_trace"],
    }
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    table = next(t.value for t in at.dataframe if "Lanczos" in t.value.columns)
    (sp,) = at.session_state["net_spectra"].values()
    rel = 100 * sp["hutchinson_stderr"] / sp["hutchinson_trace"]
    cell = table.iloc[0][[c for c in table.columns if c.startswith("trace (")][0]]
    assert cell.endswith(f"({rel:.2g} %)")
    caption = next(c.value for c in at.caption if c.value.startswith("Trace:"))
    if sp["trace_converged"]:
        assert "rule met" in caption and "ran out" not in caption
    else:
        assert f"relative standard error reached is {rel:.2g} %" in caption and "rule met" not in caption
    assert any("same axis range" in m.value for m in at.markdown)
    assert any(c.value.startswith("hessian_trace equals the spectrum's trace for SGD") for c in at.caption)
    details = at.table[0].value
    assert "how it perturbs the weights w" in details.columns
    sharp = next(t.value for t in at.dataframe if "measure" in t.value.columns)
    assert float(sharp["value"].iloc[0]) == sp["hutchinson_trace"]


def test_training_curves_stay_distinguishable_when_they_coincide(two_runs):
    """Similar optimizers give coinciding loss curves: every run has its own dash and marker, and
    earlier runs are drawn wider, so a curve under another one stays visible."""

    runs = {name: two_runs[0] for name in ("SGD", "SAM", "ASAM", "FisherSAM", "BayesianSAM", "MFVI")}
    fig = npl.training_figure(runs)
    styles = {(t.line.dash, t.marker.symbol) for t in fig.data}
    assert len(fig.data) == 6 and len(styles) == 6
    widths = [t.line.width for t in fig.data]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
