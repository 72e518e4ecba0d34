"""Flatness study page, its data: read a study written by ``python -m experiments.study`` (the
per-model table, the report's JSON or the study config, the members of each population in the order
the report correlated them, the stopping rule) and pick the rows the page correlates: the members of
one population that enter the report's correlations (status not ``diverged`` or ``not_converged``,
:data:`experiments.study.report.EXCLUDED`). A bad file raises :class:`dashboard.UserInputError`
naming it and the fix. Used by :mod:`dashboard.study_view`."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dashboard import UserInputError
from experiments.study.population import population_ids
from experiments.study.report import EXCLUDED, collect_rows
from landscape.io import read_json

__all__ = [
    "DEFAULT_DIR",
    "POOLED",
    "ROOT",
    "Study",
    "excluded_rows",
    "included",
    "included_ids",
    "load_population",
    "load_study",
    "population_choices",
    "population_frame",
    "records",
]


ROOT = Path(__file__).resolve().parents[2]
#: the committed example study (``study_digits_population.csv`` and ``study_digits.json``)
DEFAULT_DIR = ROOT / "docs" / "figures"
#: the population choice that shows the report's pooled intervals
POOLED = "pooled"


@dataclass(frozen=True)
class Study:
    """A loaded study: the per-model table (every member, whatever its status) and what the page
    needs around it.

    ``populations`` holds the member ids of each population in the order the report correlated
    them (the bootstrap resamples by position, so this order reproduces the report's intervals);
    ``seeds`` the sampling seed of each (``None`` when no config says it); ``stop`` the stopping
    rule (``{"train_loss", "max_epochs"}``; ``None`` when the study has none or no config says it);
    ``report`` the report's JSON document (``correlation.json``) when it belongs to this table, for
    the pooled intervals (``report_path`` its file), and ``source`` the file or directory the table
    came from."""

    df: pd.DataFrame
    measures: list[str] | None
    populations: list[list[str]]
    seeds: list[int] | None
    stop: dict[str, Any] | None
    report: dict[str, Any] | None
    source: Path
    report_path: Path | None = None


def _resolve(path: str | Path) -> Path:
    p = Path(str(path).strip() or DEFAULT_DIR).expanduser()
    if not p.is_absolute() and not p.exists() and (ROOT / p).exists():
        p = ROOT / p
    return p


def load_study(path: str | Path = DEFAULT_DIR) -> Study:
    """The study at ``path``: a study directory (``population.csv`` and ``correlation.json`` from
    ``report``, or ``study_config.json`` and ``models/*.json`` from ``run``), a directory holding one
    ``*_population.csv`` (the committed example in ``docs/figures``, with its ``*.json`` report) or a
    population CSV file. Bad files raise :class:`UserInputError` naming the file and the fix."""
    p = _resolve(path)
    if not p.exists():
        raise UserInputError(
            f"{p} does not exist; give a directory written by `python -m experiments.study run CONFIG "
            f"--out DIR` (then `report DIR`), or leave the box empty for the example in {DEFAULT_DIR}"
        )
    if p.is_file():
        csv_path = p
    elif (p / "population.csv").is_file():
        csv_path = p / "population.csv"
    elif (p / "study_config.json").is_file():
        try:
            rows, cfg = collect_rows(p)  # names a truncated or corrupt file and the fix
        except ValueError as exc:
            raise UserInputError(str(exc)) from None
        df = pd.DataFrame(rows)
        order = _population_order(df, _populations_file(p))
        df["populations"] = _membership_column(df["id"], order)
        return Study(
            df=df,
            measures=[m["name"] for m in cfg["measures"]],
            populations=order,
            seeds=_seeds(cfg, len(order)),
            stop=cfg.get("stop") or None,
            report=None,
            source=p,
        )
    else:
        found = sorted(p.glob("*_population.csv"))
        if len(found) != 1:
            raise UserInputError(
                f"{p} holds no population.csv, study_config.json or single *_population.csv; run "
                f"`python -m experiments.study run CONFIG --out {p}` and `report {p}` first"
            )
        csv_path = found[0]
    if csv_path.suffix.lower() != ".csv":
        raise UserInputError(f"{csv_path} is not a CSV file; give the study directory or its population CSV")
    df = _read_population_csv(csv_path)
    if df.empty:
        raise UserInputError(f"{csv_path} holds no models")
    stem = csv_path.name.removesuffix("population.csv").rstrip("_")
    docs = [csv_path.with_name("correlation.json")] + ([csv_path.with_name(f"{stem}.json")] if stem else [])
    doc, doc_path = None, None
    for path_ in docs:
        if path_.is_file():
            doc, doc_path = _report(path_), path_
            if doc is not None:
                break
    if "id" not in df.columns:
        raise UserInputError(f"{csv_path} has no 'id' column: it is not a population table of `report`")
    cfg = doc["study"] if doc is not None else None
    planned = _planned(cfg) if cfg is not None else None
    order = _population_order(df, _populations_file(csv_path.parent), planned)
    fits = doc is not None and _report_fits(doc, df, order)
    return Study(
        df=df,
        measures=[m["name"] for m in cfg["measures"]] if cfg is not None else None,
        populations=order,
        seeds=_seeds(cfg, len(order)) if cfg is not None else None,
        stop=(doc.get("stop") or cfg.get("stop") or None) if doc is not None else None,
        report=doc if fits else None,
        source=csv_path,
        report_path=doc_path if fits else None,
    )


def load_population(path: str | Path = DEFAULT_DIR) -> tuple[pd.DataFrame, list[str] | None]:
    """The per-model table of a study (every member) and its measure names (``None`` when no config
    says them); see :func:`load_study`."""
    study = load_study(path)
    return study.df, study.measures


def _populations_file(directory: Path) -> list[list[str]] | None:
    """``populations.json`` of a study directory (written by ``run``), if it is there and readable."""
    path = directory / "populations.json"
    if not path.is_file():
        return None
    try:
        pops = read_json(path, what="population list").get("populations")
    except (ValueError, AttributeError):
        return None
    ok = isinstance(pops, list) and all(isinstance(ids, list) for ids in pops)
    return [[str(i) for i in ids] for ids in pops] if ok else None


def _planned(cfg: dict[str, Any]) -> list[list[str]] | None:
    """The member ids of every population as the study config plans them (the order of
    ``populations.json``), or ``None`` when the config cannot be planned."""
    try:
        return population_ids(cfg)
    except (KeyError, TypeError, ValueError):
        return None


def _memberships(value: Any) -> list[int]:
    """The ``populations`` cell of a CSV row (``0;2``, a number, or empty) as a list of indices."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    if isinstance(value, (int, float)):
        return [int(value)]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(float(v)) for v in str(value).split(";") if v.strip()]


def _population_order(
    df: pd.DataFrame, listed: list[list[str]] | None, planned: list[list[str]] | None = None
) -> list[list[str]]:
    """The ids of each population, in the order the report correlates them.

    A table with a ``populations`` column (a report of several populations): ``populations.json``
    (``listed``), else the study config's plan (``planned``), when its members are those the column
    says, else the table's order. Without the column: the rows of a run directory take
    ``populations.json`` as the report does (ids without a row left out); otherwise (a report of
    one population, before populations existed) every row in the table's order."""
    ids = df["id"].astype(str).tolist()
    present = set(ids)
    if "populations" not in df.columns:
        return [[i for i in pop if i in present] for pop in listed] if listed else [ids]
    member = [_memberships(v) for v in df["populations"]]
    count = max((max(m) + 1 for m in member if m), default=0)
    from_table = [[i for i, m in zip(ids, member) if k in m] for k in range(count)]
    for cand in (listed, planned):
        if not cand:
            continue
        cand = [[i for i in pop if i in present] for pop in cand]
        if len(cand) == count and all(
            len(a) == len(b) and set(a) == set(b) for a, b in zip(cand, from_table)
        ):
            return cand
    return from_table


def _membership_column(ids: pd.Series, order: list[list[str]]) -> pd.Series:
    member: dict[str, list[int]] = {}
    for k, pop in enumerate(order):
        for i in pop:
            member.setdefault(i, []).append(k)
    return ids.astype(str).map(lambda i: ";".join(map(str, member.get(i, []))))


def _seeds(cfg: dict[str, Any] | None, count: int) -> list[int] | None:
    if not isinstance(cfg, dict) or not isinstance(cfg.get("sampling_seed"), int):
        return None
    return [cfg["sampling_seed"] + k for k in range(count)]


def _report_fits(doc: dict[str, Any], df: pd.DataFrame, order: list[list[str]]) -> bool:
    """Whether the report's pooled entries belong to this table: as many members, populations of
    the same sizes and as many models in each population's correlations as the table says."""
    pops = doc.get("populations")
    if not (isinstance(doc.get("combined"), list) and isinstance(pops, list) and len(pops) == len(order)):
        return False
    if doc.get("n_members") != len(df):
        return False
    ok = included(df)
    inc = set(df.loc[ok, "id"].astype(str)) if "id" in df.columns else set()
    return all(
        isinstance(pop, dict)
        and pop.get("members") == len(ids)
        and pop.get("included") == sum(i in inc for i in ids)
        for pop, ids in zip(pops, order)
    )


def _rewrite_fix(path: Path) -> str:
    return (
        f"delete it and run `python -m experiments.study report {path.parent}` to write it again from "
        "models/*.json (or restore the file)"
    )


def _read_population_csv(path: Path) -> pd.DataFrame:
    """A population CSV written by ``report``; an empty, truncated or corrupt file raises
    :class:`UserInputError` naming it, what is wrong and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise UserInputError(f"cannot read {path}: {why} — check the path and its permissions") from None
    fix = _rewrite_fix(path)
    if not raw.strip():
        raise UserInputError(f"{path} is empty (an interrupted copy?) — {fix}")
    try:
        text = raw.decode("utf-8")
        lines = list(csv.reader(io.StringIO(text)))
    except (UnicodeDecodeError, csv.Error) as exc:
        why = f"byte {exc.start} is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise UserInputError(f"{path} is not a CSV table ({why}; binary or corrupt?) — {fix}") from None
    width = len(lines[0])
    short = next((i for i, r in enumerate(lines[1:], 2) if r and len(r) != width), None)
    if not text.endswith("\n") or short is not None:
        n = short or len(lines)
        where = (
            f"line {n} has {len(lines[n - 1])} of {width} columns"
            if short
            else f"it ends inside line {n}, without a final newline"
        )
        raise UserInputError(f"{path} is truncated or corrupt ({where}; an interrupted copy?) — {fix}")
    try:
        return pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as exc:
        why = " ".join(str(exc).split())
        raise UserInputError(f"{path} is not a valid CSV table ({why}) — {fix}") from None


def _report(path: Path) -> dict[str, Any] | None:
    """A report's JSON document (``correlation.json``); ``None`` when it is another JSON file. A
    truncated or corrupt file raises :class:`UserInputError` naming it and the fix."""
    try:
        doc = read_json(path, what="study report (JSON)", fix=_rewrite_fix(path))
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    if not (isinstance(doc, dict) and "study" in doc):
        return None
    measures = doc["study"].get("measures") if isinstance(doc["study"], dict) else None
    if not (isinstance(measures, list) and all(isinstance(m, dict) and "name" in m for m in measures)):
        raise UserInputError(
            f"{path} is not a study report: its 'study' table holds no 'measures' list of tables with a "
            f"'name' (truncated or edited?) — {_rewrite_fix(path)}"
        )
    return doc


def included(df: pd.DataFrame) -> pd.Series:
    """True for the members that enter the correlations: status not ``diverged`` or ``not_converged``
    (:data:`experiments.study.report.EXCLUDED`; all True without a ``status`` column)."""
    if "status" not in df.columns:
        return pd.Series(True, index=df.index)
    return ~df["status"].astype(str).isin(EXCLUDED)


#: why a status keeps a member out of the correlations
_WHY = {"not_converged": "did not reach the stopping rule's training loss", "diverged": "diverged"}


def excluded_rows(study: Study) -> list[dict[str, Any]]:
    """The members left out of the correlations: id, populations, status, why, epochs, final
    training loss and error (what the report lists)."""
    df = study.df[~included(study.df)]
    cols = [c for c in ("id", "populations", "status", "epochs", "train_loss", "train_error") if c in df]
    out = []
    for row in records(df[cols]):
        row["why"] = _WHY.get(str(row.get("status")), str(row.get("status")))
        out.append(row)
    return out


def population_choices(study: Study) -> list[int | str]:
    """The page's population selector: each population's index, then :data:`POOLED` when the study
    has several populations and a report whose pooled entries belong to the table."""
    pops: list[int | str] = list(range(len(study.populations)))
    if len(study.populations) > 1 and study.report is not None:
        pops.append(POOLED)
    return pops


def included_ids(study: Study) -> set[str]:
    """The ids of the members that enter the correlations."""
    return set(study.df.loc[included(study.df), "id"].astype(str))


def population_frame(study: Study, choice: int | str) -> pd.DataFrame:
    """The rows the page correlates and plots: the members of population ``choice`` that enter the
    correlations, in the report's order (which its bootstrap intervals depend on); for
    :data:`POOLED` every such member of any population once, in table order."""
    df = study.df[included(study.df)]
    key = df["id"].astype(str)
    if choice == POOLED:
        members = {i for pop in study.populations for i in pop}
        return df[key.isin(members)].reset_index(drop=True)
    order = pd.Series(range(len(study.populations[int(choice)])), index=study.populations[int(choice)])
    rank = key.map(order)
    return (
        df[rank.notna()].assign(_rank=rank).sort_values("_rank").drop(columns="_rank").reset_index(drop=True)
    )


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows as plain Python values (NaN/empty cells become ``None``), as the study module takes them."""
    return json.loads(df.to_json(orient="records"))
