"""The ``laplace`` table of a method: the runner's ``bma_*`` metrics are the Laplace posterior fitted
by hand (``optimizers.KronLaplace`` / ``DiagLaplace``) to the run's checkpoint and scored with
``landscape.metrics``; the table is validated at the config boundary; old fingerprints keep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from experiments.cli import main
from experiments.config import ConfigError, resolve_config
from experiments.run_identity import semantic_config
from experiments.trained_run import read_run, restore_trainer
from landscape import metrics
from optimizers.bayes.laplace import DiagLaplace, KronLaplace

CONFIG = """
name = "lap"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits-image"
limit_train = 160
limit_test = 60
[model]
name = "lenet5-digits"
[train]
epochs = 1
batch_size = 64
lr = 0.05
optimizer_defaults = { momentum = 0.9 }
[[methods]]
name = "kron"
optimizer = "sgd"
laplace = { kind = "kron" }
[[methods]]
name = "kron_layers"
optimizer = "sgd"
laplace = { kind = "kron", prior_precision = "optimize_layerwise" }
[[methods]]
name = "diag_mc"
optimizer = "sgd"
laplace = { kind = "diag", prior_precision = 3.0, predictive = "mc", samples = 3 }
[evaluation]
metrics = ["accuracy", "nll", "ece", "brier"]
batch_size = 100
sharpness = []
"""

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lap")
    (tmp / "lap.toml").write_text(CONFIG)
    assert main(["run", str(tmp / "lap.toml"), f"out_dir={tmp / 'out'}"]) == 0
    return tmp / "out" / "lap"


def _restored(run_dir: Path):
    trainer = restore_trainer(read_run(run_dir), torch.device("cpu"))
    return trainer.model, trainer.data


def _batches(x, y, bs=100):
    return [(x[i : i + bs], y[i : i + bs]) for i in range(0, len(x), bs)]


def _check(results: dict, probs: torch.Tensor, y: torch.Tensor) -> None:
    ref = metrics.evaluate(probs, y, n_bins=15)
    for k in ("accuracy", "nll", "ece", "brier"):
        assert results["metrics"][f"bma_{k}"] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k


def test_kron_laplace_row_is_kron_laplace_of_the_checkpoint(runs):
    results = json.loads((runs / "kron" / "seed0" / "results.json").read_text())
    model, data = _restored(runs / "kron" / "seed0")
    convs = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    names = [n for n, _ in model.named_parameters() if n.rpartition(".")[0] in convs]
    la = KronLaplace(model, nn.CrossEntropyLoss(), _batches(data.x_train, data.y_train), params=names)
    delta = la.optimize_prior_precision()
    lap = results["details"]["laplace"]
    assert lap["prior_precision_used"] == pytest.approx(delta, rel=1e-9)
    assert lap["log_marginal_likelihood"] == pytest.approx(la.log_marginal_likelihood(), rel=1e-10)
    assert lap["num_params"] == sum(p.numel() for p in model.parameters())  # LeNet-5: all conv/linear
    _check(results, la.predictive(data.x_test), data.y_test)
    # the point metrics stay the trained network's
    with torch.no_grad():
        point = metrics.evaluate(torch.softmax(model(data.x_test), 1), data.y_test, n_bins=15)
    assert results["metrics"]["nll"] == pytest.approx(point["nll"], rel=1e-10)


def test_layerwise_prior_row_records_one_fitted_precision_per_block(runs):
    results = json.loads((runs / "kron_layers" / "seed0" / "results.json").read_text())
    model, data = _restored(runs / "kron_layers" / "seed0")
    la = KronLaplace(model, nn.CrossEntropyLoss(), _batches(data.x_train, data.y_train))
    delta = la.optimize_prior_precision(layerwise=True)
    lap = results["details"]["laplace"]
    assert lap["prior_groups"] == [n for n, _ in model.named_parameters()] == la.prior_groups
    assert lap["prior_precision_used"] == pytest.approx(delta.tolist(), rel=1e-9)
    assert lap["log_marginal_likelihood"] == pytest.approx(la.log_marginal_likelihood(), rel=1e-10)
    _check(results, la.predictive(data.x_test), data.y_test)


def test_diag_laplace_weight_samples_row(runs):
    results = json.loads((runs / "diag_mc" / "seed0" / "results.json").read_text())
    model, data = _restored(runs / "diag_mc" / "seed0")
    la = DiagLaplace(model, nn.CrossEntropyLoss(), _batches(data.x_train, data.y_train), 3.0)
    probs = la.bayesian_model_average(
        model, data.x_test, samples=3, generator=torch.Generator().manual_seed(0)
    )
    _check(results, probs, data.y_test)
    assert results["details"]["laplace"]["prior_precision_used"] == 3.0


def _cfg(**laplace) -> dict:
    return {
        "name": "x",
        "data": {"name": "digits"},
        "model": {"name": "mlp"},
        "methods": [{"name": "m", "optimizer": "sgd", "laplace": laplace}],
    }


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"prior_precision": -1.0}, 'prior_precision must be a number > 0, "optimize"'),
        ({"prior_precision": "auto"}, 'prior_precision must be a number > 0, "optimize"'),
        ({"kind": "full"}, r"laplace.kind must be one of \['kron', 'diag'\]"),
        ({"predictive": "nn"}, r"laplace.predictive must be one of \['glm', 'mc'\]"),
        ({"samples": 0}, "laplace.samples must be >= 1"),
        ({"kind": "kron", "priors": 1.0}, "unknown config key 'methods\\[0\\].laplace.priors'"),
    ],
)
def test_bad_laplace_tables_are_refused(table, match):
    with pytest.raises(ConfigError, match=match):
        resolve_config(_cfg(**table))


def test_laplace_table_defaults_combination_and_fingerprint():
    cfg = resolve_config(_cfg(kind="diag", prior_precision=2))
    assert cfg["methods"][0]["laplace"] == {
        "kind": "diag",
        "prior_precision": 2.0,
        "predictive": "glm",
        "link": "probit",
        "samples": 32,
    }
    bad = _cfg(kind="kron")
    bad["methods"][0]["mc_dropout"] = {"samples": 3}
    with pytest.raises(ConfigError, match="combines mc_dropout and laplace"):
        resolve_config(bad)
    # a method without the table hashes as before the key existed (tests/test_run_identity.py
    # compares the fingerprints of stored run directories byte for byte)
    plain = resolve_config({**_cfg(), "methods": [{"name": "m", "optimizer": "sgd"}]})
    assert plain["methods"][0]["laplace"] == {}
    assert "laplace" not in semantic_config(plain)["methods"][0]
    assert "laplace" in semantic_config(cfg)["methods"][0]


def test_experiments_page_shows_the_laplace_rows(runs):
    """The dashboard's Experiments page (``app/pages/5_Experiments.py``) tabulates the Laplace rows:
    their ``bma_*`` cells are the runs' ``metrics.json`` values (one seed: the value, 4 digits)."""
    import sys

    from streamlit.testing.v1 import AppTest

    app = Path(__file__).resolve().parents[1] / "app"
    sys.path.insert(0, str(app))
    from dashboard import experiments_groups as eg

    root = runs.parent
    at = AppTest.from_file(str(app / "pages" / "5_Experiments.py"), default_timeout=300)
    at.run()
    at.text_input(key="exp_root").set_value(str(root)).run()
    at.multiselect(key=eg.state_key("exp_metrics", root)).set_value(
        ["accuracy", "bma_accuracy", "bma_nll"]
    ).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    df = at.dataframe[0].value
    assert list(df["method"]) == ["diag_mc", "kron", "kron_layers"]
    for row, name in zip(df.to_dict("records"), ["diag_mc", "kron", "kron_layers"]):
        m = json.loads((runs / name / "seed0" / "metrics.json").read_text())
        assert row["bma_accuracy"] == f"{m['bma_accuracy']:.4g}"
        assert row["bma_nll"] == f"{m['bma_nll']:.4g}"
