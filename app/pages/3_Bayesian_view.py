"""Bayesian view: exact posterior vs Laplace vs MFVI vs bSAM on logistic regression; two moons."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import bayes, page_header, readable_errors  # noqa: E402

page_header(
    "Bayesian view",
    "Bayesian logistic regression in 2-D, where the exact posterior is known by numerical integration: "
    "SAM's point estimate is overconfident, a Laplace approximation around it is too wide, and "
    "Bayesian-SAM's Gaussian posterior comes close to the exact one; on two moons, bSAM's predictive "
    "uncertainty grows away from the data (Möllenhoff & Khan 2023, 'SAM as an optimal relaxation of "
    "Bayes', Fig. 3, 5 and 6).",
)


@st.cache_data(show_spinner="fitting SAM, bSAM and MFVI, integrating the exact posterior ...", max_entries=16)
def cached_logistic(resolution: int, sam_rho: float, bsam_rho: float) -> dict:
    return bayes.logistic(resolution, {"sam": {"rho": sam_rho}, "bsam": {"rho": bsam_rho}})


@st.cache_data(show_spinner="training SAM and bSAM on two moons ...", max_entries=8)
def cached_moons(resolution: int, epochs: int) -> dict:
    return bayes.two_moons(resolution, epochs)


with st.sidebar:
    sam_rho = st.slider("SAM ρ", 0.0, 3.0, 1.0, 0.05)
    bsam_rho = st.slider("bSAM ρ", 0.0, 0.5, 0.05, 0.01)
    resolution = st.select_slider(
        "predictive-map resolution", [30, 45, 60, 90], value=45, key="bayes_resolution"
    )
    n_std = st.slider("ellipse radius (standard deviations)", 1.0, 3.0, 2.0, 0.5)
    samples = st.slider("sampled decision boundaries per method", 5, 50, 20)
    show_moons = st.checkbox("two moons (trains two networks, ~10 s)", value=False, key="show_moons")
    moons_epochs = st.slider("two-moons epochs", 10, 250, 40, 10, disabled=not show_moons, key="moons_epochs")

with readable_errors("compute the logistic-regression posteriors"):
    R = cached_logistic(int(resolution), float(sam_rho), float(bsam_rho))
    left, right = st.columns(2)
    left.markdown("**Posterior over the weights** (exact density and Gaussian approximations)")
    left.plotly_chart(bayes.posterior_figure(R, n_std=n_std), key="posterior")
    right.markdown("**Sampled decision boundaries** (the model has no bias: lines through the origin)")
    right.plotly_chart(bayes.decision_boundaries_figure(R, samples=samples), key="boundaries")
    st.markdown("**Predictive maps p(y = 1 | x)**")
    st.plotly_chart(bayes.predictive_figure(R), key="predictive")
    st.markdown("**Distance of each predictive map to the exact one** (on the plotted x-grid)")
    st.dataframe(bayes.distance_rows(R), hide_index=True)

if show_moons:
    with readable_errors("train on two moons"):
        M = cached_moons(int(resolution), int(moons_epochs))
        st.markdown("**Two moons**: predictive maps of SAM, bSAM (model average) and SAM + Laplace")
        st.plotly_chart(bayes.moons_figure(M), key="moons")
