"""Experiments: open run directories of `python -m experiments run` and compare their results."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import experiments_view as ev  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure  # noqa: E402

page_header(
    "Experiments",
    "Open the run directories written by `python -m experiments run CONFIG` and compare methods: the "
    "results table (mean ± sample standard deviation over seeds, as `python -m experiments table` "
    "prints it), the per-epoch training curves and reliability diagrams of the trained models.",
)


def new_root() -> None:
    """Another directory: its runs start all selected (not the previous directory's selection)."""
    for key in ("exp_runs", "exp_curves", "exp_reliability"):
        st.session_state.pop(key, None)


root = st.text_input(
    "directory with runs",
    value=ev.default_root(),
    key="exp_root",
    help=f"the out_dir of the runner (default runs/, or ${ev.DEFAULT_ROOT_ENV})",
    on_change=new_root,
)
found: list[str] = []
with readable_errors("list the runs"):
    found = ev.find_runs(root)
if not found:
    st.info(f"No finished runs (metrics.json files) under `{root}`. Run e.g. "
            "`python -m experiments run configs/digits_sam_vs_sgd.toml` first.")  # fmt: skip
    st.stop()

labels = {ev.run_label(d, root): d for d in found}
chosen = st.multiselect("runs", list(labels), default=list(labels), key="exp_runs")
if not chosen:
    st.info("Choose at least one run.")
    st.stop()
dirs = [labels[c] for c in chosen]

with readable_errors("tabulate the runs"):
    entries = ev.results_table(dirs)
    st.subheader("Results: mean ± std over seeds per method")
    st.dataframe(ev.table_rows(entries), hide_index=True, key="exp_table")
    st.download_button(
        "download table (CSV)",
        data=ev.table_csv(entries),
        file_name="experiments_table.csv",
        mime="text/csv",
        key="exp_table_csv",
        on_click="ignore",
    )
    st.caption("std is the sample standard deviation over seeds (ddof = 1); nan with one seed or where a "
               "method has no such metric (e.g. bma_* for non-Bayesian methods).")  # fmt: skip

with readable_errors("read the training logs"):
    histories = {c: ev.read_history(labels[c]) for c in chosen}
    methods = {c: ev.run_method(labels[c]) for c in chosen}
    keys = ev.curve_keys(histories)
    if keys:
        st.subheader("Training curves (log.jsonl, one colour per method, one line per seed)")
        default = [k for k in ("train_loss", "test_accuracy") if k in keys] or keys[:1]
        shown = st.multiselect("curves", keys, default=default, key="exp_curves")
        cols = st.columns(max(1, min(len(shown), 3)))
        for i, key in enumerate(shown):
            fig = ev.curves_figure(histories, methods, key)
            show_figure(fig, f"curve_{key}", key=f"exp_curve_{key}", container=cols[i % len(cols)])
    else:
        st.info("The chosen runs have no per-epoch log (log.jsonl).")

st.subheader("Reliability diagram (test set, point model)")
st.caption("The runner saves no probabilities: each chosen run's model is rebuilt from its config.toml "
           "and checkpoint.pt and evaluated on its own test set; the recomputed ECE is shown next to "
           "the one in metrics.json.")  # fmt: skip
first_per_method: dict[str, str] = {}
for c in chosen:
    first_per_method.setdefault(ev.run_method(labels[c]), c)
rel = st.multiselect(
    "runs in the diagram", chosen, default=list(first_per_method.values()), key="exp_reliability"
)
n_bins = st.select_slider("bins", [5, 10, 15, 20], value=20, key="exp_bins")
if rel:
    with readable_errors("compute the reliability diagram"):
        fig, rows, skipped = computed_with_progress(
            "exp_reliability_cache",
            (tuple(labels[r] for r in rel), n_bins),
            lambda report: ev.reliability_of({r: labels[r] for r in rel}, n_bins=n_bins, report=report),
            "evaluating the trained models",
        )
        show_figure(fig, "reliability", key="exp_reliability_fig")
        st.dataframe(rows, hide_index=True, key="exp_reliability_rows")
        if skipped:
            st.warning(f"left out (another test set than {rel[0]}): {', '.join(skipped)}")
