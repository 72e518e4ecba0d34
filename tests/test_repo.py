"""Repository hygiene: CI runs exactly the README's test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    top = [line for line in readme.splitlines() if line.startswith("pip install torch==2.13.0")]
    assert len(top) >= 2, "README must start with the dashboard and test commands"
    test_cmd = top[1].split("#")[0].strip()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "python -m pytest -q" in test_cmd
    assert test_cmd in ci_lines, f"CI must run the README's test command verbatim: {test_cmd!r}"
