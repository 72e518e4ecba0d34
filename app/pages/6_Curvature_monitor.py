"""Curvature monitor: the sharpness lambda_max during full-batch gradient descent against 2/lr."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import monitor_view as mv  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.query import QueryPresets  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure, show_table  # noqa: E402

page_header(
    "Curvature monitor",
    "Train a small MLP on the digits with full-batch gradient descent and measure the largest Hessian "
    "eigenvalue λ_max of the training loss every few steps (Lanczos, warm-started, "
    "`landscape.CurvatureMonitor`). Gradient descent with step size lr is unstable on a quadratic "
    "whose curvature exceeds 2/lr; on networks λ_max often rises towards that line and hovers there "
    "(the edge of stability, Cohen et al. 2021). The preset *edge of stability* (MSE loss, as in their "
    "Fig. 1, 800 steps, about 4 s of one CPU core) is their setting; the short cross-entropy run is the "
    "default. What this run shows is stated under the plot, computed from the table of checks (checks "
    "whose Lanczos run did not converge are not used). Link to a preset: `?preset=edge_of_stability`.",
)

#: widget key of each run_monitor setting
KEYS = {
    "loss": "mon_loss",
    "lr": "mon_lr",
    "steps": "mon_steps",
    "every": "mon_every",
    "hidden": "mon_hidden",
    "layers": "mon_layers",
    "n_train": "mon_n",
}


def apply_preset() -> None:
    """Choosing a preset moves every widget to its settings (they stay editable)."""
    for name, value in mv.PRESETS[st.session_state["mon_preset"]][1].items():
        st.session_state[KEYS[name]] = value


query = QueryPresets.from_page()
with st.sidebar:
    presets = list(mv.PRESETS)
    label = {k: v[0] for k, v in mv.PRESETS.items()}
    preset = st.selectbox(
        "preset",
        presets,
        index=presets.index(query.choice("preset", presets, "cross_entropy")),
        format_func=label.get,
        key="mon_preset",
        on_change=apply_preset,
    )
    # the widgets start at the preset's settings (a later preset change moves them, apply_preset)
    for name, value in mv.PRESETS[preset][1].items():
        st.session_state.setdefault(KEYS[name], value)
    loss = st.radio("loss", list(mv.LOSSES), format_func=mv.LOSSES.get, horizontal=True, key="mon_loss")
    lr = st.select_slider("learning rate", [0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 8.0], key="mon_lr")
    steps = st.slider("steps", 10, 1000, step=10, key="mon_steps")
    every = st.select_slider("check every (steps)", [1, 2, 5, 10, 20, 50], key="mon_every")
    hidden = st.select_slider("hidden units", [8, 16, 32], key="mon_hidden")
    layers = st.select_slider("hidden layers", [1, 2], key="mon_layers")
    n_train = st.select_slider("training examples", [128, 256, 500, 1024], key="mon_n")
    seed = st.number_input("seed", 0, 1000, 0, key="mon_seed")
query.show()
query.write_back(preset=preset)

run = None
with readable_errors("train the network"):
    settings = {"loss": loss, "lr": lr, "steps": steps, "every": every, "hidden": hidden, "layers": layers,
                "n_train": n_train, "seed": int(seed)}  # fmt: skip
    run = computed_with_progress(
        "monitor_runs",
        tuple(settings.items()),
        lambda report: mv.run_monitor(
            **settings,
            # about 50 updates of the bar, not one per step
            on_step=lambda f: (
                round(f * steps) % max(1, steps // 50) == 0
                and report(f, f"step {round(f * steps)} of {steps}")
            ),
        ),
        "gradient descent with the curvature monitor",
    )
if run is not None:
    show_figure(mv.sharpness_figure(run), "sharpness", key="mon_sharpness")
    st.caption(mv.plot_caption(run))
    st.markdown(mv.edge_summary(run))
    show_figure(mv.loss_figure(run), "training_loss", key="mon_loss_fig")
    show_table(mv.history_rows(run), "monitor_checks", key="mon_rows")
