"""The dashboard at its edges: every page with every problem and optimizer option (alone and all at
once) runs without an exception or an error box, problems a page cannot draw are not offered, and an
uploaded file that is not a surface gets a message naming that file.

The exhaustive single-optimizer sweep is marked ``slow``; the default run keeps every problem with
all optimizers selected at once (which runs every problem-optimizer pair) and every network optimizer
in one selection."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from dashboard import network as nw  # noqa: E402
from dashboard import toy  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import landscape as ls  # noqa: E402
import toy_problems as tp  # noqa: E402

PROBLEMS, EXCLUDED = toy.playground_problems()
OPTIMIZERS = list(toy.OPTIMIZERS)


def _clean(at: AppTest, what: str) -> None:
    assert not at.exception, (what, [e.value for e in at.exception])
    assert not at.error, (what, [e.value for e in at.error])


def _app(page: str, timeout: float = 300, **state) -> AppTest:
    at = AppTest.from_file(str(APP / page), default_timeout=timeout)
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def _contour_names(at: AppTest) -> set[str]:
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        if any(d.get("type") == "contour" for d in spec["data"]):
            return {d.get("name") for d in spec["data"]}
    raise AssertionError("no contour chart on the page")


# ------------------------------------------------------------------------------ playground


def test_playground_offers_only_two_dimensional_problems_and_says_why():
    dims = {n: tp.get(n).dim for n in tp.names()}
    assert PROBLEMS == [n for n in tp.names() if dims[n] == 2]
    assert set(EXCLUDED) == {n for n in dims if dims[n] != 2} and "two_moons" in EXCLUDED
    assert f"{dims['two_moons']:,}-dimensional" in EXCLUDED["two_moons"]
    with pytest.raises(ValueError, match="needs a 2-D problem"):
        toy.problem_settings("two_moons")
    at = _app("pages/1_Optimizer_playground.py", optimizers=["GD"])
    _clean(at, "default")
    assert at.selectbox(key="problem").options == PROBLEMS
    assert any("two_moons" in c.value and "Bayesian view" in c.value for c in at.sidebar.caption)


def _sweep_playground(problem: str, selections: list[list[str]]) -> None:
    at = _app("pages/1_Optimizer_playground.py", problem=problem, optimizers=selections[0])
    for i, chosen in enumerate(selections):
        if i:
            at.multiselect(key="optimizers").set_value(chosen).run()
        _clean(at, (problem, chosen))
        # the per-problem defaults are stable: no run diverges or leaves the plot
        assert not at.warning, (problem, chosen, [w.value for w in at.warning])
        assert set(at.dataframe[0].value["status"]) == {"ok"}, (problem, chosen)
        assert set(chosen) <= _contour_names(at), (problem, chosen)
        # one table row per run, whatever happened to it
        rows = at.dataframe[0].value
        assert list(rows["optimizer"]) == chosen, (problem, chosen)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_playground_every_problem_with_all_optimizers_at_once(problem):
    _sweep_playground(problem, [OPTIMIZERS])


@pytest.mark.slow
@pytest.mark.parametrize("problem", PROBLEMS)
def test_playground_every_problem_with_every_single_optimizer(problem):
    _sweep_playground(problem, [[name] for name in OPTIMIZERS])


# ------------------------------------------------------------------------------ smoothed objectives


@pytest.mark.parametrize("log", [True, False])
def test_smoothed_page_every_problem(log):
    at = _app("pages/2_Smoothed_objectives.py", smoothed_resolution=30, smoothed_log=log)
    options = at.selectbox(key="smoothed_problem").options
    assert options == PROBLEMS
    for problem in options:
        at.selectbox(key="smoothed_problem").select(problem).run()
        _clean(at, problem)
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        assert [d["type"] for d in spec["data"]] == ["contour"] * 4, problem


# ------------------------------------------------------------------------------ Bayesian view


@pytest.mark.slow
def test_bayesian_page_with_two_moons():
    at = _app("pages/3_Bayesian_view.py", bayes_resolution=30)
    _clean(at, "default")
    at.checkbox(key="show_moons").check().run()
    at.slider(key="moons_epochs").set_value(10).run()
    _clean(at, "two moons")


# ------------------------------------------------------------------------------ network page


def _network(chosen: list[str]) -> AppTest:
    return _app(
        "pages/4_Network_landscape.py",
        timeout=600,
        net_optimizers=chosen,
        net_epochs=1,
        net_hidden=16,
        net_resolution=11,
    )


def test_network_page_all_optimizers_at_once():
    at = _network(list(nw.NETWORK_OPTIMIZERS))
    _clean(at, "all")
    training = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [d["name"] for d in training["data"]] == list(nw.NETWORK_OPTIMIZERS)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(nw.NETWORK_OPTIMIZERS))
def test_network_page_every_single_optimizer(name):
    at = _network([name])
    _clean(at, name)
    assert [r for r in at.dataframe[0].value["optimizer"]] == [name]


# ------------------------------------------------------------------------------ uploads


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


NOT_SURFACES = [
    ("notes.npz", b"plain text, not an archive", "zip signature"),
    ("weights.npz", _npz(w=np.arange(4.0)), "no 'meta' entry"),
    ("objects.npz", _npz(o=np.array([{"a": 1}], dtype=object)), "holds Python objects"),
    ("empty.npz", b"", "is empty"),
]


@pytest.mark.parametrize(("name", "data", "fragment"), NOT_SURFACES)
def test_uploading_a_file_that_is_not_a_surface_names_the_file(name, data, fragment):
    at = _app("pages/4_Network_landscape.py", net_optimizers=[])
    at.file_uploader[0].upload(name, data).run()
    assert not at.exception
    assert len(at.error) == 1
    message = at.error[0].value
    assert f"'{name}'" in message and fragment in message, message
    assert "pickled data" not in message and "allow_pickle" not in message
    assert "/tmp" not in message and "surface.npz" not in message


def test_uploading_a_surface_plots_its_values(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).double()
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.tensor([0, 1] * 4)
    obj = ls.Objective(model, torch.nn.CrossEntropyLoss(), (x, y))
    d1 = {"weight": torch.ones(2, 3, dtype=torch.float64), "bias": torch.zeros(2, dtype=torch.float64)}
    d2 = {"weight": torch.zeros(2, 3, dtype=torch.float64), "bias": torch.ones(2, dtype=torch.float64)}
    xs, ys = np.array([-1.0, 0.0, 0.5]), np.array([0.0, 2.0])
    path = ls.surface(obj, [d1, d2], [xs, ys]).save(tmp_path / "mine.npz")
    at = _app("pages/4_Network_landscape.py", net_optimizers=[])
    at.file_uploader[0].upload("mine.npz", path.read_bytes()).run()
    _clean(at, "upload")
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    z = _arr(spec["data"][0]["z"])
    assert z.shape == (2, 3)  # plotted transposed: z[j, i] is the loss at (xs[i], ys[j])
    # the cell at (xs[2], ys[1]) is the loss of the model moved by 0.5 d1 + 2 d2, computed directly
    with torch.no_grad():
        w = model.weight + 0.5 * d1["weight"] + 2.0 * d2["weight"]
        b = model.bias + 0.5 * d1["bias"] + 2.0 * d2["bias"]
        expected = float(torch.nn.functional.cross_entropy(x @ w.T + b, y))
    assert z[1, 2] == pytest.approx(expected, rel=1e-9)


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: nested lists, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        if isinstance(shape, str):  # "2, 3"
            shape = tuple(int(k) for k in shape.split(","))
        return arr.reshape(shape) if shape is not None else arr
    return np.asarray(v, dtype=float)
