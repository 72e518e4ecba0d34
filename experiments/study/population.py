"""A population of trained models and their sharpness measures (Jiang et al. 2020, "Fantastic
generalization measures and where to find them", Sec. 3-4: many models over a hyperparameter space,
each measure correlated with the generalisation gap).

Every member (a point of :func:`experiments.study.config.plan_population`) is trained as a run of
the experiment runner (:mod:`experiments.study.members`) in ``<out>/runs/<id>/<optimizer>/seed<k>/``
and then measured on the weights read back from that run directory
(:mod:`experiments.study.measure`). One JSON file per member (``models/<id>.json``, written
atomically) holds its table row, its sharpness rows, the runner's metrics and history, and the
configuration: a member whose file records the same configuration is neither trained nor measured
again, and a member whose run was interrupted resumes from the run's last epoch checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from experiments.runner import Run, semantic_config
from experiments.study.config import model_id, plan_population
from experiments.study.measure import measure_member
from experiments.study.members import load_member, member_run, sharpness_subset, train_member
from landscape.io import atomic_write_json, read_json

__all__ = ["member_runs", "run_population", "train_and_measure"]

#: Study keys that do not change what a member is (how it is sampled, named or run).
_NOT_SEMANTIC = ("space", "sampling", "n_models", "bases", "threads", "name")
#: Runner keys that do not change what a member is.
_RUNNER_NOT_SEMANTIC = ("out_dir", "progress", "threads", "device")


def member_runs(cfg: dict[str, Any], out_dir: str | Path) -> list[tuple[dict[str, Any], Run]]:
    """Every point of the population with its runner run (planned and checked before any training);
    the run directories lie under ``<out_dir>/runs``."""
    root = Path(out_dir) / "runs"
    return [(p, member_run(p, cfg, root)) for p in plan_population(cfg)]


def train_and_measure(
    point: dict[str, Any], cfg: dict[str, Any], run: Run, *, progress: bool = False
) -> dict[str, Any]:
    """Train the member's run with the experiment runner (resuming or skipping it as the runner
    does), load its weights and measure them; returns ``{"row", "measures", "runner_metrics",
    "history", "run_dir"}``. A member whose run diverged (:mod:`experiments.divergence`) is not
    measured: its row holds ``status = "diverged"`` and the reason (``divergence``)."""
    t0 = time.perf_counter()
    device = torch.device(cfg["device"])
    metrics = train_member(run, device=device, progress=progress)
    if metrics.get("status") == "diverged":  # recorded, not measured; the report leaves it out
        div = metrics.get("divergence", {})
        row = {"id": model_id(point), **point, "status": "diverged", "divergence": div.get("reason", "")}
        row["seconds"] = time.perf_counter() - t0
        return {
            "row": row,
            "measures": {},
            "runner_metrics": metrics,
            "history": [],
            "run_dir": str(run.run_dir),
        }
    model, data, history = load_member(run, device=device)
    subset = sharpness_subset(run, data, cfg["sharpness_subset"])
    res = measure_member(point, cfg, model, data, subset, history, device=device, progress=progress)
    res["row"]["seconds"] = time.perf_counter() - t0
    return {**res, "runner_metrics": metrics, "history": history, "run_dir": str(run.run_dir)}


def _fingerprint(point: dict[str, Any], cfg: dict[str, Any], run: Run) -> str:
    keep = {k: v for k, v in cfg.items() if k not in _NOT_SEMANTIC}
    runner = {k: v for k, v in semantic_config(run.cfg).items() if k not in _RUNNER_NOT_SEMANTIC}
    text = json.dumps({"point": point, "cfg": keep, "runner": runner}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _finished(path: Path, fp: str) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        d = read_json(path, what="model result")
    except ValueError:
        return None
    return d if isinstance(d, dict) and d.get("fingerprint") == fp else None


def run_population(
    cfg: dict[str, Any], out_dir: str | Path, *, progress: bool = True, log: Any = None
) -> list[dict[str, Any]]:
    """Train and measure every member of :func:`member_runs` (skipping those whose
    ``models/<id>.json`` records the same configuration); returns the table rows in plan order.

    Writes ``study_config.json``, the runner's run directories under ``runs/`` and one
    ``models/<id>.json`` per member (atomically)."""
    out = Path(out_dir)
    members = member_runs(cfg, out)  # every member's runner config is checked before any training
    (out / "models").mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "study_config.json", cfg)
    torch.set_num_threads(cfg["threads"])
    rows: list[dict[str, Any]] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(members), desc="population", unit="model")
    try:
        for point, run in members:
            mid = model_id(point)
            path = out / "models" / f"{mid}.json"
            fp = _fingerprint(point, cfg, run)
            done = _finished(path, fp)
            if done is None:
                res = train_and_measure(point, cfg, run, progress=progress)
                res["run_dir"] = str(run.run_dir.relative_to(out))
                done = {"fingerprint": fp, "config": {"point": point, "study": cfg, "runner": run.cfg}, **res}
                atomic_write_json(path, done)
                if log is not None and done["row"].get("status") == "diverged":
                    log(f"{mid} diverged ({done['row']['divergence']}); excluded from the correlations")
            elif log is not None:
                log(f"skipped {mid} (results exist)")
            rows.append(done["row"])
            if bar is not None:
                bar.update(1)
                bar.set_postfix(last=mid)
    finally:
        if bar is not None:
            bar.close()
    return rows
