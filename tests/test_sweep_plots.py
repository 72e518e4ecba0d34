"""Sweeps as one experiment and their sensitivity plots: a 1-D rho sweep of SAM and a 2-D gamma x eta
(``rho`` x ``eta``) sweep of Fisher-SAM on digits each run by one ``run`` command; ``table --plot``
draws lines with error bars / a heat map whose numbers (read back from the figure's artists and its
``.plot.json``) equal the means, sample stds (ddof 1) and standard errors recomputed with numpy
from each run's ``metrics.json``; a sweep over one method's key trains the other methods once."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main
from experiments.config import ConfigError, load_config
from experiments.runner import plan_runs
from experiments.sweep_plot import numbers_path, sweep_figure
from experiments.table import aggregate, collect_runs

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

BASE = """
name = "{name}"
seeds = [0, 1]
device = "cpu"
threads = 1
progress = false
[data]
name = "digits"
limit_train = 256
limit_test = 200
[model]
name = "mlp"
kwargs = {{ sizes = [64, 12, 10] }}
[train]
epochs = 1
batch_size = 64
lr = 0.3
schedule = "constant"
[evaluation]
metrics = ["accuracy", "nll"]
sharpness = []
"""
SGD = '[[methods]]\nname = "sgd"\noptimizer = "sgd"\n'
SAM = '[[methods]]\nname = "sam"\noptimizer = "sam"\nhyperparameters = { rho = 0.05 }\n'
FSAM = '[[methods]]\nname = "fsam"\noptimizer = "fsam"\nhyperparameters = { rho = 0.05, eta = 1.0 }\n'
RHOS = [0.01, 0.1, 0.5]
GAMMAS, ETAS = [0.05, 0.5], [1.0, 1000.0]
METRICS = ("accuracy", "nll")


def write(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.toml"
    path.write_text(BASE.format(name=name) + body)
    return path


def by_hand(run_dirs: list[Path], metric: str) -> tuple[float, float, float]:
    """mean, sample std (ddof 1) and std / sqrt(n) of ``metric`` over the runs' metrics.json."""
    values = np.array([json.loads((d / "metrics.json").read_text())[metric] for d in run_dirs])
    assert len(values) == 2
    std = float(np.std(values, ddof=1))
    return float(np.mean(values)), std, std / math.sqrt(len(values))


def seeds(d: Path) -> list[Path]:
    return [d / "seed0", d / "seed1"]


def test_sweep_of_one_methods_key_plans_only_that_method_and_refuses_unknown_methods(tmp_path):
    sweep = '[sweep]\n"data.label_noise" = [0.0, 0.2]\n"methods.sam.hyperparameters.rho" = [0.01, 0.1, 0.5]\n'
    cfg = load_config(write(tmp_path, "plan", SGD + SAM + sweep), [f"out_dir={tmp_path}"])
    runs = plan_runs(cfg)
    # SGD: 2 noise levels x 2 seeds; SAM: 2 noise levels x 3 rhos x 2 seeds
    assert len(runs) == 2 * 2 + 2 * 3 * 2
    sgd = sorted(str(r.run_dir.relative_to(tmp_path / "plan")) for r in runs if r.method == "sgd")
    assert sgd == [f"label_noise={n}/sgd/seed{s}" for n in (0.0, 0.2) for s in (0, 1)]
    sam = {
        (r.variant, r.cfg["methods"][0]["hyperparameters"]["rho"], r.cfg["data"]["label_noise"])
        for r in runs
        if r.method == "sam"
    }
    assert sam == {(f"label_noise={n},rho={rho}", rho, n) for n in (0.0, 0.2) for rho in RHOS}
    # a method addressed by its index is the same method
    cfg = load_config(
        write(tmp_path, "idx", SGD + SAM + '[sweep]\n"methods.1.hyperparameters.rho" = [0.1, 0.2]\n')
    )
    assert [(r.variant, r.method) for r in plan_runs(cfg)][::2] == [
        ("", "sgd"),
        ("rho=0.1", "sam"),
        ("rho=0.2", "sam"),
    ]
    with pytest.raises(
        ConfigError, match=r"addresses method 'sma', which the config does not define.*'sgd', 'sam'"
    ):
        load_config(
            write(tmp_path, "bad", SGD + SAM + '[sweep]\n"methods.sma.hyperparameters.rho" = [0.1]\n')
        )
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(tmp_path / "bad.toml"), "--dry-run"])
    assert exit_.value.code == 2


def test_rho_sweep_one_command_lines_with_error_bars_equal_numpy(tmp_path, capsys):
    cfg = write(tmp_path, "rho", SGD + SAM + f'[sweep]\n"methods.sam.hyperparameters.rho" = {RHOS}\n')
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'runs'}"]) == 0
    root = tmp_path / "runs" / "rho"
    # SGD ran once per seed, not once per rho
    assert sorted(p.parent.relative_to(root).as_posix() for p in root.rglob("metrics.json")) == sorted(
        [f"sgd/seed{s}" for s in (0, 1)] + [f"rho={r}/sam/seed{s}" for r in RHOS for s in (0, 1)]
    )
    png, table_csv = tmp_path / "rho.png", tmp_path / "rho.csv"
    argv = ["table", str(root), "--plot", str(png), "--format", "csv", "--out", str(table_csv), "--stderr"]
    assert main(argv) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rec = json.loads(numbers_path(png).read_text())
    assert rec["kind"] == "line" and rec["error"] == "stderr"
    sam = rec["methods"]["sam"]
    assert sam["keys"] == ["methods.sam.hyperparameters.rho"] and sam["x"] == RHOS
    assert list(rec["unswept"]) == ["sgd"] and rec["log_x"] is True  # 0.01 .. 0.5 spans > 1 decade
    rows = {r["group"]: r for r in csv.DictReader(table_csv.open())}
    for m in METRICS:
        for i, rho in enumerate(RHOS):
            mean, std, se = by_hand(seeds(root / f"rho={rho}" / "sam"), m)
            got = sam["metrics"][m]
            assert (got["mean"][i], got["std"][i], got["stderr"][i]) == pytest.approx(
                (mean, std, se), rel=1e-12
            )
            row = rows[f"rho={rho}/sam"]
            assert float(row[f"{m}_stderr"]) == pytest.approx(
                float(row[f"{m}_std"]) / math.sqrt(2), rel=1e-12
            )
            assert float(row[f"{m}_mean"]) == pytest.approx(mean, rel=1e-12)
        mean, std, se = by_hand(seeds(root / "sgd"), m)
        assert rec["unswept"]["sgd"]["metrics"][m]["mean"] == pytest.approx(mean, rel=1e-12)
        assert rec["unswept"]["sgd"]["metrics"][m]["stderr"] == pytest.approx(se, rel=1e-12)

    # the figure's artists: the errorbar line's points and the caps' half-heights = std (error="std")
    fig, _ = sweep_figure(aggregate(collect_runs([root])), ["accuracy"], error="std")
    ax = fig.axes[0]
    (container,) = ax.containers
    xs, ys = (np.asarray(a, dtype=float) for a in container.lines[0].get_data())
    hand = [by_hand(seeds(root / f"rho={rho}" / "sam"), "accuracy") for rho in RHOS]
    np.testing.assert_allclose(xs, RHOS)
    np.testing.assert_allclose(ys, [h[0] for h in hand], rtol=1e-12)
    lower, upper = (np.asarray(cap.get_ydata(), dtype=float) for cap in container.lines[1])
    np.testing.assert_allclose((upper - lower) / 2, [h[1] for h in hand], rtol=1e-9)
    (baseline,) = [ln for ln in ax.lines if ln.get_label() == "sgd (not swept)"]
    assert baseline.get_ydata()[0] == pytest.approx(by_hand(seeds(root / "sgd"), "accuracy")[0], rel=1e-12)
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "rho"

    # Markdown with --stderr: "mean ± std (se stderr)", formatted by hand
    capsys.readouterr()
    assert main(["table", str(root / "rho=0.5"), "--metrics", "accuracy", "--stderr"]) == 0
    mean, std, se = hand[2]
    assert f"| rho=0.5/sam | 2 | {mean:.4g} ± {std:.2g} (se {se:.2g}) |" in capsys.readouterr().out


def test_gamma_eta_sweep_one_command_heat_map_equals_numpy(tmp_path):
    keys = ("methods.fsam.hyperparameters.rho", "methods.fsam.hyperparameters.eta")
    sweep = f'[sweep]\n"{keys[0]}" = {GAMMAS}\n"{keys[1]}" = {ETAS}\n'
    cfg = write(tmp_path, "fsam", FSAM + sweep)
    assert main(["run", str(cfg), f"out_dir={tmp_path / 'runs'}"]) == 0
    root = tmp_path / "runs" / "fsam"
    png = tmp_path / "fsam.png"
    assert main(["table", str(root), "--plot", str(png)]) == 0
    rec = json.loads(numbers_path(png).read_text())
    assert rec["kind"] == "heatmap" and rec["error"] == "std"
    fsam = rec["methods"]["fsam"]
    assert fsam["keys"] == list(keys)
    assert fsam["rows"] == GAMMAS and fsam["cols"] == ETAS
    fig, _ = sweep_figure(aggregate(collect_runs([root])), list(METRICS))
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == len(METRICS)
    for m, image in zip(METRICS, images):
        hand = np.array(
            [[by_hand(seeds(root / f"rho={g},eta={e}" / "fsam"), m) for e in ETAS] for g in GAMMAS]
        )  # rows gamma, columns eta, last axis (mean, std, stderr)
        np.testing.assert_allclose(fsam["metrics"][m]["mean"], hand[..., 0], rtol=1e-12)
        np.testing.assert_allclose(fsam["metrics"][m]["std"], hand[..., 1], rtol=1e-12)
        np.testing.assert_allclose(fsam["metrics"][m]["stderr"], hand[..., 1] / math.sqrt(2), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(image.get_array()), hand[..., 0], rtol=1e-12)
    # eta matters: with eta = 1000 the Fisher ellipsoid differs from the Euclidean ball of SAM
    nll = np.asarray(fsam["metrics"]["nll"]["mean"])
    assert not np.allclose(nll[:, 0], nll[:, 1], rtol=0, atol=1e-9)


def test_runs_that_form_no_sweep_keep_the_bar_chart(tmp_path):
    """One setting per method: the bar chart, whose JSON holds the bars' numbers."""
    entries = [
        {"group": g, "base": g, "method": g, "swept": {}, "n": 2, "diverged": 0, "mean": {"acc": mu},
         "std": {"acc": sd}, "stderr": {"acc": sd / math.sqrt(2)}, "nonfinite": {}, "paper": {}}
        for g, mu, sd in (("sgd", 0.9, 0.02), ("sam", 0.92, 0.01))
    ]  # fmt: skip
    from experiments.table import plot_table

    plot_table(entries, tmp_path / "bars.svg", error="stderr")
    rec = json.loads((tmp_path / "bars.plot.json").read_text())
    assert rec["kind"] == "bar" and rec["groups"] == ["sgd", "sam"]
    assert rec["values"]["acc"]["stderr"] == pytest.approx([0.02 / math.sqrt(2), 0.01 / math.sqrt(2)])
