"""Figures and tables with their download buttons: CSV for every table, a stand-alone HTML file for
every figure, and PNG from the camera button of each figure's toolbar (drawn in the browser, saved
under the figure's name at twice the screen resolution)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Sequence
from typing import Any

import plotly.graph_objects as go
import streamlit as st


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "figure"


def csv_bytes(rows: Sequence[dict[str, Any]]) -> bytes:
    """The rows as CSV (UTF-8): one column per key, in the order keys first appear."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: row.get(k, "") for k in columns})
    return buf.getvalue().encode("utf-8")


def html_bytes(fig: go.Figure) -> bytes:
    """The figure as a stand-alone HTML page (plotly.js embedded: opens offline)."""
    return fig.to_html(include_plotlyjs=True, full_html=True).encode("utf-8")


def plot_config(name: str) -> dict[str, Any]:
    """Plotly's toolbar settings: the camera button saves ``NAME.png`` at twice the size."""
    return {"toImageButtonOptions": {"format": "png", "filename": _slug(name), "scale": 2}}


def show_figure(fig: go.Figure, name: str, *, key: str, container: Any = None) -> None:
    """Draw ``fig`` with a 'download HTML' button; PNG comes from the chart's camera button."""
    where = container if container is not None else st
    where.plotly_chart(fig, key=key, config=plot_config(name))
    where.download_button(
        f"download {name} (HTML)",
        data=lambda: html_bytes(fig),  # built when clicked: a page full of figures stays light
        file_name=f"{_slug(name)}.html",
        mime="text/html",
        key=f"{key}_html",
        on_click="ignore",
        help="interactive stand-alone page; for a PNG use the camera button above the figure",
    )


def show_table(rows: Sequence[dict[str, Any]], name: str, *, key: str, container: Any = None) -> None:
    """Draw the rows as a table with a 'download CSV' button."""
    where = container if container is not None else st
    where.dataframe(list(rows), hide_index=True, key=key)
    where.download_button(
        f"download {name} (CSV)",
        data=csv_bytes(rows),
        file_name=f"{_slug(name)}.csv",
        mime="text/csv",
        key=f"{key}_csv",
        on_click="ignore",
    )


#: multiselects show every chip: streamlit caps the chip box at ~5 rows and scrolls the rest out of
#: sight, and cuts a long chip label to an ellipsis
CHIP_CSS = (
    "<style>[data-testid='stMultiSelect'] div{max-height:none !important}"
    "[data-testid='stMultiSelectTagsContainer']{overflow:visible !important}"
    "[data-testid='stMultiSelect'] [data-tag] span[title]{max-width:none !important;"
    "text-overflow:clip !important;overflow:visible !important}</style>"
)


def full_chips() -> None:
    """Show every multiselect chip's whole label on this page (call once, anywhere on the page)."""
    st.html(CHIP_CSS)


def computed_with_progress(
    store: str,
    key: tuple,
    compute: Callable[[Callable[[float, str], None]], Any],
    label: str,
    max_entries: int = 16,
) -> Any:
    """``compute(report)`` once per ``key`` in this session, with a progress bar while it runs.

    ``report(fraction, what)`` moves the bar. Results are kept in ``st.session_state[store]`` (the
    oldest dropped beyond ``max_entries``); an interrupted computation stores nothing."""
    cache = st.session_state.setdefault(store, {})
    if key not in cache:
        bar = st.progress(0.0, text=label)

        def report(fraction: float, what: str = "") -> None:
            bar.progress(min(max(float(fraction), 0.0), 1.0), text=f"{label}: {what}" if what else label)

        value = compute(report)
        bar.empty()
        while len(cache) >= max_entries:
            cache.pop(next(iter(cache)))
        cache[key] = value
    return cache[key]
