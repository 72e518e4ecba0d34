"""The study's files: the per-model table (CSV/JSON), the correlation table (Markdown/CSV/JSON) and
the figure (each measure against the generalisation gap, tau in each panel's title)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from experiments.study.config import AXES
from experiments.study.correlation import correlate
from landscape.io import atomic_write, atomic_write_json, atomic_write_text, read_json

__all__ = ["TARGETS", "collect_rows", "format_markdown", "plot_study", "write_report", "write_table"]

#: What each measure is correlated with (when the rows hold it).
TARGETS: tuple[str, ...] = ("gap_error", "gap_loss", "test_error", "ood_error")


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
    member's row has no measures)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                k: ("" if r.get(k) is None else repr(r[k]) if isinstance(r.get(k), float) else r[k])
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


def plot_study(
    rows: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    measures: list[str],
    path: str | Path,
    target: str = "gap_error",
) -> Path:
    """One panel per measure: measure (log axis when all values are positive) against ``target``,
    coloured by optimizer, marker by model; tau-b and its interval in each title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    by = {(e["measure"], e["target"]): e for e in entries}
    ncol = 4
    nrow = math.ceil(len(measures) / ncol)
    fig, axs = plt.subplots(nrow, ncol, figsize=(4.0 * ncol, 3.2 * nrow), squeeze=False)
    opts = sorted({r["optimizer"] for r in rows})
    models = sorted({r["model"] for r in rows})
    colours = {o: f"C{i}" for i, o in enumerate(opts)}
    markers = {m: "os^Dv"[i % 5] for i, m in enumerate(models)}
    for ax, m in zip(axs.flat, measures):
        pts = [r for r in rows if isinstance(r.get(m), (int, float)) and math.isfinite(r[m])]
        for r in pts:
            ax.scatter(
                r[m], r[target], c=colours[r["optimizer"]], marker=markers[r["model"]], s=22, alpha=0.8
            )
        if pts and min(r[m] for r in pts) > 0:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a narrow range
        e = by[(m, target)]
        ax.set_title(f"{m}\ntau={e['tau']:+.2f} [{e['low']:+.2f}, {e['high']:+.2f}]", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_ylabel(target, fontsize=8)
    for ax in list(axs.flat)[len(measures) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], ls="", marker="o", color=colours[o], label=o) for o in opts]
    handles += [plt.Line2D([], [], ls="", marker=markers[m], color="grey", label=m) for m in models]
    fig.legend(handles=handles, loc="lower right", fontsize=8, ncol=2)
    fig.suptitle(f"Sharpness vs generalisation gap ({len(rows)} models; Kendall tau-b, 95% bootstrap CI)")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return Path(path)


def write_report(
    out_dir: str | Path,
    *,
    figure: str | Path | None = None,
    json_path: str | Path | None = None,
    samples: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Correlate every measure of the study in ``out_dir`` with the gaps, test and OOD error (members
    that diverged are left out and counted: ``k members diverged, excluded``); write
    ``population.csv``, ``population.json``, ``correlation.md``, ``correlation.json`` and the figure
    ``study.png`` there (and to ``figure`` / ``json_path`` when given). Returns the JSON content."""
    out = Path(out_dir)
    every, cfg = collect_rows(out)
    diverged = [r["id"] for r in every if r.get("status") == "diverged"]  # excluded from everything
    rows = [r for r in every if r.get("status") != "diverged"]
    if not rows:
        raise ValueError(f"all {len(every)} members of {out} diverged; there is nothing to correlate")
    measures = [m["name"] for m in cfg["measures"]]
    targets = [t for t in TARGETS if any(t in r for r in rows)]
    axes = [a for a in AXES if len({repr(r[a]) for r in rows}) > 1]
    entries = correlate(rows, measures, targets, axes, samples=samples, seed=seed)
    md = format_markdown(entries, measures, targets)
    if diverged:
        k = len(diverged)
        md += f"\n{k} member{'s' if k != 1 else ''} diverged, excluded: {', '.join(diverged)}\n"
    doc = {
        "study": cfg,
        "n_models": len(rows),
        "diverged": diverged,
        "axes": axes,
        "targets": targets,
        "bootstrap": {"samples": samples, "seed": seed, "level": 0.95},
        "correlation": entries,
        "models": rows,
    }
    write_table(every, out / "population.csv")
    atomic_write_json(out / "population.json", every)
    atomic_write_text(out / "correlation.md", md)
    atomic_write_json(out / "correlation.json", doc)
    plot_study(rows, entries, measures, out / "study.png")
    if figure is not None:
        plot_study(rows, entries, measures, figure)
    if json_path is not None:
        atomic_write_json(json_path, doc)
    doc["markdown"] = md
    return doc
