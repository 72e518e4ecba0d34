"""Claims of ``docs/guide.md`` and the method pages ``docs/methods/curvature.md``, ``sharpness.md`` and
``toy_problems.md``.

And on those pages the phrases whose numbers are no result of ours (``NOT_RESULTS``).
See ``docs/claims.py`` for what a claim is and how the pages' numbers are checked.
"""

from __future__ import annotations

import math
from typing import Any

from claim import ATEN_AVX2, Claim

GUIDE = ("docs/guide.md",)
TOY_METHODS = ("docs/methods/toy_problems.md",)
FIGURES = "python -m toy_problems figures --only {name} --out {{out}}"
FSAM_TOY = (
    "toy_problems/figures/fisher_sam.py",
    "toy_problems/figures/common.py",
    "toy_problems/gaussian_mixture.py",
)
BSAM_FIG = ("toy_problems/figures/bsam.py", "toy_problems/figures/common.py", "toy_problems/logistic.py")
#: why a figure's claim is not re-run: its command takes minutes and no other claim runs it
SLOW_FIGURE = (
    "not re-run (the figure takes about {minutes} on one core and no other claim re-runs it); "
    "regenerate with python -m toy_problems figures --only {name} --out docs/figures"
)


# ---------------------------------------------------------------------------------- guide.md
def _example_row(method: str, index: int, key: str = "value", scale: float = 1.0):
    """Row ``index`` (the order of ``MEASURES`` in ``docs/sharpness_example.py``) of ``method``:
    its value or standard error, times ``scale`` (the table writes ``2.093e-4`` as a mantissa)."""
    return lambda d: scale * d["methods"][method]["rows"][index][key]


def _sharpness_example() -> tuple[str, dict[str, Any]]:
    """The guide's worked-example table (``docs/figures/sharpness_example.json``): quote and values."""
    values: dict[str, Any] = {}
    cells = {}
    names = ("lmax", "trace", "gnorm", "wc", "awc", "avg", "keskar", "pacbayes", "fisher")
    plain = ("lmax", "gnorm", "awc", "keskar", "pacbayes", "fisher")
    for method in ("SGD", "SAM"):
        m = method.lower()
        for i, name in enumerate(names):
            values[f"{m}_{name}"] = _example_row(method, i)
        values[f"{m}_trace_se"] = _example_row(method, 1, "stderr")
        values[f"{m}_acc"] = f"methods.{method}.accuracy.test"
        cells[m] = {name: f"{{{m}_{name}:.4g}}" for name in plain}
    # the table writes these in powers of ten with a fixed exponent
    values["sgd_wc"] = _example_row("SGD", 3, scale=1e4)
    values["sam_wc"] = _example_row("SAM", 3, scale=1e4)
    values["sgd_avg"] = _example_row("SGD", 5, scale=1e4)
    values["sam_avg"] = _example_row("SAM", 5, scale=1e5)
    values["sgd_avg_se"] = _example_row("SGD", 5, "stderr", 1e6)
    values["sam_avg_se"] = _example_row("SAM", 5, "stderr", 1e6)
    g, s = cells["sgd"], cells["sam"]
    quote = "\n".join(
        [
            f"| lambda_max | {g['lmax']} | {s['lmax']} |",
            "| hessian_trace | {sgd_trace:.4g} ± {sgd_trace_se:.2g} | {sam_trace:.4g} ± {sam_trace_se:.2g} |",
            f"| gradient_norm | {g['gnorm']} | {s['gnorm']} |",
            "| worst_case ρ = 0.05 | {sgd_wc:.3f}e-4 | {sam_wc:.3f}e-4 |",
            f"| worst_case ρ = 0.5, adaptive | {g['awc']} | {s['awc']} |",
            "| average_case ρ = 0.01 | {sgd_avg:.3f}e-4 ± {sgd_avg_se:.1f}e-6 | {sam_avg:.3f}e-5 ± "
            "{sam_avg_se:.1f}e-6 |",
            f"| keskar ε = 1e-3 | {g['keskar']} | {s['keskar']} |",
            f"| pacbayes_flatness | {g['pacbayes']} | {s['pacbayes']} |",
            f"| fisher_trace | {g['fisher']} | {s['fisher']} |",
            "| test accuracy | {sgd_acc:.4f} | {sam_acc:.4f} |",
        ]
    )
    return quote, values


SHARPNESS_EXAMPLE_QUOTE, SHARPNESS_EXAMPLE_VALUES = _sharpness_example()


# ---------------------------------------------------------------------------------- toy_problems.md
def _share(panel: str, band: bool = False):
    """The sharp basin's share of panel ``panel`` of ``vsam_fig1.json`` in %, with its Wilson 95 %
    interval (``lo``, ``hi``); ``band``: panel A on the band sigma > rho."""

    def get(part: str):
        def read(d: dict[str, Any]) -> float:
            node = d["panels"][panel]
            sharp = (node["on_band_sigma_gt_rho"] if band else node)["sharp"]
            return 100 * (sharp["share"] if part == "share" else sharp["wilson95"][part == "hi"])

        return read

    return get("share"), get("lo"), get("hi")


def _basin_values() -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, panel, band in (("a", "A", False), ("ab", "A", True), ("b", "B", False), ("c", "C", False)):
        values[key], values[f"{key}_lo"], values[f"{key}_hi"] = _share(panel, band)
    for key in "abc":
        values[f"{key}_gap"] = f"panels.{key.upper()}.sharp_minus_flat"
    return values


def exact_std(i: int):
    """The exact posterior's marginal standard deviation ``i`` of a bSAM Fig. 3 JSON."""
    return lambda d: math.sqrt(d["exact"]["cov"][i][i])


def _fig6(method: str, key: str, scale: float = 1.0):
    # a key with dots ("fraction_uncertain_0.2_0.8"): read directly, not through a dotted path
    return lambda d: scale * d["methods"][method][key]


CLAIMS: list[Claim] = [
    Claim(
        id="guide.sharpness_example",
        source="docs/figures/sharpness_example.json",
        values=SHARPNESS_EXAMPLE_VALUES,
        quote=SHARPNESS_EXAMPLE_QUOTE,
        files=GUIDE,
        inputs=("docs/sharpness_example.py",),
        notes="not re-run (about 30 s on one core); regenerate with python docs/sharpness_example.py "
        "--json docs/figures/sharpness_example.json",
    ),
    Claim(
        id="toy_methods.fsam_fig1_minima",
        source="docs/figures/fsam_fig1.json",
        values={
            "fx": "minima.flat.theta.0",
            "fy": "minima.flat.theta.1",
            "fl": "minima.flat.loss",
            "ft": "minima.flat.hessian_trace",
            "pfx": "paper.flat.theta.0",
            "pfy": "paper.flat.theta.1",
            "pfl": "paper.flat.loss",
            "pft": "paper.flat.hessian_trace",
            "sx": "minima.sharp.theta.0",
            "sy": "minima.sharp.theta.1",
            "sl": "minima.sharp.loss",
            "st": "minima.sharp.hessian_trace",
            "psx": "paper.sharp.theta.0",
            "psy": "paper.sharp.theta.1",
            "psl": "paper.sharp.loss",
            "pst": "paper.sharp.hessian_trace",
            "dfl": lambda d: d["paper"]["flat"]["loss"] - d["minima"]["flat"]["loss"],
            "dsl": lambda d: d["paper"]["sharp"]["loss"] - d["minima"]["sharp"]["loss"],
        },
        quote="| flat | ({fx:.4f}, {fy:.4f}) | {fl:.4f} | {ft:.5f} | ({pfx:.2f}, {pfy:.2f}) | {pfl:.2f} | "
        "{pft:.3f} |\n| sharp | ({sx:.4f}, {sy:.4f}) | {sl:.4f} | {st:.5f} | ({psx:.2f}, {psy:.2f}) | "
        "{psl:.2f} | {pst:.3f} |\n\nLocations and traces agree to the paper's rounding or nearly (the "
        "sharp minimum's trace, which the paper prints with one digit); the loss values do not (both "
        "are lower, by {dfl:.2f} and {dsl:.2f},",
        files=TOY_METHODS,
        inputs=FSAM_TOY,
        rerun=FIGURES.format(name="fsam_fig1"),
        tolerance=5e-4,
        cost="cheap",
    ),
    Claim(
        id="toy_methods.vsam_fig1_basins",
        source="docs/figures/vsam_fig1.json",
        values=_basin_values(),
        quote="| A: loss | {a:.1f} % [{a_lo:.1f}, {a_hi:.1f}] (square); "
        "{ab:.1f} % [{ab_lo:.1f}, {ab_hi:.1f}] "
        "($\\sigma > \\rho$) | {a_gap:+.3f} |\n"
        "| B: Gaussian smoothing | {b:.1f} % [{b_lo:.1f}, {b_hi:.1f}] ($\\sigma > \\rho$) | {b_gap:+.3f} |\n"
        "| C: worst case | {c:.1f} % [{c_lo:.1f}, {c_hi:.1f}] ($\\sigma > \\rho$) | {c_gap:+.3f} |\n"
        "| D: SAM first order | no local minima | |\n\n"
        "The paper's claim holds in part: smoothing (B) removes the sharp minimum's depth advantage but "
        "keeps its basin of attraction ({b:.1f} % against {ab:.1f} % for the loss on the same band); the "
        "worst case (C) shrinks the basin to {c:.1f} %",
        files=TOY_METHODS,
        inputs=(
            "toy_problems/figures/vsam.py",
            "toy_problems/_flow_basins.py",
            "toy_problems/smoothing.py",
            "toy_problems/gaussian_mixture.py",
        ),
        notes=SLOW_FIGURE.format(minutes="1 minute", name="vsam_fig1"),
    ),
    Claim(
        id="toy_methods.bsam_fig3_distances",
        source="docs/figures/bsam_fig3.json",
        values={
            **{
                f"{key}_{stat}": f"predictive_distance_to_exact.{name}.{stat}_mean"
                for key, name in (
                    ("b", "bSAM"),
                    ("map", "MAP"),
                    ("vi", "MFVI"),
                    ("s", "SAM"),
                    ("lmap", "Laplace at MAP"),
                    ("sl", "SAM+Laplace"),
                )
                for stat in ("tv", "kl")
            },
            "det": "posteriors.SAM+Laplace.det_cov_ratio_to_exact",
            "bdet": "posteriors.bSAM.det_cov_ratio_to_exact",
        },
        quote="| bSAM | {b_tv:.3f} | {b_kl:.3f} |\n| MAP (point) | {map_tv:.3f} | {map_kl:.3f} |\n"
        "| MFVI | {vi_tv:.3f} | {vi_kl:.3f} |\n| SAM (point) | {s_tv:.3f} | {s_kl:.3f} |\n"
        "| Laplace at the MAP | {lmap_tv:.3f} | {lmap_kl:.3f} |\n"
        "| SAM + Laplace | {sl_tv:.3f} | {sl_kl:.3f} |\n\n"
        "As in the paper, bSAM is closest to the exact predictive and corrects SAM's overconfidence, and "
        "the Laplace approximation at the SAM point over-estimates the posterior's extent (covariance "
        "determinant {det:.1f} times the exact one). Caveat: our bSAM covariance is much *narrower* than "
        "the exact one (determinant ratio {bdet:.3f})",
        files=TOY_METHODS,
        inputs=BSAM_FIG,
        rerun=FIGURES.format(name="bsam_fig3"),
        tolerance=0.002,
        # SAM's last iterate (the SAM point) moves with the rounding of ATen's kernels, and with it
        # the SAM and SAM+Laplace values; the JSON was written with the AVX2 ones
        rerun_env=ATEN_AVX2,
    ),
    Claim(
        id="toy_methods.bsam_fig3_exact_std",
        source="docs/figures/bsam_fig3.json",
        values={"ex": exact_std(0), "ey": exact_std(1)},
        quote="the exact marginal standard deviations are ({ex:.2f}, {ey:.2f})",
        files=TOY_METHODS,
        inputs=BSAM_FIG,
        rerun=FIGURES.format(name="bsam_fig3"),
        tolerance=0.002,
        rerun_env=ATEN_AVX2,  # the JSON's SAM point was written with ATen's AVX2 kernels
    ),
    Claim(
        id="toy_methods.bsam_fig6_entropy",
        source="docs/figures/bsam_fig6.json",
        values={
            "s": _fig6("SAM", "mean_predictive_entropy"),
            "b": _fig6("bSAM", "mean_predictive_entropy"),
            "l": _fig6("SAM+Laplace", "mean_predictive_entropy"),
            "su": _fig6("SAM", "fraction_uncertain_0.2_0.8", 100),
            "bu": _fig6("bSAM", "fraction_uncertain_0.2_0.8", 100),
            "lu": _fig6("SAM+Laplace", "fraction_uncertain_0.2_0.8", 100),
        },
        quote="Mean predictive entropy on the plotting grid: SAM {s:.3f}, bSAM {b:.3f}, "
        "SAM + Laplace {l:.3f} nats (share of the grid with $0.2 < p < 0.8$: "
        "{su:.0f} %, {bu:.0f} %, {lu:.0f} %)",
        files=TOY_METHODS,
        inputs=(
            "toy_problems/figures/bsam.py",
            "toy_problems/figures/common.py",
            "toy_problems/two_moons.py",
        ),
        notes=SLOW_FIGURE.format(minutes="6 minutes", name="bsam_fig6"),
    ),
]

#: page -> the phrases on it whose numbers are no result of ours (a setting, a target, a paper's own
#: number); a page listed here has every other number quoted by a claim (tests/test_claims.py)
NOT_RESULTS: dict[str, tuple[str, ...]] = {
    "docs/guide.md": (
        # the test suite's tolerances (limits, not measurements)
        "(tested to 1e-12)",
        "to ≤ 1e-10 on 20 cases",
        "equal one process to 1e-10, tested",
        "are invariant (≤ 1e-4)",
        "to 1e-16 over 3 steps",
        "bf16 within 1e-2 of float32",
        "equal one\nprocess to 1e-11)",
        "equal one process to 1e-11)",
        "in torch 2.13",
        # settings of the commands and of the worked example, the optimizers' defaults
        "--set worst_case.rho=0.1",
        "SGD (momentum 0.9, lr 0.05) vs SAM (ρ = 0.05)",
        "(ρ = 1e-6, δ = 1e-8)",
        "the\n  old 1e-3/1e-2",
        # memory arithmetic from the zoo's published parameter counts
        "(2 × parameters × 4 bytes",
        "(1.7 M parameters",
    ),
    "docs/methods/curvature.md": (
        "at least 3x the parameters' bytes",
        "3,000 draws within\n8 % of the dense GGN",  # the test's tolerance
        "`level` (default 0.95)",
        "| `level` | 0.95 |",
        "nominal 95 % intervals",
        "a nominal 95 %",
        "1 % of the range of all nodes",
    ),
    "docs/methods/sharpness.md": (
        "(the paper also uses $5 \\cdot 10^{-4}$)",
        "(half-width of the 95 % interval",
        "| `rho` | 0.05 |",
        '`None`, `False`, 0.0, `"empirical"`',
        "(arXiv:2210.10452)",
        "(arXiv:2306.13914)",
        "$\\eta = 2.5\\rho/\\text{iterations}$",
        "momentum $\\alpha = 0.75$",
        "$p_1 = 0.22$",
        "$p_{j+1} = p_j + \\max(p_j - p_{j-1} - 0.03,\\ 0.06)$",
        "fewer than 75 % of the steps",
        "(pgd: $2.5\\rho/\\text{iterations}$",
        "| 0.75 (apgd) |",
        "20 iterations, momentum 0.75",
        "| `gamma` | 0.1 |",
        "| `eta` | 1.0 |",
        "($\\gamma = 0.1$, $\\eta = 1$)",
        # a closed form: one pair's relative standard deviation sqrt(2/p) over sqrt(100) pairs
        "below 10 % of the value for every $p \\ge 2$",
        "| `rho` | 0.01 (a standard deviation) |",
        "(Metric 2.1)",
        "| `radius` | 0.1 |",
        "(0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)",
        "($\\alpha$ from 0.1 to 5.0)",
        "| `target` | 0.1 |",
        "| `start` | 0.01 |",
        "Auto-PGD momentum 0.75",
    ),
    "docs/methods/toy_problems.md": (
        # the problems' definitions, grids and plotting ranges
        "= (20, 30, 0.7, 1.8)$",
        "= (-20, 10, 0.3, 1.2)$",
        "2.2^2 I)$",
        "with spacing 0.1 (rectangle rule)",
        "$x_1 \\in [-1.75, 2.75]$",
        "$x_2 \\in [-1.25, 1.75]$",
        "$(1.5 - x + xy)^2 + (2.25 - x + xy^2)^2 + (2.625 - x + xy^3)^2$ | none | $(3, 0.5)$",
        "$[-4.5, 4.5]^2$",
        "$(-2.805118, 3.131312)$, $(-3.779310, -3.283186)$, $(3.584428, -1.848126)$",
        "$[-5.12, 5.12]^2$",
        # the figures' settings
        "start with $\\gamma = 0.2$",
        "trajectories, gamma 0.2",
        "$\\gamma = 0.2$, otherwise as",
        "circle of radius 0.2 is a dot",
        "ASAM with $\\rho = 0.1$, $\\eta = 0.01$",
        "Heun steps of arc length 0.5, 0.25 for C",
        "the Wilson 95 % interval",
        "$1.96\\sqrt{se_1^2 + se_2^2}$",
        "bSAM\n($\\rho = 0.05$, learning rate 0.5, damping 0.1, prior precision $1/100$",
        "(learning rate 0.01, initial standard deviation 0.1, prior standard deviation 10",
        "(initial precision 1, $\\beta_2 = 0.999$,\ndamping 0.1)",
        "$\\rho = 0.05$,\n$\\gamma = 0.1$, $\\delta = 10^{-4}$",
        "(prior precision $\\delta N = 0.01$), learning rate 0.5",
        "SAM with $\\rho = 0.05$ and SGD (learning rate\n0.1, momentum 0.9;",
        "share of the grid with\n$0.2 < p < 0.8$",
        "bSAM's own prior precision ($\\delta N = 0.01$)",
    ),
}
