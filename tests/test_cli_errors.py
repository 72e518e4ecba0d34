"""The command lines at their edges: every bad input ends in ONE ``error: <what> — <fix>`` line on
stderr with status 2 (usage) or 1 (runtime), no traceback unless ``--debug``; the same ``--model`` /
``--model-arg`` / ``--state-dict`` forms in ``sharpness`` and ``surface`` (MLP sizes inferred from the
file); SIGTERM and Ctrl-C keep a resumable partial surface in OUT.partial; a second writer of one output is
refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from landscape import directions as D
from landscape.cli import main as landscape_main
from landscape.cli_common import CliError, output_lock
from landscape.data import load_digits
from landscape.models import model_factory
from landscape.surface import load_surface, surface
from landscape.surface.cli import partial_path
from toy_problems.__main__ import main as toy_main

ROOT = Path(__file__).resolve().parents[1]
CE = nn.CrossEntropyLoss()


def small_net(hidden: int = 4) -> nn.Module:
    """A module:function factory with a keyword argument (for --model-arg)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    tour = model_factory("mlp", sizes=[64, 32, 10], seed=0)  # the README tour's model
    paths = {name: d / f"{name}.pt" for name in ("mlp", "full", "junk", "list", "lenet", "wrapped", "net6")}
    torch.save(tour.state_dict(), paths["mlp"])
    torch.save(tour, paths["full"])  # a whole pickled module: refused
    paths["junk"].write_bytes(b"this is not a checkpoint")
    torch.save([1, 2, 3], paths["list"])
    torch.save(model_factory("lenet5-digits", seed=1).state_dict(), paths["lenet"])
    torch.save({"state_dict": tour.state_dict(), "epoch": torch.tensor(3)}, paths["wrapped"])
    net6 = small_net(6)
    with torch.no_grad():
        for p in net6.parameters():
            p.mul_(1.5)  # differs from the factory's weights: the file must be loaded
    torch.save(net6.state_dict(), paths["net6"])
    paths["dir"] = d
    return paths


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and " — " in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def fails(main, argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code, one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------- bad inputs
def _surface(files, *extra):
    return ["surface", "--model", "mlp", "--state-dict", str(files["mlp"]), "--grid", "3",
            "--limit", "50", "--quiet", "--out", str(files["dir"] / "s.npz"), *extra]  # fmt: skip


def _sharp(files, *extra):
    return ["sharpness", "--model", "mlp", "--state-dict", str(files["mlp"]), "--limit", "50",
            "--measures", "gradient_norm", *extra]  # fmt: skip


SURFACE_CASES = [
    # (extra arguments, status, message fragments)
    (["--grid", "3", "4", "5"], 2, ["--grid", "one or two values, got 3"]),
    (["--grid", "0"], 2, ["--grid", "got '0'", ">= 1"]),
    (["--grid", "-3"], 2, ["--grid", "got '-3'"]),
    (["--limit", "-5"], 2, ["--limit", "got '-5'"]),
    (["--limit", "0"], 2, ["--limit", "got '0'"]),
    (["--batch-size", "0"], 2, ["--batch-size", ">= 1"]),
    (["--range", "nan", "1"], 2, ["--range", "finite"]),
    (["--yrange", "0", "inf"], 2, ["--yrange", "finite"]),
    (["--range", "1", "-1"], 2, ["--range 1 -1", "LO < HI"]),
    (["--dims", "1", "--grid", "3", "4"], 2, ["--dims is 1", "--grid N"]),
    (["--seed", "-1"], 2, ["--seed", ">= 0"]),
    (["--model", "mlpp"], 2, ["unknown model 'mlpp'", "did you mean 'mlp'"]),
    (["--model", "no_such_pkg_xyz:f"], 1, ["cannot import module 'no_such_pkg_xyz'", "PYTHONPATH"]),
    (["--model", "os:getcwd"], 1, ["returned a str, not an nn.Module"]),
    (["--model-arg", "sizes"], 2, ["not KEY=VALUE", "--model-arg sizes=64,32,10"]),
    (["--model-arg", "{bad"], 2, ["not valid JSON"]),
    (["--model-arg", "sizes=64,32,10", "--model-arg", "sizes=64,8,10"], 2, ["'sizes' is given twice"]),
    (["--model-arg", "width=3"], 2, ["does not take the model arguments", "width"]),
    (
        ["--data", "mnist:/no/such/dir"],
        2,
        ["data directory /no/such/dir does not exist", "nothing is downloaded"],
    ),
    (["--data", "places365"], 2, ["unknown data spec 'places365'"]),
    (["--data", "digits:test", "--split", "train"], 2, ["disagree", "give the split once"]),
    (["--data", "digits:validation"], 2, ["unknown split 'validation'"]),
    (["--device", "bogus"], 2, ["--device 'bogus' is not a device name"]),
    (["--plot", "figure.xyz"], 2, ["matplotlib cannot write .xyz", ".png"]),
    (["--strategy", "fastest"], 2, ["--strategy", "invalid choice"]),
]


@pytest.mark.parametrize(("extra", "status", "fragments"), SURFACE_CASES, ids=lambda v: str(v)[:40])
def test_surface_bad_input_is_one_line(files, capsys, extra, status, fragments):
    code, line = fails(landscape_main, _surface(files, *extra), capsys)
    assert code == status, line
    for frag in fragments:
        assert frag in line, line
    assert not (files["dir"] / "s.npz.lock").exists()  # no lock left behind


def test_checkpoint_errors_name_the_file_and_the_fix(files, capsys):
    base = ["surface", "--grid", "3", "--out", str(files["dir"] / "c.npz")]
    code, line = fails(
        landscape_main, [*base, "--model", "mlp", "--state-dict", str(files["dir"] / "nope.pt")], capsys
    )
    # a path that cannot be what the option wants is a bad command line (status 2)
    assert code == 2 and "nope.pt does not exist" in line and "torch.save(model.state_dict(), PATH)" in line
    code, line = fails(landscape_main, [*base, "--model", "mlp", "--state-dict", str(files["junk"])], capsys)
    assert code == 1 and "corrupt or not a PyTorch file" in line
    code, line = fails(landscape_main, [*base, "--model", "mlp", "--state-dict", str(files["full"])], capsys)
    assert code == 1 and "pickled Python objects" in line and "arbitrary code" in line
    code, line = fails(landscape_main, [*base, "--model", "mlp", "--state-dict", str(files["list"])], capsys)
    assert code == 1 and "holds a list, not a state dict" in line
    code, line = fails(landscape_main, [*base, "--model", "mlp", "--state-dict", str(files["dir"])], capsys)
    assert code == 2 and "is a directory, not a file" in line


def test_state_dict_that_does_not_fit_names_keys_and_the_right_model(files, capsys):
    base = ["surface", "--grid", "3", "--out", str(files["dir"] / "c.npz"), "--state-dict"]
    # an MLP of other sizes: the differing shapes, and the sizes to pass
    code, line = fails(
        landscape_main, [*base, str(files["mlp"]), "--model", "mlp", "--model-arg", "sizes=64,16,10"], capsys
    )
    assert code == 1
    assert "does not fit --model mlp --model-arg sizes=64,16,10" in line
    assert "1.weight (32, 64) vs (16, 64)" in line and "3.weight (10, 32) vs (10, 16)" in line
    assert line.endswith("pass --model mlp --model-arg sizes=64,32,10")
    # another architecture: missing and unexpected keys
    code, line = fails(landscape_main, [*base, str(files["mlp"]), "--model", "lenet5"], capsys)
    assert (
        code == 1
        and "missing from the file: features.0.weight" in line
        and "not in the model: 1.weight" in line
    )
    assert "--model mlp --model-arg sizes=64,32,10" in line
    # a LeNet state dict given to --model mlp: no MLP to infer; the registered model that fits
    code, line = fails(landscape_main, [*base, str(files["lenet"]), "--model", "mlp"], capsys)
    assert code == 1 and "the file fits --model lenet5-digits" in line


def test_sharpness_bad_inputs(files, capsys):
    cases = [
        (["--measures", "flatness"], 2, "unknown measure(s) ['flatness']"),
        (["--set", "rho=0.1"], 2, "--set expects MEASURE.OPTION=VALUE"),
        (["--set", "worst_case.rho=0.1"], 2, "not in --measures"),
        (["--limit", "0"], 2, "--limit"),
        (["--batch-size", "-4"], 2, "--batch-size"),
        (["--out", str(files["dir"])], 2, "is a directory"),
        (["--model", "tiny_model"], 2, "unknown model 'tiny_model'"),
    ]
    for extra, status, frag in cases:
        code, line = fails(landscape_main, _sharp(files, *extra), capsys)
        assert code == status and frag in line, (extra, line)


def test_toy_figures_bad_inputs(files, capsys):
    out = str(files["dir"] / "figs")
    for argv, frag in (
        (["figures", "--out", out, "--resolution", "5"], "got '5'"),
        (["figures", "--out", out, "--resolution", "many"], "got 'many'"),
        (["figures", "--out", out, "--only", "nope"], "invalid choice: 'nope'"),
        (["figures", "--out", str(files["mlp"])], "is a file"),
        (["figures"], "required: --out"),
        ([], "required: COMMAND"),
    ):
        code, line = fails(toy_main, argv, capsys)
        assert code == 2 and frag in line, (argv, line)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_unavailable_device(files, capsys):
    code, line = fails(landscape_main, _surface(files, "--device", "cuda"), capsys)
    assert code == 2 and "CUDA is not available" in line and "--device cpu" in line


def test_debug_prints_the_traceback_then_the_line(files, capsys):
    with pytest.raises(SystemExit) as info:
        landscape_main(_surface(files, "--state-dict", str(files["junk"]), "--debug"))
    err = capsys.readouterr().err
    assert info.value.code == 1 and "Traceback" in err
    assert [ln for ln in err.splitlines() if ln.strip()][-1].startswith("error: --state-dict")


# ------------------------------------------------------------------- the same model forms, right numbers
def test_readme_command_infers_the_tour_mlp_and_matches_a_direct_evaluation(files, capsys):
    out = files["dir"] / "tour.npz"
    html = files["dir"] / "tour.html"
    argv = ["surface", "--model", "mlp", "--state-dict", str(files["mlp"]), "--data", "digits",
            "--grid", "3", "--limit", "200", "--dtype", "float64", "--quiet", "--out", str(out),
            "--html", str(html)]  # fmt: skip
    assert landscape_main(argv) == 0
    printed = capsys.readouterr().out
    assert "note: inferred --model-arg sizes=64,32,10" in printed
    s = load_surface(out)
    assert s.config["model_args"]["sizes"] == [64, 32, 10]
    x, y = load_digits("all")
    x, y = x[:200].double(), y[:200]
    model = model_factory("mlp", sizes=[64, 32, 10], seed=0).double()
    with torch.no_grad():
        assert s.loss[1, 1] == pytest.approx(CE(model(x), y).item(), rel=1e-12)  # centre = the model
        # a corner: theta - d1 + d2, the directions drawn as the command line draws them
        d1, d2 = (D.random(model, "filter", seed=k) for k in (0, 1))
        params = {n: p - d1[n] + d2[n] for n, p in model.named_parameters()}
        corner = CE(torch.func.functional_call(model, params, (x,)), y).item()
    assert s.loss[0, 2] == pytest.approx(corner, rel=1e-10)
    page = html.read_text()
    assert "<script src=" not in page and len(page) > 1_000_000  # plotly.js embedded: works offline


def test_both_commands_take_module_function_with_model_args(files, capsys):
    x, y = load_digits("test")
    x, y = x[:120].double(), y[:120]
    net = small_net(6).double()
    net.load_state_dict({k: v.double() for k, v in torch.load(files["net6"], weights_only=True).items()})
    with torch.enable_grad():
        loss = CE(net(x), y)
        grads = torch.autograd.grad(loss, list(net.parameters()))
    gnorm = torch.sqrt(sum((g**2).sum() for g in grads)).item()

    spec = ["--model", "tests.test_cli_errors:small_net", "--state-dict", str(files["net6"])]
    out = files["dir"] / "r.json"
    argv = ["sharpness", *spec, "--model-arg", "hidden=6", "--data", "digits:test", "--limit", "120",
            "--measures", "gradient_norm", "--out", str(out)]  # fmt: skip
    assert landscape_main(argv) == 0
    import json

    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["value"] == pytest.approx(gnorm, rel=1e-10)

    sout = files["dir"] / "n.npz"
    argv = ["surface", *spec, "--model-arg", '{"hidden": 6}', "--data", "digits:test", "--limit", "120",
            "--grid", "3", "--dims", "1", "--dtype", "float64", "--quiet", "--out", str(sout)]  # fmt: skip
    assert landscape_main(argv) == 0
    with torch.no_grad():
        assert load_surface(sout).loss[1] == pytest.approx(CE(net(x), y).item(), rel=1e-12)
    capsys.readouterr()


def test_sharpness_reads_a_wrapped_checkpoint_with_a_registered_name(files, capsys):
    argv = ["sharpness", "--model", "mlp", "--state-dict", str(files["wrapped"]), "--data", "digits:test",
            "--limit", "100", "--measures", "gradient_norm"]  # fmt: skip
    assert landscape_main(argv) == 0
    printed = capsys.readouterr().out
    assert "using the 'state_dict' entry" in printed and "sizes=64,32,10" in printed
    x, y = load_digits("test")
    model = model_factory("mlp", sizes=[64, 32, 10], seed=0).double()
    loss = CE(model(x[:100].double()), y[:100])
    gnorm = torch.sqrt(sum((g**2).sum() for g in torch.autograd.grad(loss, list(model.parameters())))).item()
    row = next(ln for ln in printed.splitlines() if ln.startswith("gradient_norm"))
    assert float(row.split()[1]) == pytest.approx(gnorm, rel=1e-5)  # the table prints 6 digits


# ------------------------------------------------------------------------------------- lock files
def test_lock_refuses_a_live_writer_takes_over_a_dead_one_and_force(files, capsys):
    out = files["dir"] / "locked.npz"
    lock = Path(f"{out}.lock")
    argv = ["surface", "--model", "mlp", "--state-dict", str(files["mlp"]), "--grid", "3", "--dims", "1",
            "--limit", "40", "--quiet", "--out", str(out)]  # fmt: skip
    import socket

    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")  # a live process holds it
    code, line = fails(landscape_main, argv, capsys)
    assert code == 1 and f"PID {os.getpid()}" in line and "--force" in line and not out.exists()
    assert landscape_main([*argv, "--force"]) == 0 and out.exists() and not lock.exists()

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(f"{dead.pid} {socket.gethostname()}\n")  # stale: its process is gone
    assert landscape_main(argv) == 0 and not lock.exists()
    capsys.readouterr()

    with output_lock(out):  # two holders in one process: the second is refused
        with pytest.raises(CliError, match="being written by another run"):
            with output_lock(out):
                pass
    assert not lock.exists()


# ---------------------------------------------------------------------------------- subprocesses
def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize(
    ("argv", "status", "fragment"),
    [
        (
            ["-m", "landscape", "surface", "--model", "mlp", "--grid", "3", "4", "5", "--out", "s.npz"],
            2,
            "--grid",
        ),
        (["-m", "landscape", "sharpness", "--model", "mlp", "--state-dict", "missing.pt"], 2, "missing.pt"),
        (["-m", "toy_problems", "figures", "--out", "figs", "--resolution", "-1"], 2, "--resolution"),
    ],
)
def test_subprocess_one_line_and_status(tmp_path, argv, status, fragment):
    proc = subprocess.run(
        [sys.executable, *argv], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == status, proc.stderr
    assert fragment in one_error_line(proc.stderr)


def _start_surface(tmp_path: Path, state: Path, out: Path, *, sigint: bool = False):
    argv = ["surface", "--model", "mlp", "--state-dict", str(state), "--grid", str(GRID), "--limit", "300",
            "--strategy", "loop", "--dtype", "float64", "--out", str(out)]  # fmt: skip
    # a shell-started background job may ignore SIGINT; restore Python's handler for the Ctrl-C test
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"from landscape.cli import main; sys.argv[1:] = {argv!r}; raise SystemExit(main())"
    )
    cmd = [sys.executable, "-c", code] if sigint else [sys.executable, "-m", "landscape", *argv]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: proc.stderr.read1(256), b"")), daemon=True
    )
    reader.start()
    deadline = time.monotonic() + 120
    while not _points_done(chunks):  # the progress bar shows part of the grid evaluated
        assert proc.poll() is None and time.monotonic() < deadline, b"".join(chunks).decode()
        time.sleep(0.05)
    return proc, reader, chunks


GRID = 120  # 14,400 points: several seconds of work, so the signal lands part-way on a fast machine


def _points_done(chunks: list[bytes]) -> int:
    counts = re.findall(rb"surface \(loop\):.*?\| *(\d+)/\d+", b"".join(chunks))
    return int(counts[-1]) if counts else 0


def _last_line(chunks: list[bytes]) -> str:
    text = b"".join(chunks).decode().replace("\r", "\n")
    assert "Traceback" not in text
    return [ln for ln in text.splitlines() if ln.strip()][-1]


@pytest.mark.slow  # a real surface subprocess, signalled part-way
def test_sigterm_saves_a_partial_surface_that_resume_completes(files, tmp_path, capsys):
    out = tmp_path / "big.npz"
    proc, reader, chunks = _start_surface(tmp_path, files["mlp"], out)
    # while it runs, a second writer of the same file is refused
    code, line = fails(
        landscape_main, ["surface", "--model", "mlp", "--grid", "3", "--out", str(out)], capsys
    )
    assert code == 1 and "being written by another run" in line and f"PID {proc.pid}" in line
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    reader.join(timeout=10)
    last = _last_line(chunks)
    assert last.startswith("error: terminated by SIGTERM;") and "--resume" in last
    assert not out.exists()  # --out only ever holds a complete surface
    part = load_surface(partial_path(out))
    assert f"saved in {partial_path(out)}" in last
    done = int(part.mask.sum())
    assert 0 < done < GRID**2 and f"{done} of {GRID**2} grid points" in last
    assert np.isnan(part.loss[~part.mask]).all() and np.isfinite(part.loss[part.mask]).all()
    assert not Path(f"{out}.lock").exists()

    argv = ["surface", "--model", "mlp", "--state-dict", str(files["mlp"]), "--grid", str(GRID),
            "--limit", "300", "--strategy", "linear_first_layer", "--dtype", "float64", "--quiet",
            "--out", str(out), "--resume"]  # fmt: skip
    assert landscape_main(argv) == 0
    capsys.readouterr()
    full = load_surface(out)
    assert full.complete and full.mask.all() and not partial_path(out).exists()
    np.testing.assert_array_equal(full.loss[part.mask], part.loss[part.mask])  # kept, not recomputed
    # reference: the library on the same model, data and directions
    from landscape.data import batches
    from landscape.objective import Objective

    x, y = load_digits("all")
    model = model_factory("mlp", sizes=[64, 32, 10], seed=0).double()
    obj = Objective(model, CE, batches(x[:300].double(), y[:300], 2048))
    dirs = [D.random(obj, "filter", seed=0), D.random(obj, "filter", seed=1)]
    sub = np.linspace(-1, 1, GRID)[::13]  # every 13th grid point: rows done before SIGTERM and after
    assert part.mask[::13, ::13].any() and not part.mask[::13, ::13].all()
    ref = surface(obj, dirs, [sub, sub], strategy="linear_first_layer")
    np.testing.assert_allclose(full.loss[::13, ::13], ref.loss, rtol=1e-10)


def test_ctrl_c_exits_130_with_one_line_and_a_partial_file(files, tmp_path):
    out = tmp_path / "int.npz"
    proc, reader, chunks = _start_surface(tmp_path, files["mlp"], out, sigint=True)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    reader.join(timeout=10)
    last = _last_line(chunks)
    assert last.startswith("error: interrupted (Ctrl-C);") and "--resume" in last
    assert not out.exists() and 0 < load_surface(partial_path(out)).mask.sum() < GRID**2
