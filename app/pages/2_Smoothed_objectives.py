"""Smoothed objectives: the four panels of the VSAM paper's Fig. 1 with a radius slider."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import page_header, readable_errors, toy  # noqa: E402
from dashboard.query import QueryPresets  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure  # noqa: E402

page_header(
    "Smoothed objectives",
    "What SAM-type methods actually minimise: (A) the loss, (B) its Gaussian smoothing (the MFVI / "
    "Random-SAM objective, by Gauss-Hermite quadrature), (C) the worst case in a ball of radius ρ "
    "(by dense search) and (D) SAM's first-order objective. Under the figure: the local minima of A and B "
    "(verified by gradient and Hessian) and the uncertainty of the estimates B and C. As ρ grows the "
    "sharp basin of the Gaussian KL-mixture shrinks or disappears (VSAM seed, 'Rethinking SAM as "
    "variational inference', Fig. 1, ρ = 8). "
    "Links keep the selection: `?problem=rosenbrock&rho=2&resolution=30`.",
)


query = QueryPresets.from_page()
with st.sidebar:
    names = toy.playground_problems()[0]
    asked = query.choice("problem", names, "gaussian_mixture")
    problem = st.selectbox("problem", names, index=names.index(asked), key="smoothed_problem")
    rho = st.slider(
        "radius ρ", 0.5, 20.0, query.number("rho", 8.0, low=0.5, high=20.0, step=0.5), 0.5, key="smoothed_rho"
    )
    resolutions = [30, 45, 60, 90]
    resolution = st.select_slider(
        "grid resolution",
        resolutions,
        value=query.number("resolution", 45, options=resolutions),
        key="smoothed_resolution",
    )
    log_scale = st.checkbox("log-scale", value=problem != "gaussian_mixture", key="smoothed_log")

query.show()
query.write_back(problem=problem, rho=float(rho), resolution=int(resolution))

with readable_errors("compute the smoothed objectives"):
    panels = computed_with_progress(
        "smoothed_panels",
        (problem, float(rho), int(resolution)),
        lambda report: toy.smoothed_panels(problem, float(rho), int(resolution), progress=report),
        "computing the four panels",
    )
    show_figure(toy.smoothed_figure(panels, log=log_scale), f"smoothed_{problem}_rho{rho:g}", key="panels")
    st.markdown(toy.smoothed_summary(panels))
