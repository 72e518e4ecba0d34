"""Flatness study: does a sharpness measure rank models by their generalisation (Kendall tau)?"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # experiments.study when run from elsewhere

import streamlit as st  # noqa: E402
from dashboard import page_header, readable_errors  # noqa: E402
from dashboard import study_data as sd  # noqa: E402
from dashboard import study_view as sv  # noqa: E402
from dashboard.query import QueryPresets  # noqa: E402
from dashboard.widgets import show_figure, show_table  # noqa: E402

page_header(
    "Flatness study",
    "A study written by `python -m experiments.study run CONFIG --out DIR` (and `report DIR`): each "
    "sharpness measure against a generalisation target over the models of one population that "
    "enter the report's correlations (not diverged; under a stopping rule, those that reached it), "
    "with Kendall's τ-b, its bootstrap interval and the granulated Ψ of Jiang et al. 2020 "
    "(`experiments.study.correlate`), or the report's intervals pooled over the populations. Link "
    "to a view: `?population=1&target=test_error`.",
)

# the bootstrap of one population (O(resamples × models²)) is the slow step: once per setting
correlate = st.cache_data(sv.correlation_table, show_spinner="bootstrapping Kendall's τ ...", max_entries=64)

query = QueryPresets.from_page()
with st.sidebar:
    where = st.text_input(
        "study directory or population CSV (empty: the committed example)",
        value=str(sd.DEFAULT_DIR.relative_to(sd.ROOT)),
        key="study_dir",
    )
    samples = st.select_slider(
        "bootstrap resamples",
        [200, 1000, 2000],
        value=1000,
        key="study_samples",
        help="per population; the pooled view shows the report's intervals",
    )
    threshold = st.select_slider(
        "mark models with a training error above",
        [0.1, 0.2, 0.3, 0.5, 0.7, 0.9],
        value=sv.BARELY_TRAINED,
        key="study_barely",
        help="models that barely trained: open markers in the plots",
    )

study = None
with readable_errors("load the study"):
    study = sd.load_study(where)

if study is not None:
    st.markdown(sv.stopping_text(study))
    excluded = sd.excluded_rows(study)
    if excluded:
        show_table(excluded, "study_excluded", key="study_excluded")
    choices = sd.population_choices(study)
    label = lambda p: sv.population_label(study, p)  # noqa: E731
    asked = query.choice("population", choices, choices[0], label=str)
    population = st.selectbox(
        "population", choices, index=choices.index(asked), format_func=label, key="study_population"
    )
    pooled = population == sd.POOLED
    with st.sidebar:
        leave_out = st.checkbox(
            "leave them out of the correlations",
            value=False,
            key="study_leave_out",
            disabled=pooled,
            help="single populations only: the pooled intervals are the report's",
        )
    leave_out = leave_out and not pooled
    st.markdown(sv.population_text(study, population))
    df = sd.population_frame(study, population)
    st.markdown(sv.barely_trained_text(df, threshold, leave_out))
    if leave_out:
        df = df[~sv.barely_trained(df, threshold)]
    targets = sv.targets_of(df)
    measures = sv.measures_of(df, study.measures)
    if not targets or not measures:
        st.error(f"The table has no target column ({', '.join(sv.TARGET_LABELS)}) or no measure column.")
    else:
        asked = query.choice("target", targets, targets[0])
        target = st.selectbox(
            "target",
            targets,
            index=targets.index(asked),
            format_func=lambda t: sv.TARGET_LABELS[t],
            key="study_target",
        )
        query.show()
        query.write_back(population=population, target=target)
        with readable_errors("correlate the measures"):
            if pooled:
                table = sv.pooled_table(study, measures, target)
                st.markdown(sv.pooled_summary_text(table, target))
            else:
                table = correlate(df, measures, target, samples=samples)
                st.markdown(sv.summary_text(table, target, len(df)))
            name = f"study_correlation_{target}_{'pooled' if pooled else f'population{population}'}"
            show_table(table.to_dict("records"), name, key="study_table")
            chosen = st.multiselect("measures to plot", measures, default=measures[:4], key="study_measures")
            if chosen:
                fig = sv.scatter_figure(
                    df, chosen, target, table, threshold, tau_label="mean τ" if pooled else "τ"
                )
                show_figure(fig, f"study_scatter_{target}", key="study_fig")
            else:
                st.info("Select at least one measure to plot.")
