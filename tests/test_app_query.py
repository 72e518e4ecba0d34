"""Pages preset from the URL (``?problem=himmelblau&optimizers=all``): the parsing in
``dashboard.query`` on its own, then each page that reads parameters under streamlit's AppTest with
valid values (the widgets take them, the numbers are computed here independently, the address bar
keeps the selection) and with invalid ones (no exception and no error box: a warning that names the
parameter and the accepted values, and the page's default)."""

from __future__ import annotations

import base64
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
from dashboard.query import QueryPresets, norm  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import landscape as ls  # noqa: E402

PAGES = APP / "pages"


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: a plain list, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        if isinstance(shape, str):
            shape = tuple(int(k) for k in shape.split(","))
        return arr.reshape(shape) if shape is not None else arr
    return np.asarray(v, dtype=float)


def _page(name: str, query: dict[str, str], timeout: float = 300, **state) -> AppTest:
    at = AppTest.from_file(str(PAGES / name), default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = v
    for k, v in state.items():
        at.session_state[k] = v
    return at.run()


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _warnings(at: AppTest) -> str:
    return "\n".join(w.value for w in at.warning)


# ------------------------------------------------------------------------------ parsing


def test_choice_matches_ignoring_case_and_punctuation_else_warns():
    q = QueryPresets({"model": ["lenet5"], "problem": ["Himmelblau"], "loss": ["hinge"]})
    assert q.choice("model", ["MLP", "LeNet-5", "ResNet"], "MLP") == "LeNet-5"
    assert q.choice("problem", ["rosenbrock", "himmelblau"], "rosenbrock") == "himmelblau"
    assert q.choice("absent", ["a", "b"], "b") == "b"  # not in the URL: the default, no warning
    assert not q.warnings
    assert q.choice("loss", ["mse", "cross_entropy"], "mse", hints={"hinge": "no margin losses"}) == "mse"
    (message,) = q.messages()
    assert message == (
        "URL parameter loss='hinge' is not valid: no margin losses; choose one of mse, cross_entropy. "
        "Showing mse instead."
    )
    assert norm("LeNet-5") == "lenet5" and norm(" Edge of stability ") == "edgeofstability"


def test_choices_lists_all_and_unknown_entries():
    options = ["GD", "Adam", "SAM"]
    q = QueryPresets({"a": ["all"], "b": ["sam,gd"], "c": ["GD", "SAM", "GD"], "d": [""], "e": ["GD,nope"]})
    assert q.choices("a", options, ["GD"]) == options
    assert q.choices("b", options, ["GD"]) == ["SAM", "GD"]  # the order given
    assert q.choices("c", options, ["Adam"]) == ["GD", "SAM"]  # repeated keys, without repeats
    assert q.choices("d", options, ["Adam"]) == []  # an explicit empty selection
    assert not q.warnings
    assert q.choices("e", options, ["Adam"]) == ["GD"]
    assert q.messages() == [
        "URL parameter e='nope' is not valid: choose from GD, Adam, SAM (comma-separated) or all. "
        "Showing GD instead."
    ]
    q = QueryPresets({"e": ["x,y"]})
    assert q.choices("e", options, ["Adam"]) == ["Adam"]  # nothing usable: the default
    assert "Showing Adam instead" in q.messages()[0]


@pytest.mark.parametrize(
    ("value", "kwargs", "expected", "fragment"),
    [
        ("50", {"low": 1, "high": 1000, "integer": True}, 50, None),
        ("5000", {"low": 1, "high": 1000, "integer": True}, 300, "give a whole number from 1 to 1000"),
        ("2.5", {"low": 1, "high": 1000, "integer": True}, 300, "whole number"),
        ("abc", {"low": 1, "high": 1000, "integer": True}, 300, "steps='abc'"),
        ("nan", {"low": 1, "high": 1000}, 300, "give a number from 1 to 1000"),
        ("2", {"low": 0.5, "high": 20, "step": 0.5}, 2.0, None),
        ("2.3", {"low": 0.5, "high": 20, "step": 0.5}, 300, "in steps of 0.5"),
        ("30", {"options": [30, 45, 60]}, 30, None),
        ("50", {"options": [30, 45, 60]}, 300, "choose one of 30, 45, 60"),
    ],
)
def test_number(value, kwargs, expected, fragment):
    q = QueryPresets({"steps": [value]})
    out = q.number("steps", 300, **kwargs)
    assert out == expected and type(out) is type(expected)
    if fragment is None:
        assert not q.messages()
    else:
        (message,) = q.messages()
        assert fragment in message and "Showing 300 instead" in message


def test_flag_unknown_names_and_encoding():
    q = QueryPresets({"moons": ["yes"], "curve": ["maybe"], "colour": ["red"], "size": ["2"]})
    assert q.flag("moons", False) is True
    assert q.flag("curve", True) is True
    assert q.flag("absent", False) is False
    assert q.messages() == [
        "URL parameter curve='maybe' is not valid: give 1 or 0 (true/false). Showing 1 instead.",
        "URL parameter(s) colour, size not used on this page; it reads moons, curve, absent.",
    ]
    assert QueryPresets.encode([1, "a"]) == "1,a" and QueryPresets.encode(2.0) == "2"
    assert QueryPresets.encode(True) == "1" and QueryPresets.encode_choices(["a", "b"], ["a", "b"]) == "all"
    assert QueryPresets.encode_choices(["b", "a"], ["a", "b"]) == "b,a"


# ------------------------------------------------------------------------------ playground


def _himmelblau_gradient(x: float, y: float) -> np.ndarray:
    """Closed form of the gradient of (x^2 + y - 11)^2 + (x + y^2 - 7)^2."""
    a, b = x * x + y - 11, x + y * y - 7
    return np.array([4 * x * a + 2 * b, 2 * a + 4 * y * b])


def test_playground_from_the_url_all_optimizers():
    at = _page("1_Optimizer_playground.py", {"problem": "Himmelblau", "optimizers": "all", "steps": "50"})
    _no_errors(at)
    assert not at.warning, _warnings(at)
    assert at.selectbox(key="problem").value == "himmelblau"
    assert at.multiselect(key="optimizers").value == list(toy.OPTIMIZERS)
    assert at.slider(key="steps_himmelblau").value == 50
    assert list(at.dataframe[0].value["optimizer"]) == list(toy.OPTIMIZERS)
    # GD's end point: 50 steps with the closed-form gradient from the page's start and lr
    lr = at.number_input(key="himmelblau_GD_lr").value
    w = np.array([at.number_input(key="sx_himmelblau").value, at.number_input(key="sy_himmelblau").value])
    for _ in range(50):
        w = w - lr * _himmelblau_gradient(*w)
    contour = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if any(d.get("type") == "contour" for d in json.loads(c.proto.spec)["data"])
    )
    gd = next(d for d in contour["data"] if d.get("name") == "GD")
    np.testing.assert_allclose([_arr(gd["x"])[-1], _arr(gd["y"])[-1]], w, rtol=1e-10)
    # the address bar keeps the selection (in the page's spelling)
    assert at.query_params == {"problem": "himmelblau", "optimizers": "all", "steps": "50"}
    at.multiselect(key="optimizers").set_value(["SAM", "GD"]).run()
    assert at.query_params["optimizers"] == "SAM,GD"


def test_playground_invalid_url_values_warn_and_fall_back():
    query = {"problem": "two_moons", "optimizers": "GD,nope", "steps": "5000", "colour": "red"}
    at = _page("1_Optimizer_playground.py", query)
    _no_errors(at)
    text = _warnings(at)
    assert "problem='two_moons'" in text and "Bayesian view" in text
    assert "choose one of " + ", ".join(toy.playground_problems()[0]) in text
    assert "optimizers='nope'" in text and "choose from " + ", ".join(toy.OPTIMIZERS) in text
    assert "steps='5000'" in text and "from 1 to 1000" in text
    assert "colour not used on this page" in text
    assert at.selectbox(key="problem").value == "gaussian_mixture"
    assert at.multiselect(key="optimizers").value == ["GD"]
    assert at.slider(key="steps_gaussian_mixture").value == 300
    assert at.query_params == {"problem": "gaussian_mixture", "optimizers": "GD", "steps": "300"}


# ------------------------------------------------------------------------------ smoothed objectives


def test_smoothed_from_the_url_and_invalid_values():
    at = _page("2_Smoothed_objectives.py", {"problem": "rosenbrock", "rho": "2", "resolution": "30"})
    _no_errors(at)
    assert not at.warning, _warnings(at)
    assert at.slider(key="smoothed_rho").value == 2.0
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    loss = next(d for d in spec["data"] if d["name"] == "loss")
    xs, ys, z = _arr(loss["x"]), _arr(loss["y"]), _arr(loss["z"])
    assert z.shape == (30, 30)
    # log scale is on for Rosenbrock: 10^z - 10^z' is (1 - x)^2 + 100 (y - x^2)^2 at two grid points
    f = [(1 - xs[k]) ** 2 + 100 * (ys[j] - xs[k] ** 2) ** 2 for j, k in ((3, 4), (20, 25))]
    assert 10 ** z[20, 25] - 10 ** z[3, 4] == pytest.approx(f[1] - f[0], rel=1e-8)
    at = _page("2_Smoothed_objectives.py", {"problem": "nope", "rho": "2.3", "resolution": "50"})
    _no_errors(at)
    text = _warnings(at)
    assert "problem='nope'" in text and "rho='2.3'" in text and "in steps of 0.5" in text
    assert "resolution='50'" in text and "choose one of 30, 45, 60, 90" in text
    assert at.selectbox(key="smoothed_problem").value == "gaussian_mixture"
    assert at.slider(key="smoothed_rho").value == 8.0


# ------------------------------------------------------------------------------ network landscape


def test_network_from_the_url():
    query = {"optimizers": "Adam,SGD", "model": "lenet5", "epochs": "1", "analyses": ""}
    at = _page("4_Network_landscape.py", query, timeout=600)
    _no_errors(at)
    assert not at.warning, _warnings(at)
    assert at.selectbox(key="net_model").value == "LeNet-5" and at.multiselect(key="net_analyses").value == []
    table = at.dataframe[0].value
    assert list(table["optimizer"]) == ["Adam", "SGD"]
    x, y = ls.data.load_digits("test", seed=0, image=True)
    for key, run in at.session_state["trained_runs"].items():
        model = ls.models.model_factory("lenet5-digits", seed=0)
        model.load_state_dict(run.state_dict)
        with torch.no_grad():
            acc = float((model.eval()(x).argmax(1) == y).double().mean())
        assert table[table["optimizer"] == key[0]]["accuracy"].iloc[0] == f"{acc:.4f}"
    assert at.query_params == {"optimizers": "Adam,SGD", "model": "LeNet-5", "epochs": "1", "analyses": ""}


def test_network_invalid_url_values():
    query = {"optimizers": "GD,Adam", "model": "VGG", "epochs": "0", "analyses": "hessian"}
    at = _page("4_Network_landscape.py", query, timeout=600, net_resolution=11, net_hidden=16)
    _no_errors(at)
    text = _warnings(at)
    assert "optimizers='GD'" in text and "choose from " + ", ".join(nw.NETWORK_OPTIMIZERS) in text
    assert "model='VGG'" in text and "choose one of MLP, LeNet-5, ResNet" in text
    assert "epochs='0'" in text and "from 1 to 50" in text
    assert "analyses='hessian'" in text and "surface, spectrum, interpolation, sharpness" in text
    assert at.multiselect(key="net_optimizers").value == ["Adam"]
    assert at.slider(key="net_epochs").value == 8 and at.selectbox(key="net_model").value == "MLP"
    assert at.multiselect(key="net_analyses").value == ["surface"]
    assert list(at.dataframe[0].value["optimizer"]) == ["Adam"]


# ------------------------------------------------------------------------------ monitor and study


def test_monitor_and_study_invalid_url_values():
    at = _page("6_Curvature_monitor.py", {"preset": "eos"})
    _no_errors(at)
    assert "preset='eos'" in _warnings(at) and "choose one of cross_entropy, edge_of_stability" in _warnings(
        at
    )
    assert at.selectbox(key="mon_preset").value == "cross_entropy" and at.slider(key="mon_steps").value == 60
    at = _page("8_Flatness_study.py", {"target": "accuracy"}, study_samples=200)
    _no_errors(at)
    assert "target='accuracy'" in _warnings(at)
    assert "choose one of gap_error, test_error, ood_error" in _warnings(at)
    assert at.selectbox(key="study_target").value == "gap_error"
    assert at.query_params["target"] == "gap_error"
