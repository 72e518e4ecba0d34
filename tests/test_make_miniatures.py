"""docs/make_miniatures.py's tables from its committed JSON: ``docs/figures/miniature_tables.md`` (a
generated page, docs/claim_list.py's ``GENERATED``) is exactly :func:`make_miniatures.tables_page`
of ``docs/figures/miniature_results.json``, so a number edited by hand in either fails; the table
cells are the mean and sample standard deviation (ddof 1) of the JSON's per-seed values, checked
against :mod:`statistics`; the verdict rule against hand-made intervals; ``--from-json`` writes the
page and names the fix for a file that is no miniature result."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import make_miniatures  # noqa: E402

FIG = ROOT / "docs" / "figures"
RESULTS = json.loads((FIG / "miniature_results.json").read_text(encoding="utf-8"))
PAGE = (FIG / "miniature_tables.md").read_text(encoding="utf-8")


def _values(part: str, method: str, key: str, variant: str | None = None) -> list[float]:
    return [
        r[key]
        for r in RESULTS[part]
        if r["method"] == method and (variant is None or r["variant"] == variant) and key in r
    ]


def test_committed_page_is_the_rendering_of_the_committed_json():
    assert make_miniatures.tables_page(RESULTS) == PAGE


def test_cells_are_mean_and_sample_std_of_the_json_rows():
    acc = _values("label_noise", "sgd", "accuracy", "label_noise=0.4")
    assert len(acc) == 3
    cell = f"| SGD | {statistics.mean(acc):.3f} ± {statistics.stdev(acc):.3f} |"
    assert cell in PAGE
    # the diverged G-TRACER seed has no metrics: its mean is over the two others, and it is counted
    gt = _values("label_noise", "sgd_tracer", "accuracy", "label_noise=0.4")
    assert len(gt) == 2
    assert f"| G-TRACER (SGD) | {statistics.mean(gt):.3f} ± {statistics.stdev(gt):.3f} |" in PAGE
    assert "(1 of 3 seeds diverged)" in PAGE
    nll = _values("flat_posteriors", "f_sgld", "bma_nll")
    assert f"| F-SGLD vs SGLD: lower NLL | {statistics.mean(nll):.3f} ± {statistics.stdev(nll):.3f} |" in PAGE
    # the timing table: seconds per run, mean over every run of a method (the diverged one included)
    secs = _values("label_noise", "sgd_tracer", "seconds")
    assert f"| sgd_tracer | 6 | {statistics.mean(secs):.1f} |" in PAGE


def test_verdict_rule_on_hand_made_intervals():
    # means 1 and 2, stds 0.5: the intervals [0.5, 1.5] and [1.5, 2.5] touch, so not resolved
    touching = make_miniatures.verdict([0.5, 1.0, 1.5], [1.5, 2.0, 2.5], "higher")
    assert touching == "not resolved (within 1 std)"
    # means 1 and 3, stds 0.5: resolved; higher is the paper's way -> the baseline wins
    assert make_miniatures.verdict([0.5, 1.0, 1.5], [2.5, 3.0, 3.5], "higher") == "not reproduced"
    assert make_miniatures.verdict([0.5, 1.0, 1.5], [2.5, 3.0, 3.5], "lower") == "reproduced"
    assert make_miniatures.verdict([1.0], [3.0], "lower") == "not resolved (one seed)"


def test_from_json_writes_the_page_and_refuses_another_file(tmp_path):
    argv = ["--from-json", str(FIG / "miniature_results.json"), "--out", str(tmp_path)]
    assert make_miniatures.main(argv) == 0
    assert (tmp_path / "miniature_tables.md").read_text(encoding="utf-8") == PAGE
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="miniature_results.json"):
        make_miniatures.main(["--from-json", str(other), "--out", str(tmp_path)])
