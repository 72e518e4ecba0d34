"""Network landscape: train a digits MLP with several optimizers and compare their landscapes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import streamlit as st  # noqa: E402
from dashboard import network as nw  # noqa: E402
from dashboard import network_analyses as na  # noqa: E402
from dashboard import network_plots as npl  # noqa: E402
from dashboard import network_text as nt  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.layout import MAX_COLUMNS  # noqa: E402
from dashboard.query import QueryPresets  # noqa: E402
from dashboard.uploads import open_uploaded_surface  # noqa: E402
from dashboard.widgets import computed_with_progress, csv_bytes, show_figure, show_table  # noqa: E402

page_header(
    "Network landscape",
    "Train the same small network (an MLP, LeNet-5 or a small ResNet on the scikit-learn 8x8 digits, "
    "one initialisation per seed) with several optimizers, then compare the loss surface around each "
    "solution with its training "
    "trajectory (PCA plane, Li et al. 2018), the Hessian spectrum (Lanczos + stochastic Lanczos "
    "quadrature), the loss on the line between two solutions and the sharpness measures: does SAM "
    "find a flatter minimum here, and does it pay off? Links keep the selection "
    "(`?optimizers=all&model=MLP&epochs=2&analyses=surface,spectrum`).",
)

ANALYSES = ["surface", "spectrum", "interpolation", "sharpness"]
query = QueryPresets.from_page()
with st.sidebar:
    names = list(nw.NETWORK_OPTIMIZERS)
    chosen = st.multiselect(
        "optimizers", names, default=query.choices("optimizers", names, ["SGD", "SAM"]), key="net_optimizers"
    )
    archs = list(nw.ARCHITECTURES)
    arch = st.selectbox(
        "model", archs, index=archs.index(query.choice("model", archs, "MLP")), key="net_model"
    )
    epochs = st.slider(
        "epochs", 1, 50, query.number("epochs", 8, low=1, high=50, integer=True), key="net_epochs"
    )
    hidden = st.select_slider(
        "hidden units (MLP)", [16, 32, 64], value=32, key="net_hidden", disabled=arch != "MLP"
    )
    n_seeds = st.slider(
        "seeds", 1, 5, 1, key="net_seeds", help="test metrics: mean ± standard deviation over the seeds"
    )
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
        "analyses", ANALYSES, default=query.choices("analyses", ANALYSES, ["surface"]), key="net_analyses"
    )
    if "sharpness" in analyses:
        sharp_split = st.radio("sharpness data", ["train", "test"], horizontal=True, key="net_sharp_split")
        sharp_rho = st.number_input(
            "sharpness rho", value=0.05, min_value=1e-4, max_value=5.0, format="%g", key="net_sharp_rho"
        )
        sharp_measures = st.multiselect(
            "measures",
            [m for m, _ in nw.SHARPNESS_MEASURES],
            default=[m for m, _ in nw.SHARPNESS_MEASURES],
            key="net_sharp_measures",
        )


def trained(
    name: str, lr: float, rho: float, epochs: int, hidden: int, arch: str, seed: int
) -> nw.TrainedRun:
    """Train once per session and configuration; a progress bar shows while it runs.

    An interrupted run (the user changes a widget mid-training) stores nothing, so the page never
    sees a half-trained model."""
    store = st.session_state.setdefault("trained_runs", {})
    key = (name, lr, rho, epochs, hidden, arch, seed)
    if key not in store:
        bar = st.progress(0.0, text=f"training {name} ...")
        store[key] = nw.train_network(
            name,
            lr=lr,
            rho=rho,
            epochs=epochs,
            hidden=hidden,
            arch=arch,
            seed=seed,
            on_step=lambda f: bar.progress(min(f, 1.0), text=f"training {name}: {100 * f:.0f}%"),
        )
        bar.empty()
    return store[key]


def progressed(store: str, key: tuple, compute, label: str):
    """``compute(report)`` once per key in this session, with a progress bar of the work done."""
    return computed_with_progress(store, key, compute, label, max_entries=32)


@st.cache_resource(show_spinner="interpolating between the solutions ...", max_entries=32)
def cached_path(_a: nw.TrainedRun, _b: nw.TrainedRun, key: tuple):
    return nw.interpolation_of(_a, _b)


query.show()
query.write_back(
    optimizers=query.encode_choices(chosen, names), model=arch, epochs=int(epochs), analyses=analyses
)
if not chosen:
    st.info("Choose at least one optimizer in the sidebar.")
else:
    seeded: dict[str, list[nw.TrainedRun]] = {}
    with readable_errors("train the networks"):
        for name in chosen:
            for seed in range(n_seeds):
                try:
                    run = trained(name, *hypers[name], epochs, hidden, arch, seed)
                except ValueError as exc:  # a diverging run: say which, keep the others
                    st.warning(f"Run {name} (seed {seed}) left out: {exc}")
                    continue
                if run.warning:
                    st.warning(f"Run {nw.run_label(run)}: {run.warning}")
                seeded.setdefault(name, []).append(run)
    # the analyses use each optimizer's first seed that trained
    runs = {n: rs[0] for n, rs in seeded.items()}
    if runs:
        st.subheader("Test metrics" + (f" (mean ± std over {n_seeds} seeds)" if n_seeds > 1 else ""))
        show_table(nw.metric_rows(seeded), "test_metrics", key="metrics")
        show_figure(npl.training_figure(runs), "training_loss", key="training")
        keys = {n: (n, *hypers[n], epochs, hidden, arch, r.config["seed"]) for n, r in runs.items()}
        if "surface" in analyses:
            span = None
            with readable_errors("find the PCA planes"):
                span = na.pca_span(list(runs.values())) if plane == "pca" else None
            st.subheader("Loss surfaces")
            st.markdown(nt.surface_heading(plane, len(runs), span, shared_colours=True))
            surfaces = {}
            for name, run in runs.items():
                with readable_errors(f"compute the surface for {name}"):
                    surfaces[name] = progressed(
                        "net_surfaces",
                        (keys[name], plane, resolution, span),
                        lambda report, run=run: na.surface_of(
                            run, kind=plane, resolution=resolution, span=span, progress=report
                        ),
                        f"loss surface of {name}",
                    )
            zrange = npl.shared_range([s for s, _ in surfaces.values()])
            names = list(surfaces)
            for start in range(0, len(names), MAX_COLUMNS):
                cols = st.columns(min(MAX_COLUMNS, len(names)))
                for col, name in zip(cols, names[start : start + MAX_COLUMNS]):
                    s, path = surfaces[name]
                    title = f"{name}: log10 loss ({plane} plane)"
                    fig = npl.surface_figure(s, path, title, zrange=zrange)
                    show_figure(fig, f"surface_{name}", key=f"surface_{name}", container=col)
                    col.caption(nw.surface_caption(s))
        spectra = None
        if "spectrum" in analyses:
            st.subheader("Hessian spectrum")
            with readable_errors("compute the Hessian spectrum"):
                spectra = {
                    n: progressed(
                        "net_spectra",
                        keys[n],
                        lambda report, r=r: na.spectrum_of(r, progress=report),
                        f"Hessian spectrum of {n}",
                    )
                    for n, r in runs.items()
                }
                show_figure(npl.spectrum_figure(spectra), "hessian_spectrum", key="spectrum")
                show_table(nt.spectrum_rows(spectra), "hessian_spectrum", key="spectrum_rows")
                st.caption(nt.spectrum_caption(spectra))
        if "interpolation" in analyses:
            st.subheader("Loss on the line between two solutions (training data)")
            every = {
                nw.run_label(r): (r, (n, *hypers[n], epochs, hidden, arch, r.config["seed"]))
                for n, rs in seeded.items()
                for r in rs
            }
            labels = list(every)
            if len(labels) < 2:
                st.info("Interpolation needs two trained solutions: choose two optimizers or two seeds.")
            else:
                c1, c2 = st.columns(2)
                a = c1.selectbox("from", labels, index=0, key="net_interp_a")
                b = c2.selectbox("to", labels, index=1, key="net_interp_b")
                with readable_errors("interpolate between the solutions"):
                    path = cached_path(every[a][0], every[b][0], (every[a][1], every[b][1]))
                    show_figure(
                        path.to_plotly(title=f"{a} (t = 0) to {b} (t = 1)"), "interpolation", key="interp"
                    )
                    st.caption(
                        f"loss {path.loss_a:.4g} at {a}, {path.loss_b:.4g} at {b}; barrier (highest loss on "
                        f"the line above the straight line between the ends) {path.barrier:.4g} at t = "
                        f"{path.t_barrier:.2f}"
                    )
        if "sharpness" in analyses:
            st.subheader(f"Sharpness measures ({sharp_split} data, rho = {sharp_rho:g})")
            if not sharp_measures:
                st.info("Choose at least one sharpness measure in the sidebar.")
            else:
                with readable_errors("measure sharpness"):
                    measures = nt.sharpness_measures(list(sharp_measures), float(sharp_rho))
                    rows = []
                    for n, r in runs.items():
                        rows += progressed(
                            "net_sharpness",
                            (keys[n], tuple(sharp_measures), float(sharp_rho), sharp_split),
                            lambda report, n=n, r=r: na.sharpness_rows(
                                {n: r}, measures, split=sharp_split, report=report
                            ),
                            f"sharpness of {n}",
                        )
                    shown = [{k: v for k, v in row.items() if k != "as run"} for row in rows]
                    st.dataframe(shown, hide_index=True, key="sharpness", column_config=nt.SHARPNESS_COLUMNS)
                    st.download_button(
                        "download sharpness (CSV)",
                        data=csv_bytes(rows),
                        file_name="sharpness.csv",
                        mime="text/csv",
                        key="sharpness_csv",
                        on_click="ignore",
                    )
                    p = na.n_params(next(iter(runs.values())))
                    st.markdown("**How each measure perturbs the weights** (the same for every optimizer)")
                    st.table(na.sharpness_details(rows, p))
                    notes = nt.sharpness_notes(rows, p, sharp_split)
                    agree = nt.trace_agreement(rows, spectra, sharp_split)
                    for line in notes + ([agree] if agree else []):
                        st.caption(line)

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
        with st.expander("the file's configuration"):
            st.json(s.config, expanded=False)
