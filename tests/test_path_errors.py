"""Results and paths at the command lines' edges (issue 36).

* A result file is replaced only by a complete one: an existing ``surface --out`` (and its
  ``--plot`` / ``--vtk``), ``sharpness --out`` / ``--csv`` survive a second run that fails or is
  interrupted, byte for byte; an interrupted surface keeps its points in ``OUT.partial`` and
  ``--resume`` finishes them.
* Every path argument is checked in one place (:func:`landscape.cli_common.check_path`): a file
  where a directory is expected and vice versa, a trailing slash, a file among the parents, a
  missing input, an unwritable location; one ``error:`` line naming the user's path (never the
  atomic writer's temporary file), exit status 2.
* A config handed to the other kind of command names the command that runs it.
* Every spelling of a loopback address is this machine only (no warning); others are warned about.
* A lock file no sharpscape run wrote (binary, an overflowing or negative PID, a directory) is named
  as such, with its content and the fix, never an unexpected failure.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import landscape.io as lio
from experiments import cli as experiments_cli
from experiments.config import DEFAULTS as RUN_DEFAULTS
from experiments.run_lock import LOCK_NAME, RunLocked, acquire
from experiments.study import __main__ as study_cli
from experiments.study.config import _DEFAULTS as STUDY_DEFAULTS
from experiments.table import write_text
from landscape.cli import main as landscape_main
from landscape.io import PathError, atomic_savefig, atomic_write_text
from landscape.surface import load_surface
from landscape.surface.cli import partial_path
from sharpscape import dashboard, network, resources
from sharpscape.command import main as sharpscape_main

ROOT = Path(__file__).resolve().parents[1]
RUN_CONFIG = ROOT / "configs" / "digits_sam_vs_sgd.toml"
STUDY_CONFIG = ROOT / "configs" / "study_digits.toml"
HOST = socket.gethostname()

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Flaky(nn.Sequential):
    """A small digits MLP (same weights every time) whose forward can fail part-way through a
    command: with ``fail_after=k`` the ``k+1``-th call without autograd (a surface grid point)
    raises ``error`` (``"runtime"``: ``ValueError``, ``"interrupt"``: ``KeyboardInterrupt``, as
    Ctrl-C does); ``fail_after=-2`` fails on every call (a sharpness run)."""

    def __init__(self, fail_after: int = -1, error: str = "runtime"):
        torch.manual_seed(0)
        super().__init__(nn.Linear(64, 6), nn.Tanh(), nn.Linear(6, 10))
        self.fail_after, self.error, self.calls = fail_after, error, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fail_after == -2 or (self.fail_after >= 0 and not torch.is_grad_enabled()):
            self.calls += 1
            if self.fail_after == -2 or self.calls > self.fail_after:
                if self.error == "interrupt":
                    raise KeyboardInterrupt
                raise ValueError("boom: the model failed part-way")
        return super().forward(x)


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and " — " in lines[0], lines[0]
    assert "Traceback" not in err and "unexpected failure" not in err
    return lines[0]


def fails(main, argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(argv)
    return int(info.value.code), one_error_line(capsys.readouterr().err)


def snapshot(*paths: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in paths}


def leftovers(directory: Path) -> list[str]:
    """Temporary files of the atomic writer (``.NAME.xxxx.tmp``) left in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# ----------------------------------------------------------------- results replaced only when complete
FLAKY = "tests.test_path_errors:Flaky"


def _surface(out: Path | str, *extra: str) -> list[str]:
    """9 x 9 points: more than one chunk of 64 points, so an interrupted run has finished some."""
    return ["surface", "--model", FLAKY, "--grid", "9", "--limit", "40", "--strategy", "loop",
            "--dtype", "float64", "--quiet", "--out", str(out), *extra]  # fmt: skip


@pytest.mark.parametrize(("error", "status"), [("runtime", 1), ("interrupt", 130)])
def test_surface_out_survives_a_failing_second_run(tmp_path, capsys, error, status):
    out, plot, vtk = tmp_path / "keep.npz", tmp_path / "keep.png", tmp_path / "keep.vtk"
    exports = ["--plot", str(plot), "--vtk", str(vtk)]
    assert landscape_main(_surface(out, *exports)) == 0
    first = load_surface(out)
    assert first.complete and first.mask.all()
    before = snapshot(out, plot, vtk)

    failing = ["--model-arg", "fail_after=70", "--model-arg", f"error={error}"]
    code, line = fails(landscape_main, _surface(out, *exports, *failing), capsys)
    assert code == status
    assert snapshot(out, plot, vtk) == before  # the finished files, byte for byte
    assert leftovers(tmp_path) == [] and not Path(f"{out}.lock").exists()
    partial = partial_path(out)
    if error == "runtime":
        assert "boom: the model failed part-way" in line
    else:  # Ctrl-C: the points done are kept beside --out, which is named as unchanged
        assert line.startswith("error: interrupted (Ctrl-C); 64 of 81 grid points are saved in ")
        assert f"saved in {partial}; {out} is unchanged" in line and "--resume" in line
        kept = load_surface(partial)
        assert int(kept.mask.sum()) == 64 and not kept.complete
        np.testing.assert_array_equal(kept.loss[kept.mask], first.loss[kept.mask])
        assert landscape_main(_surface(out, "--resume")) == 0  # the other 17 points
        done = load_surface(out)
        assert done.complete and done.evaluations == 17 and not partial.exists()
        np.testing.assert_allclose(done.loss, first.loss, rtol=1e-12)


def test_a_fresh_run_ignores_a_leftover_partial_and_removes_it_when_done(tmp_path, capsys):
    out = tmp_path / "s.npz"
    failing = ["--model-arg", "fail_after=66", "--model-arg", "error=interrupt"]
    code, line = fails(landscape_main, _surface(out, *failing), capsys)
    assert code == 130 and "64 of 81 grid points" in line and "unchanged" not in line and not out.exists()
    assert partial_path(out).exists()
    assert landscape_main(_surface(out)) == 0  # no --resume: every point computed anew
    s = load_surface(out)
    assert s.complete and s.evaluations == 81 and not partial_path(out).exists()


def test_sharpness_out_and_csv_survive_a_failing_second_run(tmp_path, capsys):
    out, csv = tmp_path / "r.json", tmp_path / "r.csv"
    argv = ["sharpness", "--model", FLAKY, "--limit", "40", "--measures", "gradient_norm",
            "--out", str(out), "--csv", str(csv)]  # fmt: skip
    assert landscape_main(argv) == 0
    assert json.loads(out.read_text())["rows"][0]["measure"] == "gradient_norm"
    before = snapshot(out, csv)
    code, line = fails(landscape_main, [*argv, "--model-arg", "fail_after=-2"], capsys)
    assert code == 1 and "boom" in line
    assert snapshot(out, csv) == before and leftovers(tmp_path) == []


def test_atomic_writers_keep_the_old_file_when_the_writer_fails(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    png = tmp_path / "fig.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    atomic_savefig(png, fig, dpi=20)
    before = png.read_bytes()
    assert before.startswith(b"\x89PNG")

    def half_then_fail(path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half a figure")
        raise RuntimeError("renderer died")

    fig.savefig = half_then_fail
    with pytest.raises(RuntimeError, match="renderer died"):
        atomic_savefig(png, fig)
    plt.close(fig)
    assert png.read_bytes() == before and leftovers(tmp_path) == []
    pdf = tmp_path / "fig.pdf"  # the format is the name's
    fig2, _ = plt.subplots()
    atomic_savefig(pdf, fig2)
    plt.close(fig2)
    assert pdf.read_bytes().startswith(b"%PDF")


def test_atomic_write_names_the_users_path_never_the_temporary_one(tmp_path, monkeypatch):
    target = tmp_path / "table.md"
    (tmp_path / "adir").mkdir()
    with pytest.raises(PathError) as info:
        write_text(tmp_path / "adir", "| a |\n")  # experiments table --out DIR, in the library
    adir = tmp_path / "adir"
    assert str(info.value) == f"{adir} is a directory, not a file — give a file name, e.g. {adir / 'result'}"
    real_replace = os.replace

    def refused(src, dst):
        raise PermissionError(errno.EACCES, "Permission denied", os.fspath(src))

    monkeypatch.setattr(lio.os, "replace", refused)
    with pytest.raises(PermissionError) as err:
        atomic_write_text(target, "x")
    assert err.value.filename == str(target) and ".tmp" not in str(err.value)
    monkeypatch.setattr(lio.os, "replace", real_replace)
    assert leftovers(tmp_path) == [] and not target.exists()


# ------------------------------------------------------------------------------------ path arguments
@pytest.fixture
def runs(tmp_path) -> Path:
    """A directory with one finished run (what `table` reads)."""
    run = tmp_path / "runs" / "sgd" / "seed0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"method": "sgd", "seed": 0, "test_accuracy": 0.9}))
    return tmp_path / "runs"


def _dir_as_out_cases(tmp: Path, runs: Path) -> list[tuple[object, list[str], str]]:
    d = tmp / "adir"
    return [
        (experiments_cli.main, ["table", str(runs), "--out", str(d)], f"--out {d}"),
        (experiments_cli.main, ["table", str(runs), "--plot", str(d)], f"--plot {d}"),
        (landscape_main, _surface(d), f"--out {d}"),
        (landscape_main, _surface(tmp / "s.npz", "--html", str(d)), f"--html {d}"),
        (landscape_main, ["sharpness", "--model", "mlp", "--csv", str(d)], f"--csv {d}"),
        (study_cli.main, ["report", str(tmp), "--json", str(d)], f"--json {d}"),
    ]


def test_a_directory_as_an_output_file_names_the_users_path(tmp_path, runs, capsys):
    (tmp_path / "adir").mkdir()
    for main, argv, named in _dir_as_out_cases(tmp_path, runs):
        code, line = fails(main, argv, capsys)
        assert code == 2 and line.startswith(f"error: {named} is a directory, not a file — give a file name")
        assert ".tmp" not in line, line
        assert list((tmp_path / "adir").iterdir()) == []


@pytest.mark.parametrize(
    ("main", "argv", "option"),
    [
        (experiments_cli.main, ["run", str(RUN_CONFIG), "out_dir={f}"], "out_dir"),
        (sharpscape_main, ["run", str(RUN_CONFIG), "out_dir={f}", "seeds=[0]"], "out_dir"),
        (study_cli.main, ["run", str(STUDY_CONFIG), "--out", "{f}"], "--out"),
        (sharpscape_main, ["figures", "--out", "{f}"], "--out"),
    ],
    ids=["experiments-run", "sharpscape-run", "study-run", "figures"],
)
def test_a_file_as_an_output_directory(tmp_path, capsys, main, argv, option):
    f = tmp_path / "results.txt"
    f.write_bytes(b"a finished result\n")
    code, line = fails(main, [a.format(f=f) for a in argv], capsys)
    assert code == 2
    assert (
        line
        == f"error: {option} {f} is a file, not a directory — give a directory (it is created if missing)"
    )
    assert f.read_bytes() == b"a finished result\n" and sorted(p.name for p in tmp_path.iterdir()) == [f.name]
    # a file further up: named, not taken for a lock file
    code, line = fails(main, [a.format(f=f / "sub") for a in argv], capsys)
    assert (
        code == 2
        and line == f"error: {option} {f / 'sub'}: {f} is a file, not a directory — choose another path"
    )


def test_input_paths_of_every_kind(tmp_path, runs, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("not a directory\n")
    state = tmp_path / "w.pt"
    torch.save(Flaky().state_dict(), state)
    cases = [
        (experiments_cli.main, ["run", str(tmp_path / "none.toml")],
         f"config {tmp_path / 'none.toml'} does not exist — give the path of a TOML config"),
        (experiments_cli.main, ["run", str(tmp_path)], f"config {tmp_path} is a directory, not a file"),
        (experiments_cli.main, ["run", f"{RUN_CONFIG}/"],
         f"config {RUN_CONFIG}/ ends in a slash but {RUN_CONFIG} is a file — write {RUN_CONFIG} without"),
        (study_cli.main, ["run", str(tmp_path / "none.toml"), "--out", str(tmp_path / "o")],
         f"config {tmp_path / 'none.toml'} does not exist — give a study TOML file"),
        (experiments_cli.main, ["table", str(tmp_path / "gone")],
         f"RUN_DIR {tmp_path / 'gone'} does not exist — give run directories written by "
         "`python -m experiments run`"),
        (study_cli.main, ["report", str(f)], f"DIR {f} is a file, not a directory — give a directory"),
        (study_cli.main, ["report", str(tmp_path / "gone")], f"DIR {tmp_path / 'gone'} does not exist"),
        (landscape_main, ["sharpness", "--model", FLAKY, "--state-dict", f"{state}/"],
         f"--state-dict {state}/ ends in a slash but {state} is a file"),
        (landscape_main, _surface(f"{tmp_path / 's.npz'}/"),
         f"--out {tmp_path / 's.npz'}/ ends in a slash, which names a directory, but a file is expected — "
         f"give a file name without the trailing slash ({tmp_path / 's.npz'})"),
    ]  # fmt: skip
    for main, argv, start in cases:
        code, line = fails(main, argv, capsys)
        assert code == 2 and line.startswith(f"error: {start}"), (argv, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "runs", "w.pt"]  # nothing written


def test_an_output_under_missing_directories_is_written_there(tmp_path, runs, capsys):
    out = tmp_path / "new" / "deeper" / "table.csv"
    assert experiments_cli.main(["table", str(runs), "--format", "csv", "--out", str(out)]) == 0
    assert out.read_text().startswith("group,n,test_accuracy_mean,")
    capsys.readouterr()


def _unwritable(locked: Path, runs: Path, capsys) -> None:
    for main, argv, option, target in (
        (
            experiments_cli.main,
            ["table", str(runs), "--out", str(locked / "new" / "t.md")],
            "--out",
            "new/t.md",
        ),
        (experiments_cli.main, ["run", str(RUN_CONFIG), f"out_dir={locked / 'runs'}"], "out_dir", "runs"),
    ):
        code, line = fails(main, argv, capsys)
        assert code == 1
        assert (
            line
            == f"error: {option} {locked / target}: {locked} is not writable — choose a writable directory"
        )
    assert list(locked.iterdir()) == []


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_location_is_named_with_status_1(tmp_path, runs, capsys):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        _unwritable(locked, runs, capsys)
    finally:
        locked.chmod(0o755)


def test_an_unwritable_location_as_the_os_reports_it(tmp_path, runs, capsys, monkeypatch):
    """The same messages where permissions cannot be taken away (root): ``os.access`` says no."""
    locked = tmp_path / "ro"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(lio.os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    _unwritable(locked, runs, capsys)


# ------------------------------------------------------------------------ configs given to the wrong command
def test_the_config_key_sets_are_the_loaders():
    # extends is read by load_config before the defaults apply
    assert resources.RUN_KEYS == (set(RUN_DEFAULTS) - set(STUDY_DEFAULTS)) | {"extends"}
    assert resources.STUDY_KEYS == set(STUDY_DEFAULTS) - set(RUN_DEFAULTS)
    kinds = {name: resources.config_kind(path) for name, path, _, _ in resources.list_configs()}
    assert kinds["study_digits"] == "study" and kinds["digits_sam_vs_sgd"] == "run"
    assert None not in kinds.values(), kinds  # every shipped config is recognised


SWAPS = [
    # (main, argv, message start, the command of the fix)
    (experiments_cli.main, ["run", str(STUDY_CONFIG)], "is a study config",
     f"run it with `python -m experiments.study run {STUDY_CONFIG} --out DIR`"),
    (sharpscape_main, ["run", str(STUDY_CONFIG)], "is a study config",
     f"run it with `sharpscape study run {STUDY_CONFIG} --out DIR`"),
    (study_cli.main, ["run", str(RUN_CONFIG), "--out", "{out}"], "is a run config",
     f"run it with `python -m experiments run {RUN_CONFIG}`"),
    (sharpscape_main, ["study", "run", str(RUN_CONFIG), "--out", "{out}"], "is a run config",
     f"run it with `sharpscape run {RUN_CONFIG}`"),
    (sharpscape_main, ["table", str(RUN_CONFIG)], "is a run config",
     f"run it with `sharpscape run {RUN_CONFIG}`, then pass its out_dir here"),
    (sharpscape_main, ["study", "report", str(STUDY_CONFIG)], "is a study config",
     f"run it with `sharpscape study run {STUDY_CONFIG} --out DIR`, then pass DIR here"),
]  # fmt: skip


def _swap_id(value) -> str:
    """The same id in every process (a function's repr holds its address, which pytest-xdist refuses)."""
    return value.__module__ if callable(value) else str(value)[-30:]


@pytest.mark.parametrize(("main", "argv", "kind", "fix"), SWAPS, ids=_swap_id)
def test_a_config_given_to_the_other_command_names_the_right_one(tmp_path, capsys, main, argv, kind, fix):
    out = tmp_path / "out"
    code, line = fails(main, [a.format(out=out) for a in argv], capsys)
    path = STUDY_CONFIG if "study config" in kind else RUN_CONFIG
    assert line.startswith(f"error: {path} {kind} (it sets ") and line.endswith(f" — {fix}"), line
    assert code == 2 and not out.exists()


def test_the_command_a_swap_names_accepts_the_config(tmp_path, capsys):
    assert (
        sharpscape_main(["study", "run", str(STUDY_CONFIG), "--out", str(tmp_path / "s"), "--dry-run"]) == 0
    )
    assert sharpscape_main(["run", str(RUN_CONFIG), f"out_dir={tmp_path / 'r'}", "--dry-run"]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------------------------------- loopback
LOOPBACK = ["127.0.0.1", "127.1", "127.0.1", "127.255.255.254", "2130706433", "0x7f.1", "0x7f000001",
            "0177.0.0.1", "localhost", "LOCALHOST", "localhost.", "::1", "[::1]", "0:0:0:0:0:0:0:1",
            "0000:0000:0000:0000:0000:0000:0000:0001", "::ffff:127.0.0.1", "[::ffff:7f00:1]",
            " 127.0.0.1 "]  # fmt: skip
NOT_LOOPBACK = ["0.0.0.0", "::", "192.168.1.5", "10.1", "128.0.0.1", "0x80.1", "126.255.255.255",
                "::2", "::ffff:10.0.0.1", "example.com", "localhost.example.com", "127.0.0.1 evil",
                "127.0.0.256.1", "", "[::1"]  # fmt: skip


@pytest.mark.parametrize("address", LOOPBACK)
def test_every_loopback_spelling_is_this_machine_only(address):
    assert network.is_loopback(address)
    note = dashboard.listening_note(network.plain_address(address), 8501)
    assert "WARNING" not in note and "this machine only" in note


@pytest.mark.parametrize("address", NOT_LOOPBACK)
def test_other_addresses_are_still_warned_about(address):
    assert not network.is_loopback(address)
    assert f"WARNING: listening on {address}" in dashboard.listening_note(address, 8501)


@pytest.mark.parametrize("address", ["127.1", "2130706433", "0x7f.1", "0177.0.0.1", "10.1", "0x80.1"])
def test_ipv4_forms_are_read_as_the_socket_layer_reads_them(address):
    packed = socket.inet_aton(address)
    assert network.is_loopback(address) == (packed[0] == 127)


def test_the_dashboard_starts_on_127_1_without_a_warning_and_warns_on_0_0_0_0(capsys, monkeypatch):
    pytest.importorskip("streamlit")
    if os.name != "posix":
        pytest.skip("the dashboard replaces its process (os.execv) on POSIX only")

    class Started(Exception):
        """Raised where Streamlit would take over the process."""

    def execv(exe: str, cmd: list[str]) -> None:
        raise Started(cmd)

    monkeypatch.setattr(dashboard.os, "execv", execv)
    for address, warned in (("127.1", False), ("0.0.0.0", True)):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with pytest.raises(Started) as started:
            dashboard.main(["--address", address, "--port", str(port)])
        out, err = capsys.readouterr()
        assert not err and ("WARNING" in out) == warned, out
        cmd = started.value.args[0]
        assert cmd[cmd.index("--server.address") + 1] == address
    code = subprocess.run(
        [sys.executable, "-m", "sharpscape", "dashboard", "--dry-run", "--address", "[::1]"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
    )  # fmt: skip
    assert code.returncode == 0 and "--server.address ::1 " in code.stdout, code.stderr


# ------------------------------------------------------------------------------------------ lock files
FOREIGN = {
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
    "huge-pid": json.dumps({"pid": 10**20, "host": HOST}).encode(),
    "negative-pid": json.dumps({"pid": -1, "host": HOST}).encode(),
    "pid-0": json.dumps({"pid": 0, "host": HOST}).encode(),
    "bool-pid": json.dumps({"pid": True, "host": HOST}).encode(),
    "text-pid": json.dumps({"pid": "4242", "host": HOST}).encode(),
    "text": b"locked by rsync\n",
    "json-list": b"[1, 2, 3]",
}


@pytest.mark.parametrize("content", list(FOREIGN.values()), ids=list(FOREIGN))
def test_a_run_lock_no_runner_wrote_is_named_as_such(tmp_path, content):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / LOCK_NAME
    lock.write_bytes(content)
    with pytest.raises(RunLocked) as info:
        acquire(run_dir)
    what, fix = info.value.what, info.value.fix
    assert what.startswith(f"lock file {lock} is not a lock written by sharpscape (content ")
    assert fix == f"remove it if no run is using the run directory {run_dir}, then run again"
    assert lock.read_bytes() == content and sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]


def test_a_lock_that_is_a_directory_and_a_run_dir_that_is_a_file(tmp_path):
    (tmp_path / "run" / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(RunLocked, match=r"is not a lock written by sharpscape \(content '<a directory>'\)"):
        acquire(tmp_path / "run")
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        PathError, match=r"^run directory .*file is a file, not a directory — give a directory"
    ):
        acquire(tmp_path / "file")


TINY = """
name = "tiny"
seeds = [0]
device = "cpu"
threads = 1
progress = false
[data]
name = "digits"
limit_train = 64
limit_test = 32
[model]
name = "mlp"
kwargs = { sizes = [64, 8, 10] }
[train]
epochs = 1
batch_size = 64
[[methods]]
name = "sgd"
optimizer = "sgd"
[evaluation]
sharpness = []
metrics = ["accuracy"]
"""


@pytest.mark.parametrize("kind", ["binary", "huge-pid"])
def test_experiments_run_on_a_foreign_lock_is_one_line(tmp_path, capsys, kind):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    run_dir = tmp_path / "out" / "tiny" / "sgd" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / LOCK_NAME).write_bytes(FOREIGN[kind])
    code, line = fails(experiments_cli.main, ["run", str(cfg), f"out_dir={tmp_path / 'out'}"], capsys)
    assert code == 1
    assert f"lock file {run_dir / LOCK_NAME} is not a lock written by sharpscape (content " in line
    assert line.endswith(f"remove it if no run is using the run directory {run_dir}, then run again")
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]


@pytest.mark.parametrize(
    "content", [FOREIGN["binary"], b"99999999999999999999 " + HOST.encode(), b"-5 " + HOST.encode()]
)
def test_a_foreign_output_lock_is_named_and_force_takes_it_over(tmp_path, capsys, content):
    out = tmp_path / "s.npz"
    lock = Path(f"{out}.lock")
    lock.write_bytes(content)
    code, line = fails(landscape_main, _surface(out), capsys)
    assert code == 1 and line.startswith(
        f"error: lock file {lock} is not a lock written by sharpscape (content "
    )
    assert line.endswith(f"remove it if no run is using {out}, then run again")
    assert lock.read_bytes() == content and not out.exists()
    assert landscape_main(_surface(out, "--force")) == 0
    assert load_surface(out).complete and not lock.exists()
    capsys.readouterr()


# ------------------------------------------------------- fresh cases (probe 2): outputs that replace inputs
def _state_file(tmp_path: Path) -> Path:
    state = tmp_path / "w.pt"
    torch.save(Flaky().state_dict(), state)
    return state


def test_an_output_never_replaces_an_input_or_another_output(tmp_path, runs, capsys):
    """Each case used to finish with exit 0 after replacing a file: the weights by the results,
    a run's metrics.json by the table, the surface by its HTML export, the JSON by the CSV."""
    state = _state_file(tmp_path)
    run = runs / "sgd" / "seed0"
    (run / "config.toml").write_text('name = "x"\n')
    study = tmp_path / "study"
    (study / "models").mkdir(parents=True)
    (study / "study_config.json").write_text("{}\n")
    sharp = ["sharpness", "--model", FLAKY, "--limit", "40", "--measures", "gradient_norm"]
    s_npz, r_json, png = tmp_path / "s.npz", tmp_path / "r.json", tmp_path / "t.png"
    cases = [
        (landscape_main, [*sharp, "--state-dict", str(state), "--out", str(state)],
         f"--out {state} is the --state-dict {state}, which this command reads"),
        (landscape_main, _surface(state, "--state-dict", str(state)),
         f"--out {state} is the --state-dict {state}, which this command reads"),
        (landscape_main, _surface(s_npz, "--html", str(s_npz)),
         f"--out and --html name the same file {s_npz} — give each output its own file"),
        (landscape_main, [*sharp, "--out", str(r_json), "--csv", str(r_json)],
         f"--out and --csv name the same file {r_json}"),
        (experiments_cli.main, ["table", str(runs), "--out", str(run / "metrics.json")],
         f"--out {run / 'metrics.json'} lies inside the run directory {run}, which this command reads"),
        (sharpscape_main, ["table", str(runs), "--out", str(run / "config.toml")],
         f"--out {run / 'config.toml'} lies inside the run directory {run}"),
        (experiments_cli.main, ["table", str(runs), "--out", str(png), "--plot", str(png)],
         "--out and --plot name the same file"),
        (study_cli.main, ["report", str(study), "--json", str(study / "study_config.json")],
         f"--json {study / 'study_config.json'} is the study config {study / 'study_config.json'}"),
        (study_cli.main, ["report", str(study), "--csv", str(study / "models" / "m1.json")],
         f"--csv {study / 'models' / 'm1.json'} lies inside the models directory {study / 'models'}"),
    ]  # fmt: skip
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    before = snapshot(*files)
    for main, argv, start in cases:
        code, line = fails(main, argv, capsys)
        assert code == 2 and line.startswith(f"error: {start}"), (argv, line)
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files
    assert snapshot(*files) == before  # every file byte for byte, nothing new
    assert landscape_main([*sharp, "--state-dict", str(state), "--out", str(r_json)]) == 0  # distinct: fine
    capsys.readouterr()


def test_a_figure_is_written_in_the_format_its_name_says(tmp_path, runs, capsys):
    """`table --plot fig.pdf` used to write a PNG into fig.pdf; a name matplotlib cannot write is refused."""
    assert experiments_cli.main(["table", str(runs), "--plot", str(tmp_path / "fig.pdf")]) == 0
    assert (tmp_path / "fig.pdf").read_bytes().startswith(b"%PDF")
    assert experiments_cli.main(["table", str(runs), "--plot", str(tmp_path / "fig.svg")]) == 0
    assert b"<svg" in (tmp_path / "fig.svg").read_bytes()[:400]
    for main, argv, option in (
        (experiments_cli.main, ["table", str(runs), "--plot", str(tmp_path / "fig.txt")], "--plot"),
        (study_cli.main, ["report", str(tmp_path), "--figure", str(tmp_path / "fig")], "--figure"),
    ):
        code, line = fails(main, argv, capsys)
        assert code == 2 and f"{option} {tmp_path / 'fig'}" in line and "matplotlib cannot write" in line
        assert line.endswith(".svg, .svgz, .tif, .tiff, .webp") and ".png" in line
    assert not (tmp_path / "fig.txt").exists() and not (tmp_path / "fig").exists()


def test_empty_and_dash_paths_are_refused(tmp_path, runs, capsys, monkeypatch):
    """'' was the current directory (figures written into it, runs under it) and ' ' / '-' file names."""
    monkeypatch.chdir(tmp_path)
    empty, dash = "is empty — give a path", "'-' (standard input / output) is not supported here"
    cases = [
        (sharpscape_main, ["figures", "--out", ""], f"error: --out {empty}"),
        (study_cli.main, ["run", str(STUDY_CONFIG), "--out", "", "--dry-run"], f"error: --out {empty}"),
        (landscape_main, _surface(""), f"error: --out {empty}"),
        (landscape_main, ["sharpness", "--model", FLAKY, "--csv", " "], "error: --csv is empty (' ') — give"),
        (experiments_cli.main, ["table", ""], f"error: RUN_DIR {empty}"),
        (experiments_cli.main, ["table", str(runs), "--out", "-"],
         f"error: --out -: {dash} — give a file name, or leave out the option"),
        (experiments_cli.main, ["run", "-"], f"error: config -: {dash} — give a file name"),
        (experiments_cli.main, ["run", str(RUN_CONFIG), "out_dir=", "--dry-run"],
         'error: config key out_dir is empty; give the directory the runs go to (default "runs")'),
    ]  # fmt: skip
    for main, argv, start in cases:
        code, line = fails(main, argv, capsys)
        assert code == 2 and line.startswith(start), (argv, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # nothing written here


def test_a_tilde_in_out_dir_is_the_home_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert experiments_cli.main(["run", str(RUN_CONFIG), "out_dir=~/runs", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# run: {tmp_path / 'home' / 'runs' / 'digits_sam_vs_sgd'}" in out and "# run: ~" not in out


def test_unreadable_run_files_and_results_given_as_configs_name_the_file(tmp_path, runs, capsys):
    run = runs / "sgd" / "seed0"
    (run / "config.toml").write_bytes(b"\x00\xff not toml")
    code, line = fails(experiments_cli.main, ["table", str(runs)], capsys)
    assert code == 2 and line.startswith(f"error: {run / 'config.toml'}: not a readable config of a run")
    assert line.endswith(
        "— run that run again (delete its directory first), or leave it out of the run directories given"
    )
    (run / "config.toml").unlink()
    (run / "metrics.json").write_text('{"method": "sgd", "se')
    code, line = fails(experiments_cli.main, ["table", str(runs)], capsys)
    assert (
        code == 2
        and "metrics.json: not a valid metrics file of a run" in line
        and "run that run again" in line
    )
    code, line = fails(
        experiments_cli.main, ["table", str(tmp_path / "runs" / "sgd" / "seed0" / "x")], capsys
    )
    assert code == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    code, line = fails(sharpscape_main, ["table", str(empty)], capsys)
    assert code == 2 and line == (
        f"error: no runs (metrics.json files) under {empty} — give the out_dir of `run` (or run directories "
        "under it); a run writes its metrics.json when it finishes"
    )
    code, line = fails(sharpscape_main, ["run", str(run / "metrics.json")], capsys)
    assert code == 2 and line == (
        f"error: {run / 'metrics.json'} is the result file of a run, not a run config — give a TOML config; "
        f"the `table` command tabulates the runs in {run}"
    )
    code, line = fails(
        landscape_main, ["sharpness", "--model", FLAKY, "--state-dict", str(RUN_CONFIG)], capsys
    )
    assert code == 1 and line.startswith(
        f"error: --state-dict {RUN_CONFIG} is not a PyTorch file (it starts with b'"
    )
    assert "Weights only load failed" not in line and "weights_only" not in line


def test_a_bad_set_value_names_the_set(capsys):
    sharp = ["sharpness", "--model", FLAKY, "--limit", "40", "--measures", "worst_case"]
    for value, what in (("abc", "rho must be a real number"), ("-1", "rho must be a finite number > 0")):
        code, line = fails(landscape_main, [*sharp, "--set", f"worst_case.rho={value}"], capsys)
        shown = '"abc"' if value == "abc" else value
        assert code == 2 and line.startswith(f"error: --set worst_case.rho={shown}: {what}"), line
        assert line.endswith("— give worst_case.rho a value it accepts")
    code, line = fails(landscape_main, [*sharp, "--set", "worst_case.nope=1"], capsys)
    assert code == 2 and line.startswith(
        "error: --set: worst_case: unknown option(s) ['nope']; accepted: ['rho',"
    )


@pytest.mark.parametrize("address", ["", " ", "[]"])
def test_an_empty_dashboard_address_is_refused(capsys, address):
    with pytest.raises(SystemExit) as info:
        dashboard.main(["--address", address, "--dry-run"])
    line = one_error_line(capsys.readouterr().err)
    assert info.value.code == 2 and line.startswith(
        f"error: argument --address: got {address!r} — give an address"
    )
