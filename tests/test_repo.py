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


def test_cli_lists_both_commands_and_needs_one(capsys):
    from landscape.cli import build_parser, main

    help_text = build_parser().format_help()
    assert "sharpness" in help_text and "surface" in help_text
    assert main([]) == 2  # no command: help and a usage error code
    assert "COMMAND" in capsys.readouterr().out
