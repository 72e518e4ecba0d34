"""The "Study harness" bullet of ``docs/reproductions.md`` quotes the committed study
(docs/figures/study_digits.json): the findings paragraph the report prints (``headline``, recomputed
here from the JSON's values) appears in the bullet verbatim, and every other number of the bullet
is one of that paragraph's, so a number edited by hand fails. The committed CSV, Markdown table and
JSON agree. The slow test re-trains three committed members with the committed config and checks
that they stop at the same epoch with the same training error (within 0.02)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch

from experiments.study.report import report_markdown
from experiments.study.summary import headline

ROOT = Path(__file__).resolve().parents[1]
FIG = ROOT / "docs" / "figures"
DOC = json.loads((FIG / "study_digits.json").read_text(encoding="utf-8"))


def _bullet() -> str:
    text = (ROOT / "docs" / "reproductions.md").read_text(encoding="utf-8")
    start = text.index("- **Study harness**")
    end = text.find("\n- **", start + 1)
    return " ".join(text[start : end if end > 0 else None].split())


def _numbers(text: str) -> list[str]:
    """The numbers of ``text`` outside code spans, links and cited years, as written (signs kept,
    the typographic minus read as '-'; digits that are part of a name are not numbers)."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"\b(19|20)\d\d\b", " ", text)
    text = text.replace("−", "-")
    return re.findall(r"(?<![\w.-])[+-]?\d+(?:\.\d+)?(?!\w)", text)  # not LeNet-5, float32


def test_headline_is_recomputed_from_the_json_values():
    assert headline(DOC) == DOC["headline"]


def test_study_bullet_quotes_the_headline_verbatim():
    assert " ".join(DOC["headline"].split()) in _bullet()


def test_every_number_of_the_study_bullet_is_the_reports():
    allowed = set(_numbers(DOC["headline"]))
    stray = [n for n in _numbers(_bullet()) if n not in allowed]
    assert not stray, f"numbers in the study bullet that the report does not print: {stray}"


def test_committed_page_is_the_reports_rendering_of_the_committed_json():
    """docs/figures/study_digits.md is generated (docs/claim_list.py's GENERATED): it must be what
    the report writes for the committed JSON, so a number edited by hand in either fails."""
    page = (FIG / "study_digits.md").read_text(encoding="utf-8")
    assert report_markdown(DOC) == page
    assert page.count("\n| lambda_max |") == len(DOC["targets"]) + 1  # a row per target table, and psi's


def test_committed_files_agree():
    rows = list(csv.DictReader((FIG / "study_digits_population.csv").open(encoding="utf-8")))
    models = {m["id"]: m for m in DOC["models"]}
    assert [r["id"] for r in rows] == [m["id"] for m in DOC["models"]] and len(rows) == DOC["n_members"]
    for r in rows:
        m = models[r["id"]]
        assert r["status"] == m["status"]
        if m["status"] != "diverged":
            assert float(r["train_error"]) == m["train_error"] and int(r["epochs"]) == m["epochs"]
    assert DOC["n_models"] == sum(m["status"] == "completed" for m in DOC["models"])
    short = sorted(m["id"] for m in DOC["models"] if m["status"] == "not_converged")
    assert sorted(DOC["not_converged"]) == short
    assert (FIG / "study_digits.md").read_text(encoding="utf-8").startswith(DOC["headline"])
    assert min(p["members"] for p in DOC["populations"]) >= 150 and len(DOC["populations"]) == 3
    assert (FIG / "study_digits.png").stat().st_size > 10_000


def _sample() -> list[dict]:
    """Three committed members: the cheapest LeNet-5 / bSAM and MLP / SAM members that reached the
    target, and the cheapest member that did not (or a LeNet-5 / ASAM one)."""
    done = [m for m in DOC["models"] if m["status"] == "completed"]
    cheap = lambda ms: min(ms, key=lambda m: (m["epochs"] * m["n_train"], m["id"]))  # noqa: E731
    picks = [
        cheap([m for m in done if (m["model"], m["optimizer"]) == ("lenet5-digits", "bsam")]),
        cheap([m for m in done if (m["model"], m["optimizer"]) == ("mlp", "sam")]),
    ]
    short = [m for m in DOC["models"] if m["status"] == "not_converged"]
    picks.append(cheap(short or [m for m in done if m["optimizer"] == "asam" and m["model"] != "mlp"]))
    return picks


@pytest.mark.slow
@pytest.mark.parametrize("index", [0, 1, 2])
def test_committed_members_train_again_to_the_same_epoch_and_error(index, tmp_path):
    from experiments.study.config import AXES, resolve_study_config
    from experiments.study.measure import error_and_loss
    from experiments.study.members import load_member, member_run, train_member

    cfg = resolve_study_config(
        {k: v for k, v in DOC["study"].items() if not (k == "epochs" and DOC["study"].get("stop"))}
    )
    ref = _sample()[index]
    point = {a: ref[a] for a in AXES}
    torch.set_num_threads(cfg["threads"])
    run = member_run(point, cfg, tmp_path)
    metrics = train_member(run, device=torch.device("cpu"), stop=cfg["stop"])
    model, data, history = load_member(run, device=torch.device("cpu"))
    err, _ = error_and_loss(model, data.x_train, data.y_train)
    assert len(history) == ref["epochs"], (ref["id"], len(history), ref["epochs"])
    assert abs(err - ref["train_error"]) <= 0.02, (ref["id"], err, ref["train_error"])
    assert metrics["stop"]["reached"] == (ref["status"] == "completed")
