"""Bayesian view: exact posterior vs Laplace vs MFVI vs bSAM on logistic regression; two moons."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import bayes, page_header, readable_errors  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure, show_table  # noqa: E402

page_header(
    "Bayesian view",
    "Bayesian logistic regression in 2-D, where the exact posterior is known by numerical integration: "
    "SAM's point estimate, a Laplace approximation around it, MFVI and Bayesian-SAM's Gaussian posterior "
    "are compared with the exact posterior and its predictive map; the sentence under the table says what "
    "the numbers show. On two moons, the predictive uncertainty of SAM, bSAM and SAM + Laplace "
    "(Möllenhoff & Khan 2023, 'SAM as an optimal relaxation of Bayes', Fig. 3, 5 and 6).",
)


def cached_logistic(resolution: int, sam_rho: float, bsam_rho: float) -> dict:
    """The posteriors, once per setting in this session, with a progress bar while they are fitted."""
    return computed_with_progress(
        "logistic",
        (resolution, sam_rho, bsam_rho),
        lambda report: bayes.logistic(
            resolution, {"sam": {"rho": sam_rho}, "bsam": {"rho": bsam_rho}}, progress=report
        ),
        "fitting SAM, bSAM and MFVI and integrating the exact posterior",
    )


with st.sidebar:
    sam_rho = st.slider("SAM ρ", 0.0, 3.0, 1.0, 0.05)
    bsam_rho = st.slider("bSAM ρ", 0.0, 0.5, 0.05, 0.01)
    resolution = st.select_slider(
        "predictive-map resolution", [30, 45, 60, 90], value=45, key="bayes_resolution"
    )
    n_std = st.slider("ellipse radius (standard deviations)", 1.0, 3.0, 2.0, 0.5)
    samples = st.slider("sampled decision boundaries per method", 5, 50, 20)
    show_moons = st.checkbox(
        "two moons (trains two networks; a progress bar shows how far)", value=False, key="show_moons"
    )
    moons_epochs = st.slider(
        "two-moons epochs",
        10,
        500,
        250,
        10,
        disabled=not show_moons,
        key="moons_epochs",
        help="the paper's figure trains 250 epochs; with fewer the networks do not fit the moons yet",
    )

with readable_errors("compute the logistic-regression posteriors"):
    R = cached_logistic(int(resolution), float(sam_rho), float(bsam_rho))
    left, right = st.columns(2)
    left.markdown("**Posterior over the weights** (exact density and Gaussian approximations)")
    show_figure(bayes.posterior_figure(R, n_std=n_std), "posterior", key="posterior", container=left)
    right.markdown("**Sampled decision boundaries** (the model has no bias: lines through the origin)")
    show_figure(
        bayes.decision_boundaries_figure(R, samples=samples), "boundaries", key="boundaries", container=right
    )
    st.markdown("**Predictive maps p(y = 1 | x)**")
    show_figure(bayes.predictive_figure(R), "predictive_maps", key="predictive")
    st.markdown("**Distance of each predictive map to the exact one** (on the plotted x-grid)")
    show_table(bayes.distance_table(R), "distances_to_exact", key="distances")
    st.caption(bayes.distance_footnote(R))
    st.markdown(bayes.logistic_findings(R))
    with st.expander("Where the SAM, bSAM and MFVI runs ended (gradient and Hessian of the loss)"):
        show_table(bayes.end_point_rows(R), "logistic_end_points", key="logistic_ends")
        st.caption(bayes.end_point_note(R))

if show_moons:
    with readable_errors("train on two moons"):
        M = computed_with_progress(
            "two_moons",
            (int(resolution), int(moons_epochs)),
            lambda report: bayes.two_moons(int(resolution), int(moons_epochs), progress=report),
            "two moons",
            max_entries=8,
        )
        st.markdown("**Two moons**: predictive maps of SAM, bSAM (model average) and SAM + Laplace")
        show_figure(bayes.moons_figure(M), "two_moons", key="moons")
        show_table(bayes.moons_rows(M), "two_moons_fit", key="moons_fit")
        st.caption(bayes.moons_note(M))
        st.markdown(bayes.moons_findings(M))
