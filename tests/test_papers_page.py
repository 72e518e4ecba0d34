"""docs/papers.md, the coverage of the five papers: every table and figure each paper prints is a row
(the inventories ``docs/coverage/*.toml``), every row's config exists, resolves and carries the
paper's numbers and its differences, every toy figure is registered, every paper config is on the
page, the page is current, and the README's verdicts agree with the page's statuses."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tomllib

from experiments.config import ConfigError, load_config
from experiments.runner import plan_runs, validate
from toy_problems.figures import FIGURES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import make_papers  # noqa: E402

PAPERS = make_papers.inventories()
ITEMS = [(p["key"], item) for p in PAPERS for item in p["items"]]


def test_five_papers_each_table_and_figure_once_in_order():
    assert [p["key"] for p in PAPERS] == ["bsam", "fisher_sam", "flat_bnn", "g_tracer", "vsam"]
    for p in PAPERS:
        expected = [f"Table {i}" for i in range(1, p["tables"] + 1)]
        expected += [f"Figure {i}" for i in range(1, p["figures"] + 1)]
        assert [item["id"] for item in p["items"]] == expected, p["key"]
        for item in p["items"]:
            assert item["status"] in make_papers.STATUSES, (p["key"], item["id"])
            assert item["what"].strip(), (p["key"], item["id"])


@pytest.mark.parametrize("key,item", ITEMS, ids=lambda x: x if isinstance(x, str) else x["id"])
def test_each_row_has_a_command_or_a_reason(key, item):
    status = item["status"]
    if status in ("reference", "not runnable"):
        assert item.get("reason", "").strip(), "a row without a run says why"
    else:
        assert make_papers.commands(item), "a row with a status other than reference has a command"
    if status in ("reproduced", "partly reproduced", "not reproduced", "toy figure"):
        assert item.get("figure") in FIGURES, "a toy-figure status names a registered toy figure"
    if status == "configured":
        assert item.get("configs"), "configured means a config"
    for name in item.get("configs", []):
        path = ROOT / "configs" / f"{name}.toml"
        assert path.is_file(), path
        if status == "configured":
            assert make_papers.config_differences(name), f"{name}: no 'Differences from the authors' run'"


CONFIGS = sorted({c for _, item in ITEMS for c in item.get("configs", [])})


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_on_the_page_resolves_and_carries_the_papers_numbers(name, tmp_path):
    """A config that fine-tunes names the user's checkpoint as a file that is not shipped: planning
    it refuses (no silent start from random weights), with a stand-in file it validates."""
    path = ROOT / "configs" / f"{name}.toml"
    overrides = []
    if load_config(path)["model"]["checkpoint"]:
        with pytest.raises(ConfigError, match="model.checkpoint .* does not exist"):
            plan_runs(load_config(path))
        (tmp_path / "weights.pt").write_bytes(b"stand-in: hashed by planning, read only by training")
        overrides = [f"model.checkpoint={tmp_path / 'weights.pt'}"]
    cfg = load_config(path, overrides)
    validate(plan_runs(cfg))
    assert cfg["name"] == name and cfg["budget"] < 1.0
    paper = tomllib.loads(path.read_text(encoding="utf-8")).get("paper", {})
    assert paper.get("source"), f"{name}: [paper] source names the table and where its numbers come from"


def test_every_paper_config_is_on_the_page():
    with_paper = {
        p.stem
        for p in (ROOT / "configs").glob("*.toml")
        if tomllib.loads(p.read_text(encoding="utf-8")).get("paper")
    }
    assert with_paper <= set(CONFIGS), sorted(with_paper - set(CONFIGS))


def test_the_page_is_current():
    assert (ROOT / "docs" / "papers.md").read_text(encoding="utf-8") == make_papers.render(), (
        "run python docs/make_papers.py"
    )


def test_readme_and_configs_readme_link_to_the_page_and_claim_no_more():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    configs = (ROOT / "configs" / "README.md").read_text(encoding="utf-8")
    assert "docs/papers.md" in readme and "../docs/papers.md" in configs
    for text in (readme, configs):
        assert "one config per paper table" not in text.lower()


def _verdict(cell: str) -> str:
    bold = re.findall(r"\*\*(.+?)\*\*", cell)
    yes = any(b.startswith("reproduced") for b in bold)
    no = any(b.startswith("not reproduced") for b in bold)
    return "partly reproduced" if yes and no else "reproduced" if yes else "not reproduced" if no else ""


def test_readme_verdicts_of_paper_figures_and_tables_match_the_page():
    """A README claims row naming a paper's figure or table ("Fig. 2: ...") has the page's status."""
    shorts = {p["short"]: p for p in PAPERS}
    lines = (ROOT / "README.md").read_text().splitlines()
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| ")]
    checked = 0
    paper = None
    for cells in rows:
        if len(cells) != 4:
            continue
        name = cells[0].strip().split(" (")[0]
        paper = shorts.get(name, paper if name == "" else None)
        m = re.match(r"\s*(Fig|Table)\.? (\d+):", cells[1])
        if not (paper and m):
            continue
        item_id = f"{'Figure' if m.group(1) == 'Fig' else 'Table'} {m.group(2)}"
        item = next(i for i in paper["items"] if i["id"] == item_id)
        assert _verdict(cells[3]) == item["status"], (paper["key"], item_id, cells[3])
        checked += 1
    assert checked >= 3  # Fisher-SAM Figs. 1 and 2, bSAM Fig. 3
