"""What the dashboard shows: compact numbers and a "diverged" mark for exploding runs, axes clipped to
the finite loss range, the log-scale box on the loss curves, one colour per method on every page,
legends outside the axes, at most three subplots per row, shared colour scales on compared
surfaces, download buttons, and the Bayesian view's text agreeing with its own table."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

APP = Path(__file__).resolve().parents[1] / "app"
sys.path.insert(0, str(APP))

from dashboard import bayes, layout, toy, widgets  # noqa: E402
from dashboard import network as nw  # noqa: E402
from dashboard import network_plots as npl  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import toy_problems as tp  # noqa: E402
from toy_problems.figures.palette import ALIASES, METHOD_COLORS, method_color  # noqa: E402

PLAYGROUND = "pages/1_Optimizer_playground.py"


def _arr(v) -> np.ndarray:
    """A Plotly JSON array: nested lists, or numpy's typed-array encoding {"dtype", "bdata"}."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        if isinstance(shape, str):
            shape = tuple(int(k) for k in shape.split(","))
        return arr.reshape(shape) if shape is not None else arr
    return np.asarray([np.nan if x is None else x for x in np.ravel(v)], dtype=float).reshape(np.shape(v))


def _charts(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


#: Fisher-SAM with the generic defaults (lr 0.05) explodes on Rosenbrock (curvature ~2000 at the start)
EXPLODING_FISHER_SAM = {"lr": 0.05, "rho": 0.1, "eta": 1.0}


def _rosenbrock_fisher_sam():
    settings = toy.problem_settings("rosenbrock")
    return toy.run(
        "rosenbrock",
        settings["start"],
        settings["steps"],
        [("FisherSAM", EXPLODING_FISHER_SAM), ("SAM", toy.hyper_defaults("SAM", "rosenbrock"))],
    )


# ------------------------------------------------------------------------------ diverged runs


def test_diverged_run_is_marked_and_printed_compactly():
    prob = tp.get("rosenbrock")
    fsam, sam = _rosenbrock_fisher_sam()
    end = fsam.trajectory.path[-1].tolist()
    assert max(abs(v) for v in end) > 1e50
    assert toy.run_status(prob, fsam)[0] and not toy.run_status(prob, sam)[0]
    rows = {r["optimizer"]: r for r in toy.end_rows(prob, [fsam, sam])}
    assert rows["FisherSAM"]["status"] == "diverged" and rows["SAM"]["status"] == "not converged"
    assert rows["FisherSAM"]["end point"] == f"({end[0]:.4g}, {end[1]:.4g})"
    assert rows["FisherSAM"]["Hessian trace"] == "n/a"
    for row in rows.values():
        for value in row.values():
            assert len(str(value)) < 60, value
    # the runner's own message is compact too: no coordinate with more than 4 significant digits
    assert not re.search(r"\d\.\d{5,}", fsam.trajectory.message), fsam.trajectory.message
    # SAM's row: its Hessian trace is the closed-form Rosenbrock Hessian's at its end point
    x, y = sam.trajectory.path[-1].tolist()
    trace = (1200 * x**2 - 400 * y + 2) + 200  # f = (1 - x)^2 + 100 (y - x^2)^2
    assert float(rows["SAM"]["Hessian trace"]) == pytest.approx(trace, rel=1e-3)


def test_iterates_that_explode_without_overflow_count_as_diverged():
    prob = tp.get("ill_conditioned_quadratic")  # curvature 100: GD with lr 0.05 multiplies y by -4
    (r,) = toy.run("ill_conditioned_quadratic", (0.5, 1.0), 100, [("GD", {"lr": 0.05})])
    assert not r.trajectory.diverged and abs(float(r.trajectory.path[-1, 1])) == pytest.approx(
        4.0**100, rel=1e-9
    )
    diverged, status = toy.run_status(prob, r)
    assert diverged and "ran off" in status
    # a run that leaves the plotted box with a *falling* loss is reported, not called diverged
    path = torch.tensor([[0.0, 0.0], [30.0, 0.0]], dtype=torch.float64)
    tr = tp.Trajectory(
        path=path,
        perturbations=torch.zeros(1, 2, dtype=torch.float64),
        losses=torch.tensor([1.0, 0.5], dtype=torch.float64),
        step_losses=torch.tensor([1.0], dtype=torch.float64),
        evaluations=[path[:1]],
        steps=1,
    )
    diverged, status = toy.run_status(prob, toy.Run("GD", "GD", {"lr": 0.05}, tr))
    assert not diverged and status == "left the plotted region (end (30, 0), loss 0.5)"


def test_surface_view_and_loss_curves_keep_to_the_finite_loss_range():
    prob = tp.get("rosenbrock")
    runs = _rosenbrock_fisher_sam()
    xs, ys, theta = prob.grid(80)
    z = prob.loss(theta).detach().numpy()  # the loss on the 3-D view's grid, directly
    for log in (False, True):
        zd = np.log10(z + 2e-12) if log else z  # Rosenbrock >= 0: the shift is 1e-12
        fig = toy.surface_figure(prob, runs, resolution=80, log=log)
        lo, hi = fig.layout.scene.zaxis.range
        width = zd.max() - zd.min()
        assert lo == pytest.approx(zd.min() - 0.05 * width, rel=1e-9)
        assert hi == pytest.approx(zd.max() + 0.05 * width, rel=1e-9)
        for trace in fig.data[1:]:
            pz = np.asarray(trace.z, dtype=float)
            assert np.all(np.isnan(pz) | ((pz >= zd.min()) & (pz <= zd.max())))
    # the SAM path is inside the box: its lifted points are its losses
    sam3d = next(t for t in toy.surface_figure(prob, runs, resolution=80).data if t.name == "SAM")
    np.testing.assert_allclose(np.asarray(sam3d.z, dtype=float), runs[1].trajectory.losses.numpy())
    curves = toy.loss_curves_figure(runs, log=True, prob=prob)
    lo, hi = curves.layout.yaxis.range
    assert hi < 10 and "log10" in curves.layout.yaxis.title.text  # not stretched to 1e115


def test_loss_curves_axis_covers_the_runs_not_the_whole_surface():
    """The loss-curve axis spans the curves' points inside the plotted box (5 % padding), not the
    range of the loss over the whole plotted grid, which squeezed the curves into a thin band."""
    prob = tp.get("gaussian_mixture")
    settings = toy.problem_settings("gaussian_mixture")
    runs = toy.run(
        "gaussian_mixture",
        settings["start"],
        settings["steps"],
        [(n, toy.hyper_defaults(n, "gaussian_mixture")) for n in ("GD", "SAM", "FisherSAM")],
    )
    (x0, x1), (y0, y1) = prob.bounds
    values = []
    for r in runs:
        p, loss = r.trajectory.path.numpy(), r.trajectory.losses.numpy()
        values.append(loss[(p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)])
    v = np.concatenate(values)
    lo, hi = toy.loss_curves_figure(runs, log=False, prob=prob).layout.yaxis.range
    width = v.max() - v.min()
    assert lo == pytest.approx(v.min() - 0.05 * width, rel=1e-9)
    assert hi == pytest.approx(v.max() + 0.05 * width, rel=1e-9)
    z = prob.loss(prob.grid(60)[2]).detach().numpy()
    assert z.max() > 2 * hi  # the surface reaches far above the curves


def test_log_scale_box_applies_to_the_loss_curves():
    at = AppTest.from_file(str(APP / PLAYGROUND), default_timeout=300)
    at.session_state["optimizers"] = ["GD"]
    at.run()
    box = next(c for c in at.sidebar.checkbox if c.label == "log-scale loss")
    assert box.value is False  # Gaussian mixture default: linear
    settings = toy.problem_settings("gaussian_mixture")
    (gd,) = toy.run(
        "gaussian_mixture",
        settings["start"],
        settings["steps"],
        [("GD", toy.hyper_defaults("GD", "gaussian_mixture"))],
    )
    losses = gd.trajectory.losses.numpy()

    def curve(at):
        spec = next(
            c for c in _charts(at) if c["layout"].get("xaxis", {}).get("title", {}).get("text") == "step"
        )
        return _arr(spec["data"][0]["y"]), spec["layout"]["yaxis"]["title"]["text"]

    y, title = curve(at)
    np.testing.assert_allclose(y, losses, rtol=1e-12)
    assert title == "loss"
    box.check().run()
    assert not at.exception
    y, title = curve(at)
    np.testing.assert_allclose(y, np.log10(losses + 2e-12), rtol=1e-12)  # all losses > 0: shift 1e-12
    assert title == "log10 loss"


def test_playground_page_marks_the_diverged_run():
    at = AppTest.from_file(str(APP / PLAYGROUND), default_timeout=300)
    at.session_state["problem"] = "rosenbrock"
    at.session_state["optimizers"] = ["FisherSAM", "SAM"]
    at.session_state["rosenbrock_FisherSAM_lr"] = EXPLODING_FISHER_SAM["lr"]
    at.run()
    assert not at.exception and not at.error
    assert len(at.warning) == 1 and at.warning[0].value.startswith("FisherSAM diverged")
    table = at.dataframe[0].value
    assert list(table["status"]) == ["diverged", "not converged"]  # SAM ends at loss 2.58, off the valley
    assert max(len(str(v)) for v in table.to_numpy().ravel()) < 60


# ------------------------------------------------------------------------------ colours


def test_one_colour_per_method_everywhere():
    assert len(set(METHOD_COLORS.values())) == len(METHOD_COLORS)  # no two methods share one
    names = set(toy.OPTIMIZERS) | set(nw.NETWORK_OPTIMIZERS) | {"exact", "MAP", "SAM+Laplace", "bSAM", "MFVI"}
    for name in names:
        assert method_color(name) == METHOD_COLORS[ALIASES.get(name, name)]
    assert method_color("SAM #2") == METHOD_COLORS["SAM"]
    with pytest.raises(KeyError, match="no colour for method 'Nope'"):
        method_color("Nope")
    # the playground: a method's colour does not depend on what else is selected
    prob = tp.get("himmelblau")
    alone = toy.run("himmelblau", (0.0, 0.0), 3, [("SAM", {})])
    mixed = toy.run("himmelblau", (0.0, 0.0), 3, [("GD", {}), ("Adam", {}), ("SAM", {})])

    def color_of(fig, name):
        return next(t.line.color for t in fig.data if t.name == name)

    for fig_of in (toy.contour_figure, toy.surface_figure, lambda p, r: toy.loss_curves_figure(r)):
        assert (
            color_of(fig_of(prob, alone), "SAM")
            == color_of(fig_of(prob, mixed), "SAM")
            == METHOD_COLORS["SAM"]
        )
    # the Bayesian view draws SAM and bSAM in the same colours as the playground and the network page
    R = bayes.logistic(20)
    post = bayes.posterior_figure(R)
    assert next(t.marker.color for t in post.data if t.name == "SAM") == METHOD_COLORS["SAM"]
    assert next(t.line.color for t in post.data if t.name.startswith("bSAM")) == METHOD_COLORS["BayesianSAM"]
    fake = {n: _FakeRun([1.0, 0.5]) for n in ("SGD", "SAM")}
    training = npl.training_figure(fake)
    assert [t.line.color for t in training.data] == [METHOD_COLORS["SGD"], METHOD_COLORS["SAM"]]


class _FakeRun:
    def __init__(self, losses):
        self.history = {"epoch_loss": losses}


# ------------------------------------------------------------------------------ layout


def test_legends_sit_outside_the_axes():
    prob = tp.get("himmelblau")
    runs = toy.run("himmelblau", (0.0, 0.0), 3, [("GD", {}), ("SAM", {})])
    R = bayes.logistic(20)
    figures = [
        toy.contour_figure(prob, runs),
        toy.surface_figure(prob, runs),
        toy.loss_curves_figure(runs),
        bayes.posterior_figure(R),
        bayes.decision_boundaries_figure(R, samples=3),
        npl.training_figure({"SGD": _FakeRun([1.0])}),
    ]
    # the contour lists each run once (its region and probe toggle with it) plus the known minima
    shown = [t.name for t in figures[0].data if t.showlegend is not False and t.type == "scatter"]
    assert shown == [f"minimum {m.label}".strip() for m in prob.minima] + ["GD", "SAM"]
    assert {t.legendgroup for t in figures[0].data if t.name.startswith("SAM")} == {"SAM"}
    for fig in figures:
        legend = fig.layout.legend
        assert legend.y is not None and (legend.y < 0 or (legend.x or 0) > 1), fig.layout.title


def test_many_panels_wrap_into_rows_of_at_most_three():
    assert [layout.grid_shape(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [
        (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (2, 3), (3, 3)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="at least one panel"):
        layout.grid_shape(0)
    fig = bayes.predictive_figure(bayes.logistic(20))  # five maps
    domains = {
        (tuple(fig.layout[f"xaxis{k or ''}"].domain), tuple(fig.layout[f"yaxis{k or ''}"].domain))
        for k in (0, 2, 3, 4, 5)
    }
    assert len({d[1] for d in domains}) == 2 and len({d[0] for d in domains}) == 3


# ------------------------------------------------------------------------------ smoothed objectives


def test_smoothed_panels_masked_titled_and_on_one_colour_scale():
    rho = 8.0
    seen = []
    panels = toy.smoothed_panels(
        "gaussian_mixture", rho, resolution=24, progress=lambda f, what: seen.append(f)
    )
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) > 5
    sigma = panels["ys"][:, None] * np.ones_like(panels["xs"])[None, :]
    for key in ("gaussian_smoothed", "worst_case"):  # masked exactly where the ball reaches sigma <= 0
        np.testing.assert_array_equal(np.isnan(panels[key]), sigma <= rho)
    assert not np.isnan(panels["loss"]).any()
    assert panels["masked"] == pytest.approx(float((sigma <= rho).mean()))
    fig = toy.smoothed_figure(panels, log=False)
    assert all("max_{" not in t and "‖ε‖≤ρ" not in t for t in toy.PANEL_TITLES.values())
    assert sum(bool(t.showscale) for t in fig.data) == 1  # one colour bar ...
    assert {(t.zmin, t.zmax) for t in fig.data} == {(fig.data[0].zmin, fig.data[0].zmax)}  # ... one scale
    everything = np.concatenate([panels[k][np.isfinite(panels[k])] for k in toy.PANEL_TITLES])
    assert fig.data[0].zmin == pytest.approx(everything.min())
    assert fig.data[0].zmax == pytest.approx(np.percentile(everything, 98))
    for k in ("", "2", "3", "4"):
        assert fig.layout[f"xaxis{k}"].title.text == "mu" and fig.layout[f"yaxis{k}"].title.text == "sigma"


def test_network_surfaces_share_one_colour_scale():
    surfaces = [
        _FakeSurface(np.array([[1.0, 10.0], [100.0, 0.1]])),
        _FakeSurface(np.array([[1e3, 2.0], [3.0, 4.0]])),
    ]
    lo, hi = npl.shared_range(surfaces)
    assert (lo, hi) == pytest.approx((-1.0, 3.0), abs=1e-9)  # log10 of 0.1 and 1000
    for s in surfaces:
        c = npl.surface_figure(s, None, "t", zrange=(lo, hi)).data[0]
        assert (c.zmin, c.zmax, c.contours.start, c.contours.end) == (lo, hi, lo, hi)


class _FakeSurface:
    def __init__(self, loss):
        self.loss, self.xs, self.ys = loss, np.array([-1.0, 1.0]), np.array([-1.0, 1.0])


# ------------------------------------------------------------------------------ downloads


def test_tables_download_as_csv_and_figures_as_html():
    rows = [{"method": "SAM", "value": 0.25}, {"method": "bSAM", "value": 1e-3, "extra": "x"}]
    back = list(csv.DictReader(io.StringIO(widgets.csv_bytes(rows).decode())))
    assert back == [
        {"method": "SAM", "value": "0.25", "extra": ""},
        {"method": "bSAM", "value": "0.001", "extra": "x"},
    ]
    prob = tp.get("himmelblau")
    fig = toy.contour_figure(prob, toy.run("himmelblau", (0.0, 0.0), 2, [("GD", {})]), resolution=10)
    html = widgets.html_bytes(fig).decode()
    assert html.lower().startswith("<!doctype html>") and '"name":"GD"' in html.replace(" ", "")
    assert widgets.plot_config("a b/c")["toImageButtonOptions"] == {
        "format": "png",
        "filename": "a_b_c",
        "scale": 2,
    }


def test_pages_offer_downloads_for_their_tables_and_figures():
    at = AppTest.from_file(str(APP / PLAYGROUND), default_timeout=300)
    at.session_state["optimizers"] = ["GD"]
    at.run()
    labels = [b.label for b in at.get("download_button")]
    assert sum(lbl.endswith("(HTML)") for lbl in labels) == len(at.get("plotly_chart")) == 3
    assert sum(lbl.endswith("(CSV)") for lbl in labels) == len(at.dataframe) == 1


# ------------------------------------------------------------------------------ Bayesian view text


def test_bayesian_text_states_what_its_table_shows():
    R = bayes.logistic(20)
    rows = {r["method"]: r for r in bayes.distance_rows(R)}
    text = bayes.logistic_findings(R)
    ratio = rows["bSAM"]["det Σ / det Σ_exact"]
    assert ratio < 0.1  # bSAM's Gaussian is far narrower than the exact posterior
    assert f"bSAM {layout.fmt(ratio, 2)} (narrower than the exact posterior)" in text
    lap = rows["SAM+Laplace"]["det Σ / det Σ_exact"]
    assert lap > 1.25 and f"SAM+Laplace {layout.fmt(lap, 2)} (wider than the exact posterior)" in text
    best = min(
        ("bSAM", "SAM", "SAM+Laplace", "MFVI", "Laplace at MAP"), key=lambda m: rows[m]["mean |p - p_exact|"]
    )
    assert f"closest predictive to the exact one is **{best}**" in text
    assert f"enclose {100 * math.sqrt(ratio):.0f}% of the area" in text
    page = (APP / "pages" / "3_Bayesian_view.py").read_text()
    assert "comes close to the exact" not in page and "~10 s" not in page


def test_two_moons_reports_progress():
    seen = []
    M = bayes.two_moons(resolution=10, epochs=2, progress=lambda f, what: seen.append((f, what)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] >= 0.9
    assert any("bSAM, epoch 2 of 2" in w for _, w in seen)
    text = bayes.moons_findings(M)
    assert f"bSAM {layout.fmt(M['entropy']['bSAM'], 3)}" in text
    assert torch.isfinite(M["maps"]["bSAM"]).all()
