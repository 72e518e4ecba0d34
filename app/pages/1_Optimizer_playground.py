"""Optimizer playground: trajectories of SAM-family and Bayesian optimizers on 2-D toy problems."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import page_header, readable_errors, toy  # noqa: E402
from dashboard.query import QueryPresets  # noqa: E402
from dashboard.widgets import computed_with_progress, full_chips, show_figure, show_table  # noqa: E402

import toy_problems as tp  # noqa: E402

page_header(
    "Optimizer playground",
    "Pick a 2-D problem and several optimizers: you see their paths on the contour and on the 3-D "
    "surface, the neighbourhood each SAM-type method searches for its perturbation (ball, ASAM ellipse, "
    "Fisher ellipse) with the probe it chose, the loss curves, and what each end point is (minimum, "
    "saddle point, not converged, ...) from the exact gradient and Hessian there. "
    "The default problem is the Gaussian KL-mixture of the Fisher-SAM paper (Kim et al. 2022, Fig. 2-3). "
    "The address bar keeps the selection (`?problem=himmelblau&optimizers=all&steps=100`): share the link.",
)


def cached_run(problem: str, start: tuple[float, float], steps: int, configs: tuple) -> list:
    """The runs, once per setting in this session, with a progress bar while they run."""
    return computed_with_progress(
        "playground_runs",
        (problem, start, steps, configs),
        lambda report: toy.run(problem, start, steps, [(n, dict(h)) for n, h in configs], progress=report),
        "running the optimizers",
        max_entries=64,
    )


query = QueryPresets.from_page()
full_chips()
with st.sidebar:
    problems, excluded = toy.playground_problems()
    hints = {
        n: f"{n} is not drawn here ({why}; the Bayesian view page shows it)" for n, why in excluded.items()
    }
    asked = query.choice("problem", problems, "gaussian_mixture", hints=hints)
    problem = st.selectbox("problem", problems, index=problems.index(asked), key="problem")
    for name, why in excluded.items():
        st.caption(f"Not offered here: **{name}** ({why}); the Bayesian view page shows it.")
    prob = tp.get(problem)
    settings = toy.problem_settings(problem)
    (x0, x1), (y0, y1) = prob.bounds
    c1, c2 = st.columns(2)
    sx = c1.number_input(
        prob.axis_labels[0] + " start", value=float(settings["start"][0]), key=f"sx_{problem}"
    )
    sy = c2.number_input(
        prob.axis_labels[1] + " start", value=float(settings["start"][1]), key=f"sy_{problem}"
    )
    asked_steps = query.number("steps", int(settings["steps"]), low=1, high=1000, integer=True)
    # the URL's steps belong to the URL's problem; another problem starts from its own default
    steps_default = asked_steps if problem == asked else int(settings["steps"])
    steps = st.slider("steps", 1, 1000, steps_default, key=f"steps_{problem}")
    names = list(toy.OPTIMIZERS)
    chosen = st.multiselect(
        "optimizers",
        names,
        default=query.choices("optimizers", names, ["GD", "SAM", "FisherSAM"]),
        key="optimizers",
    )
    configs = []
    for name in chosen:
        with st.expander(f"{name} hyperparameters", expanded=False):
            defaults = toy.hyper_defaults(name, problem)
            values = {}
            for h in toy.OPTIMIZERS[name].hypers:
                values[h.name] = st.number_input(
                    f"{name}: {h.name}",
                    value=float(defaults[h.name]),
                    min_value=float(h.low),
                    max_value=float(h.high),
                    format="%g",
                    help=h.help,
                    key=f"{problem}_{name}_{h.name}",
                )
        configs.append((name, tuple(sorted(values.items()))))
    log_scale = st.checkbox(
        "log-scale loss",
        value=problem != "gaussian_mixture",
        help="log10 of the loss on the contour, the 3-D view and the loss curves",
    )

query.show()
query.write_back(problem=problem, optimizers=query.encode_choices(chosen, names), steps=int(steps))
if not chosen:
    st.info("Choose at least one optimizer in the sidebar.")
    st.stop()

with readable_errors("run the optimizers"):
    runs = cached_run(problem, (float(sx), float(sy)), int(steps), tuple(configs))
    for message in toy.divergence_messages(prob, runs):
        st.warning(message)
    max_step = max(len(r.trajectory.perturbations) for r in runs)
    step = (
        st.slider("show the neighbourhood and probe at step", 0, max(max_step - 1, 0), 0)
        if max_step > 1
        else 0
    )
    left, right = st.columns(2)
    contour = toy.contour_figure(prob, runs, log=log_scale, neighbourhood_step=step)
    show_figure(contour, f"{problem}_paths", key="contour", container=left)
    show_figure(
        toy.surface_figure(prob, runs, log=log_scale), f"{problem}_surface", key="surface", container=right
    )
    left, right = st.columns(2)
    curves = toy.loss_curves_figure(runs, log=log_scale, prob=prob)
    show_figure(curves, f"{problem}_loss_curves", key="losses", container=left)
    points = toy.end_points(prob, runs)
    right.markdown("**What the end points are**")
    right.markdown(toy.end_summary(prob, runs, points))
    note = toy.overlap_note(prob, runs)
    if note:
        right.caption(note)
    st.markdown("**Where each run ended** (exact gradient and Hessian by autograd)")
    show_table(toy.end_rows(prob, runs, points), f"{problem}_end_points", key="end_points")
    st.caption(toy.thresholds_text(toy.endpoints.box_width(prob)))
