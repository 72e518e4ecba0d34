"""The dashboard: every page under streamlit's AppTest (defaults and changed widgets), with the
figures' traces asserted from the Plotly JSON, and the page logic against independent numbers."""

from __future__ import annotations

import base64
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from dashboard import toy  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import toy_problems as tp  # noqa: E402


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: a plain list, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return arr.reshape(v["shape"]) if "shape" in v else arr
    return np.asarray(v, dtype=float)


def _types(spec: dict) -> list[str]:
    return [d.get("type", "scatter") for d in spec["data"]]


def _names(spec: dict) -> list[str]:
    return [d.get("name") for d in spec["data"]]


def _run(page: str, timeout: float = 240) -> AppTest:
    at = AppTest.from_file(str(APP / page), default_timeout=timeout).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


# ------------------------------------------------------------------------------------ pages


def test_home_page():
    at = _run("Home.py")
    _no_errors(at)
    assert "sharpscape" in at.title[0].value
    assert any("Optimizer playground" in m.value for m in at.markdown)


def test_playground_defaults_and_changed_widgets():
    at = _run("pages/1_Optimizer_playground.py")
    _no_errors(at)
    charts = _charts(at)
    contour = next(c for c in charts if "contour" in _types(c))
    names = _names(contour)
    for opt in ("GD", "SAM", "FisherSAM"):
        assert opt in names
    assert "SAM neighbourhood" in names and "FisherSAM neighbourhood" in names
    assert any("surface" in _types(c) for c in charts)
    # the contour's paths are the trajectories the logic computes (same start, steps, settings)
    settings = toy.problem_settings("gaussian_mixture")
    runs = toy.run(
        "gaussian_mixture",
        settings["start"],
        settings["steps"],
        [("SAM", toy.hyper_defaults("SAM", "gaussian_mixture"))],
    )
    sam_trace = next(d for d in contour["data"] if d.get("name") == "SAM")
    np.testing.assert_allclose(_arr(sam_trace["x"])[-1], float(runs[0].trajectory.path[-1, 0]), rtol=1e-9)
    # the Fisher-SAM paper's Fig. 2 claim, read off the page's figure: SAM ends in the sharp basin
    # (mu < 0), Fisher-SAM crosses into the flat one (mu > 0)
    fsam_trace = next(d for d in contour["data"] if d.get("name") == "FisherSAM")
    assert _arr(sam_trace["x"])[-1] < 0 < _arr(fsam_trace["x"])[-1]
    # ... and each end point is a minimum (positive-definite Hessian), not the ridge between them
    from toy_problems.figures.fisher_sam import _basin_of

    prob = tp.get("gaussian_mixture")
    for trace, basin in ((sam_trace, "sharp"), (fsam_trace, "flat")):
        end = torch.tensor([_arr(trace["x"])[-1], _arr(trace["y"])[-1]], dtype=torch.float64)
        h = torch.autograd.functional.hessian(lambda t: prob.loss(t), end)
        assert _basin_of(prob, end) == basin and float(torch.linalg.eigvalsh(h).min()) > 1e-4
    # change widgets: another problem, fewer steps, one optimizer
    at.sidebar.selectbox[0].select("himmelblau").run()
    at.multiselect(key="optimizers").set_value(["GD", "SAM"]).run()
    _no_errors(at)
    contour = next(c for c in _charts(at) if "contour" in _types(c))
    assert {"GD", "SAM"} <= set(_names(contour)) and "FisherSAM" not in _names(contour)


def test_playground_start_outside_domain_is_a_message_not_a_traceback():
    at = _run("pages/1_Optimizer_playground.py")
    sigma_input = next(w for w in at.sidebar.number_input if w.key and w.key.startswith("sy_"))
    sigma_input.set_value(-5.0).run()
    assert not at.exception
    assert at.error and "valid region" in at.error[0].value


def test_playground_divergence_is_reported():
    at = _run("pages/1_Optimizer_playground.py")
    at.sidebar.selectbox[0].select("rosenbrock").run()
    at.multiselect(key="optimizers").set_value(["GD"]).run()
    lr = next(w for w in at.sidebar.number_input if w.key and w.key.endswith("_GD_lr"))
    lr.set_value(1.0).run()  # Rosenbrock's curvature is ~2000 near (-1.5, 2): lr = 1 explodes
    assert not at.exception
    assert at.warning and "stopped after" in at.warning[0].value


def test_smoothed_page_has_four_panels_and_rho_slider():
    at = _run("pages/2_Smoothed_objectives.py")
    _no_errors(at)
    spec = _charts(at)[0]
    assert _types(spec) == ["contour"] * 4
    assert _names(spec) == ["loss", "gaussian_smoothed", "worst_case", "sam_first_order"]
    at.sidebar.slider[0].set_value(2.0).run()
    _no_errors(at)
    assert _types(_charts(at)[0]) == ["contour"] * 4


# ------------------------------------------------------------------------------------ logic


def test_neighbourhood_geometry_matches_its_definition():
    prob = tp.get("gaussian_mixture")
    runs = toy.run(
        "gaussian_mixture",
        (5.0, 40.0),
        3,
        [
            ("FisherSAM", {"lr": 1.0, "rho": 2.0, "eta": 1.0}),
            ("SAM", {"lr": 1.0, "rho": 2.0}),
            ("ASAM", {"lr": 1.0, "rho": 0.1, "eta": 0.01}),
        ],
    )
    fsam, sam, asam = runs
    w = fsam.trajectory.path[1]
    pts = torch.as_tensor(toy.neighbourhood(prob, fsam, 1)) - w
    f = prob.fisher(w)  # analytic (1/sigma^2, 2/sigma^2)
    np.testing.assert_allclose(((pts**2) * f).sum(-1).numpy(), 4.0, rtol=1e-10)  # eps^T F eps = rho^2
    pts = torch.as_tensor(toy.neighbourhood(prob, sam, 0)) - sam.trajectory.path[0]
    np.testing.assert_allclose(pts.norm(dim=-1).numpy(), 2.0, rtol=1e-10)
    w = asam.trajectory.path[0]
    pts = torch.as_tensor(toy.neighbourhood(prob, asam, 0)) - w
    np.testing.assert_allclose((pts / (w.abs() + 0.01)).norm(dim=-1).numpy(), 0.1, rtol=1e-10)
    # FisherSAM's actual probe lies on its ellipse
    e = fsam.trajectory.perturbations[1]
    assert math.isclose(float((e**2 * f).sum()), 4.0, rel_tol=1e-8)


def test_hessian_summary_against_closed_form():
    prob = tp.get("himmelblau")
    x, y = 3.0, 2.0  # f = (x^2 + y - 11)^2 + (x + y^2 - 7)^2
    hxx = 12 * x**2 + 4 * y - 42
    hyy = 12 * y**2 + 4 * x - 26
    hxy = 4 * (x + y)
    out = toy.hessian_summary(prob, (x, y))
    np.testing.assert_allclose(out["hessian"], [[hxx, hxy], [hxy, hyy]], rtol=1e-12)
    assert math.isclose(out["trace"], hxx + hyy, rel_tol=1e-12)


def test_run_rejects_bad_inputs():
    with pytest.raises(ValueError, match="valid region"):
        toy.run("gaussian_mixture", (0.0, -1.0), 5, [("SAM", {})])
    with pytest.raises(ValueError, match="outside"):
        toy.run("gaussian_mixture", (0.0, 10.0), 5, [("SAM", {"lr": -1.0})])
    with pytest.raises(ValueError, match="unknown optimizer"):
        toy.run("gaussian_mixture", (0.0, 10.0), 5, [("NoSuch", {})])


def test_smoothed_panels_against_direct_formulas():
    panels = toy.smoothed_panels("ill_conditioned_quadratic", rho=1.0, resolution=9)
    prob = tp.get("ill_conditioned_quadratic")
    xs, ys = panels["xs"], panels["ys"]
    theta = torch.tensor([xs[3], ys[5]], dtype=torch.float64)
    # Gaussian smoothing of a quadratic: L(theta) + (rho^2/p)/2 * Tr(H)
    h = tp.hessian(prob, theta)
    expected = float(prob.loss(theta)) + 0.5 * (1.0 / 2) * float(torch.trace(h))
    assert math.isclose(panels["gaussian_smoothed"][5, 3], expected, rel_tol=1e-9)
    # SAM first-order objective, by hand
    g = tp.gradient(prob, theta)
    expected_d = float(prob.loss(theta + g / (g.norm() + 1e-12)))
    assert math.isclose(panels["sam_first_order"][5, 3], expected_d, rel_tol=1e-9)
    assert np.all(panels["worst_case"] >= panels["loss"] - 1e-12)


def test_bayesian_page_defaults():
    at = _run("pages/3_Bayesian_view.py")
    _no_errors(at)
    charts = _charts(at)
    posterior = charts[0]
    names = _names(posterior)
    assert "exact posterior" in names and "SAM" in names and "MAP" in names
    for method in ("bSAM", "MFVI", "SAM+Laplace", "Laplace at MAP"):
        assert any(n and n.startswith(method + " (") for n in names), method
    boundaries = charts[1]
    # every sampled decision boundary is a line through the origin (the model has no bias)
    for d in boundaries["data"][1:]:
        xs, ys = d["x"], d["y"]
        for i in range(0, len(xs), 3):
            x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
            assert abs(x0 * y1 - x1 * y0) <= 1e-9 * (1 + abs(x0 * y1))
    assert _types(charts[2]).count("contour") == 5  # exact, SAM, SAM+Laplace, bSAM, MFVI
    at.sidebar.slider[0].set_value(0.5).run()  # SAM rho
    _no_errors(at)


@pytest.mark.slow  # about 25 s; two moons is also covered by the slow sweep in test_app_edges
def test_bayesian_page_two_moons():
    at = _run("pages/3_Bayesian_view.py")
    at.sidebar.checkbox[0].check().run()  # two moons
    at.sidebar.slider[4].set_value(10).run()
    _no_errors(at)
    moons = _charts(at)[-1]
    assert _names(moons)[::2] == ["SAM", "bSAM", "SAM+Laplace"]


def test_bayes_distances_and_ellipses_against_direct_computation():
    from dashboard import bayes

    R = bayes.logistic(20)
    rows = {r["method"]: r for r in bayes.distance_rows(R)}
    p_exact = R["maps"]["exact"].double()
    for method in ("SAM", "bSAM", "MFVI"):
        tv = float((R["maps"][method].double() - p_exact).abs().mean())
        assert math.isclose(rows[method]["mean |p - p_exact|"], tv, rel_tol=1e-9)
    fig = bayes.posterior_figure(R, n_std=2.0)
    g = R["gauss"]["bSAM"]
    ell = next(d for d in fig.data if d.name.startswith("bSAM"))
    pts = torch.stack([torch.as_tensor(np.asarray(ell.x)), torch.as_tensor(np.asarray(ell.y))], -1) - g.mean
    maha = torch.einsum("ni,ij,nj->n", pts, torch.linalg.inv(g.cov.double()), pts)
    np.testing.assert_allclose(maha.numpy(), 4.0, rtol=1e-6)  # the 2-sigma ellipse
    with pytest.raises(ValueError, match="unknown method"):
        bayes.logistic(20, {"adam": {"lr": 1.0}})


def _network_app(**state) -> AppTest:
    at = AppTest.from_file(str(APP / "pages/4_Network_landscape.py"), default_timeout=400)
    base = {"net_optimizers": ["SGD", "SAM"], "net_epochs": 1, "net_hidden": 16, "net_resolution": 11}
    for k, v in {**base, **state}.items():
        at.session_state[k] = v
    return at.run()


def _cells(at: AppTest) -> list:
    return [v for t in at.dataframe for col in t.value.columns for v in t.value[col]]


@pytest.mark.slow  # about 90 s on two shared cores
def test_network_page_defaults_and_all_analyses():
    from dashboard import network as nw

    import landscape as ls

    at = _network_app()
    _no_errors(at)
    charts = _charts(at)
    assert _names(charts[0]) == ["SGD", "SAM"]  # training curves
    surfaces = [c for c in charts if "contour" in _types(c)]
    assert len(surfaces) == 2 and all("trajectory" in _names(c) for c in surfaces)
    at.session_state["net_sharp_split"] = "test"
    at.session_state["net_sharp_rho"] = 0.1
    at.session_state["net_sharp_measures"] = ["lambda_max", "worst_case"]
    at.multiselect(key="net_analyses").set_value(["spectrum", "interpolation", "sharpness"]).run()
    _no_errors(at)
    assert not any(c is None or (isinstance(c, float) and math.isnan(c)) for c in _cells(at))
    runs = {k[0]: r for k, r in at.session_state["trained_runs"].items()}
    sgd, sam = runs["SGD"], runs["SAM"]
    charts = _charts(at)
    spectrum = next(c for c in charts if c["layout"].get("yaxis", {}).get("type") == "log")
    assert _names(spectrum) == ["SGD", "SAM"]
    # spectrum table: the smallest eigenvalue is Lanczos' on the same model, the trace Hutchinson's
    table = next(t.value for t in at.dataframe if "smallest eigenvalue" in t.value.columns)
    assert "trace (SLQ)" not in table.columns
    for name, run in (("SGD", sgd), ("SAM", sam)):
        row = table[table["optimizer"] == name].iloc[0]
        h = ls.hessian(nw.objective_of(run))
        low = float(ls.eigenvalues(h, k=1, which="smallest", seed=0).values[0])
        assert math.isclose(float(row["smallest eigenvalue"].split()[0]), low, rel_tol=1e-3)
        assert row["smallest eigenvalue"].endswith("negative") == (low < 0)
        tr = float(ls.trace(h, seed=0).value)
        assert math.isclose(float(row["trace (Hutchinson)"].split(" ± ")[0]), tr, rel_tol=1e-3)
    assert any("Hutchinson" in c.value and "few probe" in c.value for c in at.caption)
    # interpolation: the curve's ends are the two models' training losses
    path = next(
        c for c in charts if c["layout"].get("xaxis", {}).get("title", {}).get("text", "").startswith("t")
    )
    x, y = nw.data_of(sgd, "train")
    loss = _arr(path["data"][0]["y"])
    with torch.no_grad():
        la = float(torch.nn.functional.cross_entropy(nw.model_of(sgd)(x), y))
        lb = float(torch.nn.functional.cross_entropy(nw.model_of(sam)(x), y))
    np.testing.assert_allclose([loss[0], loss[-1]], [la, lb], rtol=1e-5)
    # sharpness: the chosen measures on the test split with rho 0.1
    sharp = next(t.value for t in at.dataframe if "measure" in t.value.columns)
    assert set(sharp["measure"]) == {"lambda_max", "worst_case"}
    assert all("0.1" in o for o in sharp[sharp["measure"] == "worst_case"]["options"])
    v = float(sharp[(sharp["optimizer"] == "SGD") & (sharp["measure"] == "lambda_max")]["value"].iloc[0])
    top = float(ls.eigenvalues(ls.hessian(nw.objective_of(sgd, "test")), k=1, seed=0).values[0])
    assert math.isclose(v, top, rel_tol=1e-3)


def test_network_page_diverging_run_warns_and_seeds_give_error_bars():
    at = AppTest.from_file(str(APP / "pages/4_Network_landscape.py"), default_timeout=400)
    for k, v in {"net_optimizers": ["SGD"], "net_epochs": 1, "net_hidden": 16, "net_seeds": 2}.items():
        at.session_state[k] = v
    at.session_state["net_analyses"] = []
    at.run()
    next(w for w in at.number_input if w.label == "SGD: lr").set_value(10.0).run()
    _no_errors(at)
    warnings = [w.value for w in at.warning]
    assert any("SGD" in w and "diverged" in w and "seed 0" in w for w in warnings), warnings
    runs = sorted(
        (r for k, r in at.session_state["trained_runs"].items() if k[1] == 10.0),
        key=lambda r: r.config["seed"],
    )
    assert [r.config["seed"] for r in runs] == [0, 1]
    acc = np.array([r.test["accuracy"] for r in runs])
    row = at.dataframe[0].value.iloc[0]
    assert row["seeds"] == 2
    assert row["accuracy"] == f"{acc.mean():.4f} ± {acc.std(ddof=1):.4f}"


def test_network_models_and_table_cells():
    from dashboard import network as nw
    from dashboard import network_text as nt

    import landscape as ls

    for arch, (name, _, image) in nw.ARCHITECTURES.items():
        assert name in ls.models.available_models()
        model = nw.make_model(16, 0, arch)
        x, _ = nw.digits(0, image)[1]
        assert model(x[:3]).shape == (3, 10), arch
    with pytest.raises(ValueError, match="unknown model"):
        nw.make_model(16, 0, "VGG")
    assert nt.cell(None) == "—" and nt.cell(float("nan")) == "—" and nt.cell(0.123456) == "0.1235"
    with pytest.raises(ValueError, match="unknown sharpness measure"):
        nt.sharpness_measures(["nope"])
    assert dict(nt.sharpness_measures(["worst_case"], 0.2))["worst_case"]["rho"] == 0.2


def test_network_logic_against_dense_hessian_and_plain_evaluation():
    from dashboard import network as nw
    from dashboard import network_analyses as na

    from tests import references as ref

    run = nw.train_network("SGD", epochs=1, hidden=8, record_every=5)
    model = nw.model_of(run)
    x, y = nw.digits(0)[0]
    # surface: the centre is the trained model; a random cell equals a plain evaluation
    s, path = na.surface_of(run, kind="random", resolution=5)
    i0, j0 = int(np.argmin(np.abs(s.xs))), int(np.argmin(np.abs(s.ys)))
    with torch.no_grad():
        centre = float(torch.nn.functional.cross_entropy(model(x), y))
    assert math.isclose(float(s.loss[i0, j0]), centre, rel_tol=1e-5)
    # spectrum: top eigenvalues equal the dense float64 Hessian's
    sp = na.spectrum_of(run, k=3, runs=2, lanczos_steps=10)
    m64 = nw.model_of(run).double()
    h = ref.dense_hessian(m64, torch.nn.CrossEntropyLoss(), [(x.double(), y)])
    top = torch.linalg.eigvalsh(h).flip(0)[:3]
    np.testing.assert_allclose(sp["eigenvalues"], top.numpy(), rtol=1e-4)
    assert all(sp["converged"])
    # the PCA plane contains the trajectory's end point at the origin
    s2, path2 = na.surface_of(run, kind="pca", resolution=5)
    np.testing.assert_allclose(path2[-1], 0.0, atol=1e-12)
