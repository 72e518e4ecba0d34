"""Claims of ``docs/miniatures.md`` (its tables come from ``docs/figures/miniature_tables.md``).

And on those pages the phrases whose numbers are no result of ours (``NOT_RESULTS``).
See ``docs/claims.py`` for what a claim is and how the pages' numbers are checked. The page's
label-noise, bSAM-calibration, F-version verdict and timing tables are rows copied whole from the
generated ``docs/figures/miniature_tables.md`` (``tests/test_make_miniatures.py`` compares it with
``docs/figures/miniature_results.json``), so they need no claim; the sentences and the tables the
generated page does not hold are claims on the same JSON here.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from claim import Claim

PAGE = ("docs/miniatures.md",)
SOURCE = "docs/figures/miniature_results.json"
#: the command that remakes the miniatures (about 10 min): every claim on miniature_results.json
#: names this one string (docs/claim_list.py, claim_list_optimizers.py), so the expensive re-run,
#: grouped by command, runs once for all of them
MINIATURE_RUN = (
    "python -m experiments run configs/miniatures/label_noise.toml out_dir={out}/runs && "
    "python -m experiments run configs/miniatures/flat_posteriors.toml out_dir={out}/runs && "
    "python docs/make_miniatures.py --runs {out}/runs --out {out}"
)
MINIATURE_INPUTS = (
    "configs/miniatures/label_noise.toml",
    "configs/miniatures/flat_posteriors.toml",
    "docs/make_miniatures.py",
)
#: ``experiments run`` exits with 3 when a run diverged and was recorded (G-TRACER seed 1 at 40 %)
MINIATURE_STATUS = (0, 3)
LN4, LN6 = "label_noise=0.4", "label_noise=0.6"


def _values(d: dict[str, Any], part: str, variant: str | None, method: str, key: str) -> list[float]:
    """``key`` of every run of ``method`` (and ``variant``) that has it (a diverged run has no metrics)."""
    rows = [
        r[key]
        for r in d[part]
        if r["method"] == method and (variant is None or r["variant"] == variant) and key in r
    ]
    if not rows:
        raise KeyError(f"{part}: no {key!r} for {variant!r} / {method!r}")
    return rows


def _stat(
    part: str,
    variant: str | None,
    method: str,
    key: str,
    stat: Callable = statistics.mean,
    scale: float = 1.0,
):
    """``stat`` (mean; ``statistics.stdev`` is the tables' ddof-1 std) of ``key`` over the seeds."""
    return lambda d: scale * stat(_values(d, part, variant, method, key))


def _seed(variant: str, method: str, seed: int, key: str, scale: float = 1.0):
    def get(d: dict[str, Any]) -> float:
        return scale * next(
            r[key]
            for r in d["label_noise"]
            if (r["variant"], r["method"], r["seed"]) == (variant, method, seed)
        )

    return get


def _mean_sd(name: str, part: str, variant: str | None, method: str, key: str) -> dict[str, Any]:
    """Values ``name`` and ``name_sd``: mean and sample std over the seeds."""
    return {
        name: _stat(part, variant, method, key),
        f"{name}_sd": _stat(part, variant, method, key, statistics.stdev),
    }


def _divergence(field: str):
    """A field of the runner's divergence record of the G-TRACER run it stopped (40 % noise)."""
    return lambda d: next(r["divergence"][field] for r in d["label_noise"] if r.get("status") == "diverged")


def _bma_table() -> tuple[str, dict[str, Any]]:
    """Section 4's model-average table: BMA accuracy, NLL and ECE, mean ± std over the seeds."""
    lines, values = [], {}
    for method, label in (("swag", "SWAG"), ("f_swag", "F-SWAG"), ("sgld", "SGLD"), ("f_sgld", "F-SGLD")):
        cells = []
        for metric in ("bma_accuracy", "bma_nll", "bma_ece"):
            name = f"{method}_{metric}"
            values.update(_mean_sd(name, "flat_posteriors", None, method, metric))
            cells.append(f"{{{name}:.3f}} ± {{{name}_sd:.3f}}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines), values


BMA_QUOTE, BMA_VALUES = _bma_table()


def _claim(id: str, values: dict[str, Any], quote: str, tolerance: float = 0.01) -> Claim:
    """A claim on the miniatures' JSON; ``tolerance``: 0.01 for accuracies, NLL and ECE (as the
    miniature claims of docs/claim_list.py), one percentage point for percentages."""
    return Claim(
        id=f"miniatures_page.{id}",
        source=SOURCE,
        values=values,
        quote=quote,
        files=PAGE,
        inputs=MINIATURE_INPUTS,
        rerun=MINIATURE_RUN,
        tolerance=tolerance,
        ok_status=MINIATURE_STATUS,
    )


CLAIMS: list[Claim] = [
    _claim(
        "sgd_memorises_pct",
        {"m": lambda d: 100 * min(_values(d, "label_noise", None, "sgd", "memorised"))},
        "here SGD fits {m:.0f} % of the flipped training labels",
        tolerance=1.0,
    ),
    _claim(
        "sgd_accuracy_falls",
        {
            "b4": _stat("label_noise", LN4, "sgd", "best_accuracy"),
            "a4": _stat("label_noise", LN4, "sgd", "accuracy"),
            "b6": _stat("label_noise", LN6, "sgd", "best_accuracy"),
            "a6": _stat("label_noise", LN6, "sgd", "accuracy"),
        },
        "its test accuracy falls from {b4:.2f} (best epoch) to {a4:.2f} at 40 % noise, and from {b6:.2f} "
        "to {a6:.2f} at 60 %.",
    ),
    _claim(
        "sam_rho05_pct",
        {
            "m": lambda d: (
                100
                * max(
                    statistics.mean(_values(d, "label_noise", v, "sam_rho0.5", "memorised"))
                    for v in (LN4, LN6)
                )
            ),
            "g": lambda d: (
                100
                * min(statistics.mean(_values(d, "label_noise", v, "sgd", "memorised")) for v in (LN4, LN6))
            ),
            "c4lo": _stat("label_noise", LN4, "sam_rho0.5", "flipped_predicted_clean", min, 100),
            "c4hi": _stat("label_noise", LN4, "sam_rho0.5", "flipped_predicted_clean", max, 100),
            "c6lo": _stat("label_noise", LN6, "sam_rho0.5", "flipped_predicted_clean", min, 100),
            "c6hi": _stat("label_noise", LN6, "sam_rho0.5", "flipped_predicted_clean", max, 100),
        },
        "At ρ 0.5 SAM fits only {m:.0f} % of the wrong labels (SGD {g:.0f} %), classifies "
        "{c4lo:.0f}-{c4hi:.0f} % (40 % noise) and {c6lo:.0f}-{c6hi:.0f} % (60 % noise) of the flipped "
        "training examples by their *true* class",
        tolerance=1.0,
    ),
    _claim(
        "sam_rho05_accuracy_ece",
        {
            "s4": _stat("label_noise", LN4, "sam_rho0.5", "accuracy"),
            "g4": _stat("label_noise", LN4, "sgd", "accuracy"),
            "s6": _stat("label_noise", LN6, "sam_rho0.5", "accuracy"),
            "g6": _stat("label_noise", LN6, "sgd", "accuracy"),
            "e4": _stat("label_noise", LN4, "sam_rho0.5", "ece"),
            "e6": _stat("label_noise", LN6, "sam_rho0.5", "ece"),
        },
        "keeps its best-epoch accuracy to the end: {s4:.3f} vs SGD's {g4:.3f} at 40 %, "
        "{s6:.3f} vs {g6:.3f} at 60 %. At ρ 0.1 SAM memorises as SGD does, only a few epochs later "
        "(figure). Its ECE at ρ 0.5 is high ({e4:.2f} / {e6:.2f})",
    ),
    _claim(
        "asam_memorises_pct",
        {
            "lo": lambda d: (
                100
                * min(statistics.mean(_values(d, "label_noise", v, "asam", "memorised")) for v in (LN4, LN6))
            ),
            "hi": lambda d: (
                100
                * max(statistics.mean(_values(d, "label_noise", v, "asam", "memorised")) for v in (LN4, LN6))
            ),
        },
        "it memorises {lo:.0f}-{hi:.0f} % of the wrong labels.",
        tolerance=1.0,
    ),
    _claim(
        "gtracer_divergence",
        {
            "step": _divergence("step"),
            "w": _divergence("window"),
            "loss": _divergence("loss"),
            "ref": _divergence("reference"),
        },
        "the runner stopped the run at step {step:.0f}, where the mean training loss of the last {w:.0f} "
        "steps ({loss:.1f}) exceeded ten times the first step's ({ref:.2f})",
        # the loss of a diverging run: another machine's rounding moves it more than an accuracy
        tolerance=0.5,
    ),
    _claim(
        "gtracer_seeds",
        {
            "a": _seed(LN4, "sgd_tracer", 0, "accuracy"),
            "b": _seed(LN4, "sgd_tracer", 2, "accuracy"),
            **_mean_sd("g4", "label_noise", LN4, "sgd", "accuracy"),
            **_mean_sd("t6", "label_noise", LN6, "sgd_tracer", "accuracy"),
            **_mean_sd("g6", "label_noise", LN6, "sgd", "accuracy"),
        },
        "The other two seeds ({a:.3f}, {b:.3f}) are not resolved from SGD "
        "({g4:.3f} ± {g4_sd:.3f}). At 60 % noise all three seeds converged and G-TRACER is not resolved "
        "from SGD ({t6:.3f} ± {t6_sd:.3f} vs {g6:.3f} ± {g6_sd:.3f});",
    ),
    _claim(
        "gtracer_seed1_memorises_pct",
        {"m": _seed(LN6, "sgd_tracer", 1, "memorised", 100)},
        "seed 1 again started unstably and fitted fewer wrong labels ({m:.0f} %).",
        tolerance=1.0,
    ),
    _claim(
        "bsam_point_accuracy",
        {
            **_mean_sd("b4", "label_noise", LN4, "bsam", "accuracy"),
            **_mean_sd("g4", "label_noise", LN4, "sgd", "accuracy"),
            **_mean_sd("b6", "label_noise", LN6, "bsam", "accuracy"),
            **_mean_sd("g6", "label_noise", LN6, "sgd", "accuracy"),
        },
        "**bSAM (point accuracy): not resolved** at 40 % ({b4:.3f} ± {b4_sd:.3f} vs {g4:.3f} ± {g4_sd:.3f}); "
        "at 60 %\n**resolved** in these runs ({b6:.3f} ± {b6_sd:.3f} vs SGD's {g6:.3f} ± {g6_sd:.3f}).",
    ),
    _claim(
        "bsam_mean_weights_and_sam_rho02",
        {
            "b": _stat("label_noise", LN4, "bsam", "ece"),
            "s": _stat("label_noise", LN4, "sam", "ece"),
            "e4": _stat("label_noise", LN4, "sam_rho0.2", "ece"),
            "e6": _stat("label_noise", LN6, "sam_rho0.2", "ece"),
            "n4": _stat("label_noise", LN4, "sam_rho0.2", "nll"),
            "n6": _stat("label_noise", LN6, "sam_rho0.2", "nll"),
        },
        "bSAM's own mean weights are not better calibrated than SAM's (ECE {b:.3f} vs {s:.3f} at 40 %): the "
        "gain comes from averaging over the posterior. Against SAM at ρ 0.2 (ECE {e4:.3f} / {e6:.3f}, NLL "
        "{n4:.3f} / {n6:.3f}) bSAM's model average has the lower ECE at 40 % only; at 60 % SAM ρ 0.2 is "
        "better on both.",
    ),
    _claim("bma_table", BMA_VALUES, BMA_QUOTE),
    _claim(
        "sgld_final_sharpness",
        {
            **_mean_sd("s", "flat_posteriors", None, "sgld", "sharpness_lambda_max"),
            **_mean_sd("f", "flat_posteriors", None, "f_sgld", "sharpness_lambda_max"),
        },
        "The sharpness of the last SGLD / F-SGLD iterate (λ_max {s:.2f} ± {s_sd:.2f} vs {f:.2f} ± "
        "{f_sd:.2f}) is not resolved",
    ),
    Claim(
        id="miniatures_page.digits_8_epoch_ece",
        source="docs/figures/digits_miniature.json",
        values={
            "b": "settings.clean.methods.bsam.mean.bma_ece",
            "b_sd": "settings.clean.methods.bsam.std.bma_ece",
            "s": "settings.clean.methods.sam.mean.ece",
            "s_sd": "settings.clean.methods.sam.std.ece",
            "g": "settings.clean.methods.sgd.mean.ece",
            "g_sd": "settings.clean.methods.sgd.std.ece",
        },
        quote="reproduces it (ECE {b:.3f} ± {b_sd:.3f} vs {s:.3f} ± {s_sd:.3f} and {g:.3f} ± {g_sd:.3f})",
        files=PAGE,
        # as docs/claim_list.py's digits_miniature.table: the same command, re-run once for both
        inputs=("configs/digits_sam_vs_sgd.toml", "docs/make_digits_table.py"),
        rerun="python docs/make_digits_table.py --out {out}",
        tolerance=0.005,
    ),
]

#: page -> the phrases on it whose numbers are no result of ours (a setting, a target, a paper's own
#: number); a page listed here has every other number quoted by a claim (tests/test_claims.py)
NOT_RESULTS: dict[str, tuple[str, ...]] = {
    "docs/miniatures.md": (
        # the settings of the label-noise config and of the papers
        "40 % and 60 % of the training labels moved",
        "lr 0.05, cosine, momentum 0.9, weight decay 5e-4",
        "SAM ρ 0.1",
        "ASAM (ρ 0.5, η 0.01)",
        "Fisher-SAM (γ 0.1, η 0.001)",
        "(ρ 1e-6, δ 1e-8, β 0.01)",
        "also run at ρ 0.2 and 0.5",
        "ρ ∈ {0.05, 0.1, 0.2, 0.5} at 40 % noise",
        "reproduced for ρ ≥ 0.2, not resolved at the papers' ρ = 0.1",
        "in which the true class has probability 0.6 / 0.4",
        "With η = 0.001",
        "At 40 % noise seed 1 diverged",
        "δ = 1e-8",
        "ρ 1e-3, δ 1e-2",
        "was just resolved at 60 %",
        "the papers' ρ 0.1",
        # the settings of the flat-posterior config
        "constant lr 0.05, momentum 0.9, weight decay 5e-4",
        "at a final lr of 0.01",
        "SAM ρ 0.05 inside",
        "step 0.05 on the mean loss",
        "ρ 0.05 F-SGLD",
    ),
}
