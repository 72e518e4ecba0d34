"""The network landscape page (page 4) offers KFAC's trace and lambda_max in its sharpness table: the
numbers shown are ``ls.kfac(...).trace()`` and the top of ``ls.kfac(...).eigenvalues()`` of the same
trained model (its Linear/Conv2d parameters), recomputed here from the session's run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"
sys.path.insert(0, str(APP))

from dashboard import network as nw  # noqa: E402
from dashboard import network_text as nt  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import landscape as ls  # noqa: E402
from landscape.sharpness.kronecker_based import kronecker_params  # noqa: E402


def test_page_shows_the_kfac_trace_and_lambda_max_of_the_trained_model():
    at = AppTest.from_file(str(APP / "pages" / "4_Network_landscape.py"), default_timeout=600)
    state = {
        "net_optimizers": ["SGD"],
        "net_epochs": 1,
        "net_hidden": 8,
        "net_analyses": ["sharpness"],
        "net_sharp_measures": ["kfac_trace", "kfac_lambda_max"],
    }
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (run,) = at.session_state["trained_runs"].values()
    obj = nw.objective_of(run)
    K = ls.kfac(obj.subset(kronecker_params(obj)))
    sharp = next(t.value for t in at.dataframe if "measure" in t.value.columns)
    shown = dict(zip(sharp["measure"], sharp["value"]))
    assert shown["kfac_trace"] == pytest.approx(float(K.trace()), rel=1e-12)
    assert shown["kfac_lambda_max"] == pytest.approx(float(K.eigenvalues(1)[0]), rel=1e-12)
    details = at.table[0].value
    text = " ".join(details["how it perturbs the weights w"])
    assert "Martens & Grosse 2015" in text
    assert set(nt.MEASURE_OPTIONS) >= {"kfac_trace", "kfac_lambda_max"}
