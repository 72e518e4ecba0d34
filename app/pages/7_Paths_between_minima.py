"""Paths between minima: the loss along the straight line and a trained Bezier curve between two nets."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard import paths_view as pv  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure, show_table  # noqa: E402

page_header(
    "Paths between minima",
    "Two small networks (MLP 64-h-10 on the scikit-learn digits) trained from different seeds, or two "
    "uploaded state dicts: the loss along the straight line between their weights (`landscape.interpolate`) "
    "and along a quadratic Bézier curve trained to connect them (`landscape.fit_curve`, Garipov et al. "
    "2018). The barrier is the largest excess of the loss over the chord between the two end losses "
    "(Entezari et al. 2022); it speaks of a barrier *between minima* only when the ends are minima, so "
    "each end is classified from its gradient and Hessian below the figures.",
)

with st.sidebar:
    source = st.radio("models", ["train two seeds", "upload two state dicts"], key="paths_source")
    if source == "train two seeds":
        seed_a = st.number_input("seed of model A", 0, 1000, 0, key="paths_seed_a")
        seed_b = st.number_input("seed of model B", 0, 1000, 1, key="paths_seed_b")
        hidden = st.select_slider("hidden units", [8, 16, 32], value=16, key="paths_hidden")
        epochs = st.slider("epochs", 1, 100, pv.DEFAULT_EPOCHS, key="paths_epochs")
        lr = st.select_slider(
            "learning rate (SGD, momentum 0.9)", [0.01, 0.02, 0.05, 0.1], value=0.05, key="paths_lr"
        )
    split = st.radio("measure on", ["train", "test"], horizontal=True, key="paths_split")
    n_points = st.select_slider("points on each path", [11, 21, 41], value=21, key="paths_points")
    with_curve = st.checkbox("also fit a Bézier curve", value=True, key="paths_curve")
    curve_steps = st.select_slider(
        "curve training steps", [50, 100, 300, 1000], value=pv.DEFAULT_CURVE_STEPS, key="paths_steps"
    )

pair = None
with readable_errors("prepare the two models"):
    if source == "train two seeds":
        pair = computed_with_progress(
            "paths_pairs",
            (int(seed_a), int(seed_b), hidden, epochs, lr),
            lambda report: pv.train_pair(
                seeds=(int(seed_a), int(seed_b)),
                hidden=hidden,
                epochs=epochs,
                lr=lr,
                on_step=lambda f: report(f, "model A" if f < 0.5 else "model B"),
            ),
            "training the two networks",
        )
    else:
        up_a = st.file_uploader("model A: torch.save(model.state_dict(), ...)", key="paths_up_a")
        up_b = st.file_uploader("model B", key="paths_up_b")
        if up_a is None or up_b is None:
            st.info("Upload the state dicts of two tanh MLPs with 64 inputs and 10 outputs (same sizes).")
        else:
            pair = pv.pair_from_state_dicts(
                pv.load_state_dict_bytes(up_a.getvalue(), up_a.name),
                pv.load_state_dict_bytes(up_b.getvalue(), up_b.name),
            )

if pair is not None:
    paths = {}
    with readable_errors("evaluate the straight line"):
        paths["line"] = pv.line_path(pair, split=split, n_points=n_points)
    if with_curve:
        with readable_errors("fit the Bézier curve"):
            key = (repr(pair.config), split, n_points, curve_steps)
            paths["bezier"] = computed_with_progress(
                "paths_curves",
                key,
                lambda report: pv.bezier_path(
                    pair,
                    split=split,
                    steps=curve_steps,
                    n_points=n_points,
                    on_step=lambda f: report(f, f"step {round(f * curve_steps)} of {curve_steps}"),
                ),
                f"training the Bézier curve ({curve_steps} steps)",
            )
    ends = None
    with readable_errors("classify the end points"):
        ends = computed_with_progress(
            "paths_ends",
            repr(pair.config),
            lambda report: pv.end_points(pair, progress=report),
            "end points: full-batch gradient and Lanczos Hessian eigenvalues",
        )
    if paths:
        show_figure(pv.paths_figure(paths), "paths_loss", key="paths_fig")
        show_figure(pv.paths_figure(paths, "error"), "paths_error", key="paths_err_fig")
        show_table(pv.barrier_rows(paths), "path_barriers", key="paths_rows")
    if ends is not None:
        show_table(pv.end_point_rows(pair, ends), "path_end_points", key="paths_end_rows")
        st.markdown(pv.ends_statement(pair, ends))
    if paths:
        st.caption(pv.path_caption(pair, paths, split, ends))
