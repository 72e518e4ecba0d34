"""The seed papers' toy figures, regenerated from code, each with a JSON of the numbers it shows.

``python -m toy_problems figures --out DIR [--only NAME] [--resolution N]``

Figures (name -> what):

* ``fsam_fig1``: Fisher SAM Fig. 1, contour of eq. 15 with both minima (loss, Hessian trace), ours and
  the paper's.
* ``fsam_fig2``: Fisher SAM Fig. 2, SAM vs FSAM (analytic Fisher, gamma = 1): SAM sharp, FSAM flat.
* ``fsam_fig2_small_gamma``: the same pair with gamma = 0.2 from a large-sigma start: FSAM stalls on
  the ridge between the basins.
* ``fsam_fig3``: Fisher SAM Fig. 3, ASAM (its own radius) vs FSAM from a start with mu near 0.
* ``vsam_fig1``: VSAM Fig. 1 A-D at rho = 8 (loss, Gaussian-smoothed, worst case in the ball, SAM's
  first-order objective) with basin areas.
* ``bsam_fig1``: bSAM Fig. 1, SAM's max-loss vs the expected loss on a 1-D loss (a), the relaxation
  ``-f**`` vs the expected loss at three sigmas (b).
* ``bsam_fig2``: bSAM Fig. 2, the dual spaces (a) and ``f`` vs its biconjugate ``f**`` over ``mu`` (b)
  and over ``(m, sigma)`` (c).
* ``bsam_fig3``: bSAM Fig. 3, predictive maps (exact, SAM, SAM + Laplace, bSAM) on logistic regression.
* ``bsam_fig5``: bSAM Fig. 5, data with decision boundaries of the MAP and of exact-posterior samples,
  the exact density with the samples, posterior contours (exact density, MAP, SAM, SAM + Laplace,
  bSAM).
* ``bsam_fig6``: bSAM Fig. 6, two moons predictive uncertainty (SAM, bSAM, SAM + Laplace).
* ``bsam_fig7``: bSAM Fig. 7, full-covariance Gaussians of the Bayes objective and of its relaxation
  against the exact posterior (logistic regression).

``resolution`` is the grid size of every map; below 100 the figures run in *reduced* mode (fewer
quadrature nodes, fewer epochs for two moons) so that the test suite can run them.

Modules: ``common`` (plotting and saving helpers), ``fisher_sam`` (Fisher SAM Fig. 1-3), ``vsam``
(VSAM Fig. 1), ``bsam`` (bSAM Fig. 3, 5 and 6), ``bsam_relaxation`` (bSAM Fig. 1, 2 and 7).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from toy_problems.figures.bsam import (
    LOGREG_SETTINGS,
    MOONS_SETTINGS,
    bsam_fig3,
    bsam_fig5,
    bsam_fig6,
    logistic_results,
    moons_results,
)
from toy_problems.figures.bsam_relaxation import (
    FIG7_SETTINGS,
    RELAXATION_SETTINGS,
    bsam_fig1,
    bsam_fig2,
    bsam_fig7,
)
from toy_problems.figures.common import REDUCED_BELOW, save_json
from toy_problems.figures.fisher_sam import (
    FSAM_SETTINGS,
    fsam_fig1,
    fsam_fig2,
    fsam_fig2_small_gamma,
    fsam_fig3,
)
from toy_problems.figures.vsam import VSAM_BOUNDS, VSAM_RHO, vsam_fig1, vsam_panels

__all__ = [
    "FIGURES",
    "make_figures",
    "FSAM_SETTINGS",
    "LOGREG_SETTINGS",
    "RELAXATION_SETTINGS",
    "FIG7_SETTINGS",
    "MOONS_SETTINGS",
    "VSAM_RHO",
    "VSAM_BOUNDS",
    "logistic_results",
    "moons_results",
    "vsam_panels",
    "fsam_fig1",
    "fsam_fig2",
    "fsam_fig2_small_gamma",
    "fsam_fig3",
    "vsam_fig1",
    "bsam_fig1",
    "bsam_fig2",
    "bsam_fig3",
    "bsam_fig5",
    "bsam_fig6",
    "bsam_fig7",
]

FIGURES: dict[str, Callable[[Path, int], dict]] = {
    "fsam_fig1": fsam_fig1,
    "fsam_fig2": fsam_fig2,
    "fsam_fig2_small_gamma": fsam_fig2_small_gamma,
    "fsam_fig3": fsam_fig3,
    "vsam_fig1": vsam_fig1,
    "bsam_fig1": bsam_fig1,
    "bsam_fig2": bsam_fig2,
    "bsam_fig3": bsam_fig3,
    "bsam_fig5": bsam_fig5,
    "bsam_fig6": bsam_fig6,
    "bsam_fig7": bsam_fig7,
}


def make_figures(
    out: str | Path, only: list[str] | None = None, resolution: int = 200, progress: bool = True
) -> dict[str, dict]:
    """Write ``NAME.png`` (+ ``NAME.html`` where interactive helps) and ``NAME.json`` for each figure."""
    if resolution < 10:
        raise ValueError(f"resolution must be >= 10, got {resolution}")
    names = list(FIGURES) if not only else list(only)
    unknown = [n for n in names if n not in FIGURES]
    if unknown:
        raise ValueError(f"unknown figure(s) {unknown}; choose from {list(FIGURES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in names:
        t0 = time.perf_counter()
        numbers = FIGURES[name](out, resolution)
        numbers = {
            "figure": name,
            "resolution": resolution,
            "reduced": resolution < REDUCED_BELOW,
            "seconds": time.perf_counter() - t0,
            **numbers,
        }
        save_json(numbers, out / f"{name}.json")
        results[name] = numbers
        if progress:
            print(f"{name}: {numbers['seconds']:.1f} s -> {out / (name + '.png')}", flush=True)
    return results
