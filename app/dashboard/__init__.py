"""Importable, tested logic behind the dashboard pages (the pages themselves stay thin).

``ui`` helpers (header, readable errors) live here; the page-specific work lives in
``dashboard.toy``, ``dashboard.bayes``, ``dashboard.network`` (training; below
``network_analyses``, ``network_plots`` and ``network_text``, which import it, never the other way
round), ``experiments_*`` and ``study_*``, which return plain data and Plotly figures so that tests
can assert on them without a browser.
``dashboard.layout`` holds the presentation rules (compact numbers, legends, subplot grids, colour
ranges), ``dashboard.widgets`` the figure/table display with download buttons and progress bars,
``dashboard.uploads`` the checks on uploaded files; method colours come from
``toy_problems.figures.palette``.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

import streamlit as st


class UserInputError(ValueError):
    """A bad input the page should explain in words (never shown as a traceback)."""


def page_header(title: str, intro: str) -> None:
    """Page title and the two-sentence explanation every page starts with."""
    st.set_page_config(page_title=title.split("—")[0].strip(), layout="wide")
    st.title(title)
    st.markdown(intro)


@contextlib.contextmanager
def readable_errors(what: str) -> Iterator[None]:
    """Show any exception raised inside as a readable ``st.error`` message instead of a traceback.

    Library errors (ValueError/TypeError/RuntimeError) carry messages written for users; anything
    else is summarised with its type, and the traceback goes into a collapsed expander.
    """
    try:
        yield
    except (UserInputError, ValueError, TypeError, KeyError, FileNotFoundError) as exc:
        st.error(f"Could not {what}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a page must never die with a traceback
        st.error(f"Could not {what}: {type(exc).__name__}: {exc}")
        with st.expander("details"):
            st.text(traceback.format_exc())
