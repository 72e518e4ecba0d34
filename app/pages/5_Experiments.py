"""Experiments: open run directories of `python -m experiments run` and compare their results."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402
from dashboard import experiments_groups as eg  # noqa: E402
from dashboard import experiments_view as ev  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard.widgets import computed_with_progress, show_figure  # noqa: E402

from experiments.table import collect_runs, table_notes  # noqa: E402

page_header(
    "Experiments",
    "Open the run directories written by `python -m experiments run CONFIG` and compare methods "
    "within each experiment: one results table per experiment (mean ± sample standard deviation over "
    "seeds, as `python -m experiments table <out_dir>/<name>` prints it), the per-epoch training "
    "curves and reliability diagrams of the trained models.",
)


root = st.text_input(
    "directory with runs",
    value=ev.default_root(),
    key="exp_root",
    help=f"the out_dir of the runner (default runs/, or ${ev.DEFAULT_ROOT_ENV})",
)
found: list[str] = []
with readable_errors("list the runs"):
    found = ev.find_runs(root)
if not found:
    st.info(f"No finished runs (metrics.json files) under `{root}`. Run e.g. "
            "`python -m experiments run configs/digits_sam_vs_sgd.toml` first.")  # fmt: skip
    st.stop()

experiments: dict = {}
with readable_errors("read the runs"):
    experiments = eg.split_experiments(collect_runs(found), root)
if not experiments:
    st.stop()
# every selection belongs to this directory (eg.state_key): another directory gets new widgets
titles = eg.experiment_titles(experiments, max_keys=2)
names = list(experiments)
chosen_exps = st.multiselect(
    "experiments (one directory <out_dir>/<name> of `python -m experiments run` each)",
    names,
    default=names,
    format_func=lambda e: f"{e} ({titles[e]})" if titles[e] else e,
    key=eg.state_key("exp_experiments", root),
)
if not chosen_exps:
    st.info("Choose at least one experiment.")
    st.stop()
labels = {ev.run_label(r["_dir"], root): r["_dir"] for e in chosen_exps for r in experiments[e]}
with st.expander(f"runs: all {len(labels)} of the chosen experiments (leave some out here)"):
    chosen = st.multiselect(
        "runs", list(labels), default=list(labels), key=eg.state_key("exp_runs", root, chosen_exps)
    )
if not chosen:
    st.info("Choose at least one run.")
    st.stop()
picked = {labels[c] for c in chosen}
shown = {e: [r for r in experiments[e] if r["_dir"] in picked] for e in chosen_exps}
shown = {e: rows for e, rows in shown.items() if rows}

tables: dict = {}
with readable_errors("tabulate the runs"):
    tables = eg.tables_by_experiment(shown)
    differs = eg.experiment_titles(shown, max_keys=8)
    metrics = list(dict.fromkeys(m for entries in tables.values() for m in eg.metrics_of(entries)))
    columns = st.multiselect(
        "metrics in the tables (all are in the CSV files)",
        metrics,
        default=eg.default_metrics(metrics),
        key=eg.state_key("exp_metrics", root),
    )
    for exp, entries in tables.items():
        n_runs = sum(e["runs"] for e in entries)
        st.subheader(f"Experiment {exp}")
        if differs[exp]:
            st.markdown(f"Differs from the other experiments shown in: `{differs[exp]}`")
        st.dataframe(eg.display_rows(entries, columns), hide_index=True, key=eg.state_key("exp_t", root, exp))
        st.download_button(
            f"download the table of {exp} (CSV)",
            data=ev.table_csv(entries),
            file_name=f"{eg.slug(exp)}_table.csv",
            mime="text/csv",
            key=eg.state_key("exp_csv", root, exp),
            on_click="ignore",
        )
        st.caption(eg.table_caption(entries, n_runs, columns))
        for line in table_notes(entries, ("settings", "config")):
            st.info(line)
        for line in table_notes(entries, ("duplicates", "nonfinite", "missing")):
            st.warning(line)
        failed = ev.diverged_rows(entries, root)
        if failed:
            st.markdown(f"**Diverged runs of {exp}** (counted, not in the means)")
            st.dataframe(failed, hide_index=True, key=eg.state_key("exp_div", root, exp))

with readable_errors("read the training logs"):
    multi = len(tables) > 1
    histories = {c: ev.read_history(labels[c]) for c in chosen}
    groups = eg.curve_groups(tables, multi)
    methods = {c: groups.get(labels[c]) or ev.run_method(labels[c]) for c in chosen}
    styles = eg.curve_styles(tables, multi)
    keys = ev.curve_keys(histories)
    if keys:
        st.subheader("Training curves (log.jsonl, one line per seed)")
        st.caption(eg.curves_caption(multi))
        default = [k for k in ("train_loss", "test_accuracy") if k in keys] or keys[:1]
        picked_curves = st.multiselect("curves", keys, default=default, key=eg.state_key("exp_curves", root))
        cols = st.columns(max(1, min(len(picked_curves), 3)))
        for i, key in enumerate(picked_curves):
            fig = ev.curves_figure(
                histories,
                methods,
                key,
                {g: c for g, (c, _) in styles.items()},
                {g: d for g, (_, d) in styles.items()},
            )
            show_figure(fig, f"curve_{key}", key=f"exp_curve_{key}", container=cols[i % len(cols)])
    else:
        st.info("The chosen runs have no per-epoch log (log.jsonl).")

st.subheader("Reliability diagram (test set, point model)")
st.caption("The runner saves no probabilities: each chosen run's model is rebuilt from its config.toml "
           "and checkpoint.pt and evaluated on its own test set; the recomputed ECE is shown next to "
           f"the one in metrics.json. Default: the first completed run of each table row (at most "
           f"{eg.MAX_RELIABILITY} rows).")  # fmt: skip
label_of = {d: c for c, d in labels.items() if c in chosen}
default_rel = [label_of[d] for d in eg.default_reliability(tables) if d in label_of]
rel = st.multiselect(
    "runs in the diagram", chosen, default=default_rel, key=eg.state_key("exp_reliability", root, chosen)
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
