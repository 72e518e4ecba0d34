"""Issue 29, curvature monitor (page 6): what the page says about lambda_max against 2/lr is
computed from the table of checks. A check above the threshold by 6.3 % is "above by 6.3 %", never
"within 5 %"; a check whose Lanczos run did not converge is named and not used for the claims; the
introduction makes no claim about the run's outcome."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import monitor_view as mv  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402


def _row(step, lam, thr=1.0, converged=True, residual=1e-6, matvecs=5):
    return {
        "step": step,
        "lambda_max": lam,
        "threshold": thr,
        "converged": converged,
        "residual": residual,
        "matvecs": matvecs,
    }


def test_relation_gives_true_percentages():
    assert mv.relation(1.0632, 1.0) == "above by 6.3 %"
    assert mv.relation(0.5887, 0.5) == "above by 17.7 %"
    assert mv.relation(0.5448, 1.0) == "below by 45.5 %"
    assert mv.relation(1.02, 1.0) == "within 5 % (above by 2.0 %)"
    assert mv.relation(0.97, 1.0) == "within 5 % (below by 3.0 %)"
    assert mv.compare(1.0632, 1.0) == ("above", pytest.approx(6.32))


def test_statement_above_is_never_within():
    text = mv.threshold_statement([_row(0, 1.0632), _row(10, 0.5448)])
    assert "above by 6.3 %" in text
    assert "within 5 %" not in text
    assert "It first lay above 2/lr by more than 5 % at step 0" in text
    assert "1 lie above 2/lr by more than 5 %, 0 inside the ±5 % band around it and 1 below" in text
    assert "λ_max never entered the ±5 % band around 2/lr; the closest check is step 0" in text
    # at lr 4: 0.5887 against 0.5 is 17.7 % above
    text = mv.threshold_statement([_row(0, 0.5887, thr=0.5)])
    assert "above by 17.7 %" in text and "within 5 %" not in text


def test_statement_first_within_band():
    text = mv.threshold_statement([_row(0, 0.3), _row(10, 0.96), _row(20, 1.2), _row(30, 1.01)])
    assert "λ_max first came within 5 % of 2/lr at step 10 (λ_max = 0.96 against 1: below by 4.0 %)" in text
    assert "It first lay above 2/lr by more than 5 % at step 20" in text and "above by 20.0 %" in text
    assert (
        "At the last converged check (step 30) λ_max = 1.01 = 1.010 × 2/lr (within 5 % (above by 1.0 %))"
        in text
    )


def test_unconverged_check_is_named_and_not_used():
    rows = [_row(0, 1.0632, converged=False, residual=0.01, matvecs=20), _row(10, 0.5448), _row(20, 0.38)]
    text = mv.threshold_statement(rows)
    assert (
        "1 check did not converge (step 0: λ_max = 1.063, residual 0.01 after 20 Hessian-vector products)"
        in text
    )
    assert "not used below" in text
    assert "above by 6.3 %" not in text and "first came within" not in text
    assert "Of the 2 converged checks, 0 lie above" in text
    only_bad = mv.threshold_statement([_row(0, 1.0632, converged=False, residual=0.01)])
    assert "No converged check: nothing is concluded" in only_bad


def test_cross_entropy_preset_statement_from_its_table():
    """The default run: its first check (cold Lanczos, 20 products) does not converge; the page's
    statement and table column come from the checks, never "within 5 % ... at step 0"."""
    run = mv.run_monitor(**mv.PRESETS["cross_entropy"][1])
    rows = mv.history_rows(run)
    assert rows[0]["step"] == 0 and rows[0]["converged"] is False
    assert rows[0]["vs threshold"] == "not converged: not used"
    for r in rows[1:]:
        assert r["converged"] is True
        assert r["vs threshold"] == mv.relation(r["lambda_max"], r["threshold"])
    text = mv.edge_summary(run)
    assert text == mv.threshold_statement(rows)
    assert "at step 0" not in text.split("not used below.")[1]
    below = sum(r["lambda_max"] < 0.95 * r["threshold"] for r in rows[1:])
    assert f"{below} below it by more than 5 %" in text
    fig = mv.sharpness_figure(run)
    circled = next(t for t in fig.data if t.name == "check not converged (not used)")
    assert list(circled.x) == [0] and list(circled.y) == [rows[0]["lambda_max"]]
    cap = mv.plot_caption(run)
    assert f"Last check (step {rows[-1]['step']}): λ_max = {rows[-1]['lambda_max']:.4g};" in cap


def test_page_statement_equals_the_table():
    at = AppTest.from_file(str(APP / "pages" / "6_Curvature_monitor.py"), default_timeout=300)
    at.run()
    assert not at.exception and not at.error
    (run,) = at.session_state["monitor_runs"].values()
    table = at.dataframe[0].value
    assert list(table["vs threshold"]) == [r["vs threshold"] for r in mv.history_rows(run)]
    assert at.markdown[-1].value == mv.threshold_statement(mv.history_rows(run))
    intro = at.markdown[0].value
    assert "stays below" not in intro and "computed from the table of checks" in intro
