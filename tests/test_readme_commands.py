"""Every command the README shows is exercised by a test (issue 37): the README's command lines and
inline commands are listed in :data:`EXERCISED` with the tests that run them, each of which must
exist and name the command; the ``sharpscape`` synopsis takes only options the real command line
has; and the digits experiment and its table, copied verbatim from the README, run as written
(issue 26; ``-m slow``, in a scratch directory holding the configs)."""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the words a command in the README starts with
COMMAND_WORDS = ("pip ", "python ", "sharpscape ", "streamlit ", "mkdocs ", "bash ", "torchrun ")

_DASHBOARD = "tests/test_wheel_dashboard.py"
_CLI = "tests/test_command_line.py"
_DIGITS = ("tests/test_readme_commands.py", "test_digits_experiment_and_table_run_as_written")
_TEST_LINE = (
    'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q -n auto --dist loadfile'
)

#: README command -> the tests that run it: (test file, test function, a string its source holds), or
#: (".ci/run", None, the line CI runs verbatim)
EXERCISED: dict[str, list[tuple[str, str | None, str]]] = {
    'pip install torch==2.13.0 && pip install -e ".[app]" && streamlit run app/Home.py': [
        (_DASHBOARD, "test_readme_streamlit_command_listens_on_loopback_only", '"app/Home.py"'),
        (_DASHBOARD, "test_wheel_in_a_fresh_venv_serves_the_dashboard_on_loopback", "[app]"),
    ],
    _TEST_LINE: [
        (".ci/run", None, _TEST_LINE),
        ("tests/test_repo.py", "test_ci_runs_the_readme_test_command", "python -m pytest -q"),
    ],
    "pip install torch==2.13.0 &&": [
        ("tests/test_repo.py", "test_ci_runs_the_readme_test_command", "pip install torch==2.13.0"),
    ],
    "streamlit run app/Home.py": [
        (_DASHBOARD, "test_readme_streamlit_command_listens_on_loopback_only", '"app/Home.py"'),
    ],
    "sharpscape dashboard": [
        (_DASHBOARD, "test_sharpscape_dashboard_listens_on_loopback_only", '"dashboard"')
    ],
    "sharpscape COMMAND --help": [(_CLI, "test_each_command_help_names_sharpscape", '"--help"')],
    "sharpscape run CONFIG [key=value ...]": [
        ("tests/test_experiments.py", "test_finished_runs_are_skipped_and_other_configs_refused", '["run"'),
        (_CLI, "test_list_configs_and_bare_names", '["run", "miniatures/label_noise"'),
    ],
    "sharpscape run CONFIG --estimate": [
        (
            "tests/test_estimate.py",
            "test_estimate_prints_one_row_per_variant_and_method_and_writes_nothing",
            '"--estimate"',
        ),
    ],
    "sharpscape run CONFIG --slurm slurm.time=240 slurm.partition=gpu && sharpscape status runs/NAME": [
        (
            "tests/test_cluster_slurm.py",
            "test_six_run_config_completes_with_the_results_of_a_local_run",
            '"--slurm", "slurm.time=10"',
        ),
        (
            "tests/test_cluster_slurm.py",
            "test_a_killed_task_is_reported_failed_with_its_log_and_resubmitted",
            '["status"',
        ),
    ],
    "sharpscape status RUN_DIR": [
        ("tests/test_cluster.py", "test_table_names_the_planned_runs_it_lacks", '["status"'),
    ],
    "sharpscape run --list-configs": [(_CLI, "test_list_configs_and_bare_names", '"--list-configs"')],
    "sharpscape run digits_sam_vs_sgd": [(_CLI, "test_list_configs_and_bare_names", '"digits_sam_vs_sgd"')],
    "sharpscape table RUN_DIR ... [--plot F]": [
        ("tests/test_experiments.py", "test_table_is_mean_and_sample_std_computed_by_hand", '["table"'),
        _DIGITS + ("--plot",),
    ],
    "sharpscape study run|report ...": [
        ("tests/test_study.py", "test_tiny_population_end_to_end", '["run"'),
        ("tests/test_study.py", "test_bad_input_gives_one_error_line", '["report"'),
    ],
    "sharpscape figures --out DIR": [
        ("tests/test_toy_claims.py", "test_figures_command_quick_subset", '"figures"'),
    ],
    "sharpscape sharpness --model M ...": [
        ("tests/test_sharpness_cli.py", "test_cli_writes_json_and_csv_with_the_right_numbers", '"sharpness"'),
    ],
    "sharpscape surface --model M --out F.npz": [
        (
            "tests/test_cli_errors.py",
            "test_readme_command_infers_the_tour_mlp_and_matches_a_direct_evaluation",
            '"surface"',
        ),
    ],
    "sharpscape dashboard [--address 127.0.0.1] [--port 8501] [--max-upload-mb 32] [--dry-run]": [
        (_CLI, "test_dashboard_dry_run_takes_the_given_address_port_and_limit", '"--max-upload-mb"'),
        (_CLI, "test_dashboard_dry_run_binds_loopback_by_default", "127.0.0.1"),
    ],
    "python -m experiments": [
        (
            "tests/test_experiments.py",
            "test_python_dash_m_reports_one_line_and_status",
            '"-m", "experiments"',
        ),
    ],
    "python -m experiments run configs/digits_sam_vs_sgd.toml": [_DIGITS + ("experiments run configs/",)],
    "python -m experiments table runs/digits_sam_vs_sgd --format markdown --plot t.png": [
        _DIGITS + ("experiments table runs/",)
    ],
}


def _readme_lines() -> list[str]:
    """The command lines of the README's ``bash`` blocks, comments cut off."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), re.S)
    lines = [ln.split("  #")[0].strip() for block in blocks for ln in block.splitlines()]
    return [ln for ln in lines if ln]


def _readme_commands() -> list[str]:
    """Every command of the README: its ``bash`` lines and the inline code spans that are commands."""
    prose = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)
    inline = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]  # across line breaks
    return _readme_lines() + [span for span in inline if span.startswith(COMMAND_WORDS)]


def _commands_with_prefix(prefix: str) -> list[str]:
    return [ln for ln in _readme_lines() if ln.startswith(prefix)]


def _function_source(path: str, name: str) -> str | None:
    text = (ROOT / path).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    return None


def test_every_readme_command_is_exercised_by_a_named_test():
    commands = _readme_commands()
    assert len(commands) >= 12  # the two lines on top, the synopsis, the digits example, inline ones
    missing = sorted({c for c in commands if c not in EXERCISED})
    assert not missing, f"README commands no test is listed for (add the test, then list it here): {missing}"
    stale = sorted(set(EXERCISED) - set(commands))
    assert not stale, f"listed commands the README no longer shows: {stale}"
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    for command, tests in EXERCISED.items():
        assert tests, command
        for path, name, needle in tests:
            if name is None:
                assert needle in ci_lines, (command, path)
                continue
            source = _function_source(path, name)
            assert source is not None, f"{path}::{name} (listed for {command!r}) does not exist"
            assert needle in source, f"{path}::{name} does not run {command!r} (no {needle!r})"


def _help(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    from sharpscape import command

    with pytest.raises(SystemExit) as info:
        command.main([name, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_readme_synopsis_takes_only_options_the_command_line_has(capsys):
    from sharpscape import command

    lines = _commands_with_prefix("sharpscape ")
    assert {ln.split()[1] for ln in lines} == set(command.COMMANDS)
    for line in lines:
        name, *rest = line.split()[1:]
        text = _help(name, capsys)
        for option in re.findall(r"--[\w-]+", line):
            assert re.search(rf"{re.escape(option)}\b", text), (
                f"{line!r}: `sharpscape {name}` has no {option}"
            )
        if name == "study":  # the sub-commands run|report
            for sub in rest[0].split("|"):
                assert re.search(rf"^\s+{sub}\s", text, re.M), (line, sub)


@pytest.mark.slow
def test_digits_experiment_and_table_run_as_written(tmp_path):
    run, table = (
        _commands_with_prefix("python -m experiments run configs/digits_sam_vs_sgd.toml")[0],
        _commands_with_prefix("python -m experiments table runs/digits_sam_vs_sgd")[0],
    )
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (run, table):
        argv = [sys.executable if a == "python" else a for a in shlex.split(cmd)]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (cmd, done.stderr[-2000:])
    assert (tmp_path / "t.png").stat().st_size > 10_000  # the --plot of the table command
    for method in ("sgd", "sam", "bsam"):
        assert f"| {method}" in done.stdout  # the markdown table lists every method of the config
