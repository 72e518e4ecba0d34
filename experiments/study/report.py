"""The study's files: the per-model table (CSV/JSON), the correlation tables (Markdown/JSON) and the
figure (each measure against the generalisation gap; :mod:`experiments.study.figure`).

The members that enter the correlations are those that trained (not ``diverged``) and, under a
stopping rule, reached the target training loss (not ``not_converged``, Jiang et al. 2020 train
every model to the same training cross-entropy); the others are listed with their final training
loss, error and epochs. Each population is correlated on its own
(:func:`experiments.study.combine.population_correlations`) and the populations are combined
(:func:`experiments.study.combine.combine`: pooled bootstrap interval, ``k/P`` populations whose
interval excludes 0). ``correlation.json`` keeps the keys of a one-population report
(``correlation``: population 0's entries, ``models``, ``diverged``, ...) and adds ``populations``,
``combined``, ``excluded``, ``not_converged``, ``stop``, ``timing`` and ``headline``
(:func:`experiments.study.summary.headline`, the findings in words)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from experiments.study.combine import combine, population_correlations
from experiments.study.config import AXES
from experiments.study.figure import plot_study
from experiments.study.summary import headline, interval
from landscape.io import atomic_write_json, atomic_write_text, read_json

__all__ = [
    "EXCLUDED",
    "TARGETS",
    "collect_rows",
    "format_combined",
    "format_markdown",
    "report_markdown",
    "write_report",
    "write_table",
]

#: What each measure is correlated with (when the rows hold it).
TARGETS: tuple[str, ...] = ("gap_error", "gap_loss", "test_error", "ood_error")
#: Row statuses left out of the correlations.
EXCLUDED: tuple[str, ...] = ("diverged", "not_converged")


def read_study_config(path: str | Path) -> dict[str, Any]:
    """``study_config.json`` of a study directory; a truncated, corrupt or foreign file raises
    ``ValueError`` naming it and the fix (one line ``<what> — <fix>``)."""
    path = Path(path)
    fix = (
        f"run `python -m experiments.study run CONFIG --out {path.parent}` again, which rewrites it "
        "(finished models are kept)"
    )
    cfg = read_json(path, what="study config", fix=fix)
    measures = cfg.get("measures") if isinstance(cfg, dict) else None
    if not (isinstance(measures, list) and all(isinstance(m, dict) and "name" in m for m in measures)):
        raise ValueError(
            f"{path} is not a study config: it holds no 'measures' list of tables with a 'name' "
            f"(truncated, edited or another file?) — {fix}"
        )
    return cfg


def read_model_row(path: str | Path) -> dict[str, Any]:
    """The table row of a ``models/<id>.json`` file; a truncated, corrupt or foreign file raises
    ``ValueError`` naming it and the fix (one line ``<what> — <fix>``)."""
    path = Path(path)
    out = path.parent.parent
    fix = (
        f"delete it and run `python -m experiments.study run CONFIG --out {out}` again (that member is "
        "measured again; its trained run is kept)"
    )
    doc = read_json(path, what="model result", fix=fix)
    row = doc.get("row") if isinstance(doc, dict) else None
    if not (isinstance(row, dict) and "id" in row):
        raise ValueError(
            f"{path} is not a model result of `experiments.study run`: it holds no 'row' table with an "
            f"'id' (truncated, edited or another file?) — {fix}"
        )
    return row


def collect_rows(out_dir: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of every ``models/*.json`` under ``out_dir`` (sorted by id) and the study config;
    a missing, truncated or corrupt file raises ``ValueError`` naming it and the fix."""
    out = Path(out_dir)
    cfg_path = out / "study_config.json"
    if not cfg_path.is_file():
        raise ValueError(
            f"{out} holds no study_config.json — "
            f"run `python -m experiments.study run CONFIG --out {out}` first"
        )
    cfg = read_study_config(cfg_path)
    rows = [read_model_row(p) for p in sorted((out / "models").glob("*.json"))]
    if not rows:
        raise ValueError(
            f"{out}/models holds no model results — run `python -m experiments.study run CONFIG --out {out}`"
        )
    return sorted(rows, key=lambda r: str(r["id"])), cfg


def write_table(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """The per-model table as CSV (atomically); columns in the order they first appear (a diverged
    member's row has no measures); a list (a member's ``populations``) is written ``0;2``."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                k: (
                    ""
                    if r.get(k) is None
                    else repr(r[k])
                    if isinstance(r.get(k), float)
                    else ";".join(map(str, r[k]))
                    if isinstance(r.get(k), list)
                    else r[k]
                )
                for k in cols
            }
        )
    return atomic_write_text(path, buf.getvalue())


def _cell(e: dict[str, Any]) -> str:
    if math.isnan(e["tau"]):
        return "n/a"
    return f"{e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}]"


def format_markdown(entries: list[dict[str, Any]], measures: list[str], targets: list[str]) -> str:
    """Rows: measures; columns: tau-b [95 % bootstrap interval] per target, then Psi (granulated tau)
    and its per-axis psi for the first target."""
    by = {(e["measure"], e["target"]): e for e in entries}
    first = targets[0]
    axes = list(next(iter(entries))["psi"])
    head = ["measure"] + [f"tau({t})" for t in targets] + [f"Psi({first})"] + [f"psi_{a}" for a in axes]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in measures:
        e0 = by[(m, first)]
        cells = [m] + [_cell(by[(m, t)]) for t in targets]
        cells.append("n/a" if math.isnan(e0["Psi"]) else f"{e0['Psi']:+.2f}")
        cells += ["-" if math.isnan(e0["psi"][a]) else f"{e0['psi'][a]:+.2f}" for a in axes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def format_combined(combined: list[dict[str, Any]], measures: list[str], targets: list[str]) -> str:
    """One table per target: rows measures; columns each population's tau-b [95 % bootstrap
    interval], the pooled interval, how many populations' intervals exclude 0, and (first target
    only) each population's granulated Psi; then the per-axis psi of the first target (mean over
    the populations)."""
    by = {(e["measure"], e["target"]): e for e in combined}
    n_pop = next(iter(combined))["populations"]
    lines: list[str] = []
    for i, t in enumerate(targets):
        head = ["measure"] + [f"pop {p}" for p in range(n_pop)] + ["pooled", "excl. 0"]
        if i == 0:
            head += [f"Psi pop {p}" for p in range(n_pop)] + ["Psi mean"]
        lines += [f"\n**tau({t})**\n", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in measures:
            e = by[(m, t)]
            cells = [m] + [
                "n/a" if math.isnan(tau) else f"{tau:+.2f} [{lo:+.2f}, {hi:+.2f}]"
                for tau, (lo, hi) in zip(e["taus"], e["intervals"])
            ]
            cells += ["n/a" if math.isnan(e["tau"]) else interval(e), f"{e['excludes_zero']}/{n_pop}"]
            if i == 0:
                cells += ["n/a" if math.isnan(v) else f"{v:+.2f}" for v in e["Psis"]]
                cells.append("n/a" if math.isnan(e["Psi"]) else f"{e['Psi']:+.2f}")
            lines.append("| " + " | ".join(cells) + " |")
    first = targets[0]
    axes = list(by[(measures[0], first)]["psi"])
    lines += [
        f"\n**psi({first}) per axis** (mean over the populations; '-': no group)\n",
        "| measure | " + " | ".join(f"psi_{a}" for a in axes) + " |",
        "|" + "---|" * (len(axes) + 1),
    ]
    for m in measures:
        psi = by[(m, first)]["psi"]
        lines.append(
            "| " + " | ".join([m] + ["-" if math.isnan(psi[a]) else f"{psi[a]:+.2f}" for a in axes]) + " |"
        )
    return "\n".join(lines) + "\n"


def _excluded_lines(excluded: list[dict[str, Any]]) -> str:
    if not excluded:
        return "\nNo member was excluded.\n"
    lines = [
        f"\n**Excluded from the correlations** ({len(excluded)}):\n",
        "| member | populations | status | epochs | training loss | training error |",
        "|---|---|---|---|---|---|",
    ]
    for r in excluded:
        loss, err, epochs = r.get("train_loss"), r.get("train_error"), r.get("epochs")
        lines.append(
            f"| {r['id']} | {';'.join(map(str, r['populations']))} | {r['status']} | "
            f"{'-' if epochs is None else epochs} | {'-' if loss is None else f'{loss:.3f}'} | "
            f"{'-' if err is None else f'{err:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def _populations(out: Path, cfg: dict[str, Any], every: list[dict[str, Any]]) -> list[list[str]]:
    path = out / "populations.json"
    if path.is_file():
        pops = read_json(path, what="population list").get("populations")
        if isinstance(pops, list) and all(isinstance(p, list) for p in pops):
            return pops
    return [[r["id"] for r in every]]  # a study written before populations.json: one population


def _timing(out: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    path = out / "timing.json"
    runs = read_json(path, what="timing").get("invocations", []) if path.is_file() else []
    trained = [r for r in runs if r.get("members")]
    return {
        "wall_seconds": sum(r["wall_seconds"] for r in trained),
        "cpu_seconds": sum(r.get("cpu_seconds", 0.0) for r in rows),
        "jobs": max((r["jobs"] for r in trained), default=1),
        "threads": max((r.get("threads", 1) for r in trained), default=1),
        "invocations": trained,
    }


def report_markdown(doc: dict[str, Any]) -> str:
    """``correlation.md`` from the report's JSON (``correlation.json``, or a copy such as
    ``docs/figures/study_digits.json``): the headline, the combined tables, the excluded members and
    the diverged ones; :func:`write_report` writes this, so a committed page can be compared with
    its JSON without re-running the study."""
    measures = [m["name"] for m in doc["study"]["measures"]]
    md = doc["headline"] + "\n" + format_combined(doc["combined"], measures, doc["targets"])
    md += _excluded_lines(doc["excluded"])
    if doc["diverged"]:
        k = len(doc["diverged"])
        md += f"\n{k} member{'s' if k != 1 else ''} diverged, excluded: {', '.join(doc['diverged'])}\n"
    return md


def write_report(
    out_dir: str | Path,
    *,
    figure: str | Path | None = None,
    json_path: str | Path | None = None,
    csv_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    samples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Correlate every measure of the study in ``out_dir`` with the gaps, test and OOD error, per
    population and combined (members that diverged or did not reach the stopping rule's training
    loss are left out and listed); write ``population.csv``, ``population.json``, ``correlation.md``,
    ``correlation.json`` and the figure ``study.png`` there (and to ``figure`` / ``json_path`` /
    ``csv_path`` / ``markdown_path`` when given). Returns the JSON content with ``markdown`` added."""
    out = Path(out_dir)
    every, cfg = collect_rows(out)
    pops = _populations(out, cfg, every)
    member_of: dict[str, list[int]] = {}
    for i, ids in enumerate(pops):
        for mid in ids:
            member_of.setdefault(mid, []).append(i)
    for r in every:
        r["populations"] = member_of.get(r["id"], [])
    rows = [r for r in every if r.get("status") not in EXCLUDED]
    if not rows:
        raise ValueError(
            f"none of the {len(every)} members of {out} can be correlated (all diverged or not converged)"
        )
    by_id = {r["id"]: r for r in rows}
    pop_rows = [[by_id[i] for i in ids if i in by_id] for ids in pops]
    short = [i for i, p in enumerate(pop_rows) if len(p) < 2]
    if short:
        which = "; ".join(
            f"population {i} (sampling seed {cfg['sampling_seed'] + i}): {len(pop_rows[i])} of "
            f"{len(pops[i])} members trained and correlatable"
            for i in short
        )
        raise ValueError(
            f"{out}: a partial study is reported once every population has at least 2 trained "
            f"members (a correlation needs 2); {which}. Train more: run the same `study run` command "
            "again (it resumes where it stopped)"
        )
    measures = [m["name"] for m in cfg["measures"]]
    targets = [t for t in TARGETS if any(t in r for r in rows)]
    axes = [a for a in AXES if len({repr(r[a]) for r in rows}) > 1]
    per_pop = population_correlations(pop_rows, measures, targets, axes, samples=samples, seed=seed)
    combined = combine(pop_rows, per_pop, samples=samples, seed=seed)
    excluded = [r for r in every if r.get("status") in EXCLUDED]
    doc: dict[str, Any] = {
        "study": cfg,
        "n_models": len(rows),
        "n_members": len(every),
        "diverged": [r["id"] for r in every if r.get("status") == "diverged"],
        "not_converged": [r["id"] for r in every if r.get("status") == "not_converged"],
        "excluded": [
            {k: r.get(k) for k in ("id", "populations", "status", "epochs", "train_loss", "train_error")}
            for r in excluded
        ],
        "stop": cfg.get("stop") or {},
        "axes": axes,
        "targets": targets,
        "bootstrap": {"samples": samples, "seed": seed, "level": 0.95, "pooled": "equal-weight mixture"},
        "correlation": per_pop[0],
        "populations": [
            {
                "index": i,
                "sampling_seed": cfg["sampling_seed"] + i,
                "members": len(ids),
                "included": len(pop_rows[i]),
                "excluded": [mid for mid in ids if mid not in by_id],
                "correlation": per_pop[i],
            }
            for i, ids in enumerate(pops)
        ],
        "combined": combined,
        "timing": _timing(out, every),
        "models": every,
    }
    doc["headline"] = headline(doc)
    md = report_markdown(doc)
    write_table(every, out / "population.csv")
    atomic_write_json(out / "population.json", every)
    atomic_write_text(out / "correlation.md", md)
    atomic_write_json(out / "correlation.json", doc)
    plot_study(every, combined, measures, out / "study.png")
    if figure is not None:
        plot_study(every, combined, measures, figure)
    if json_path is not None:
        atomic_write_json(json_path, doc)
    if csv_path is not None:
        write_table(every, csv_path)
    if markdown_path is not None:
        atomic_write_text(markdown_path, md)
    doc["markdown"] = md
    return doc
