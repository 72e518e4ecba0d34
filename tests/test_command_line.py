"""The one command line: ``sharpscape run | table | study | figures | sharpness | surface | dashboard``.

Every command names itself as the user called it (``sharpscape run`` here, ``python -m experiments
run`` under ``python -m``), a bad command line ends in exactly one ``error:`` line and exit status 2,
and ``sharpscape dashboard`` binds 127.0.0.1 unless told otherwise. Starting the dashboard for real
(and from an installed wheel) is in ``test_wheel_dashboard.py``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from experiments.cli import _parser as experiments_parser
from experiments.study.__main__ import _parser as study_parser
from landscape import cli_common
from landscape.cli import build_parser as landscape_parser
from sharpscape import command, dashboard, resources
from toy_problems.__main__ import _parser as figures_parser

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("run", "table", "status", "study", "figures", "sharpness", "surface", "dashboard")


def _exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``sharpscape ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        code = command.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def test_help_lists_every_command_with_one_line(capsys):
    code, out, _ = _exit(["--help"], capsys)
    assert code == 0 and out.startswith("usage: sharpscape COMMAND")
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and line.split()}
    for name in COMMANDS:
        assert name in rows and len(rows[name].split()) > 2, out  # the name and a description
    assert tuple(command.COMMANDS) == COMMANDS


def test_no_command_and_unknown_command_are_one_error_line(capsys):
    for argv, word in (([], "no command given"), (["bogus"], "unknown command 'bogus'"), (["-x"], "option")):
        code, _, err = _exit(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0], err


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_help_names_sharpscape(name, capsys):
    code, out, err = _exit([name, "--help"], capsys)
    assert code == 0 and not err
    assert out.startswith(f"usage: sharpscape {name} "), out[:200]


# one bad argument per command, refused by the parser before any work
BAD = {
    "run": ["configs/digits_sam_vs_sgd.toml", "--bogus"],
    "table": ["runs", "--format", "xml"],
    "status": ["runs", "--format", "xml"],
    "study": ["run", "configs/study_digits.toml"],  # --out is required
    "figures": ["--out", "figs", "--resolution", "3"],
    "sharpness": ["--model", "mlp", "--bogus"],
    "surface": ["--model", "mlp", "--out", "s.npz", "--grid", "1", "2", "3"],
    "dashboard": ["--port", "0"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_bad_argument_is_one_error_line_and_status_2(name, capsys):
    code, _, err = _exit([name, *BAD[name]], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "usage:" not in err
    if "--help" in lines[0]:  # a usage error points at the command's own help
        assert f"`sharpscape {name}" in lines[0], lines[0]


BAD_VALUES = {
    "unknown --data form": ["sharpness", "--model", "mlp", "--data", "bogus"],
    "missing --data directory": [
        "surface",
        "--model",
        "mlp",
        "--data",
        "mnist:/no/such/dir",
        "--out",
        "s.npz",
    ],
    "study without a subcommand": ["study"],
    "study report of a non-study directory": ["study", "report", "."],
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_every_bad_command_line_exits_2_naming_sharpscape(case, capsys, tmp_path, monkeypatch):
    """A bad value (not only a bad option) is a bad command line: status 2, one error line, and the
    advice names the command as the user typed it (not ``python -m experiments.study``)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = _exit(BAD_VALUES[case], capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    assert "Traceback" not in err and "python -m experiments" not in err, err
    if case.startswith("study report"):
        assert "`sharpscape study run CONFIG --out DIR`" in lines[0], lines[0]


def test_unknown_option_points_at_the_commands_help(capsys):
    code, _, err = _exit(["run", "configs/digits_sam_vs_sgd.toml", "--bogus"], capsys)
    assert code == 2 and "see `sharpscape run --help`" in err, err
    code, _, err = _exit(["study", "report", "x", "--bogus"], capsys)
    assert code == 2 and "see `sharpscape study report --help`" in err, err


def test_python_m_forms_keep_their_own_names(capsys):
    from experiments.cli import main as experiments_main
    from experiments.study.__main__ import main as study_main
    from landscape.cli import main as landscape_main
    from toy_problems.__main__ import main as toy_main

    for main, argv, prog in (
        (experiments_main, ["run", "--help"], "python -m experiments run"),
        (experiments_main, ["table", "--help"], "python -m experiments table"),
        (study_main, ["run", "--help"], "python -m experiments.study run"),
        (toy_main, ["figures", "--help"], "python -m toy_problems figures"),
        (landscape_main, ["surface", "--help"], "python -m landscape surface"),
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {prog} ")
    with pytest.raises(SystemExit) as info:
        experiments_main(["run", "x.toml", "--bogus"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("error:") == 1 and "`python -m experiments run --help`" in err


def test_console_script_and_python_m_sharpscape():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"sharpscape": "sharpscape.command:main"}
    script = Path(sys.executable).parent / "sharpscape"  # the installed console script, if any
    if script.is_file():
        assert "from sharpscape.command import main" in script.read_text(), (
            f"{script} runs an older entry point: reinstall (pip install -e .)"
        )
    # `python -m sharpscape` names itself so, and neither --help nor a usage error imports torch
    probe = (
        "import sys\nfrom sharpscape.command import main\n"
        "try:\n    main(sys.argv[1:], prog='python -m sharpscape')\n"
        "except SystemExit as e:\n    print('status', e.code, 'torch' in sys.modules)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe, "dashboard", "--address"], capture_output=True, text=True, env=_env()
    )
    assert res.stdout.strip() == "status 2 False", res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: argument --address: expected one argument — see `python -m sharpscape dashboard --help`"
    ]
    res = subprocess.run(
        [sys.executable, "-m", "sharpscape", "--help"], capture_output=True, text=True, env=_env()
    )
    assert res.returncode == 0 and res.stdout.startswith("usage: python -m sharpscape COMMAND"), res.stderr


# ----------------------------------------------------------------------------------- dashboard
def _dry_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    code, out, err = _exit(["dashboard", "--dry-run", *argv], capsys)
    assert code == 0 and not err, err
    return shlex.split(out.strip())


def test_dashboard_dry_run_binds_loopback_by_default(capsys):
    cmd = _dry_run([], capsys)
    text = " ".join(cmd)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and Path(cmd[4]).name == "Home.py"
    assert Path(cmd[4]).is_file() and Path(cmd[4]) == resources.app_home()
    assert "--server.address 127.0.0.1" in text and "--server.port 8501" in text
    assert "--server.headless true" in text
    assert f"--server.maxUploadSize {dashboard.DEFAULT_MAX_UPLOAD_MB}" in text


def test_dashboard_dry_run_takes_the_given_address_port_and_limit(capsys):
    cmd = " ".join(_dry_run(["--address", "0.0.0.0", "--port", "8600", "--max-upload-mb", "300"], capsys))
    assert "--server.address 0.0.0.0" in cmd and "127.0.0.1" not in cmd
    assert "--server.port 8600" in cmd and "--server.maxUploadSize 300" in cmd


def test_dashboard_refuses_a_port_in_use(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = _exit(["dashboard", "--port", str(port)], capsys)
    assert code == 1 and err.strip().startswith(f"error: port {port} on 127.0.0.1 is in use"), err
    assert len(err.strip().splitlines()) == 1


def test_repository_streamlit_config_listens_on_loopback():
    cfg = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["address"] == "127.0.0.1"
    assert cfg["server"]["maxUploadSize"] == dashboard.DEFAULT_MAX_UPLOAD_MB
    readme = (ROOT / "README.md").read_text()
    assert "streamlit run app/Home.py" in readme.split("\n## ")[0]  # the command this config serves


def test_url_of_the_address():
    assert dashboard.url("127.0.0.1", 8501) == "http://127.0.0.1:8501/"
    assert dashboard.url("0.0.0.0", 8502) == "http://127.0.0.1:8502/"
    assert dashboard.url("::1", 8503) == "http://[::1]:8503/"


# ------------------------------------------------------------------------------- example configs
def test_list_configs_and_bare_names(capsys, tmp_path, monkeypatch):
    code, out, _ = _exit(["run", "--list-configs"], capsys)
    assert code == 0 and "digits_sam_vs_sgd" in out and "miniatures/label_noise" in out
    assert "[study]" in out and "sharpscape study run study_digits --out DIR" in out
    names = {c[0] for c in resources.list_configs()}
    on_disk = {
        p.relative_to(ROOT / "configs").with_suffix("").as_posix() for p in (ROOT / "configs").rglob("*.toml")
    }
    assert names == on_disk
    monkeypatch.chdir(tmp_path)  # outside the repository: names and configs/... paths still resolve
    want = resources.configs_dir() / "digits_sam_vs_sgd.toml"
    for text in ("digits_sam_vs_sgd", "digits_sam_vs_sgd.toml", "configs/digits_sam_vs_sgd.toml"):
        assert Path(resources.resolve_config(text)) == want
    assert resources.resolve_config("nothere") == "nothere"
    assert resources.resolve_config("../configs/digits_sam_vs_sgd") == "../configs/digits_sam_vs_sgd"
    (tmp_path / "digits_sam_vs_sgd.toml").write_text("name = 'mine'\n")  # a file given is used as given
    assert resources.resolve_config("digits_sam_vs_sgd.toml") == "digits_sam_vs_sgd.toml"
    code, out, err = _exit(["run", "miniatures/label_noise", f"out_dir={tmp_path}", "--dry-run"], capsys)
    assert code == 0 and "# run: " in out, err


def test_readme_lists_every_command():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    for name in COMMANDS:
        assert f"sharpscape {name}" in section, name
    assert "sharpscape run --list-configs" in section and "127.0.0.1" in section


def _every_option():
    """(command, option) for every option of every command line (sharpscape's and the python -m
    forms share these parsers)."""
    parsers = {
        "landscape": landscape_parser(),
        "experiments": experiments_parser(),
        "study": study_parser(),
        "dashboard": dashboard.build_parser(),
        "figures": figures_parser(),
    }

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(p, f"{name} {sub}")
            elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                yield name, action

    for name, parser in parsers.items():
        yield from walk(parser, name)


def test_every_option_has_help_naming_its_default():
    """Every option says what it does, and one with a default value names it in its help."""
    missing, silent_default = [], []
    for name, action in _every_option():
        flag = action.option_strings[0] if action.option_strings else action.dest
        text = action.help or ""
        if not text or text == argparse.SUPPRESS:
            missing.append(f"{name} {flag}")
        elif action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            silent_default.append(f"{name} {flag} (default {action.default!r})")
    assert not missing and not silent_default, (missing, silent_default)


def test_task_progress_estimates_from_the_tasks_that_ran(monkeypatch, capsys):
    # tasks of 10 s, 0.2 s (found on disk) and 29.8 s
    clock = iter([0.0, 0.0, 0.0, 10.0, 10.0, 10.0, 10.2, 10.2, 10.2, 40.0])
    monkeypatch.setattr(cli_common.time, "monotonic", lambda: next(clock))
    progress = cli_common.TaskProgress(4, "run")
    progress.begin("a")
    progress.end()
    progress.begin("b")
    progress.end()
    progress.begin("c")
    progress.end()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "note: run 1/4: a"
    assert lines[1] == "note: run 2/4: b (elapsed 10 s, about 30 s left)"  # 10 s x 3 left
    assert lines[2] == "note: run 3/4: c (elapsed 10 s, about 20 s left)"  # the 0.2 s task does not count
    with pytest.raises(RuntimeError, match="without begin"):
        progress.end()
