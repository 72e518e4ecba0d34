"""The flatness-vs-generalisation study: Kendall tau-b against scipy, the granulated tau against a
hand-enumerated example, the bootstrap interval, and a tiny population end to end (CLI included;
the members' runner runs are tested in test_study_runner.py)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import scipy.stats

import landscape as ls
from experiments.study import (
    bootstrap_tau,
    granulated_tau,
    kendall_tau_b,
    plan_population,
    resolve_study_config,
)
from experiments.study.__main__ import main


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kendall_tau_b_matches_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=25).astype(float)  # many ties in both
    y = x + rng.integers(-2, 3, size=25)
    expected = scipy.stats.kendalltau(x, y, variant="b").statistic
    assert kendall_tau_b(x, y) == pytest.approx(expected, abs=1e-12)
    z = rng.normal(size=30)
    w = rng.normal(size=30)
    assert kendall_tau_b(z, w) == pytest.approx(scipy.stats.kendalltau(z, w).statistic, abs=1e-12)


def test_kendall_tau_b_constant_is_nan_and_bad_input_raises():
    assert math.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="equally long"):
        kendall_tau_b([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="finite"):
        kendall_tau_b([1, float("nan")], [1, 2])


def _tau_by_pairs(m, g):
    """tau-b by enumerating the pairs: (C - D) / sqrt((n0 - ties_m)(n0 - ties_g))."""
    c = d = tm = tg = 0
    pairs = list(itertools.combinations(range(len(m)), 2))
    for i, j in pairs:
        dm, dg = m[j] - m[i], g[j] - g[i]
        tm += dm == 0
        tg += dg == 0
        if dm * dg > 0:
            c += 1
        elif dm * dg < 0:
            d += 1
    n0 = len(pairs)
    return (c - d) / math.sqrt((n0 - tm) * (n0 - tg))


def test_granulated_tau_hand_example():
    # 2 axes (a, b) x 2 values, 2 replicates per cell (rep is not an axis): 8 models
    cells = [
        (0, 0, 1.0, 0.1), (0, 0, 2.0, 0.3), (1, 0, 3.0, 0.2), (1, 0, 4.0, 0.4),
        (0, 1, 1.0, 0.5), (0, 1, 1.0, 0.6), (1, 1, 2.0, 0.7), (1, 1, 3.0, 0.6),
    ]  # fmt: skip
    rows = [{"a": a, "b": b, "m": m, "gap": g} for a, b, m, g in cells]
    # axis a: groups b=0 and b=1; axis b: groups a=0 and a=1 (4 models each)
    groups_a = [[r for r in rows if r["b"] == v] for v in (0, 1)]
    groups_b = [[r for r in rows if r["a"] == v] for v in (0, 1)]
    enum = lambda grp: _tau_by_pairs([r["m"] for r in grp], [r["gap"] for r in grp])  # noqa: E731
    # by hand: b=0 -> C=5, D=1: 4/6; b=1 -> C=3, D=1, one tie in each: 2/5
    # a=0 -> C=1, D=2, 3 ties in m: -1/sqrt(18); a=1 -> C=1, D=4, 1 tie in m: -3/sqrt(30)
    hand = {"a": [2 / 3, 0.4], "b": [-1 / math.sqrt(18), -3 / math.sqrt(30)]}
    assert [enum(g) for g in groups_a] == pytest.approx(hand["a"], abs=1e-12)
    assert [enum(g) for g in groups_b] == pytest.approx(hand["b"], abs=1e-12)
    out = granulated_tau(rows, "m", "gap", ["a", "b"])
    psi_a, psi_b = np.mean(hand["a"]), np.mean(hand["b"])
    assert out["psi"]["a"] == pytest.approx(psi_a, abs=1e-12)
    assert out["psi"]["b"] == pytest.approx(psi_b, abs=1e-12)
    assert out["Psi"] == pytest.approx((psi_a + psi_b) / 2, abs=1e-12)
    assert out["groups"] == {"a": 2, "b": 2}


def test_bootstrap_interval_contains_tau_and_is_seeded():
    rng = np.random.default_rng(3)
    x = rng.normal(size=40)
    y = x + rng.normal(size=40)
    a = bootstrap_tau(x, y, samples=300, seed=7)
    b = bootstrap_tau(x, y, samples=300, seed=7)
    c = bootstrap_tau(x, y, samples=300, seed=8)
    assert a["tau"] == pytest.approx(scipy.stats.kendalltau(x, y).statistic, abs=1e-12)
    assert a["low"] <= a["tau"] <= a["high"]
    assert (a["low"], a["high"]) == (b["low"], b["high"])
    assert (a["low"], a["high"]) != (c["low"], c["high"])
    # the percentile interval of an explicit loop over the same resamples (scipy's tau on each)
    rng = np.random.default_rng(7)
    taus = []
    for _ in range(300):
        i = rng.integers(0, 40, size=40)
        taus.append(scipy.stats.kendalltau(x[i], y[i]).statistic)
    assert [a["low"], a["high"]] == pytest.approx(np.quantile(taus, [0.025, 0.975]).tolist(), abs=1e-12)
    with pytest.raises(ValueError, match="samples"):
        bootstrap_tau(x, y, samples=0)


def _tiny_config(tmp_path):
    adaptive = {"adaptive": True, "rho": 0.5, "iterations": 3}
    measures = [
        {"measure": "lambda_max", "options": {"tol": 1e-3, "max_matvecs": 20}},
        {"measure": "hessian_trace", "options": {"max_matvecs": 12}},
        {"measure": "fisher_trace"},
        {"measure": "ggn_trace", "options": {"max_matvecs": 12}},
        {"measure": "gradient_norm"},
        {"measure": "worst_case", "options": {"iterations": 3}},
        {"name": "wc_adaptive_m16", "measure": "worst_case", "options": {**adaptive, "m": 16}},
        {"name": "wc_lognorm", "measure": "worst_case", "options": {**adaptive, "logit_normalization": True}},
        {"measure": "fisher_worst_case", "options": {"iterations": 3}},
        {"measure": "average_case", "options": {"samples": 4}},
        {"measure": "keskar", "options": {"iterations": 2}},
        {"measure": "pacbayes_flatness", "options": {"steps": 3, "samples": 2}},
        {"measure": "sharpness_flatness", "options": {"steps": 3, "iterations": 2}},
        {"measure": "directional", "options": {"directions": 2}},
        {"measure": "perturbation_robustness", "options": {"noise_samples": 1}},
        {"measure": "tracer"},
        {"measure": "kfac_trace"},
        {"measure": "kfac_lambda_max"},
        {"measure": "ekfac_trace"},
        {"measure": "ekfac_lambda_max"},
    ]  # fmt: skip
    cfg = {
        "name": "tiny",
        "sampling": "grid",
        "epochs": 1,
        "sharpness_subset": 32,
        "space": {
            "model": ["mlp"],
            "optimizer": ["sgd", "sam", "asam", "bsam"],
            "lr": [0.05],
            "batch_size": [64],
            "width": [8],
            "n_train": [96],
        },
        "optimizer_options": {"bsam": {"lr_scale": 5.0}},
        "runner": {"evaluation": {"bma_samples": 2}},
        "measures": measures,
    }
    path = tmp_path / "tiny.toml"
    from experiments.toml_writer import dumps

    path.write_text(dumps(cfg))
    return path, cfg


def test_tiny_population_end_to_end(tmp_path, capsys):
    path, raw = _tiny_config(tmp_path)
    cfg = resolve_study_config(raw)
    assert {m["measure"] for m in cfg["measures"]} == set(ls.MEASURES)  # every measure of landscape
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--no-progress"]) == 0
    rows = json.loads((out / "population.json").read_text())
    assert len(rows) == 4 == len(plan_population(cfg))
    names = [m["name"] for m in cfg["measures"]]
    for r in rows:
        for k in names + ["train_error", "test_error", "gap_error", "gap_loss", "ood_error"]:
            assert k in r and math.isfinite(r[k]), (r["id"], k)
        assert r["gap_error"] == pytest.approx(r["test_error"] - r["train_error"], abs=1e-12)
        assert r["gap_loss"] == pytest.approx(r["test_loss"] - r["train_loss"], abs=1e-12)
    header = (out / "population.csv").read_text().splitlines()[0].split(",")
    assert set(names) <= set(header)
    corr = json.loads((out / "correlation.json").read_text())
    e = next(c for c in corr["correlation"] if c["measure"] == "lambda_max" and c["target"] == "gap_error")
    by_id = {r["id"]: r for r in rows}
    xs = [by_id[i]["lambda_max"] for i in sorted(by_id)]
    ys = [by_id[i]["gap_error"] for i in sorted(by_id)]
    expected = scipy.stats.kendalltau(xs, ys).statistic
    assert e["tau"] == pytest.approx(expected, abs=1e-12) or (math.isnan(e["tau"]) and math.isnan(expected))
    assert (out / "study.png").stat().st_size > 1000 and (out / "correlation.md").is_file()
    # every member is a run of the experiment runner; --dry-run lists their directories
    capsys.readouterr()
    assert main(["run", str(path), "--out", str(out), "--dry-run"]) == 0
    dirs = [line for line in capsys.readouterr().out.split() if "/runs/" in line]
    assert len(dirs) == 4 and {d.split("/")[-2] for d in dirs} == {"sgd", "sam", "asam", "bsam"}
    for r in rows:
        doc = json.loads((out / "models" / f"{r['id']}.json").read_text())
        assert str(out / doc["run_dir"]) in dirs and (out / doc["run_dir"] / "results.json").is_file()
    # resumable: a second run trains nothing and reports each model as skipped
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--no-report"]) == 0
    assert capsys.readouterr().out.count("skipped") == 4


def test_bad_input_gives_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[space]\noptimizer = ["adamx"]\n[[measures]]\nmeasure = "lambda_max"\n')
    with pytest.raises(SystemExit) as exc:
        main(["run", str(bad), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1  # a bad config is a bad command line, as for `run`
    assert err[0].startswith("error:") and "unknown optimizer 'adamx'" in err[0]
    with pytest.raises(ValueError, match="sharpness_subset=1200 exceeds"):
        resolve_study_config({"sharpness_subset": 1200, "measures": [{"measure": "keskar"}]})
    with pytest.raises(ValueError, match="unknown measure 'flatness'"):
        resolve_study_config({"measures": [{"measure": "flatness"}]})
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "nothing")])
    assert f"DIR {tmp_path / 'nothing'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "empty")])
    assert "holds no study_config.json" in capsys.readouterr().err


def test_star_sampling_gives_one_axis_groups():
    cfg = resolve_study_config(
        {
            "sampling": "star",
            "bases": 2,
            "space": {"optimizer": ["sgd", "sam", "bsam"], "lr": [0.01, 0.1], "seed": [0, 1]},
            "measures": [{"measure": "keskar"}],
        }
    )
    pts = plan_population(cfg)
    keys = {json.dumps(p, sort_keys=True) for p in pts}
    assert len(keys) == len(pts)
    # every point's one-axis variations are in the population (a star around each base)
    base = pts[0]
    for axis, values in (("optimizer", ["sgd", "sam", "bsam"]), ("lr", [0.01, 0.1]), ("seed", [0, 1])):
        for v in values:
            assert json.dumps({**base, axis: v}, sort_keys=True) in keys
