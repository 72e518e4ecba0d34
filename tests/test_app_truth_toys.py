"""Issue 29 on the toy pages (Home, playground, smoothed objectives, Bayesian view, paths): every end
point is classified from its gradient and Hessian, every count and conclusion rests on the numbers
shown (and is not printed when its condition fails), every estimate carries its uncertainty, and the
home page's snippet and links work. Each test checks numbers or text against an independent
computation (closed forms, finite differences, the figures' own code)."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from dashboard import bayes, toy  # noqa: E402
from dashboard import paths_view as pv  # noqa: E402
from dashboard.query import PRESETS, preset_url  # noqa: E402
from dashboard.toy import endpoints, minima, posteriors  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import landscape as ls  # noqa: E402
import toy_problems as tp  # noqa: E402


def _fd_grad(f, x: torch.Tensor, h: float = 1e-5) -> torch.Tensor:
    e = torch.eye(len(x), dtype=x.dtype)
    return torch.stack([(f(x + h * e[i]) - f(x - h * e[i])) / (2 * h) for i in range(len(x))])


def _fd_hessian(f, x: torch.Tensor, h: float = 1e-4) -> torch.Tensor:
    e = torch.eye(len(x), dtype=x.dtype)
    return torch.stack(
        [(_fd_grad(f, x + h * e[i]) - _fd_grad(f, x - h * e[i])) / (2 * h) for i in range(len(x))]
    )


# ------------------------------------------------------------------------------ end points (toy)


def test_himmelblau_points_are_classified_from_gradient_and_hessian():
    prob = tp.get("himmelblau")
    # where ASAM ends with the defaults: both eigenvalues negative, far from any minimum
    e = toy.classify_point(prob, (-1.214, 0.7207))
    assert e.kind == "not converged" and not e.is_minimum
    assert e.eigenvalues == pytest.approx([-25.6, -20.5], abs=0.1)
    # the closed-form minimum (3, 2): f = 0, gradient 0, Hessian [[74, 20], [20, 34]]
    e = toy.classify_point(prob, (3.0, 2.0))
    assert e.kind == "minimum" and e.grad_norm == 0.0
    assert sorted(e.eigenvalues) == pytest.approx(sorted(np.linalg.eigvalsh([[74, 20], [20, 34]])), rel=1e-12)
    # its local maximum and a saddle point (Newton-polished here from the literature's values)
    f = lambda t: prob.loss(t)  # noqa: E731
    for start, kind in (((-0.270845, -0.923039), "maximum"), ((-3.073026, -0.081353), "saddle point")):
        t = torch.tensor(start, dtype=torch.float64)
        for _ in range(20):
            t = t - torch.linalg.solve(_fd_hessian(f, t), _fd_grad(f, t))
        assert toy.classify_point(prob, t).kind == kind, start
    # near a minimum: SAM's fixed point next to (3, 2)
    e = toy.classify_point(prob, (3.073, 2.069))
    assert e.kind == "near a minimum" and e.nearest == pytest.approx((3.0, 2.0), abs=1e-9)
    assert e.distance == pytest.approx(math.hypot(0.073, 0.069), rel=1e-6)
    assert toy.classify_point(prob, (3.0, 2.0), diverged=True).kind == "diverged"


def _check_rows_against_autograd(prob, runs, rows):
    """Every row's class follows from the gradient and Hessian computed here."""
    width = endpoints.box_width(prob)
    for r, row in zip(runs, rows):
        end = r.trajectory.path[-1]
        g = tp.gradient(prob, end)
        ev, vecs = torch.linalg.eigh(tp.hessian(prob, end))
        newton = float((vecs @ ((vecs.T @ g) / ev)).norm())
        status = row["status"].split(" (")[0]
        if status == "minimum":
            assert newton <= 1e-3 * width and float(ev.min()) > 0, row
        elif status == "near a minimum":
            assert newton > 1e-3 * width and float(ev.min()) > 0, row
        elif status == "not converged":
            assert newton > 1e-3 * width, row
        if float(ev.min()) < 0:  # a negative eigenvalue is never called a minimum
            assert status not in ("minimum", "near a minimum"), row


@pytest.mark.parametrize("problem", ["himmelblau", "rosenbrock"])
def test_playground_table_never_calls_a_non_minimum_a_minimum(problem):
    prob = tp.get(problem)
    s = toy.problem_settings(problem)
    runs = toy.run(
        problem, s["start"], s["steps"], [(n, toy.hyper_defaults(n, problem)) for n in toy.OPTIMIZERS]
    )
    rows = toy.end_rows(prob, runs)
    _check_rows_against_autograd(prob, runs, rows)
    assert "ok" not in {r["status"] for r in rows}
    summary = toy.end_summary(prob, runs)
    negative = [r["optimizer"] for r in rows if r["Hessian eigenvalues"].startswith("-")]
    if problem == "himmelblau":
        asam = next(r for r in rows if r["optimizer"] == "ASAM")
        assert asam["status"] == "not converged" and asam["Hessian eigenvalues"] == "-25.6, -20.5"
        assert "**ASAM** ends at a point that is not a minimum" in summary
        assert next(r for r in rows if r["optimizer"] == "GD")["status"] == "minimum"
    else:
        assert len(negative) == 6  # the reviewer's count: 6 of 9 runs end with a negative eigenvalue
    for name in negative:
        assert f"**{name}** ends at a point that is not a minimum" in summary
    counted = sum(int(part.split()[0]) for part in summary.split(": ", 1)[1].split(".")[0].split(", "))
    assert counted == len(runs)


def test_playground_progress_overlaps_and_line_styles():
    seen = []
    configs = [("GD", {"lr": 0.01}), ("SGDTracer", {"lr": 0.01}), ("SAM", {"lr": 0.01, "rho": 0.3})]
    runs = toy.run("himmelblau", (0.0, 0.0), 40, configs, progress=lambda f, what: seen.append((f, what)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 10
    assert any("SAM, step 40 of 40" in w for _, w in seen)
    prob = tp.get("himmelblau")
    # GD and SGDTracer (rho = 0.05 curvature penalty) follow one path within 0.5% of the width
    gap = float((runs[0].trajectory.path - runs[1].trajectory.path).norm(dim=-1).max())
    assert gap <= 0.005 * 10
    assert toy.path_overlaps(prob, runs) == [["GD", "SGDTracer"]]
    assert "GD, SGDTracer" in toy.overlap_note(prob, runs)
    # each run its own dash and marker, and earlier runs wider (visible around later ones)
    fig = toy.contour_figure(prob, runs)
    paths = [d for d in fig.data if d.name in ("GD", "SGDTracer", "SAM")]
    assert len({d.line.dash for d in paths}) == 3 and len({d.marker.symbol for d in paths}) == 3
    widths = [d.line.width for d in paths]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    curves = toy.loss_curves_figure(runs, prob=prob)
    assert len({d.marker.symbol for d in curves.data}) == 3
    assert [d.line.width for d in curves.data] == widths
    # the 3-D axis titles: the camera stands further back than plotly's default (1.25, 1.25, 1.25)
    eye = toy.surface_figure(prob, runs).layout.scene.camera.eye
    assert math.hypot(eye.x, eye.y, eye.z) > math.sqrt(3 * 1.25**2)


def test_playground_page_shows_classes_and_thresholds():
    at = AppTest.from_file(str(APP / "pages/1_Optimizer_playground.py"), default_timeout=300)
    at.query_params["problem"] = "himmelblau"
    at.query_params["optimizers"] = "GD,SAM,ASAM"
    at.run()
    assert not at.exception and not at.error
    table = at.dataframe[0].value
    assert list(table["status"]) == ["minimum", "near a minimum", "not converged"]
    text = "\n".join(m.value for m in at.markdown)
    assert "**ASAM** ends at a point that is not a minimum" in text
    assert "Of 3 runs: 1 at a minimum, 1 near a minimum, 1 not converged." in text
    caption = "\n".join(c.value for c in at.caption)
    assert "0.001 W = 0.01" in caption and "0.05 W = 0.5" in caption


# ------------------------------------------------------------------------------ smoothed objectives


def test_rosenbrock_rho_2_has_one_minimum_per_smooth_panel_not_22():
    panels = toy.smoothed_panels("rosenbrock", 2.0, resolution=45)
    m = panels["minima"]
    assert m["loss"]["candidates"] == 22  # the grid artefacts the page used to count
    assert len(m["loss"]["points"]) == 1 and m["loss"]["points"][0] == pytest.approx([1.0, 1.0], abs=1e-9)
    # smoothed Rosenbrock, eps ~ N(0, s2 I), s2 = rho^2/2 = 2, in closed form:
    # (1-x)^2 + s2 + 100 [(y - x^2 - s2)^2 + 4 x^2 s2 + 2 s2^2 + s2]: minimum x = 1/(1 + 400 s2), y = x^2 + s2
    s2 = 2.0
    x = 1 / (1 + 400 * s2)
    (point,) = m["gaussian_smoothed"]["points"]
    assert point == pytest.approx([x, x * x + s2], abs=1e-8)
    # independent check with the library's own (no-grad) smoothing: zero gradient, positive Hessian
    prob = tp.get("rosenbrock")
    f = lambda t: tp.gaussian_smoothed(prob, t[None], 2.0, n_quad=24)[0]  # noqa: E731
    t = torch.tensor(point, dtype=torch.float64)
    assert float(_fd_grad(f, t).norm()) < 1e-4
    assert float(torch.linalg.eigvalsh(_fd_hessian(f, t)).min()) > 0
    text = toy.smoothed_summary(panels)
    assert "**A** 1 ((1, 1), value 0); **B** 1 ((0.00125, 2), value 1e+03)" in text
    assert "22" not in text.split("starts")[1] and "C and D are not counted" in text


def test_smoothed_minima_are_distinct_stationary_and_positive_definite():
    panels = toy.smoothed_panels("himmelblau", 2.0, resolution=30)
    prob = tp.get("himmelblau")
    found = panels["minima"]["loss"]["points"]
    assert len(found) == 4  # Himmelblau's four minima, each found once
    for p in found:
        assert min(np.hypot(*(np.asarray(m.theta) - p)) for m in prob.minima) < 1e-8
    for key in ("loss", "gaussian_smoothed"):
        pts = panels["minima"][key]["points"]
        f = minima.gaussian_smoothing(prob, 2.0, panels["n_quad"]) if key != "loss" else prob.loss
        for p in pts:
            t = torch.tensor(p, dtype=torch.float64)
            assert (
                float(_fd_grad(f, t).norm()) < 1e-4
                and float(torch.linalg.eigvalsh(_fd_hessian(f, t)).min()) > 0
            )
        d = [np.hypot(*(a - b)) for i, a in enumerate(pts) for b in pts[i + 1 :]]
        assert min(d, default=1.0) > 1e-2


def test_rastrigin_smoothing_counts_only_minima_stable_under_quadrature_refinement():
    # at rho = 2 the 24-node rule is off by ~12: the panel is refined to 48 nodes and has one minimum
    panels = toy.smoothed_panels("rastrigin", 2.0, resolution=30)
    assert panels["n_quad"] == 48
    (p,) = panels["minima"]["gaussian_smoothed"]["points"]
    assert p == pytest.approx([0.0, 0.0], abs=1e-9)
    assert len(panels["minima"]["loss"]["points"]) == 121  # one near every lattice point: real minima
    assert panels["uncertainty"]["gaussian_smoothed"] < 1e-3 * np.nanmax(panels["gaussian_smoothed"])
    # the Gaussian mixture at rho = 8: the sharp side's quadrature minima move when the nodes double
    panels = toy.smoothed_panels("gaussian_mixture", 8.0, resolution=30)
    m = panels["minima"]["gaussian_smoothed"]
    assert m["unstable"] >= 1 and all(p[0] > 0 for p in m["points"])
    text = toy.smoothed_summary(panels)
    assert "when the nodes double (quadrature error, not counted)" in text
    assert f"({len(m['points'])} in B against 2 in A)" in text


def test_smoothed_estimates_state_their_uncertainty():
    panels = toy.smoothed_panels("himmelblau", 1.0, resolution=12)
    prob = tp.get("himmelblau")
    xs, ys, theta = prob.grid(12)
    sub = theta[::3, ::3]
    fine = tp.worst_case_ball(prob, sub, 1.0, n_radii=16, n_angles=128)
    coarse = torch.as_tensor(panels["worst_case"][::3, ::3])
    # the 8 x 64 search points are among the 16 x 128 ones: the finer maximum is never lower
    assert bool((fine >= coarse - 1e-12).all())
    assert panels["uncertainty"]["worst_case"] == pytest.approx(float((fine - coarse).max()), rel=1e-12)
    text = toy.smoothed_summary(panels)
    assert "**B** is an estimate: Gauss-Hermite quadrature with 24 x 24 nodes" in text
    assert "**C** is an estimate: dense search of 8 radii x 64 directions" in text


# ------------------------------------------------------------------------------ Bayesian view


def test_logistic_progress_and_numbers_equal_the_figures():
    from toy_problems import figures

    seen = []
    R = bayes.logistic(20, {"sam": {"rho": 0.5}}, progress=lambda f, what: seen.append((f, what)))
    ref = figures.logistic_results(20, overrides={"sam": {"rho": 0.5}})
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and len(fractions) > 20
    assert any("bSAM, step 1000 of 1000" in w for _, w in seen)
    assert torch.equal(R["w_sam"], ref["w_sam"])
    for k in ref["maps"]:
        assert torch.equal(R["maps"][k], ref["maps"][k]), k
    for k in ref["gauss"]:
        assert torch.equal(R["gauss"][k].mean, ref["gauss"][k].mean) and torch.equal(
            R["gauss"][k].cov, ref["gauss"][k].cov
        )
    # every run's end point classified on the loss
    assert set(R["end_points"]) == {"SAM", "bSAM", "MFVI"}
    e = R["end_points"]["SAM"]
    assert e.point == pytest.approx(tuple(ref["w_sam"].tolist()))
    assert e.grad_norm == pytest.approx(float(tp.gradient(R["prob"], ref["w_sam"]).norm()), rel=1e-9)


def test_distance_table_shows_a_dash_with_a_footnote_not_none():
    R = bayes.logistic(20)
    table = bayes.distance_table(R)
    cells = [v for row in table for v in row.values()]
    assert None not in cells and "None" not in cells
    sam = next(r for r in table if r["method"] == "SAM")
    assert sam["det Σ / det Σ_exact"] == "—" and sam["‖mean − exact mean‖"] == "—"
    raw = {r["method"]: r for r in bayes.distance_rows(R)}
    bsam = next(r for r in table if r["method"] == "bSAM")
    assert bsam["det Σ / det Σ_exact"] == f"{raw['bSAM']['det Σ / det Σ_exact']:.4g}"
    note = bayes.distance_footnote(R)
    assert note.startswith("—: SAM and MAP are point estimates without a covariance")
    assert f"{R['post'].boundary_mass:.2g}" in note


def _moons(acc_sam: float, acc_bsam: float, ent_sam: float, ent_bsam: float, std: float) -> dict:
    return {
        "entropy": {"SAM": ent_sam, "bSAM": ent_bsam, "SAM+Laplace": 0.5},
        "fit": {"SAM": (acc_sam, 0.1), "bSAM": (acc_bsam, 0.1), "SAM+Laplace": (acc_sam, 0.3)},
        "entropy_mc": {"values": [ent_bsam] * 5, "std": std, "samples": 32},
        "epochs": 40,
    }


def test_two_moons_conclusion_only_when_its_conditions_hold():
    underfit = bayes.moons_findings(_moons(0.89, 0.90, 0.2, 0.3, 0.001))
    assert "No conclusion about bSAM yet" in underfit and "SAM fits 89.0%" in underfit
    assert "model average is" not in underfit and "equally uncertain" not in underfit
    fitted = bayes.moons_findings(_moons(1.0, 1.0, 0.03, 0.13, 0.006))
    assert "bSAM's model average is more uncertain than SAM's point estimate (difference 0.1" in fitted
    within = bayes.moons_findings(_moons(1.0, 1.0, 0.100, 0.105, 0.006))
    assert "equally uncertain within bSAM's Monte-Carlo error" in within and "model average is" not in within


def test_two_moons_reports_fit_end_points_and_monte_carlo_error():
    from toy_problems import figures

    seen = []
    M = bayes.two_moons(resolution=10, epochs=3, progress=lambda f, what: seen.append(f))
    assert seen == sorted(seen) and seen[-1] == 1.0
    ref = figures.moons_results(10, 3)
    for k in ref["maps"]:
        assert torch.equal(M["maps"][k], ref["maps"][k]), k
    X, y = M["data"]
    with torch.no_grad():
        acc = float(((M["models"]["SAM"](X).squeeze(-1) > 0).double() == y).double().mean())
    assert M["fit"]["SAM"][0] == pytest.approx(acc, abs=1e-12)
    rows = {r["method"]: r for r in bayes.moons_rows(M)}
    assert rows["SAM"]["training accuracy"] == f"{100 * acc:.1f}%"
    assert "±" in rows["bSAM"]["mean entropy (nats)"]
    assert M["entropy_mc"]["std"] > 0 and len(M["entropy_mc"]["values"]) == posteriors.MC_REPEATS
    assert {r["network end point"] for r in rows.values()} <= set(endpoints.KINDS)
    if min(a for a, _ in M["fit"].values()) < posteriors.MOONS_FIT_ACCURACY:
        assert "No conclusion about bSAM yet" in bayes.moons_findings(M)


def test_bayes_page_defaults_train_until_the_conclusion_holds():
    page = (APP / "pages" / "3_Bayesian_view.py").read_text()
    tree = ast.parse(page)

    def is_epochs(n: ast.AST) -> bool:
        keys = [getattr(k.value, "value", None) for k in getattr(n, "keywords", []) if k.arg == "key"]
        return isinstance(n, ast.Call) and keys == ["moons_epochs"]

    slider = next(n for n in ast.walk(tree) if is_epochs(n))
    assert ast.literal_eval(slider.args[3]) == 250  # the default: the CLI figure's epochs


# ------------------------------------------------------------------------------ paths between minima


def _path(loss: list[float], barrier: float, t_barrier: float) -> ls.PathResult:
    t = list(np.linspace(0, 1, len(loss)))
    return ls.PathResult(path="bezier", t=t, loss=loss, loss_a=loss[0], loss_b=loss[-1], barrier=barrier,
                         t_barrier=t_barrier, max_loss=max(loss))  # fmt: skip


def test_path_statement_says_the_ends_are_not_minima_when_the_curve_is_lower():
    lower = _path([0.174, 0.15, 0.11, 0.14, 0.167], 0.0, 0.0)
    text = pv.path_statement(lower, "Bézier curve")
    assert "is lower than at both ends" in text and "the ends are not minima along this path" in text
    assert "barrier 0" not in text and "t = 0 " not in text and "zero barrier" not in text
    flat = _path([0.2, 0.19, 0.18, 0.17, 0.16], 0.0, 0.0)  # monotone: at or below the chord
    text = pv.path_statement(flat, "line")
    assert text.startswith("line: no barrier: the loss stays at or below the chord") and "t = 0" not in text
    bump = _path([0.2, 0.3, 0.5, 0.3, 0.1], 0.35, 0.5)
    assert pv.path_statement(bump, "line") == (
        "line: barrier 0.35 at t = 0.5 above the chord from 0.2 (A) to 0.1 (B)."
    )


def test_network_end_points_minimum_saddle_and_not_converged():
    from torch import nn

    torch.manual_seed(0)
    x = torch.randn(50, 3, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]], dtype=torch.float64) + 0.1 * torch.randn(
        50, 1, dtype=torch.float64
    )
    model = nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():  # least squares: the exact minimum of the MSE
        model.weight.copy_(torch.linalg.lstsq(x, y).solution.T)
    mse = nn.MSELoss()
    assert endpoints.classify_network_point(model, mse, (x, y)).kind == "minimum"
    with torch.no_grad():
        model.weight.add_(0.5)
    e = endpoints.classify_network_point(model, mse, (x, y))
    assert e.kind == "not converged" and e.predicted_drop > 1e-3 * e.loss
    # a two-layer linear network at zero weights: gradient 0, Hessian eigenvalues +-2|E[x y]|
    deep = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)).double()
    for p in deep.parameters():
        nn.init.zeros_(p)
    xs = torch.linspace(-1, 1, 20, dtype=torch.float64)[:, None]
    e = endpoints.classify_network_point(deep, mse, (xs, xs))
    assert e.kind == "saddle point" and e.grad_norm == 0.0
    assert e.lambda_min == pytest.approx(-2 * float((xs * xs).mean()), rel=1e-6)


@pytest.mark.slow  # trains the page's default pair (50 epochs) and fits its curve: ~30 s
def test_paths_defaults_make_no_barrier_claim_the_numbers_do_not_support():
    pair = pv.train_pair()
    paths = {"line": pv.line_path(pair), "bezier": pv.bezier_path(pair)}
    ends = pv.end_points(pair)
    caption = pv.path_caption(pair, paths, "train", ends)
    assert "t = 0 " not in caption and "barrier 0 " not in caption
    for name, p in paths.items():
        inner = min(v for t, v in zip(p.t, p.loss) if 0 < t < 1)
        assert inner >= min(p.loss_a, p.loss_b), name  # the defaults do not dip below the ends
    assert all(e.kind == "not converged" for e in ends.values())
    assert "The ends are not both minima" in caption
    assert "cross-entropy on data a network fits perfectly has no minimum" in pv.ends_statement(pair, ends)


# ------------------------------------------------------------------------------ home page


def _home_snippet() -> str:
    tree = ast.parse((APP / "Home.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if getattr(target, "id", None) == "SNIPPET":
                return ast.literal_eval(node.value)
    raise AssertionError("Home.py has no SNIPPET")


def test_home_snippet_runs_as_printed(capsys):
    code = _home_snippet()
    assert code.startswith("import torch\nimport landscape as ls\n")
    exec(compile(code, "Home.py snippet", "exec"), {"__name__": "__snippet__"})  # noqa: S102
    out = capsys.readouterr().out
    assert "lambda_max" in out and "hessian_trace" in out and "worst_case" in out


def test_home_links_preset_their_pages():
    at = AppTest.from_file(str(APP / "Home.py"), default_timeout=120).run()
    assert not at.exception
    links = at.get("page_link")
    assert len(links) == len(PRESETS)
    for link, (page, _, params) in zip(links, PRESETS):
        assert (APP / page).exists()
        assert link.proto.query_string == preset_url(page, params).split("?", 1)[1]
        assert link.proto.page == preset_url(page, {})
    assert any("import torch" in c.value for c in at.code)


@pytest.mark.parametrize("index", [0, 1])
def test_home_links_open_without_warnings(index):
    page, _, params = PRESETS[index]
    at = AppTest.from_file(str(APP / page), default_timeout=300)
    for k, v in params.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception and not at.warning and not at.error
    # the page's widgets took the link's values
    if index == 0:
        assert at.selectbox(key="problem").value == "himmelblau"
        assert at.multiselect(key="optimizers").value == list(toy.OPTIMIZERS)
    else:
        assert at.selectbox(key="smoothed_problem").value == "rosenbrock"
        assert at.slider(key="smoothed_rho").value == 2.0
