"""Claims of the benchmarks of ``docs/benchmarks.md`` other than the curvature-product benchmark
(``docs/claim_list_products.py``): the PyHessian comparison, the H100 tables, loss surfaces, optimizer
steps, per-example quantities, Kronecker factors.

And on those pages the phrases whose numbers are no result of ours (``NOT_RESULTS``).
See ``docs/claims.py`` for what a claim is and how the pages' numbers are checked.

Every claim here is a measurement (``rerun=None``): timings on a shared machine, and accuracies measured
in the same runs, checked against the committed JSON, not re-run (the benchmarks take minutes to hours).
"""

from __future__ import annotations

from typing import Any

from claim import Claim
from claim_list_products import sci_field, scientific

BENCHMARKS = ("docs/benchmarks.md",)
CURVATURE = "benchmarks/results/curvature.json"
H100 = "benchmarks/results/products_cuda_h100.json"
TRAINING = "benchmarks/results/training_mlp_cpu.json"
SURFACE = "benchmarks/results/bench_surface.json"
OPTIMIZERS = "benchmarks/results/bench_optimizers.json"


def _note(script: str, how_long: str) -> str:
    return (
        "a measurement (timings on a shared machine, and the accuracies of the same run): checked "
        f"against its JSON, not re-run; regenerate with python {script} ({how_long})"
    )


def _measured(
    cid: str, source: str, script: str, how_long: str, values: dict[str, Any], quote: str, **kw
) -> Claim:
    return Claim(
        id=cid,
        source=source,
        values=values,
        quote=quote,
        files=BENCHMARKS,
        inputs=(script,),
        notes=_note(script, how_long),
        **kw,
    )


# ---------------------------------------------------------------- against PyHessian (bench_curvature)
def _curvature_row(task: str, method: str, key: str):
    """A field of the row of ``method`` on ``task`` in ``benchmarks/bench_curvature.py``'s JSON."""
    return lambda d: next(r[key] for r in d["rows"] if r["task"] == task and r["method"] == method)


def _sci(prefix: str, get) -> dict[str, Any]:
    """The values of a quote's ``{<prefix>_m:.1f}e{<prefix>_e:.0f}`` (``1.4e-3``)."""
    return scientific(prefix, get, 1)


def _sci_field(prefix: str) -> str:
    return sci_field(prefix, 1)


PYH, LANCZOS, AUTO = "pyhessian", "ours lanczos tol=1e-06", "ours auto rtol=1e-3"
CURVATURE_VALUES: dict[str, Any] = {
    "n1p": _curvature_row("top-1", PYH, "hvps"),
    **_sci("e1p", _curvature_row("top-1", PYH, "rel_err")),
    "n1o": _curvature_row("top-1", LANCZOS, "hvps"),
    **_sci("e1o", _curvature_row("top-1", LANCZOS, "rel_err")),
    "n5p": _curvature_row("top-5", PYH, "hvps"),
    **_sci("e5p", _curvature_row("top-5", PYH, "rel_err")),
    "n5o": _curvature_row("top-5", LANCZOS, "hvps"),
    "r5o": _curvature_row("top-5", LANCZOS, "hvps_ratio"),
    **_sci("e5o", _curvature_row("top-5", LANCZOS, "rel_err")),
    "ntp": _curvature_row("trace", PYH, "hvps"),
    **_sci("etp", _curvature_row("trace", PYH, "rel_err")),
    "nto": _curvature_row("trace", AUTO, "hvps"),
    **_sci("eto", _curvature_row("trace", AUTO, "rel_err")),
    "se": lambda d: 100 * _curvature_row("trace", AUTO, "stderr_rel")(d),
}
CURVATURE_TABLE = (
    f"| top-1 | PyHessian | {{n1p:.0f}} | {_sci_field('e1p')} | no residuals |\n"
    f"| top-1 | ours (Lanczos, tol 1e-6) | {{n1o:.0f}} | {_sci_field('e1o')} | converged |\n"
    f"| top-5 | PyHessian | {{n5p:.0f}} | {_sci_field('e5p')} | |\n"
    f"| top-5 | **ours** | **{{n5o:.0f}}** ({{r5o:.2f}}×) | **{_sci_field('e5o')}** | converged |\n"
    f"| trace | PyHessian | {{ntp:.0f}} | {_sci_field('etp')} | no error bar |\n"
    f"| trace | ours (auto → XTrace) | {{nto:.0f}} | {_sci_field('eto')} | "
    "stderr {se:.2f} %, 95 % CI covers |"
)


CLAIMS: list[Claim] = [
    _measured(
        "bench_curvature.pyhessian_table",
        CURVATURE,
        "benchmarks/bench_curvature.py",
        "about 20 min for the dense Hessian",
        CURVATURE_VALUES,
        CURVATURE_TABLE,
        minus="-",  # 1.4e-3 is written with an ASCII minus, as in Python
    ),
    _measured(
        "bench_curvature.per_hvp_time",
        CURVATURE,
        "benchmarks/bench_curvature.py",
        "about 20 min for the dense Hessian",
        {
            "one": _curvature_row("per-HVP", "ours matvec", "per_hvp_ms_ratio"),
            "block": _curvature_row("per-HVP", "ours matmat(10)/10", "per_hvp_ms_ratio"),
        },
        "Per-HVP time: {one:.2f}× PyHessian's cached-graph HVP ({block:.2f}× per column of a block of 10;",
    ),
]


# ---------------------------------------------------------------- the H100 products (bench_products)
def _h100(method: str):
    """Time per product of ``method`` as a multiple of one gradient, ResNet-20 on the H100."""
    return lambda d: next(
        r["x_gradient"] for r in d["rows"] if r["model"] == "resnet20" and r["method"] == method
    )


H100_NOTE = (
    "a measurement (one NVIDIA H100, an earlier version of the products): checked against its JSON, not "
    "re-run (no GPU since); regenerate with python benchmarks/bench_products.py --device cuda"
)
CLAIMS += [
    Claim(
        id="products_cuda_h100.table",
        source=H100,
        values={
            "db": _h100("landscape double_backward"),
            "pyh": _h100("pyhessian"),
            "clh": _h100("curvlinops HessianLinearOperator"),
            "eth": _h100("eigenthings HessianOperator"),
            "gf": _h100("landscape ggn forward"),
            "gl": _h100("landscape ggn linearize"),
            "clg": _h100("curvlinops GGNLinearOperator"),
            "etg": _h100("eigenthings GGNOperator"),
            "floor": _h100("floor jvp+H+cached vjp"),
        },
        quote="| Hessian-vector | {db:.2f}× (double backward) | {pyh:.2f}× | {clh:.1f}× | {eth:.2f}× | – |\n"
        '| GGN-vector | {gf:.2f}× (forward jvp), **{gl:.2f}×** (`jvp="linearize"`) | – | {clg:.2f}× | '
        "{etg:.2f}× | {floor:.2f}× (jvp + closed-form H_out + cached vjp) |",
        files=BENCHMARKS,
        inputs=("benchmarks/bench_products.py",),
        notes=H100_NOTE,
    ),
    Claim(
        id="products_cuda_h100.forward_over_reverse",
        source=H100,
        values={"fr": _h100("landscape forward_over_reverse")},
        quote="H100 above, forward-over-reverse was {fr:.1f}× a gradient for one vector",
        files=BENCHMARKS,
        inputs=("benchmarks/bench_products.py",),
        notes=H100_NOTE,
    ),
]


# ---------------------------------------------------------------- training steps (bench_training)
def _training_target(name: str):
    """The ratio of a target of ``benchmarks/bench_training.py`` (names hold dots: no JSON path)."""
    return lambda d: next(t["ratio"] for t in d["summary"]["targets"] if t["target"] == name)


def _x_sgd(key: str) -> str:
    return f"rows.key={key}.x_runner_sgd"


TRAINING_KEYS = {
    "minimal": "minimal-sgd",
    "one_file": "one-file-sam",
    "sam": "sam",
    "sam8": "sam-m8",
    "sam8_loop": "sam-m8-loop",
    "asam": "asam",
    "fsam": "fsam",
    "ivon": "ivon",
    "bsam": "bsam",
    "bsam8": "bsam-m8",
    "bsam8_loop": "bsam-m8-loop",
    "swag": "swag",
    "vogn": "vogn",
    "sgd_c": "sgd-compiled",
    "sam_c": "sam-compiled",
    "bsam_c": "bsam-compiled",
}
TRAINING_TABLE = """| SGD, minimal hand-written loop | {minimal:.2f} |
| SAM, one-file two-pass | {one_file:.2f} |
| SAM m=1 | {sam:.2f} |
| SAM m=8 batched / loop | {sam8:.2f} / {sam8_loop:.2f} |
| ASAM / Fisher-SAM / IVON | {asam:.2f} / {fsam:.2f} / {ivon:.2f} |
| bSAM m=1 | {bsam:.2f} |
| bSAM m=8 batched / loop | {bsam8:.2f} / {bsam8_loop:.2f} |
| SWAG | {swag:.2f} |
| VOGN (5 samples, per-example gradients) | {vogn:.2f} |
| SGD / SAM / bSAM with `train.compile = "default"` | {sgd_c:.2f} / {sam_c:.2f} / {bsam_c:.2f} |"""
TRAINING_SCRIPT, TRAINING_TIME = "benchmarks/bench_training.py", "about 15 min"
CLAIMS += [
    _measured(
        "bench_training.table",
        TRAINING,
        TRAINING_SCRIPT,
        TRAINING_TIME,
        {name: _x_sgd(key) for name, key in TRAINING_KEYS.items()},
        TRAINING_TABLE,
    ),
    _measured(
        "bench_training.sam_m1",
        TRAINING,
        TRAINING_SCRIPT,
        TRAINING_TIME,
        {"sam": _training_target("sam_m1_le_2.05x_sgd")},
        "SAM m=1 is {sam:.2f}× SGD (target 2.05×)",  # unique: bSAM m=1 is ... SGD too
    ),
    _measured(
        "bench_training.batched_vs_loop",
        TRAINING,
        TRAINING_SCRIPT,
        TRAINING_TIME,
        {"b": "rows.key=sam-m8.batched_x_loop"},
        "the batched sub-batches {b:.2f}× the loop's time",
    ),
    _measured(
        "bench_training.compiled_vs_eager",
        TRAINING,
        TRAINING_SCRIPT,
        TRAINING_TIME,
        {
            k: f"rows.key={key}.x_eager"
            for k, key in (("s", "sgd-compiled"), ("m", "sam-compiled"), ("b", "bsam-compiled"))
        },
        "(`x_eager` in the JSON: {s:.2f} / {m:.2f} / {b:.2f})",
    ),
]


#: the training benchmark at commit c19b215 (issue 25's targets met) and now, alternated on one machine
BEFORE, AFTER = (f"benchmarks/results/step_protocol_cost/{n}.json" for n in ("before_c19b215", "after"))
CLAIMS += [
    _measured(
        f"bench_training.step_protocol_cost_{name}",
        source,
        TRAINING_SCRIPT,
        "about a minute for sgd,sam,bsam with --rounds 15",
        {
            f"{tag}_sam": _training_target("sam_m1_le_2.05x_sgd"),
            f"{tag}_ep": _training_target("runner_sgd_epoch_le_1.10x_minimal_loop"),
        },
        quote,
    )
    for name, source, tag, quote in (
        (
            "before",
            BEFORE,
            "b",
            "SAM m=1 at {b_sam:.2f}× SGD and the runner epoch at {b_ep:.2f}× the minimal loop before",
        ),
        ("after", AFTER, "a", "and\n{a_sam:.2f}× and {a_ep:.2f}× now"),
    )
]


# ---------------------------------------------------------------- loss surfaces (bench_surface)
def _surface(method: str, key: str):
    return lambda d: next(r[key] for r in d["rows"] if r["method"] == method)


OURS_SURFACE, LOSS_LANDSCAPES = "landscape.surface linear_first_layer", "loss-landscapes random_plane"
CLAIMS.append(
    _measured(
        "bench_surface.vs_loss_landscapes",
        SURFACE,
        "benchmarks/bench_surface.py",
        "a few minutes",
        {
            "g0": "config.grid.0",
            "g1": "config.grid.1",
            "r": _surface(OURS_SURFACE, "vs_loss_landscapes"),
            "ours": _surface(OURS_SURFACE, "min_s"),
            "ll": _surface(LOSS_LANDSCAPES, "min_s"),
            "floor": _surface("floor: plain forward passes", "min_s"),
            "diff": "config.float64_max_abs_diff_vs_loss_landscapes",
        },
        "({g0:.0f}×{g1:.0f}, MLP 64-128-10, 1,797 digits, CPU): {r:.2f}× the time of\n"
        "`loss-landscapes` ({ours:.2f} s vs {ll:.2f} s) and below the floor of 2,601 plain forward passes "
        "({floor:.2f} s); the values agree with `loss-landscapes` on the same directions to {diff:.0e} in "
        "float64",
    )
)


# ---------------------------------------------------------------- optimizer steps (bench_optimizers)
def _fastest(optimizer: str, key: str = "min_vs_base"):
    """An optimizer's fastest-of-repeats step time over its base optimizer's (or the reference SAM's)."""
    return lambda d: next(r[key] for r in d["rows"] if r["optimizer"] == optimizer)


#: the two-pass methods of the SAM family (one ascent, one descent pass each) the page's range covers
TWO_PASS = (
    "SAM",
    "SAM (model=, BN bypass)",
    "SAM (Adam)",
    "ASAM",
    "FisherSAM",
    "MixSAM",
    "VariationalSAM",
)
TRACERS = ("SGDTracer (exact)", "SGDTracer (fd)", "AdamTracer (exact)")


def _range(names: tuple[str, ...], pick):
    return lambda d: pick(_fastest(name)(d) for name in names)


CLAIMS.append(
    _measured(
        "bench_optimizers.step_times",
        OPTIMIZERS,
        "benchmarks/bench_optimizers.py",
        "a few minutes",
        {
            "n": "config.repeat",
            "lo": _range(TWO_PASS, min),
            "hi": _range(TWO_PASS, max),
            "sam": _fastest("SAM"),
            "ref": _fastest("SAM", "min_vs_ref_sam"),
            "rand": _fastest("RandomSAM"),
            "mfvi": _fastest("MFVI"),
            "bsam": _fastest("BayesianSAM"),
            "tlo": _range(TRACERS, min),
            "thi": _range(TRACERS, max),
        },
        "fastest of {n:.0f} repeats): two-pass methods {lo:.1f}–{hi:.1f}× (SAM {sam:.2f}×, {ref:.2f}× a\n"
        "straightforward reference SAM), RandomSAM {rand:.1f}×, MFVI {mfvi:.1f}×, bSAM {bsam:.1f}×, "
        "G-TRACER {tlo:.1f}–{thi:.1f}×",
    )
)


# ------------------------------------- per-example moments and VOGN (bench_per_example, issue 41)
PER_EXAMPLE = "benchmarks/results/issue41/per_example_resnet20_cpu.json"
VOGN_MLP = "benchmarks/results/issue41/training_mlp_cpu.json"
VOGN_LENET = "benchmarks/results/issue41/training_lenet5-digits_cpu.json"


def _vogn_per_sample(d: dict) -> float:
    return next(r["per_mc_sample_x_runner_sgd"] for r in d["rows"] if r["key"] == "vogn")


CLAIMS += [
    _measured(
        "bench_per_example.vs_backpack",
        PER_EXAMPLE,
        "benchmarks/bench_per_example.py",
        "about 6 min",
        {"r": "ours_x_backpack", "n": "config.rounds", "d": "max_relative_difference"},
        "the gradient,\nthe sum of squared per-example gradients and the per-example gradient norms cost "
        "{r:.2f}× BackPACK's\ntime for the same three (`BatchL2Grad` and `SumGradSquared` in one backward), "
        "medians of {n:.0f}\nalternating rounds (target ≤ 1×); the two agree to {d:.0e} relative in float32",
        minus="-",
    ),
    _measured(
        "bench_training.vogn_per_sample_mlp",
        VOGN_MLP,
        TRAINING_SCRIPT,
        "under a minute for sgd,vogn",
        {"mlp": _vogn_per_sample},
        "its step costs\n{mlp:.2f}× the runner's SGD step per Monte-Carlo sample on the digits MLP "
        "(target 3×)",
    ),
    _measured(
        "bench_training.vogn_per_sample_lenet5",
        VOGN_LENET,
        TRAINING_SCRIPT,
        "a few minutes for sgd,vogn",
        {"lenet": _vogn_per_sample},
        "and {lenet:.2f}×\non LeNet-5 (target 4×)",
    ),
]


# ------------------------------------------------------- Kronecker factors (kfac_vs_curvlinops, issue 40)
KFAC = "benchmarks/results/kfac_cpu.json"
KFAC_TRACE = "benchmarks/results/kfac_trace_vs_hutchinson.json"


def _kfac(model: str, fisher: str, key: str):
    """A field of our row for ``model`` and ``fisher`` in ``benchmarks/kfac_vs_curvlinops.py``'s JSON."""
    return lambda d: next(
        r[key]
        for r in d["rows"]
        if (r["model"], r["fisher_type"], r["library"]) == (model, fisher, "landscape")
    )


def _ktrace(model: str, method: str, key: str):
    return lambda d: next(r[key] for r in d["rows"] if (r["model"], r["method"]) == (model, method))


KFAC_TABLE_VALUES: dict[str, Any] = {}
for short, model in (("r", "resnet20"), ("t", "transformer")):
    KFAC_TABLE_VALUES |= {
        f"{short}p": _kfac(model, "type-2", "params"),
        f"{short}f": _kfac(model, "type-2", "factors_ratio"),
        f"{short}m": _kfac(model, "mc", "factors_ratio"),
        f"{short}s": _kfac(model, "type-2", "inverse_setup_ratio"),
        f"{short}i": _kfac(model, "type-2", "inverse_product_ratio"),
    }
REDUCE, EXPAND = "kfac (reduce)", "kfac (expand)"
CLAIMS += [
    _measured(
        "bench_kfac.vs_curvlinops",
        KFAC,
        "benchmarks/kfac_vs_curvlinops.py",
        "about 5 min",
        KFAC_TABLE_VALUES,
        "| ResNet-20 (128 images) | {rp:,.0f} | {rf:.2f}× | {rm:.2f}× | {rs:.2f}× / {ri:.2f}× |\n"
        "| 2-layer transformer (64 sequences) | {tp:,.0f} | {tf:.2f}× | {tm:.2f}× | {ts:.2f}× / {ti:.2f}× |",
    ),
    _measured(
        "bench_kfac.agreement",
        KFAC,
        "benchmarks/kfac_vs_curvlinops.py",
        "about 5 min",
        {
            "kd": lambda d: max(
                r["max_rel_diff"] for r in d["rows"] if r["library"] == "landscape" and r["max_rel_diff"]
            )
        },
        "type-2 products agree to {kd:.0e} relative (float32;",
        minus="-",
    ),
    _measured(
        "bench_kfac.trace_vs_hutchinson",
        KFAC_TRACE,
        "benchmarks/kfac_trace_vs_hutchinson.py",
        "about 10 min",
        {
            "b": "config.batch_size",
            "er": lambda d: 100 * _ktrace("resnet20", REDUCE, "rel_error")(d),
            "et": lambda d: 100 * _ktrace("transformer", REDUCE, "rel_error")(d),
            "hr": _ktrace("resnet20", f"hutchinson at {REDUCE}'s error", "hutchinson_over_kfac"),
            "ht": _ktrace("transformer", f"hutchinson at {REDUCE}'s error", "hutchinson_over_kfac"),
            "xr": lambda d: 100 * _ktrace("resnet20", EXPAND, "rel_error")(d),
            "xt": lambda d: 100 * _ktrace("transformer", EXPAND, "rel_error")(d),
            "kr": _ktrace("resnet20", "exact (ekfac)", "exact_over_kfac"),
            "kt": _ktrace("transformer", "exact (ekfac)", "exact_over_kfac"),
        },
        "{b:.0f} random inputs at initialisation, the\nexact trace from EKFAC; "
        "`benchmarks/results/kfac_trace_vs_hutchinson.json`): KFAC with\n"
        '`kfac_approx="reduce"` is {er:.1f} % from the exact trace on ResNet-20 and {et:.1f} % on the\n'
        "transformer, where Hutchinson would need {hr:,.0f}× and {ht:,.0f}× its time for that error "
        "(from the\n"
        'probes\' measured spread); with `"expand"` the error is {xr:.0f} % and {xt:.0f} %, which one '
        "Hutchinson\nprobe already matches in less time. The exact trace (EKFAC) costs {kr:.1f}× and "
        "{kt:.1f}× "
        "KFAC-expand's time",
    ),
]

#: page -> the phrases on it whose numbers are no result of ours (a setting, a target, a paper's own
#: number); a page listed here has every other number quoted by a claim (tests/test_claims.py)
NOT_RESULTS: dict[str, tuple[str, ...]] = {
    "docs/benchmarks.md": (
        "PyHessian 0.1",  # the peer's version (three places)
        "target ≤ 1.2×",  # the per-HVP target
        # the bounds tests/test_trace.py asserts on synthetic spectra (results are not kept as JSON)
        "error below 1e-3",
        "95 % intervals to cover the truth in at least 90 % of",
        # the memory target of bench_products.py (``memory_limit_x_best_peer`` in its JSON)
        "no default product above 1.2× the",
        # bounds that tests assert (tests/test_memory_budget.py, test_compiled.py, test_lanczos_budget.py)
        "within 3× the memory of one",
        "within 1e-6 of the eager product",
        "(hessian-eigenthings' algorithm) to 1e-10",
        # issue 25's targets of the training benchmark (``limit`` in its JSON)
        "SAM m=8 ≤ 2× SAM m=1 and bSAM m=1 ≤ 2.2× SGD are met, SAM\nm=1 ≤ 2.05× SGD and runner epoch ≤ "
        "1.10× the minimal loop",
        # the setting of the before/after runs (benchmarks/results/step_protocol_cost/)
        "with 15 rounds each",
        "(target 1.10×)",
        "(target 2×)",
        "(target 2.2×)",
        # the per-example and KFAC benchmarks' settings, targets and the tests' tolerance
        "(target ≤ 1×)",
        "curvlinops 3.0.1",
        "to 1e-10 in float64 on",
        "--repeat 3` (float32, mean cross-entropy, the\nminimum of 3 alternating runs",
        "(ResNet-20 in eval mode, 128 CIFAR-shaped images",
        "5\nMonte-Carlo samples, batch 256, one thread",
        # the grid's points and the GPU target of bench_surface.py (settings)
        "batched ≥ 5×",
    ),
}
