"""The experiment runner end to end on digits with a tiny MLP: a config trains and evaluates (weights
equal a hand-written SGD loop, metrics equal a recomputation), a crashed run resumes bit-identically,
``table`` gives mean ± sample std (ddof=1) by hand, overrides parse types, and bad configs end in one
``error:`` line with exit status 2 / 1."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from torch import nn

import experiments.train as train_mod
from experiments.budget import apply_budget
from experiments.cli import main
from experiments.config import ConfigError, load_config, parse_override, resolve_config
from experiments.schedules import lr_factor
from experiments.toml_writer import dumps
from landscape.data import load_digits
from landscape.models import model_factory

ROOT = Path(__file__).resolve().parents[1]

BASE = """
name = "tiny"
seeds = [0, 1]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
[model]
name = "mlp"
kwargs = {{ sizes = [64, 12, 10], activation = "tanh" }}
[train]
epochs = {epochs}
batch_size = 256
lr = 0.2
schedule = "{schedule}"
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = {{ rho = 0.05, momentum = 0.9 }}
[evaluation]
sharpness = ["lambda_max"]
sharpness_subset = 64
every = 1
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def write_config(tmp: Path, epochs: int = 2, schedule: str = "constant", extra: str = "") -> Path:
    path = tmp / "tiny.toml"
    path.write_text(BASE.format(epochs=epochs, schedule=schedule) + extra)
    return path


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """sgd and sam, seeds 0 and 1, two epochs, float64: run once for several tests."""
    tmp = tmp_path_factory.mktemp("grid")
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["run", str(write_config(tmp)), f"out_dir={tmp / 'runs'}"]) == 0
    finally:
        torch.set_num_threads(old)
    return tmp / "runs" / "tiny"


def test_run_writes_every_file_and_sgd_weights_equal_a_hand_written_loop(grid):
    run = grid / "sgd" / "seed0"
    for name in (
        "config.toml",
        "environment.json",
        "metrics.json",
        "results.json",
        "log.jsonl",
        "log.csv",
        "checkpoint.pt",
    ):
        assert (run / name).is_file(), name
    env = json.loads((run / "environment.json").read_text())
    assert env["seed"] == 0 and env["device"] == "cpu" and env["torch"] == torch.__version__
    assert {"python", "numpy", "hostname", "git_commit"} <= set(env)
    # the same SGD by hand: model_factory(seed), randperm from a generator seeded with the seed
    x, y = load_digits("train", dtype=torch.float64)
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh", seed=0).double()
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), 256):
            idx = perm[i : i + 256]
            model.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.2 * p.grad
    saved = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    for k, v in model.state_dict().items():
        assert torch.allclose(saved[k], v, rtol=0, atol=1e-13), k
    # metrics.json equals a recomputation from the weights (numpy, independent of landscape.metrics)
    xt, yt = load_digits("test", dtype=torch.float64)
    with torch.no_grad():
        logits = model(xt).numpy()
    logp = logits - logits.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(float((logits.argmax(1) == yt.numpy()).mean()), abs=1e-12)
    assert metrics["nll"] == pytest.approx(float(-logp[np.arange(len(yt)), yt.numpy()].mean()), rel=1e-9)
    assert math.isfinite(metrics["sharpness_lambda_max"]) and metrics["sharpness_lambda_max"] > 0
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["step"] == 2 * math.ceil(len(y) / 256)
    assert (run / "log.csv").read_text().splitlines()[0].startswith("epoch,step,lr,train_loss")


def test_run_config_toml_is_the_resolved_config_of_that_run(grid):
    text = (grid / "sam" / "seed1" / "config.toml").read_text()
    cfg = tomllib.loads(text)
    assert cfg["seeds"] == [1] and [m["name"] for m in cfg["methods"]] == ["sam"]
    assert cfg["methods"][0]["hyperparameters"] == {"rho": 0.05, "momentum": 0.9}
    assert resolve_config(cfg) == cfg  # complete: resolving it again changes nothing
    results = json.loads((grid / "sam" / "seed1" / "results.json").read_text())
    assert results["optimizer_arguments"]["rho"] == 0.05 and results["optimizer_arguments"]["lr"] == 0.2


def test_table_is_mean_and_sample_std_computed_by_hand(grid, tmp_path, capsys):
    m0 = json.loads((grid / "sam" / "seed0" / "metrics.json").read_text())
    m1 = json.loads((grid / "sam" / "seed1" / "metrics.json").read_text())
    assert main(["table", str(grid), "--format", "json"]) == 0
    table = {e["group"]: e for e in json.loads(capsys.readouterr().out)}
    assert set(table) == {"sgd", "sam"} and table["sam"]["n"] == 2
    for key in ("accuracy", "nll", "ece", "brier"):
        a, b = m0[key], m1[key]
        # two values: mean (a + b) / 2 and sample std (ddof = 1) |a - b| / sqrt(2)
        assert table["sam"]["mean"][key] == pytest.approx((a + b) / 2, rel=1e-12)
        assert table["sam"]["std"][key] == pytest.approx(abs(a - b) / math.sqrt(2), rel=1e-9, abs=1e-15)
    out = tmp_path / "t.csv"
    png = tmp_path / "t.png"
    assert (
        main(
            [
                "table",
                str(grid / "sam"),
                "--format",
                "csv",
                "--out",
                str(out),
                "--plot",
                str(png),
                "--metrics",
                "accuracy,nll",
            ]
        )
        == 0
    )
    lines = out.read_text().splitlines()
    assert lines[0] == "group,n,accuracy_mean,accuracy_std,accuracy_stderr,nll_mean,nll_std,nll_stderr"
    assert float(lines[1].split(",")[2]) == pytest.approx((m0["accuracy"] + m1["accuracy"]) / 2)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["table", str(grid)]) == 0
    md = capsys.readouterr().out
    assert "| sam | 2 |" in md and "ddof = 1" in md


def test_crashed_run_resumes_bit_identically(tmp_path):
    extra = '\n[[methods]]\nname = "bsam"\noptimizer = "bsam"\nhyperparameters = { lr = 0.5, rho = 0.01 }\n'
    cfg = write_config(tmp_path, epochs=3, schedule="cosine", extra=extra)
    text = (
        cfg.read_text()
        .replace('name = "digits"', 'name = "digits-image"\naugmentation = "crop_flip"\ncrop_padding = 1')
        .replace("seeds = [0, 1]", "seeds = [3]")
    )
    text = text.replace('precision = "float64"', 'precision = "float32"')
    cfg.write_text(text)
    args = lambda out: ["run", str(cfg), f"out_dir={out}"]  # noqa: E731
    assert main(args(tmp_path / "a")) == 0

    def crash(step: int) -> None:
        if step == 8:  # mid-epoch 2 of 3 (6 steps per epoch)
            raise RuntimeError("simulated crash")

    train_mod.STEP_HOOK = crash
    try:
        with pytest.raises(SystemExit) as exc:
            main(args(tmp_path / "b"))
        assert exc.value.code == 1
    finally:
        train_mod.STEP_HOOK = None
    first = tmp_path / "b" / "tiny" / "sgd" / "seed3"
    assert torch.load(first / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 1
    assert not (first / "results.json").exists()
    assert main(args(tmp_path / "b")) == 0  # resumes sgd, then trains sam and bsam
    for method in ("sgd", "sam", "bsam"):
        a = torch.load(tmp_path / "a" / "tiny" / method / "seed3" / "checkpoint.pt", weights_only=True)
        b = torch.load(tmp_path / "b" / "tiny" / method / "seed3" / "checkpoint.pt", weights_only=True)
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), (method, k)
        ma = json.loads((tmp_path / "a" / "tiny" / method / "seed3" / "metrics.json").read_text())
        mb = json.loads((tmp_path / "b" / "tiny" / method / "seed3" / "metrics.json").read_text())
        assert ma == mb
        la = [{k: v for k, v in r.items() if k != "seconds"} for r in a["history"]]
        lb = [{k: v for k, v in r.items() if k != "seconds"} for r in b["history"]]
        assert la == lb and len(la) == 3


def test_finished_runs_are_skipped_and_other_configs_refused(grid, tmp_path, capsys):
    cfg = write_config(tmp_path)
    out = grid.parent
    before = (grid / "sgd" / "seed0" / "results.json").stat().st_mtime_ns
    assert main(["run", str(cfg), f"out_dir={out}"]) == 0
    assert (grid / "sgd" / "seed0" / "results.json").stat().st_mtime_ns == before  # not redone
    with pytest.raises(SystemExit) as exc:
        main(["run", str(cfg), f"out_dir={out}", "train.lr=0.3"])  # same directory, other training
    assert exc.value.code == 1
    assert "belongs to a run with another configuration" in capsys.readouterr().err


# ------------------------------------------------------------------------------ configs and overrides
def test_overrides_parse_toml_types():
    assert parse_override("train.epochs=3") == (["train", "epochs"], 3)
    assert parse_override("budget=0.05") == (["budget"], 0.05)
    assert parse_override("progress=false") == (["progress"], False)
    assert parse_override("seeds=[0, 1]") == (["seeds"], [0, 1])
    assert parse_override("data.name=cifar10:/data/c10") == (["data", "name"], "cifar10:/data/c10")
    assert parse_override('name="two words"') == (["name"], "two words")
    assert parse_override("model.kwargs={sizes=[64, 10]}") == (["model", "kwargs"], {"sizes": [64, 10]})
    assert parse_override("+paper.note=x") == (["paper", "note"], "x")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("train.epochs")


def test_overrides_apply_to_methods_by_name_or_index_and_are_checked(tmp_path):
    cfg = load_config(
        write_config(tmp_path),
        [
            "methods.sam.hyperparameters.rho=0.1",
            "methods.0.optimizer=adam",
            "train.lr=1",
            "evaluation.severities=[1, 5]",
        ],
    )
    assert cfg["methods"][1]["hyperparameters"]["rho"] == 0.1 and cfg["methods"][0]["optimizer"] == "adam"
    assert cfg["train"]["lr"] == 1.0 and isinstance(cfg["train"]["lr"], float)
    with pytest.raises(ConfigError, match="train.epochs must be an integer"):
        load_config(write_config(tmp_path), ["train.epochs=2.5"])
    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        load_config(write_config(tmp_path), ["train.lrr=0.1"])
    with pytest.raises(ConfigError, match="no method named 'adamw'"):
        load_config(write_config(tmp_path), ["methods.adamw.hyperparameters.lr=0.1"])
    with pytest.raises(ConfigError, match="must be one of"):
        load_config(write_config(tmp_path), ["train.schedule=linear"])
    with pytest.raises(ConfigError, match="budget must lie in"):
        load_config(write_config(tmp_path), ["budget=2"])


def test_budget_scales_epochs_and_data(tmp_path):
    cfg = load_config(
        write_config(tmp_path, epochs=10, schedule="step"),
        ["budget=0.25", "train.milestones=[4, 8]", "train.warmup_epochs=2"],
    )
    short = apply_budget(cfg)
    assert short["train"]["epochs"] == 3  # ceil(10 * 0.25): every epoch-valued setting scales by 0.3
    t = short["train"]
    # 10 steps per epoch: warm-up ends at step 2 * 0.3 * 10 = 6, milestones at steps 12 and 24
    assert [lr_factor(s, 10, t) for s in (0, 5, 11, 12, 23, 24)] == pytest.approx(
        [1 / 6, 1.0, 1.0, 0.1, 0.1, 0.01]
    )
    from experiments.data import prepare_data

    data = prepare_data(short, seed=0)
    n_train, n_test = len(load_digits("train")[1]), len(load_digits("test")[1])
    assert len(data.y_train) == math.ceil(n_train * 0.25)
    assert len(data.y_test) == max(100, math.ceil(n_test * 0.25))  # at least 100 test examples


def test_toml_writer_round_trips():
    data = {
        "a": 1,
        "b": 0.1,
        "c": 'x "q" \\ é',
        "d": [1.5, math.inf],
        "e": True,
        "nested": {"k": {"z": []}},
        "methods": [{"name": "s", "hyperparameters": {"rho": 0.05, "betas": [0.9, 0.99]}}],
        "paper": {"accuracy": {"label_noise=0.2/sgd": [87.97, 0.04]}},
    }
    back = tomllib.loads(dumps(data))
    assert back == data
    assert math.isnan(tomllib.loads(dumps({"v": math.nan}))["v"])


def test_lr_schedules_match_closed_forms():
    t = {"epochs": 4, "schedule": "cosine", "milestones": [], "gamma": 0.1, "warmup_epochs": 0.0}
    for step in (0, 5, 10, 19):
        assert lr_factor(step, 5, t) == pytest.approx(0.5 * (1 + math.cos(math.pi * step / 20)))
    t.update(schedule="step", milestones=[1, 3])
    assert [lr_factor(s, 5, t) for s in (4, 5, 14, 15)] == pytest.approx([1, 0.1, 0.1, 0.01])
    t.update(milestones=[0.25, 0.75])  # fractions of the 4 epochs: epochs 1 and 3
    assert [lr_factor(s, 5, t) for s in (4, 5, 14, 15)] == pytest.approx([1, 0.1, 0.1, 0.01])
    t.update(schedule="constant", warmup_epochs=1.0)
    assert [lr_factor(s, 5, t) for s in (0, 3, 4, 9)] == pytest.approx([0.2, 0.8, 1, 1])
    # SWA (Izmailov et al. 2018): 1 until swa_start / 2, linear to swa_lr / lr at 0.9 swa_start, then flat
    t.update(schedule="swa", warmup_epochs=0.0, epochs=20, lr=0.1, swa_lr=0.01, swa_start=10.0)
    got = [lr_factor(e * 5, 5, t) for e in (0, 5, 7, 9, 15)]
    assert got == pytest.approx([1.0, 1.0, 1 - 0.9 * 0.2 / 0.4, 0.1, 0.1])


# ------------------------------------------------------------------------------------------- errors
def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and " — " in lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("override", "status", "fragment"),
    [
        ("train.epoch=3", 2, "unknown config key 'train.epoch' (did you mean 'epochs'?)"),
        ("methods.sgd.optimizer=sgdd", 2, "unknown optimizer 'sgdd'; available:"),
        ("model.name=wrn99_1", 2, "model.name 'wrn99_1' is not a registered model; available:"),
        ("methods.sam.hyperparameters.rhoo=1", 2, "does not accept ['rhoo']"),
        ("data.name=cifar10:/nonexistent/c10", 1, "/nonexistent/c10"),
        ("seeds=[]", 2, "seeds must be a non-empty list"),
    ],
)
def test_bad_configs_end_in_one_error_line(tmp_path, capsys, override, status, fragment):
    with pytest.raises(SystemExit) as exc:
        main(["run", str(write_config(tmp_path)), f"out_dir={tmp_path}", override])
    assert exc.value.code == status
    line = one_line(capsys.readouterr().err)
    assert fragment in line
    if "registered model" in fragment:
        assert "mlp" in line and "resnet20" in line


def test_missing_config_and_debug_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", str(tmp_path / "nope.toml")])
    assert exc.value.code == 2 and "does not exist" in one_line(capsys.readouterr().err)
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nepochs = 1")
    with pytest.raises(SystemExit):
        main(["run", str(bad)])
    assert "is not valid TOML" in one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as exc:
        main(
            ["--debug", "run", str(write_config(tmp_path)), f"out_dir={tmp_path}", "data.name=cifar10:/nope"]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: ")
    with pytest.raises(SystemExit) as exc:
        main(["table", str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "does not exist" in one_line(capsys.readouterr().err)


def test_python_dash_m_reports_one_line_and_status(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "run", str(write_config(tmp_path)), "budget=0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "budget must lie in (0, 1]" in one_line(proc.stderr) and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_sigterm_stops_with_status_143_and_the_same_command_resumes(tmp_path):
    """A real process killed by SIGTERM after its first checkpoint resumes to the weights of an
    uninterrupted run (slow: two interpreter start-ups)."""
    import os
    import signal
    import time

    cfg = write_config(tmp_path, epochs=30, schedule="cosine")
    cfg.write_text(
        cfg.read_text()
        .replace("batch_size = 256", "batch_size = 16")
        .replace("seeds = [0, 1]", "seeds = [0]")
    )
    sam_only = 'methods=[{name = "sam", optimizer = "sam", hyperparameters = {rho = 0.05}}]'
    args = [sys.executable, "-m", "experiments", "run", str(cfg), f"out_dir={tmp_path / 'b'}", sam_only]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = tmp_path / "b" / "tiny" / "sam" / "seed0" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "run the same command again to resume" in one_line(err)
    done = torch.load(ckpt, weights_only=True)["counters"]["epoch"]
    assert 1 <= done < 30
    assert subprocess.run(args, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'a'}", sam_only]) == 0
    a = torch.load(tmp_path / "a" / "tiny" / "sam" / "seed0" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(ckpt, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
