"""sharpscape dashboard: home page.  Run with ``streamlit run app/Home.py``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import streamlit as st  # noqa: E402
from dashboard import page_header  # noqa: E402
from dashboard.query import PRESETS, preset_url  # noqa: E402

#: the Python example below the table; it runs as printed (tests execute it in a fresh namespace)
SNIPPET = """import torch
import landscape as ls

x, y = ls.data.load_digits("train", seed=0)  # 8 x 8 digits as 64 features, labels 0-9
model = ls.models.model_factory("mlp", sizes=[64, 16, 10], seed=0)
ls.models.train(model, (x, y), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), epochs=3)
obj = ls.Objective(model, torch.nn.CrossEntropyLoss(), (x, y))
print(ls.eigenvalues(ls.hessian(obj), k=5).values, ls.trace(obj).ci(0.95))
print(ls.sharpness_report(obj, measures=["lambda_max", "hessian_trace", "worst_case"]))"""

page_header(
    "sharpscape — loss landscapes, sharpness and flat-minima optimizers",
    "A toolkit for the questions researchers ask about flat minima: is this minimum flat, does SAM (or "
    "Fisher-SAM, Bayesian-SAM, ...) find flatter minima, and does flatness buy generalisation and "
    "calibration? Everything on these pages runs live on embedded data (2-D toy problems and the "
    "scikit-learn digits); nothing is downloaded.",
)

st.markdown(
    """
| page | what you see | from |
|---|---|---|
| **Optimizer playground** | trajectories of SAM, ASAM, Fisher-SAM, bSAM, ... on 2-D problems, the perturbation neighbourhood at the current iterate, loss curves, and what each end point is (minimum, saddle point, not converged) from its gradient and Hessian | Fisher-SAM (Kim et al. 2022) Fig. 2-3; SAM, ASAM |
| **Smoothed objectives** | the loss, its Gaussian smoothing, the exact worst case in a ball and SAM's first-order objective, with a radius slider | VSAM seed (Rethinking SAM as VI), Fig. 1 |
| **Bayesian view** | exact posterior vs Laplace vs MFVI vs bSAM on Bayesian logistic regression, predictive maps, sampled decision boundaries; two moons | bSAM (Möllenhoff & Khan 2023) Fig. 3, 5, 6 |
| **Network landscape** | train a small network on digits with chosen optimizers, then its loss surface with the trajectory, Hessian spectrum and sharpness table, side by side | Li et al. 2018 surfaces; curvature core; sharpness measures |
| **Experiments** | run directories of `python -m experiments run`: mean ± std over seeds per method, training curves, reliability diagrams | experiments runner |
| **Curvature monitor** | λ_max of the training-loss Hessian during full-batch gradient descent against the stability threshold 2/lr; the *edge of stability* preset (MSE) shows λ_max rising to 2/lr and staying there | edge of stability (Cohen et al. 2021, Fig. 1) |
| **Paths between minima** | loss along the straight line and a trained Bézier curve between two networks, the barrier heights, and whether the two ends are minima | Garipov et al. 2018; Frankle et al. 2020; Entezari et al. 2022 |
| **Flatness study** | Kendall τ-b (bootstrap interval) and granulated Ψ of each sharpness measure against the gap, test or OOD error over one population of models (those that reached the study's stopping rule), or the report's intervals pooled over the populations; measure-vs-target scatter panels | Jiang et al. 2020; `experiments.study` |

The same analysis from Python:
"""
)
st.code(SNIPPET, language="python")
st.markdown(
    """
**Links that preset a page.** The pages keep their main selection in the address bar, so a view can
be shared as a link; a value a page cannot use falls back to its default with a warning that lists
the accepted values. Lists are comma-separated, `all` selects every option.

| page | parameters |
|---|---|
| Optimizer playground | `problem`, `optimizers`, `steps` |
| Smoothed objectives | `problem`, `rho`, `resolution` |
| Network landscape | `optimizers`, `model`, `epochs`, `analyses` |
| Curvature monitor | `preset` (`cross_entropy`, `edge_of_stability`) |
| Flatness study | `population` (`0`, `1`, ..., `pooled`), `target` (`gap_error`, `test_error`, `ood_error`) |

Examples (each opens the page with these settings):
"""
)
for page, label, params in PRESETS:
    st.page_link(page, label=f"{label} — `{preset_url(page, params)}`", query_params=params)
st.caption("Pages are listed in the sidebar. Source, tests and benchmarks: see the README.")
