"""Logic of the toy-problem pages: optimizer catalogue, trajectory runs, Plotly figures.

Everything here is plain Python over ``toy_problems`` and ``optimizers`` (no Streamlit), so the
tests call it directly and assert on the returned figures' traces. Modules: ``catalogue``
(optimizers, hyperparameters, per-problem settings), ``runs`` (trajectories, neighbourhoods,
Hessians), ``endpoints`` (what an end point is: minimum, saddle point, ...), ``plots`` (playground
figures), ``smoothed`` (the smoothed-objectives panels and their local minima).
"""

from __future__ import annotations

from .catalogue import (
    OPTIMIZERS,
    PROBLEM_SETTINGS,
    Hyper,
    OptimizerSpec,
    hyper_defaults,
    playground_problems,
    problem_settings,
    validate_hypers,
)
from .endpoints import EndPoint, classify_point, thresholds_text
from .plots import contour_figure, loss_curves_figure, loss_grid, surface_figure
from .runs import (
    Run,
    divergence_messages,
    end_points,
    end_rows,
    end_summary,
    hessian_summary,
    neighbourhood,
    overlap_note,
    path_overlaps,
    run,
    run_status,
)
from .smoothed import (
    PANEL_TITLES,
    ball_inside,
    smoothed_figure,
    smoothed_minima,
    smoothed_panels,
    smoothed_summary,
)

__all__ = [
    "OPTIMIZERS",
    "PROBLEM_SETTINGS",
    "Hyper",
    "OptimizerSpec",
    "hyper_defaults",
    "playground_problems",
    "problem_settings",
    "validate_hypers",
    "Run",
    "run",
    "neighbourhood",
    "hessian_summary",
    "EndPoint",
    "classify_point",
    "thresholds_text",
    "end_points",
    "end_rows",
    "end_summary",
    "path_overlaps",
    "overlap_note",
    "run_status",
    "divergence_messages",
    "loss_grid",
    "contour_figure",
    "surface_figure",
    "loss_curves_figure",
    "PANEL_TITLES",
    "smoothed_panels",
    "smoothed_minima",
    "smoothed_figure",
    "smoothed_summary",
    "ball_inside",
]
