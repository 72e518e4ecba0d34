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


root = st.text_input(
    "directory with runs",
    value=ev.default_root(),
    key="exp_root",
    help=f"the out_dir of the runner (default runs/, or ${ev.DEFAULT_ROOT_ENV})",
)
# the selections belong to the directory they were made in: another directory (typed, or from
# $SHARPSCAPE_RUNS) starts with all its runs selected, not with the previous directory's chips
if st.session_state.get("exp_selection_root") != root:
    for key in ("exp_runs", "exp_curves", "exp_reliability"):
        st.session_state.pop(key, None)
    st.session_state["exp_selection_root"] = root
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

entries: list[dict] = []
with readable_errors("tabulate the runs"):
    entries = ev.results_table(dirs)
    st.subheader("Results: mean ± std over seeds per method and settings")
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
               "method has no such metric (e.g. bma_* for non-Bayesian methods). Runs are averaged "
               "only with runs of the same method and settings (config.toml, all but the seed).")  # fmt: skip
    for line in ev.table_notes(entries, ("settings", "config")):
        st.info(line)
    for line in ev.table_notes(entries, ("duplicates",)):
        st.warning(line)
    failed = ev.diverged_rows(entries, root)
    if failed:
        st.subheader("Diverged runs (counted, not in the means)")
        st.dataframe(failed, hide_index=True, key="exp_diverged")

with readable_errors("read the training logs"):
    histories = {c: ev.read_history(labels[c]) for c in chosen}
    groups = ev.run_groups(entries)
    methods = {c: groups.get(labels[c]) or ev.run_method(labels[c]) for c in chosen}
    colors = ev.group_colors(list(dict.fromkeys(methods.values())))
    keys = ev.curve_keys(histories)
    if keys:
        st.subheader("Training curves (log.jsonl, one colour per table row, one line per seed)")
        default = [k for k in ("train_loss", "test_accuracy") if k in keys] or keys[:1]
        shown = st.multiselect("curves", keys, default=default, key="exp_curves")
        cols = st.columns(max(1, min(len(shown), 3)))
        for i, key in enumerate(shown):
            fig = ev.curves_figure(histories, methods, key, colors)
            show_figure(fig, f"curve_{key}", key=f"exp_curve_{key}", container=cols[i % len(cols)])
    else:
        st.info("The chosen runs have no per-epoch log (log.jsonl).")

st.subheader("Reliability diagram (test set, point model)")
st.caption("The runner saves no probabilities: each chosen run's model is rebuilt from its config.toml "
           "and checkpoint.pt and evaluated on its own test set; the recomputed ECE is shown next to "
           "the one in metrics.json.")  # fmt: skip
label_of = {d: c for c, d in labels.items() if c in chosen}
default_rel = [label_of[d] for d in ev.default_reliability_runs(entries) if d in label_of]
if not set(st.session_state.get("exp_reliability") or ()) <= set(chosen):
    st.session_state.pop("exp_reliability", None)  # runs no longer chosen: back to the default
rel = st.multiselect("runs in the diagram", chosen, default=default_rel, key="exp_reliability")
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
