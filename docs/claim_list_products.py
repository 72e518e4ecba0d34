"""Claims of the CPU curvature-product benchmark (``benchmarks/bench_products.py``, quoted in
``docs/benchmarks.md``): the time and memory tables, the targets paragraph and the spectra sentence,
each number read from the committed ``benchmarks/results/products_cpu*.json``.

Timings and peak memory are measurements (``rerun=None``): their quotes are checked against their
JSON, not re-measured (the benchmark takes hours on 2 CPU cores).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from claim import Claim

BENCHMARKS = ("docs/benchmarks.md",)
RESNET_MLP = "benchmarks/results/products_cpu.json"
TRANSFORMER_WRN = "benchmarks/results/products_cpu_transformer_wrn.json"
SPECTRA = "benchmarks/results/products_cpu_spectra.json"
INPUTS = ("benchmarks/bench_products.py",)
NOTE = (
    "a measurement (timings and peak memory on a shared 2-core machine): checked against its JSON, "
    "not re-run; regenerate with python benchmarks/bench_products.py (hours)"
)
#: the default product of each kind and the peers the tables name
DEFAULT = {
    "h": "landscape auto",
    "g": "landscape ggn forward",
    "ef": "landscape empirical_fisher",
    "mc": "landscape fisher (MC, 1 sample)",
}
PYHESSIAN, CURVLINOPS_GGN, FLOOR = "pyhessian", "curvlinops GGNLinearOperator", "floor jvp+H+cached vjp"


def _row(model: str, method: str, key: str):
    """A field of the benchmark row of ``method`` on ``model``."""
    return lambda d: next(r[key] for r in d["rows"] if r["model"] == model and r["method"] == method)


def _summary(model: str, method: str, key: str):
    """A field of the summary entry (ratios to the best peer) of ``method`` on ``model``."""
    return lambda d: next(p[key] for p in d["summary"]["models"][model]["products"] if p["method"] == method)


def _target(model: str, target: str, key: str):
    return lambda d: next(
        t[key] for t in d["summary"]["models"][model]["time_targets"] if t["target"] == target
    )


def _compiled(model: str, method: str):
    return lambda d: next(
        c["speedup_over_eager"] for c in d["summary"]["models"][model]["compiled"] if c["method"] == method
    )


def _problem(model: str, key: str):
    return lambda d: next(p[key] for p in d["problems"] if p["name"] == model)


def _pyhessian_memory(model: str):
    """PyHessian's peak memory over that of the lightest peer of our default Hessian product."""

    def get(d: dict[str, Any]) -> float:
        peer = _summary(model, DEFAULT["h"], "best_peer_memory")(d)
        return _row(model, PYHESSIAN, "peak_mb")(d) / _row(model, peer, "peak_mb")(d)

    return get


def _time_values(model: str) -> dict[str, Any]:
    values: dict[str, Any] = {"n": _problem(model, "params"), "b": _problem(model, "batch_size")}
    for k, method in DEFAULT.items():
        values[k] = _row(model, method, "x_gradient")
        values[f"{k}_peer"] = _summary(model, method, "time_x_best_peer")
    values["pyh"] = _row(model, PYHESSIAN, "x_gradient")
    values["cl"] = _row(model, CURVLINOPS_GGN, "x_gradient")
    values["floor"] = _row(model, FLOOR, "x_gradient")
    return values


def _memory_values(model: str, pyhessian: bool) -> dict[str, Any]:
    values: dict[str, Any] = {k: _summary(model, method, "mem_x_best_peer") for k, method in DEFAULT.items()}
    if pyhessian:
        values["pyh"] = _pyhessian_memory(model)
    return values


def _claim(cid: str, source: str, values: dict[str, Any], quote: str) -> Claim:
    return Claim(
        id=cid, source=source, values=values, quote=quote, files=BENCHMARKS, inputs=INPUTS, notes=NOTE
    )


def _time_row(name: str, bold_h: bool, bold_g: bool) -> str:
    h, g = "{h:.2f}× ({h_peer:.2f})", "{g:.2f}× ({g_peer:.2f})"
    h, g = (f"**{h}**" if bold_h else h), (f"**{g}**" if bold_g else g)
    return (
        f"| {name} ({{n:,.0f}}, {{b:.0f}}) | {h} | {{pyh:.2f}}× | {g} | {{cl:.2f}}× | {{floor:.2f}}× | "
        "{ef:.2f}× ({ef_peer:.2f}) | {mc:.2f}× ({mc_peer:.2f}) |"
    )


def _memory_row(name: str, bold_h: bool, pyhessian: bool) -> str:
    h = "**{h:.2f}×**" if bold_h else "{h:.2f}×"
    h += " (PyHessian {pyh:.2f}×)" if pyhessian else ""
    return f"| {name} | {h} | {{g:.2f}}× | {{ef:.2f}}× | {{mc:.2f}}× |"


#: (id part, model key, name in the tables, source, bold Hessian / GGN times, bold Hessian memory,
#: PyHessian memory)
MODELS = [
    ("resnet20", "resnet20", "ResNet-20", RESNET_MLP, (True, True), True, True),
    ("wrn16_4", "wrn", "WRN-16-4", TRANSFORMER_WRN, (False, False), False, True),
    ("transformer", "transformer", "transformer", TRANSFORMER_WRN, (False, False), False, True),
    ("mlp", "mlp", "MLP", RESNET_MLP, (False, False), False, False),
]

CLAIMS = [
    _claim(f"products_cpu.time.{cid}", source, _time_values(model), _time_row(name, *bold))
    for cid, model, name, source, bold, _, _ in MODELS
] + [
    _claim(f"products_cpu.memory.{cid}", source, _memory_values(model, pyh), _memory_row(name, bold_h, pyh))
    for cid, model, name, source, _, bold_h, pyh in MODELS
]

CLAIMS += [
    _claim(
        "products_cpu.resnet20_targets",
        RESNET_MLP,
        {
            "hv": _target("resnet20", "hvp_vs_pyhessian", "ratio_of_medians"),
            "hm": _summary("resnet20", DEFAULT["h"], "mem_x_best_peer"),
            "gc": _target("resnet20", "ggn_vs_curvlinops", "ratio_of_medians"),
            "gcr": _target("resnet20", "ggn_vs_curvlinops", "ratio"),
            "gcl": _target("resnet20", "ggn_vs_curvlinops", "limit"),
            "gf": _target("resnet20", "ggn_vs_floor", "ratio_of_medians"),
            "gfr": _target("resnet20", "ggn_vs_floor", "ratio"),
            "gfl": _target("resnet20", "ggn_vs_floor", "limit"),
        },
        "Hessian-vector {hv:.2f}× PyHessian's time at {hm:.2f}× hessian-eigenthings' memory, GGN-vector "
        "{gc:.2f}× curvlinops (median of per-round ratios {gcr:.2f}×, limit {gcl:.1f}×) and {gf:.2f}× the "
        "plain floor (per-round {gfr:.2f}×, limit {gfl:.1f}×)",
    ),
    _claim(
        "products_cpu.mlp_hessian_vs_pyhessian",
        RESNET_MLP,
        {"r": _target("mlp", "hvp_vs_pyhessian", "ratio_of_medians")},
        "the MLP's Hessian product is {r:.2f}× PyHessian's",
    ),
    _claim(
        "products_cpu.transformer_hessian_vs_pyhessian",
        TRANSFORMER_WRN,
        {
            "r": _target("transformer", "hvp_vs_pyhessian", "ratio_of_medians"),
            "per": _target("transformer", "hvp_vs_pyhessian", "ratio"),
        },
        "the transformer's Hessian product is {r:.2f}× PyHessian's (ratio of medians; median of per-round "
        "ratios {per:.2f}×",
    ),
    _claim(
        "products_cpu.opt_in_paths",
        RESNET_MLP,
        {
            "lt": _summary("resnet20", "landscape ggn linearize", "time_x_best_peer"),
            "lm": _summary("resnet20", "landscape ggn linearize", "mem_x_best_peer"),
            "pt": _summary("resnet20", "landscape empirical_fisher per_example", "time_x_best_peer"),
            "pm": _summary("resnet20", "landscape empirical_fisher per_example", "mem_x_best_peer"),
        },
        '`jvp="linearize"` GGN ({lt:.2f}× curvlinops, {lm:.1f}× its memory), `method="per_example"` Fisher '
        "({pt:.3f}× the time per product on ResNet-20 after a per-example cache, {pm:.2f}× the memory there",
    ),
    _claim(
        "products_cpu.compiled_resnet20_mlp",
        RESNET_MLP,
        {
            "rh": _compiled("resnet20", "landscape compiled hessian"),
            "rg": _compiled("resnet20", "landscape compiled ggn"),
            "mh": _compiled("mlp", "landscape compiled hessian"),
            "mg": _compiled("mlp", "landscape compiled ggn"),
        },
        "run {rh:.2f}× / {rg:.2f}× (ResNet-20), {mh:.2f}× / {mg:.2f}× (MLP)",
    ),
    _claim(
        "products_cpu.compiled_transformer_wrn",
        TRANSFORMER_WRN,
        {
            "th": _compiled("transformer", "landscape compiled hessian"),
            "tg": _compiled("transformer", "landscape compiled ggn"),
            "wh": _compiled("wrn", "landscape compiled hessian"),
            "wg": _compiled("wrn", "landscape compiled ggn"),
        },
        "{th:.2f}× / {tg:.2f}× (transformer) and {wh:.2f}× / {wg:.2f}× (WRN-16-4) as fast as",
    ),
    _claim(
        "products_cpu.compiled_hessian_path",
        RESNET_MLP,
        {
            "cf": _row("resnet20", "landscape compiled hessian", "x_gradient"),
            "ef": _row("resnet20", "landscape forward_over_reverse", "x_gradient"),
            "d": _row("resnet20", DEFAULT["h"], "x_gradient"),
        },
        "for every product ({cf:.2f}× a gradient on ResNet-20 compiled, {ef:.2f}× eager), while the default\n"
        "differentiates a cached backward graph once per product ({d:.2f}×)",
    ),
]


def _spectrum(model: str, task: str, method: str):
    """The relative error (in %) of ``method`` on ``task`` for ``model`` in the spectra run."""
    return lambda d: (
        100
        * next(
            r["rel_error"]
            for r in d["spectra"]
            if (r["model"], r["task"], r["method"]) == (model, task, method)
        )
    )


OURS, EIGENTHINGS, PYHESSIAN_POWER = (
    "landscape eigenvalues (Lanczos)",
    "eigenthings lanczos",
    "pyhessian eigenvalues (power)",
)
SPECTRA_VALUES = {
    f"{who}_{m}{k}": _spectrum(model, task, method)
    for who, method in (("o", OURS), ("e", EIGENTHINGS), ("p", PYHESSIAN_POWER))
    for m, model in (("r", "resnet20"), ("m", "mlp"))
    for k, task in (("1", "top-1 eigenvalue"), ("5", "top-5 eigenvalues"))
}
CLAIMS.append(
    _claim(
        "products_cpu_spectra.relative_errors",
        SPECTRA,
        {**SPECTRA_VALUES, "b1": "config.eig1", "b5": "config.eig5"},
        "top-1/top-5 relative errors at {b1:.0f}/{b5:.0f} matvecs, ours {o_r1:.1f} %/{o_r5:.1f} % on "
        "ResNet-20 and {o_m1:.1f} %/{o_m5:.1f} % on the MLP, "
        "hessian-eigenthings' Lanczos {e_r1:.1f} %/{e_r5:.1f} % and {e_m1:.1f} %/{e_m5:.1f} %, PyHessian's "
        "power iteration {p_r1:.0f} %/{p_r5:.0f} % and {p_m1:.1f} %/{p_m5:.0f} %",
    )
)


# ---------------------------------------------------------------- the paragraphs around the tables
def scientific(prefix: str, get, digits: int = 1) -> dict[str, Any]:
    """The values ``<prefix>_m`` (the mantissa, rounded to ``digits`` decimals) and ``<prefix>_e``
    (the decimal exponent) of ``get(data)``, for a quote that writes it ``1.4e-3`` or ``2e-6``
    (``{p_m:.1f}e{p_e:.0f}``, with ``minus="-"``) rather than Python's ``1.4e-03``."""

    def split(d: dict[str, Any]) -> tuple[float, int]:
        x = get(d)
        e = math.floor(math.log10(abs(x)))
        m = round(x / 10**e, digits)
        if abs(m) >= 10:
            m, e = round(m / 10, digits), e + 1
        return m, e

    return {f"{prefix}_m": lambda d: split(d)[0], f"{prefix}_e": lambda d: split(d)[1]}


def sci_field(prefix: str, digits: int = 1) -> str:
    """The quote's field pair of :func:`scientific`."""
    return f"{{{prefix}_m:.{digits}f}}e{{{prefix}_e:.0f}}"


def _all_models(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(model, its JSON) for the four models: ``d`` is ``products_cpu.json`` (ResNet-20, MLP), the
    transformer and WRN-16-4 are read from ``products_cpu_transformer_wrn.json`` beside it."""
    other = json.loads((Path(__file__).resolve().parents[1] / TRANSFORMER_WRN).read_text())
    return [(m, d) for m in d["summary"]["models"]] + [(m, other) for m in other["summary"]["models"]]


def _compiled_error(key: str, models: tuple[str, ...] | None = None):
    """The largest relative difference ``key`` (``rel_err_eager``: float32, ``rel_err_eager_float64``)
    between a compiled product and its eager one, over ``models`` (all four when ``None``)."""
    return lambda d: max(
        c[key]
        for m, src in _all_models(d)
        if models is None or m in models
        for c in src["summary"]["models"][m]["compiled"]
    )


def _compile_seconds(pick):
    """``pick`` (min / max) of the build time of the compiled products over the four models."""
    return lambda d: pick(
        r["build_s"]
        for _, src in _all_models(d)
        for r in src["rows"]
        if r["method"].startswith("landscape compiled")
    )


CLAIMS += [
    _claim(
        "products_cpu.resnet20_graph_chunks_memory",
        RESNET_MLP,
        {"pyh": _pyhessian_memory("resnet20"), "h": _summary("resnet20", DEFAULT["h"], "mem_x_best_peer")},
        "lowers the peak from PyHessian's {pyh:.2f}× to {h:.2f}×",
    ),
    _claim(
        "products_cpu.mlp_hessian_product",
        RESNET_MLP,
        {
            "ms": _row("mlp", DEFAULT["h"], "ms"),
            "n": lambda d: _problem("mlp", "params")(d) / 1e6,
        },
        "a {ms:.0f} ms product that also checks its input and output for NaN ({n:.1f}M entries each)",
    ),
    _claim(
        "products_cpu.transformer_hessian_memory",
        TRANSFORMER_WRN,
        {
            "h": _summary("transformer", DEFAULT["h"], "mem_x_best_peer"),
            "pyh": _pyhessian_memory("transformer"),
        },
        "keep its memory at {h:.2f}× hessian-eigenthings' against PyHessian's {pyh:.2f}×",
    ),
    _claim(
        "products_cpu.per_example_fisher_mlp_memory",
        RESNET_MLP,
        {
            "pm": _summary("resnet20", "landscape empirical_fisher per_example", "mem_x_best_peer"),
            "m": _summary("mlp", "landscape empirical_fisher per_example", "mem_x_best_peer"),
        },
        "{pm:.2f}× the memory there, {m:.0f}× on the MLP)",
    ),
    replace(
        _claim(
            "products_cpu.compiled_equal_eager",
            RESNET_MLP,
            {
                **scientific("f64", _compiled_error("rel_err_eager_float64"), 0),
                **scientific("f32", _compiled_error("rel_err_eager", ("resnet20", "mlp", "transformer")), 0),
                **scientific("wrn", _compiled_error("rel_err_eager", ("wrn",)), 0),
            },
            f"equal eager ones in float64 to {sci_field('f64', 0)} (float32: within {sci_field('f32', 0)} on "
            "ResNet-20, the MLP and the transformer, the spread between two eager engines; "
            f"{sci_field('wrn', 0)} on WRN-16-4)",
        ),
        minus="-",
    ),
    _claim(
        "products_cpu.compile_time",
        RESNET_MLP,
        {"lo": _compile_seconds(min), "hi": _compile_seconds(max)},
        "compile time ({lo:.1f}-{hi:.0f} s) is reported separately",
    ),
]
