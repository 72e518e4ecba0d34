"""Every failure of the command lines ends in ONE line ``error: <what> — <fix>`` that names the file,
key or layer (issue 24, item 5): a model that does not fit the data (checked before the first step),
``lr = 1e39``, a hyperparameter of the wrong type, an option between overrides, SIGTERM on a study
(what was kept), truncated study files (``study report`` and the dashboard) and a full disk under the
atomic writers (the old file intact)."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
import tomllib

from experiments.cli import main
from experiments.study.__main__ import interrupted_error, kept_files
from experiments.study.__main__ import main as study_main
from landscape.cli_common import describe_error
from landscape.io import DiskFullError, atomic_write_json, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "app"))

CONFIG = """
name = "msg"
seeds = [0]
device = "cpu"
threads = 1
progress = false
[data]
name = "digits"
[model]
name = "mlp"
kwargs = { sizes = [64, 16, 10] }
[train]
epochs = 1
batch_size = 256
lr = 0.1
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "sam"
optimizer = "sam"
hyperparameters = { rho = 0.05 }
[evaluation]
sharpness = []
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "msg.toml"
    path.write_text(CONFIG)
    return path


def _error_line(err: str) -> str:
    """The one ``error:`` line (the last line of stderr, and the only one starting so)."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("error: "), err
    assert sum(ln.startswith("error:") for ln in lines) == 1, err
    assert " — " in lines[-1]
    return lines[-1]


def _fails(argv: list[str], capsys, runner=main) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        runner(argv)
    return exc.value.code, _error_line(capsys.readouterr().err)


# --------------------------------------------------------------------------- 1. model against data
@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (
            ["model.kwargs.sizes=[64,16,5]"],
            ["model 'mlp'", "has 5 outputs", "data.name 'digits' has 10 classes", "labels 0 to 9",
             "set model.kwargs.sizes = [64, 16, 10]"],
        ),
        (
            ["model.kwargs.sizes=[32,16,10]"],
            ["model 'mlp'", "takes inputs of 32 features (its first nn.Linear)", "shape [64] (64 values)",
             "set model.kwargs.sizes = [64, 16, 10] (the first entry is the input size)"],
        ),
        (
            ["model.name=lenet5-digits", "data.name=digits-image", "model.kwargs={in_channels=3}"],
            ["model 'lenet5-digits'", "in_channels = 3 (its first convolution)", "shape [1, 8, 8]",
             "set model.kwargs.in_channels = 1"],
        ),
    ],
)  # fmt: skip
def test_model_that_does_not_fit_the_data_fails_before_training(
    config, tmp_path, capsys, overrides, fragments
):
    out = tmp_path / "runs"
    code, line = _fails(["run", str(config), f"out_dir={out}", "methods=[{name='sgd',optimizer='sgd'}]",
                         *overrides], capsys)  # fmt: skip
    assert code == 2
    for f in fragments:
        assert f in line, line
    assert line.endswith("— fix the config file or the key=value override")
    assert not list(out.rglob("checkpoint.pt")) and not list(out.rglob("log.jsonl"))  # no step taken


# ------------------------------------------------------------------------------------- 2. lr = 1e39
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.lr=1e39", "train.lr"),
        ("train.lr=-1e39", "train.lr"),
        ("train.lr=inf", "train.lr"),
        ("methods.sam.hyperparameters.rho=1e39", "methods.sam.hyperparameters.rho"),
        ("train.optimizer_defaults={momentum=nan}", "train.optimizer_defaults.momentum"),
    ],
)
def test_numbers_beyond_float32_name_the_key(config, tmp_path, capsys, override, key):
    code, line = _fails(["run", str(config), f"out_dir={tmp_path}", override, "--dry-run"], capsys)
    assert code == 2
    assert f"config key {key} must be a finite number below 3.4e38 in magnitude (the float32 range)" in line
    assert not (tmp_path / "msg").exists()


# ------------------------------------------------------------------------ 3. hyperparameter types
@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        (
            'methods.sgd.hyperparameters.momentum="0.9"',
            "methods.sgd.hyperparameters.momentum must be a number (the default of momentum in 'sgd' is 0), "
            "got '0.9' (str); write it without quotes: methods.sgd.hyperparameters.momentum=0.9",
        ),
        (
            "methods.sam.hyperparameters.rho=abc",
            "methods.sam.hyperparameters.rho must be a number (the default of rho in 'sam' is 0.05), "
            "got 'abc' (str)",
        ),
        (
            "methods.sam.hyperparameters.nesterov=1",
            "methods.sam.hyperparameters.nesterov must be true or false",
        ),
        ("methods.sgd.hyperparameters.lr=inf", "methods.sgd.hyperparameters.lr must be a finite number"),
    ],
)
def test_hyperparameter_of_the_wrong_type_names_the_key_before_training(
    config, tmp_path, capsys, override, fragment
):
    out = tmp_path / "runs"
    code, line = _fails(["run", str(config), f"out_dir={out}", override], capsys)
    assert code == 2 and fragment in line, line
    assert "not supported between" not in line
    assert not out.exists()  # refused by the checks of every run, before the first one trains


def test_optimizer_defaults_of_the_wrong_type_name_the_key(config, tmp_path, capsys):
    bad = 'train.optimizer_defaults={momentum="x"}'
    code, line = _fails(["run", str(config), f"out_dir={tmp_path}", bad], capsys)
    assert code == 2 and "train.optimizer_defaults.momentum must be a number" in line and "got 'x'" in line


# ------------------------------------------------------------------ 4. options among the overrides
def test_options_anywhere_among_the_overrides(config, tmp_path, capsys):
    argv = ["run", str(config), "train.epochs=3", "--no-progress", f"out_dir={tmp_path}", "--dry-run",
            "seeds=[4,5]", "methods.sam.hyperparameters.rho=0.2"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    cfg = tomllib.loads("\n".join(ln for ln in out.splitlines() if not ln.startswith("# run:")))
    assert cfg["train"]["epochs"] == 3 and cfg["seeds"] == [4, 5] and cfg["out_dir"] == str(tmp_path)
    assert [m["hyperparameters"] for m in cfg["methods"]] == [{}, {"rho": 0.2}]
    assert out.count("# run:") == 4
    # the later override still wins, and an unknown option is still refused
    assert main(["run", str(config), "train.epochs=3", "--dry-run", "train.epochs=2"]) == 0
    assert "\nepochs = 2\n" in capsys.readouterr().out
    code, line = _fails(["run", str(config), "train.epochs=3", "--bogus", "seeds=[1]"], capsys)
    assert code == 2 and line.startswith("error: unrecognized arguments: --bogus")


# ----------------------------------------------------------------------------- 5. SIGTERM on a study
def test_interrupted_study_says_what_was_kept(tmp_path):
    out = tmp_path / "study"
    (out / "models").mkdir(parents=True)
    for mid in ("mlp-sgd-aaaa", "mlp-sam-bbbb"):  # two finished members (their checkpoints too)
        (out / "models" / f"{mid}.json").write_text("{}")
        (out / "runs" / mid / "sgd" / "seed0").mkdir(parents=True)
        (out / "runs" / mid / "sgd" / "seed0" / "checkpoint.pt").write_bytes(b"x")
    (out / "runs" / "mlp-bsam-cccc" / "bsam" / "seed0").mkdir(parents=True)  # one in progress
    (out / "runs" / "mlp-bsam-cccc" / "bsam" / "seed0" / "checkpoint.pt").write_bytes(b"x")
    assert kept_files(out) == (2, 1)
    status, line = describe_error(interrupted_error(out, sigterm=True))
    assert status == 143
    assert line == (
        f"error: terminated by SIGTERM; kept in {out}: 2 finished models (models/*.json) and 1 checkpoint "
        "of an unfinished member (runs/<id>/.../checkpoint.pt) — run the same command again to resume: "
        "finished models are not trained again, an unfinished member resumes from its last epoch"
    )
    assert "nothing was saved" not in line
    status, line = describe_error(interrupted_error(tmp_path / "empty", sigterm=False))
    assert status == 130 and "interrupted (Ctrl-C); nothing finished yet in" in line


def test_sigterm_during_a_study_run_reports_the_kept_files(tmp_path, capsys, monkeypatch):
    import experiments.study.population as population
    from landscape.cli_common import Terminated

    cfg = tmp_path / "s.toml"
    cfg.write_text('data = "digits"\nsampling = "grid"\nepochs = 1\n[space]\nmodel = ["mlp"]\n'
                   'optimizer = ["sgd"]\n[[measures]]\nmeasure = "gradient_norm"\n')  # fmt: skip
    out = tmp_path / "out"

    def killed(point, cfg, run, progress=False):
        run.run_dir.mkdir(parents=True)
        (run.run_dir / "checkpoint.pt").write_bytes(b"x")
        raise Terminated("SIGTERM")

    monkeypatch.setattr(population, "train_and_measure", killed)
    code, line = _fails(["run", str(cfg), "--out", str(out), "--no-progress"], capsys, study_main)
    assert code == 143 and "kept in" in line and "0 finished models" in line and "1 checkpoint" in line


# ------------------------------------------------------------------ 6. truncated study files
@pytest.fixture
def study_dir(tmp_path: Path) -> Path:
    """A study directory as ``run`` and ``report`` leave it (two members), without training."""
    from experiments.study.report import write_table
    from landscape.io import atomic_write_json

    out = tmp_path / "study"
    measures = [{"name": "lambda_max"}, {"name": "gradient_norm"}]
    atomic_write_json(out / "study_config.json", {"measures": measures})
    rows = []
    for i, opt in enumerate(("sgd", "sam")):
        row = {"id": f"mlp-{opt}", "model": "mlp", "optimizer": opt, "lr": 0.1, "lambda_max": 1.0 + i,
               "gradient_norm": 0.5 * i, "gap_error": 0.1 * i, "test_error": 0.2}  # fmt: skip
        atomic_write_json(out / "models" / f"mlp-{opt}.json", {"fingerprint": "f", "row": row})
        rows.append(row)
    write_table(rows, out / "population.csv")
    atomic_write_json(out / "correlation.json", {"study": {"measures": measures}})
    return out


def _truncate(path: Path, keep: int | None = None) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2 if keep is None else keep])


@pytest.mark.parametrize(
    ("rel", "keep", "fragments"),
    [
        ("models/mlp-sam.json", 40, ["mlp-sam.json: not a valid model result",
                                     "Unterminated string starting at (line 4, column 5)",
                                     "the file is truncated or corrupt — delete it and run "
                                     "`python -m experiments.study run CONFIG --out"]),
        ("models/mlp-sam.json", 0, ["mlp-sam.json: the model result is empty", "— delete it and run"]),
        ("study_config.json", None, ["study_config.json: not a valid study config",
                                     "— run `python -m experiments.study run CONFIG --out"]),
    ],
)  # fmt: skip
def test_study_report_names_a_truncated_file(study_dir, capsys, rel, keep, fragments):
    _truncate(study_dir / rel, keep)
    code, line = _fails(["report", str(study_dir)], capsys, study_main)
    assert code == 1
    assert f"{study_dir / rel}" in line
    for f in fragments:
        assert f in line, line


def test_study_report_names_a_model_file_without_its_row(study_dir, capsys):
    (study_dir / "models" / "mlp-sgd.json").write_text('{"fingerprint": "f"}')
    code, line = _fails(["report", str(study_dir)], capsys, study_main)
    assert code == 1 and f"{study_dir / 'models' / 'mlp-sgd.json'} is not a model result" in line
    assert "holds no 'row' table with an 'id'" in line and "— delete it and run" in line


@pytest.mark.parametrize(
    ("rel", "keep", "fragment"),
    [
        ("population.csv", None, "population.csv is truncated or corrupt ("),
        ("population.csv", 10, "population.csv is truncated or corrupt (it ends inside line 1"),
        ("population.csv", 0, "population.csv is empty"),
        ("correlation.json", 24, "correlation.json: not a valid study report (JSON): "),
    ],
)
def test_dashboard_names_a_truncated_file(study_dir, rel, keep, fragment):
    from dashboard import UserInputError
    from dashboard import study_data as sd

    df, measures = sd.load_population(study_dir)  # intact: read as written
    assert len(df) == 2 and measures == ["lambda_max", "gradient_norm"]
    _truncate(study_dir / rel, keep)
    with pytest.raises(UserInputError) as exc:
        sd.load_population(study_dir)
    msg = str(exc.value)
    assert fragment in msg and str(study_dir / rel) in msg and "\n" not in msg
    assert f"— delete it and run `python -m experiments.study report {study_dir}`" in msg
    (study_dir / "population.csv").unlink()  # the run layout (study_config.json and models/)
    _truncate(study_dir / "models" / "mlp-sgd.json", 24)
    with pytest.raises(UserInputError, match=r"mlp-sgd\.json: not a valid model result.*\(line 3, column"):
        sd.load_population(study_dir)


# ---------------------------------------------------------------------------- 7. a full disk
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_names_path_bytes_and_free_space_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    atomic_write_json(path, {"old": 1})
    before = path.read_bytes()
    monkeypatch.setattr(os, "write", _no_space)
    with pytest.raises(DiskFullError) as exc:
        atomic_write_json(path, {"new": list(range(10))})
    monkeypatch.undo()
    err = exc.value
    assert err.errno == errno.ENOSPC and isinstance(err, OSError)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    size = len(json.dumps({"new": list(range(10))}, indent=2)) + 1
    status, line = describe_error(err)
    assert status == 1 and line.startswith(
        f"error: no space left on the device writing {path} ({size:,} bytes; "
    )
    assert f"bytes free in {tmp_path}); the previous results.json is unchanged" in line
    assert line.endswith("— free some disk space, or write to another directory (another out_dir / --out)")


def test_full_disk_in_any_writer_and_for_a_new_file(tmp_path, monkeypatch):
    from landscape.io import atomic_write

    def half_then_full(p: Path) -> None:
        p.write_bytes(b"x" * 100)
        _no_space()

    with pytest.raises(DiskFullError, match=r"a file \(failed after 100 bytes\).*no fig\.png was written"):
        atomic_write(tmp_path / "fig.png", half_then_full)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(os, "write", _no_space)
    with pytest.raises(DiskFullError, match=r"writing .*table\.md \(5 bytes; [\d,]+ bytes free in"):
        atomic_write_text(tmp_path / "table.md", "hello")
    monkeypatch.undo()
    # outside the atomic writers, a bare ENOSPC still gets the fix
    status, line = describe_error(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "log.csv")))
    assert line.startswith(f"error: no space left on the device writing {tmp_path / 'log.csv'}; ")
    assert "— free some disk space" in line


def test_experiments_page_names_a_truncated_config_checkpoint_or_metrics_file(config, tmp_path):
    """The Experiments page's reliability diagram reads a finished run's config.toml, checkpoint.pt and
    metrics.json: a truncated or foreign file gives a message naming it, not a TOML / torch / KeyError."""
    import pickle

    from app.dashboard.experiments_view import run_probs

    assert (
        main(["run", str(config), f"out_dir={tmp_path / 'runs'}", 'methods=[{name="sgd", optimizer="sgd"}]'])
        == 0
    )
    run_dir = next(p.parent for p in (tmp_path / "runs").rglob("checkpoint.pt"))
    cfg_text = (run_dir / "config.toml").read_text()
    (run_dir / "config.toml").write_text(cfg_text[: len(cfg_text) // 2])
    with pytest.raises(ValueError, match=r"config\.toml is not a valid run config.*truncated"):
        run_probs(run_dir)
    (run_dir / "config.toml").write_text(cfg_text)
    good = (run_dir / "checkpoint.pt").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(good[: len(good) // 3])
    with pytest.raises(ValueError, match=r"checkpoint\.pt: not a readable checkpoint"):
        run_probs(run_dir)
    (run_dir / "checkpoint.pt").write_bytes(pickle.dumps({"model": 1}))
    with pytest.raises(ValueError, match=r"checkpoint\.pt"):
        run_probs(run_dir)
    (run_dir / "checkpoint.pt").write_bytes(good)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    (run_dir / "metrics.json").write_text(json.dumps({k: v for k, v in metrics.items() if k != "seed"}))
    with pytest.raises(ValueError, match=r"metrics\.json has no integer 'seed'"):
        run_probs(run_dir)
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    probs, labels, _ = run_probs(run_dir)
    assert probs.shape == (len(labels), 10) and abs(float(probs.sum(1).mean()) - 1) < 1e-5
