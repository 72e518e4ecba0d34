"""Curvature monitor: the sharpness lambda_max during full-batch gradient descent against 2/lr."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import monitor_view as mv  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.layout import fmt  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure, show_table  # noqa: E402

page_header(
    "Curvature monitor",
    "Train a small MLP on the digits with full-batch gradient descent and measure the largest Hessian "
    "eigenvalue λ_max of the training loss every few steps (Lanczos, warm-started, "
    "`landscape.CurvatureMonitor`). Gradient descent with step size lr is unstable on a quadratic "
    "whose curvature exceeds 2/lr; on networks λ_max often rises towards that line and hovers there "
    "(the edge of stability, Cohen et al. 2021).",
)

with st.sidebar:
    lr = st.select_slider("learning rate", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0], value=2.0, key="mon_lr")
    steps = st.slider("steps", 10, 300, 60, step=10, key="mon_steps")
    every = st.select_slider("check every (steps)", [1, 2, 5, 10, 20, 50], value=10, key="mon_every")
    hidden = st.select_slider("hidden units", [8, 16, 32], value=16, key="mon_hidden")
    n_train = st.select_slider("training examples", [128, 256, 512, 1024], value=256, key="mon_n")
    seed = st.number_input("seed", 0, 1000, 0, key="mon_seed")

run = None
with readable_errors("train the network"):
    run = computed_with_progress(
        "monitor_runs",
        (lr, steps, every, hidden, n_train, int(seed)),
        lambda report: mv.run_monitor(
            lr=lr,
            steps=steps,
            every=every,
            hidden=hidden,
            n_train=n_train,
            seed=int(seed),
            on_step=lambda f: report(f, f"step {round(f * steps)} of {steps}"),
        ),
        "gradient descent with the curvature monitor",
    )
if run is not None:
    show_figure(mv.sharpness_figure(run), "sharpness", key="mon_sharpness")
    last = run.result.history[-1]
    st.caption(
        f"λ_max of the Hessian of the training loss on the {n_train} training examples at each check "
        f"(solid) and the gradient-descent threshold 2/lr = {2 / lr:.4g} (dashed). Last check "
        f"(step {last['step']}): λ_max = {fmt(last['lambda_max'])}; {run.result.matvecs} Hessian-vector "
        "products in all."
    )
    show_figure(mv.loss_figure(run), "training_loss", key="mon_loss")
    show_table(mv.history_rows(run), "monitor_checks", key="mon_rows")
