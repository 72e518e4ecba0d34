"""The claims registry (``docs/claims.py``, ``docs/claim_list.py``, ``docs/claims.json``): every quoted
result equals its JSON, the registry is current (values, sources, input hashes), a hand-edited
number fails, and the claims re-run within their tolerance (cheap ones here, expensive ones slow)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import claims as reg  # noqa: E402
from claim_list import CLAIMS  # noqa: E402


def test_every_quote_equals_its_source():
    missing = [(c.id, f) for c in CLAIMS for f in reg.quote_problems(c, reg.read_values(c))]
    assert not missing, f"quotes that differ from their JSON (regenerate, do not hand-edit): {missing}"


def test_every_number_of_a_checked_page_is_a_claim_or_exempt():
    import claim_list

    assert not reg.page_problems(CLAIMS, claim_list)


def test_an_unregistered_number_on_a_checked_page_fails(tmp_path, monkeypatch):
    """A number typed into a checked page (here the README) is named with its line and context; an
    exempt phrase the page no longer holds is named too."""
    import claim_list

    (tmp_path / "README.md").write_text((ROOT / "README.md").read_text() + "\nSAM is 1.37× slower.\n")
    monkeypatch.setattr(reg, "ROOT", tmp_path)
    problems = reg.unclaimed_numbers("README.md", CLAIMS, claim_list.NOT_RESULTS["README.md"])
    assert len(problems) == 1 and "'1.37×'" in problems[0] and "SAM is 1.37× slower" in problems[0]
    stale = reg.unclaimed_numbers("README.md", CLAIMS, ("Python 3.12+",))
    assert any("'Python 3.12+' is not on the page" in p for p in stale)
    assert any("'3.11'" in p for p in stale)  # its own exemption dropped: the number is named


def test_a_line_copied_whole_from_a_generated_page_is_covered(tmp_path, monkeypatch):
    """A table row copied verbatim (whitespace aside) from a generated page quotes that page's
    numbers; a row with one digit changed, or the same number inside a sentence, does not."""
    (tmp_path / "gen.md").write_text("# Tables\n\n| SGD | 0.695 ± 0.033 |\n| SAM | 0.918 ± 0.004 |\n")
    (tmp_path / "page.md").write_text(
        "| method | accuracy |\n|---|---|\n|  SGD |  0.695 ± 0.033 |\n| SAM | 0.918 ± 0.005 |\n"
        "SGD ends at 0.695 here.\n"
    )
    monkeypatch.setattr(reg, "ROOT", tmp_path)
    problems = reg.unclaimed_numbers("page.md", [], (), ("gen.md",))
    assert [tuple(p.split(": ")[0].split(":")[1:]) + (p.split("'")[1],) for p in problems] == [
        ("4", "0.918"), ("4", "0.005"), ("5", "0.695")
    ]  # fmt: skip
    assert len(reg.unclaimed_numbers("page.md", [], ())) == 5  # without the generated page: every number


def test_numbers_that_are_never_results():
    """Code, link targets, section / equation / table references and versions are not results."""
    text = "Sec. 5.1, eq. 12.3, Table 2.1, App. C.2, curvlinops 3.0.1, `lr = 0.05`, [x](a/1.5.md)"
    assert not [m.group() for m in reg.PAGE_NUMBER.finditer(text) if not any(
        a <= m.start() < b for a, b in ((n.start(), n.end()) for n in reg.NOT_A_RESULT.finditer(text))
    )]  # fmt: skip
    text = r"0.34× and 12 % and 2.1e-13, 1,797.5, 4x faster, $3\cdot 10^{-4}$, accuracy 0.974. 8x8 or 2.1.0"
    assert [m.group() for m in reg.PAGE_NUMBER.finditer(text)] == [
        "0.34×", "12 %", "2.1e-13", "1,797.5", "4x", r"3\cdot 10^{-4}", "0.974"
    ]  # fmt: skip


def test_registry_is_current():
    assert not reg.registry_problems(CLAIMS)
    payload = json.loads(reg.REGISTRY.read_text())
    for e in payload["claims"]:
        assert e["command"] or e["kind"] == "measurement"
        assert e["inputs"] and all(len(h) == 16 for h in e["inputs"].values())
    assert {"commit_before_update", "python", "torch"} <= set(payload["provenance"])


def test_a_hand_edited_number_or_changed_code_fails(tmp_path, monkeypatch):
    claim = next(c for c in CLAIMS if c.id == "fsam_fig1.minima")
    for rel in {*claim.files, *claim.inputs, claim.source, "docs/claims.json"}:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    monkeypatch.setattr(reg, "ROOT", tmp_path)
    monkeypatch.setattr(reg, "REGISTRY", tmp_path / "docs" / "claims.json")
    values = reg.read_values(claim)
    assert reg.quote_problems(claim, values) == []
    page = tmp_path / claim.files[0]
    page.write_text(page.read_text().replace("(19.81, 29.94)", "(19.82, 29.94)"))
    assert reg.quote_problems(claim, values) == [claim.files[0]]
    code = tmp_path / claim.inputs[0]
    code.write_text(code.read_text() + "\n# changed\n")
    assert any("inputs changed" in p for p in reg.registry_problems([claim]))


def test_rewrite_writes_the_json_numbers_into_a_stale_quote_and_keeps_line_breaks(tmp_path, monkeypatch):
    claim = next(c for c in CLAIMS if c.id == "products_cpu.time.wrn16_4")
    (tmp_path / claim.source).parent.mkdir(parents=True)
    shutil.copy(ROOT / claim.source, tmp_path / claim.source)
    monkeypatch.setattr(reg, "ROOT", tmp_path)
    values = reg.read_values(claim)
    right = reg.fill(claim, values)
    wrong = right.replace("| 2.23× |", "| 9.99× |").replace(" | 1.69×", "\n| 1.69×")
    assert wrong.count("9.99") == 1 and "\n" in wrong
    page = claim.files[0]
    (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / page).write_text(f"before\n{wrong}\nafter\n")
    assert reg.quote_problems(claim, values) == [page]
    assert reg.rewrite_quotes(claim, values) == [page]
    assert (tmp_path / page).read_text() == "before\n" + right.replace(" | 1.69×", "\n| 1.69×") + "\nafter\n"
    assert reg.quote_problems(claim, values) == [] and reg.rewrite_quotes(claim, values) == []


def _rerun_all(claims) -> list[str]:
    """Run the claims' common command once into a scratch directory; every claim compared."""
    with tempfile.TemporaryDirectory() as tmp:
        reg.rerun(claims[0], Path(tmp))
        return [
            problem
            for c in claims
            for problem in reg.rerun_problems(
                c, reg.read_values(c), reg.read_values(c, Path(tmp) / Path(c.source).name)
            )
        ]


def _by_command(cost: str) -> list[list]:
    groups: dict[str, list] = {}
    for c in CLAIMS:
        if c.rerun and c.cost == cost:
            groups.setdefault(c.rerun, []).append(c)  # one environment per command (registry_problems)
    return list(groups.values())


@pytest.mark.parametrize("claims", _by_command("cheap"), ids=lambda cs: cs[0].id)
def test_cheap_claims_reproduce(claims):
    assert not _rerun_all(claims)


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("claims", _by_command("expensive"), ids=lambda cs: cs[0].id)
def test_expensive_claims_reproduce(claims):
    """Each regenerating command runs once (the miniatures' three commands serve four claims).

    The miniatures' 60 runs take about 8 min on a quiet 2-core machine and longer on a loaded one,
    past the suite's 600 s default, hence the test's own limit."""
    assert not _rerun_all(claims)
