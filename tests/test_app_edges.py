"""The dashboard at its edges: every page with every problem, model and optimizer option (alone and
all at once) runs without an exception or an error box and shows the numbers computed here
independently (update rules written out, optimizers built directly, models evaluated on the test
split, losses at grid points); problems a page cannot draw are not offered, and an uploaded file
that is not a surface gets a message naming that file.

The exhaustive single-optimizer sweeps and the ResNet are marked ``slow``; the default run keeps
every problem with all optimizers selected at once (which runs every problem-optimizer pair), every
network optimizer in one selection and LeNet-5."""

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
from dashboard.toy.endpoints import KINDS  # noqa: E402
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


def _contour_traces(at: AppTest) -> dict[str, dict]:
    for c in at.get("plotly_chart"):
        spec = json.loads(c.proto.spec)
        if any(d.get("type") == "contour" for d in spec["data"]):
            return {d.get("name"): d for d in spec["data"]}
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


def _grad(prob, x: torch.Tensor) -> torch.Tensor:
    x = x.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(prob.loss(x, check=False), x)
    return g


def _step_by_hand(name: str, prob, x: torch.Tensor, h: dict) -> torch.Tensor:
    """One step of GD, SAM (Foret et al. 2021, eq. 2) or ASAM (Kwon et al. 2021, T = |w| + eta)
    from ``x``, written out here."""
    g = _grad(prob, x)
    if name == "SAM":
        g = _grad(prob, x + h["rho"] * g / (g.norm() + 1e-12))
    elif name == "ASAM":
        t = x.abs() + h["eta"]
        g = _grad(prob, x + h["rho"] * t**2 * g / ((t * g).norm() + 1e-12))
    return x - h["lr"] * g


def _adam(prob, start: torch.Tensor, steps: int, h: dict) -> torch.Tensor:
    p = torch.nn.Parameter(start.clone())
    opt = torch.optim.Adam([p], lr=h["lr"])
    for _ in range(steps):
        opt.zero_grad()
        prob.loss(p, check=False).backward()
        opt.step()
    return p.detach()


def _page_setting(at: AppTest, problem: str, chosen: list[str]):
    start = torch.tensor(
        [at.number_input(key=f"sx_{problem}").value, at.number_input(key=f"sy_{problem}").value],
        dtype=torch.float64,
    )
    hypers = {
        n: {h.name: at.number_input(key=f"{problem}_{n}_{h.name}").value for h in toy.OPTIMIZERS[n].hypers}
        for n in chosen
    }
    return start, int(at.slider(key=f"steps_{problem}").value), hypers


def _library_run(name: str, prob, start: torch.Tensor, steps: int, h: dict) -> torch.Tensor:
    """The end point of ``name`` built from the ``optimizers`` package directly (not the page's
    catalogue), run by ``toy_problems.run_trajectory``."""
    import optimizers as o

    sgd = torch.optim.SGD
    fisher = (lambda p: prob.fisher(p.detach())) if hasattr(prob, "fisher") else None
    build = {
        "GD": lambda p: sgd(p, lr=h["lr"]),
        "Adam": lambda p: torch.optim.Adam(p, lr=h["lr"]),
        "SAM": lambda p: o.SAM(p, sgd, rho=h["rho"], lr=h["lr"]),
        "ASAM": lambda p: o.ASAM(p, sgd, rho=h["rho"], eta=h["eta"], lr=h["lr"], scale_all=True),
        "FisherSAM": lambda p: o.FisherSAM(p, sgd, rho=h["rho"], eta=h["eta"], lr=h["lr"], fisher=fisher),
        "RandomSAM": lambda p: o.RandomSAM(p, sgd, rho=h["rho"], lr=h["lr"], seed=0),
        "MixSAM": lambda p: o.MixSAM(p, sgd, rho=h["rho"], kappa=h["kappa"], lr=h["lr"], seed=0),
        "BayesianSAM": lambda p: o.BayesianSAM(
            p,
            lr=h["lr"],
            num_data=int(getattr(prob, "num_data", 100)),
            rho=h["rho"],
            prior_precision=h["prior_precision"],
            seed=0,
        ),
        "SGDTracer": lambda p: o.SGDTracer(
            p, lr=h["lr"], rho=h["rho"], delta=h["delta"], hvp="finite_difference"
        ),
    }[name]
    return tp.run_trajectory(prob, build, start, steps).path[-1]


def _sweep_playground(problem: str, selections: list[list[str]], library: bool = False) -> None:
    """Each selection on the page: no exception, error or warning; one table row per run; each
    plotted GD/SAM/ASAM step is the update written out here, Adam's end point torch's Adam run here,
    and with ``library`` every end point is the ``optimizers`` package run directly; the table's final
    loss and Hessian trace are the problem's loss and autograd Hessian at the plotted end point."""
    prob = tp.get(problem)
    at = _app("pages/1_Optimizer_playground.py", problem=problem, optimizers=selections[0])
    for i, chosen in enumerate(selections):
        if i:
            at.multiselect(key="optimizers").set_value(chosen).run()
        _clean(at, (problem, chosen))
        # the per-problem defaults are stable: no run diverges or leaves the plot
        assert not at.warning, (problem, chosen, [w.value for w in at.warning])
        rows = at.dataframe[0].value
        allowed = set(KINDS) - {"diverged"}
        assert set(rows["status"]) <= allowed, (problem, chosen)  # classified, none diverged
        assert list(rows["optimizer"]) == chosen, (problem, chosen)  # one row per run
        traces = _contour_traces(at)
        assert set(chosen) <= set(traces), (problem, chosen)
        start, steps, hypers = _page_setting(at, problem, chosen)
        for name in chosen:
            end = torch.tensor(
                [_arr(traces[name]["x"])[-1], _arr(traces[name]["y"])[-1]], dtype=torch.float64
            )
            if library:
                expected = _library_run(name, prob, start, steps, hypers[name])
                np.testing.assert_array_equal(end.numpy(), expected.numpy(), err_msg=name)
            elif name == "Adam":
                expected = _adam(prob, start, steps, hypers[name])
                np.testing.assert_array_equal(end.numpy(), expected.numpy(), err_msg=name)
            elif name in ("GD", "SAM", "ASAM"):
                # every plotted step is the update rule applied to the point before it (step by step:
                # a whole re-run would amplify rounding differences on the steep problems)
                path = torch.tensor(np.stack([_arr(traces[name][c]) for c in "xy"], -1), dtype=torch.float64)
                assert len(path) == steps + 1 and torch.equal(path[0], start), name
                for k in range(steps):
                    want = _step_by_hand(name, prob, path[k], hypers[name])
                    np.testing.assert_allclose(path[k + 1], want, rtol=1e-9, atol=1e-12, err_msg=(name, k))
            row = rows[rows["optimizer"] == name].iloc[0]
            assert float(row["final loss"]) == pytest.approx(float(prob.loss(end)), rel=5e-4, abs=1e-12)
            h = torch.autograd.functional.hessian(lambda t: prob.loss(t, check=False), end)
            assert float(row["Hessian trace"]) == pytest.approx(float(torch.trace(h)), rel=5e-4, abs=1e-9)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_playground_every_problem_with_all_optimizers_at_once(problem):
    _sweep_playground(problem, [OPTIMIZERS])


@pytest.mark.slow
@pytest.mark.parametrize("problem", PROBLEMS)
def test_playground_every_problem_with_every_single_optimizer(problem):
    _sweep_playground(problem, [[name] for name in OPTIMIZERS], library=True)


# ------------------------------------------------------------------------------ smoothed objectives


def _sam_objective(prob, theta: torch.Tensor, rho: float) -> float:
    """SAM's first-order objective L(theta + rho g / ||g||) (Foret et al. 2021, eq. 2)."""
    g = _grad(prob, theta)
    return float(prob.loss(theta + rho * g / (g.norm() + 1e-12), check=False))


def test_smoothed_page_every_problem():
    """Every problem (the log-scale box alternating): four panels, and the loss and SAM panels are
    the problem's loss and SAM objective evaluated here at grid points (through log10(v + shift)
    on log scale, where differences of 10^z are differences of v)."""
    at = _app("pages/2_Smoothed_objectives.py", smoothed_resolution=30)
    options = at.selectbox(key="smoothed_problem").options
    assert options == PROBLEMS
    rho = at.slider(key="smoothed_rho").value
    for i, problem in enumerate(options):
        log = i % 2 == 0
        at.checkbox(key="smoothed_log").set_value(log)
        at.selectbox(key="smoothed_problem").select(problem).run()
        _clean(at, problem)
        spec = json.loads(at.get("plotly_chart")[0].proto.spec)
        assert [d["type"] for d in spec["data"]] == ["contour"] * 4, problem
        prob = tp.get(problem)
        for panel, value in (
            ("loss", lambda t, prob=prob: float(prob.loss(t, check=False))),
            ("sam_first_order", lambda t, prob=prob: _sam_objective(prob, t, rho)),
        ):
            trace = next(d for d in spec["data"] if d["name"] == panel)
            xs, ys, z = _arr(trace["x"]), _arr(trace["y"]), _arr(trace["z"])
            points = [(j, k) for j, k in ((5, 7), (15, 15), (24, 3)) if np.isfinite(z[j, k])]
            assert len(points) >= 2, (problem, panel)
            direct = [value(torch.tensor([xs[k], ys[j]], dtype=torch.float64)) for j, k in points]
            shown = [10 ** z[j, k] if log else z[j, k] for j, k in points]
            scale = max(abs(v) for v in direct)
            for a_, b_ in zip(shown[1:], direct[1:]):
                assert a_ - shown[0] == pytest.approx(b_ - direct[0], rel=1e-6, abs=1e-9 * scale), (
                    problem,
                    panel,
                )
            if not log:
                assert shown == pytest.approx(direct, rel=1e-9, abs=1e-12), (problem, panel)


# ------------------------------------------------------------------------------ Bayesian view


@pytest.mark.slow
def test_bayesian_page_with_two_moons():
    at = _app("pages/3_Bayesian_view.py", bayes_resolution=30)
    _clean(at, "default")
    at.checkbox(key="show_moons").check().run()
    at.slider(key="moons_epochs").set_value(10).run()
    _clean(at, "two moons")


# ------------------------------------------------------------------------------ network page


def _network(chosen: list[str], **state) -> AppTest:
    base = {"net_epochs": 1, "net_hidden": 16, "net_resolution": 11}
    return _app("pages/4_Network_landscape.py", timeout=600, net_optimizers=chosen, **{**base, **state})


def _check_network_numbers(
    at: AppTest, chosen: list[str], arch: str = "MLP", retrain: tuple = ("SGD",)
) -> None:
    """The test-metrics table is each trained model evaluated here on the test split; the optimizers
    in ``retrain`` are trained again here with ``landscape.models.train`` and the optimizer built
    directly, and must give the page's weights bit for bit."""
    import optimizers as o

    table = at.dataframe[0].value
    assert list(table["optimizer"]) == chosen
    runs = {k[0]: r for k, r in at.session_state["trained_runs"].items() if k[0] in chosen}
    image = nw.ARCHITECTURES[arch][2]
    x_test, y_test = ls.data.load_digits("test", seed=0, image=image)
    for name in chosen:
        model = nw.make_model(16, 0, arch)
        model.load_state_dict(runs[name].state_dict)
        with torch.no_grad():
            acc = float((model.eval()(x_test).argmax(1) == y_test).double().mean())
        row = table[table["optimizer"] == name].iloc[0]
        assert row["accuracy"] == f"{acc:.4f}", (name, row["accuracy"], acc)
    factories = {
        "SGD": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "Adam": lambda p: torch.optim.Adam(p, lr=0.003),
        "SAM": lambda p: o.SAM(p, torch.optim.SGD, rho=0.05, lr=0.05, momentum=0.9),
    }
    data = ls.data.load_digits("train", seed=0, image=image)
    for name in retrain:
        model = nw.make_model(16, 0, arch)
        ls.models.train(model, data, factories[name], epochs=1, batch_size=64, seed=0)
        for k, v in model.state_dict().items():
            assert torch.equal(v, runs[name].state_dict[k]), (name, k)


def test_network_page_all_optimizers_at_once():
    names = list(nw.NETWORK_OPTIMIZERS)
    at = _network(names)
    _clean(at, "all")
    training = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [d["name"] for d in training["data"]] == names
    _check_network_numbers(at, names, retrain=("SGD", "SAM", "Adam"))
    # one surface per optimizer; the caption's centre loss is the model's training loss
    x, y = ls.data.load_digits("train", seed=0)
    centres = [c.value for c in at.caption if c.value.startswith("centre loss")]
    assert len(centres) == len(names)
    runs = {k[0]: r for k, r in at.session_state["trained_runs"].items()}
    for name, caption in zip(names, centres):
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(nw.model_of(runs[name])(x), y))
        assert float(caption.split()[2].rstrip(";")) == pytest.approx(loss, rel=1e-3), name


@pytest.mark.parametrize(
    "arch",
    [a if a != "ResNet" else pytest.param(a, marks=pytest.mark.slow) for a in nw.ARCHITECTURES if a != "MLP"],
)
def test_network_page_every_model(arch):
    """The other models (the MLP is the default above): trained on the page, evaluated here."""
    at = _network(["SGD"], net_model=arch, net_analyses=[])
    _clean(at, arch)
    _check_network_numbers(at, ["SGD"], arch)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(nw.NETWORK_OPTIMIZERS))
def test_network_page_every_single_optimizer(name):
    at = _network([name])
    _clean(at, name)
    _check_network_numbers(at, [name], retrain=(name,) if name in ("SGD", "SAM", "Adam") else ())


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
