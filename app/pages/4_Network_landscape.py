"""Network landscape: train a digits MLP with several optimizers and compare their landscapes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import streamlit as st  # noqa: E402
from dashboard import network as nw  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.layout import MAX_COLUMNS  # noqa: E402
from dashboard.uploads import open_uploaded_surface  # noqa: E402
from dashboard.widgets import show_figure, show_table  # noqa: E402

page_header(
    "Network landscape",
    "Train the same small network (MLP 64-h-10 on the scikit-learn digits, one initialisation) with "
    "several optimizers, then compare the loss surface around each solution with its training "
    "trajectory (PCA plane, Li et al. 2018), the Hessian spectrum (Lanczos + stochastic Lanczos "
    "quadrature) and the sharpness measures: does SAM find a flatter minimum here, and does it pay off?",
)

with st.sidebar:
    chosen = st.multiselect(
        "optimizers", list(nw.NETWORK_OPTIMIZERS), default=["SGD", "SAM"], key="net_optimizers"
    )
    epochs = st.slider("epochs", 1, 50, 8, key="net_epochs")
    hidden = st.select_slider("hidden units", [16, 32, 64], value=32, key="net_hidden")
    hypers = {}
    for name in chosen:
        _, lr0, rho0 = nw.NETWORK_OPTIMIZERS[name]
        with st.expander(f"{name} hyperparameters"):
            lr = st.number_input(f"{name}: lr", value=float(lr0), min_value=1e-5, max_value=10.0, format="%g")
            rho = st.number_input(
                f"{name}: rho",
                value=float(rho0),
                min_value=0.0,
                max_value=5.0,
                format="%g",
                disabled=rho0 == 0.0,
            )
        hypers[name] = (float(lr), float(rho))
    resolution = st.select_slider("surface resolution", [11, 15, 21, 31], value=15, key="net_resolution")
    plane = st.radio(
        "surface plane",
        ["pca", "random"],
        horizontal=True,
        help="pca: the plane of the trajectory's principal directions; random: filter-normalised",
    )
    analyses = st.multiselect(
        "analyses", ["surface", "spectrum", "sharpness"], default=["surface"], key="net_analyses"
    )


def trained(name: str, lr: float, rho: float, epochs: int, hidden: int) -> nw.TrainedRun:
    """Train once per session and configuration; a progress bar shows while it runs.

    An interrupted run (the user changes a widget mid-training) stores nothing, so the page never
    sees a half-trained model."""
    store = st.session_state.setdefault("trained_runs", {})
    key = (name, lr, rho, epochs, hidden)
    if key not in store:
        bar = st.progress(0.0, text=f"training {name} ...")
        store[key] = nw.train_network(
            name,
            lr=lr,
            rho=rho,
            epochs=epochs,
            hidden=hidden,
            on_step=lambda f: bar.progress(min(f, 1.0), text=f"training {name}: {100 * f:.0f}%"),
        )
        bar.empty()
    return store[key]


@st.cache_resource(show_spinner="computing the loss surface ...", max_entries=32)
def cached_surface(_run: nw.TrainedRun, key: tuple, kind: str, resolution: int):
    return nw.surface_of(_run, kind=kind, resolution=resolution)


@st.cache_resource(show_spinner="Lanczos and SLQ on the Hessian ...", max_entries=32)
def cached_spectrum(_run: nw.TrainedRun, key: tuple):
    return nw.spectrum_of(_run)


@st.cache_resource(show_spinner="measuring sharpness ...", max_entries=32)
def cached_sharpness(_run: nw.TrainedRun, key: tuple):
    return nw.sharpness_rows({_run.name: _run})


if not chosen:
    st.info("Choose at least one optimizer in the sidebar.")
else:
    runs = {}
    with readable_errors("train the networks"):
        for name in chosen:
            runs[name] = trained(name, *hypers[name], epochs, hidden)
    if runs:
        st.subheader("Test metrics")
        show_table(nw.metric_rows(runs), "test_metrics", key="metrics")
        show_figure(nw.training_figure(runs), "training_loss", key="training")
        keys = {n: (n, *hypers[n], epochs, hidden) for n in runs}
        if "surface" in analyses:
            st.subheader("Loss surface around each solution (one colour scale for all)")
            surfaces = {}
            for name, run in runs.items():
                with readable_errors(f"compute the surface for {name}"):
                    surfaces[name] = cached_surface(run, keys[name], plane, resolution)
            zrange = nw.shared_range([s for s, _ in surfaces.values()])
            names = list(surfaces)
            for start in range(0, len(names), MAX_COLUMNS):
                cols = st.columns(MAX_COLUMNS)
                for col, name in zip(cols, names[start : start + MAX_COLUMNS]):
                    s, path = surfaces[name]
                    title = f"{name}: log10 loss ({plane} plane)"
                    fig = nw.surface_figure(s, path, title, zrange=zrange)
                    show_figure(fig, f"surface_{name}", key=f"surface_{name}", container=col)
                    col.caption(nw.surface_caption(s))
        if "spectrum" in analyses:
            st.subheader("Hessian spectrum")
            with readable_errors("compute the Hessian spectrum"):
                spectra = {n: cached_spectrum(r, keys[n]) for n, r in runs.items()}
                show_figure(nw.spectrum_figure(spectra), "hessian_spectrum", key="spectrum")
                show_table(nw.spectrum_rows(spectra), "hessian_spectrum", key="spectrum_rows")
        if "sharpness" in analyses:
            st.subheader("Sharpness measures (training data)")
            with readable_errors("measure sharpness"):
                rows = [row for n, r in runs.items() for row in cached_sharpness(r, keys[n])]
                show_table(rows, "sharpness", key="sharpness")

st.subheader("Open a saved surface file")
upload = st.file_uploader(
    "a surface written by Surface.save / python -m landscape surface (.npz)", type=["npz"]
)
if upload is not None:
    with readable_errors("open the surface file"):
        s = open_uploaded_surface(upload.name, upload.getvalue())
        if s.ndim == 2:
            show_figure(s.to_plotly(title=upload.name), Path(upload.name).stem, key="uploaded")
        else:
            st.line_chart({"loss": np.asarray(s.loss)})
        st.json(s.config)
