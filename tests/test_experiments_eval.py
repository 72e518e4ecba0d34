"""The experiment runner's data and evaluation paths against hand computations: label noise (the
weights equal a hand-written SGD loop on the saved noisy labels), OOD AUROC (sklearn), CIFAR-10-C
per corruption / severity / group (synthetic files in the release's format), SWA and SWAG
collection once per epoch, batched Bayesian model averages with one set of weight samples, sweeps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from experiments.cli import main
from experiments.config import ConfigError, load_config, resolve_config
from experiments.data import SUBSET_SEED
from experiments.ensembles import predict_probs
from experiments.evaluate import _corruption_sets, _corruption_table, evaluate_run
from experiments.runner import plan_runs
from experiments.train import Trainer
from landscape import load_result
from landscape.data import load_digits
from landscape.models import model_factory
from tests.runner_helpers import cpu_trainer, planned_run

CONFIG = """
name = "ev"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
[model]
name = "mlp"
kwargs = { sizes = [64, 12, 10], activation = "tanh" }
[train]
epochs = 1
batch_size = 256
lr = 0.2
schedule = "constant"
[[methods]]
name = "sgd"
optimizer = "sgd"
[evaluation]
every = 0
sharpness = []
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def config(tmp: Path, text: str = CONFIG) -> Path:
    path = tmp / "ev.toml"
    path.write_text(text)
    return path


def trainer(tmp: Path, *overrides: str, text: str = CONFIG) -> Trainer:
    cfg = load_config(config(tmp, text), [f"out_dir={tmp / 'runs'}", *overrides])
    return cpu_trainer(planned_run(cfg), seed=0, fingerprint="e")


def probs_of(model: nn.Module, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return torch.softmax(model(x), dim=1).numpy()


def test_label_noise_is_saved_and_trained_on_and_ood_auroc_matches_sklearn(tmp_path):
    out = tmp_path / "runs"
    args = [
        "run",
        str(config(tmp_path)),
        f"out_dir={out}",
        "data.label_noise=0.3",
        'evaluation.ood="gaussian-noise"',
    ]
    assert main(args) == 0
    run = out / "ev" / "sgd" / "seed0"
    noisy = load_result(run / "noisy_labels.json")
    x, clean = load_digits("train", dtype=torch.float64)
    assert torch.equal(noisy.clean, clean) and int(noisy.flipped.sum()) == round(0.3 * len(clean))
    assert bool((noisy.labels[noisy.flipped] != clean[noisy.flipped]).all())
    assert torch.equal(noisy.labels != clean, noisy.flipped)
    # one epoch of SGD by hand on the saved noisy labels gives the run's weights
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh", seed=0).double()
    n = len(clean)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    for i in range(0, n, 256):
        idx = perm[i : i + 256]
        model.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), noisy.labels[idx]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.2 * p.grad
    saved = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.allclose(saved[k], v, rtol=0, atol=1e-13) for k, v in model.state_dict().items())
    results = json.loads((run / "results.json").read_text())
    assert results["details"]["label_noise"]["realised_rate"] == pytest.approx(round(0.3 * n) / n)
    # OOD AUROC: in-distribution test inputs (positive) vs standard-normal inputs, max-probability score
    xt, _ = load_digits("test", dtype=torch.float64)
    x_ood = torch.randn(xt.shape, generator=torch.Generator().manual_seed(SUBSET_SEED), dtype=torch.float64)
    score = np.concatenate([probs_of(model, xt).max(1), probs_of(model, x_ood).max(1)])
    truth = np.concatenate([np.ones(len(xt)), np.zeros(len(x_ood))])
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["auroc_ood_maxprob"] == pytest.approx(roc_auc_score(truth, score), abs=1e-12)


def _write_cifar10c(root: Path, names: list[str], per: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = np.tile(rng.integers(0, 10, per), 5).astype(np.int64)
    np.save(root / "labels.npy", labels)
    images = {}
    for name in names:
        images[name] = rng.integers(0, 256, (5 * per, 32, 32, 3), dtype=np.uint8)
        np.save(root / f"{name}.npy", images[name])
    return {"labels": labels, **images}


def test_cifar10c_table_matches_a_hand_computation(tmp_path):
    files = _write_cifar10c(tmp_path, ["gaussian_noise", "snow"])
    cfg = resolve_config(
        {
            "methods": [{"optimizer": "sgd"}],
            "model": {"kwargs": {"sizes": [3072, 10]}},
            "evaluation": {
                "corruptions": f"cifar10c:{tmp_path}",
                "corruption_names": ["gaussian_noise", "snow"],
                "severities": [1, 3],
            },
        }
    )
    model = model_factory("mlp", sizes=[3072, 10], seed=0)
    labels: dict[str, torch.Tensor] = {}
    sets = _corruption_sets(cfg, torch.float32, labels)
    assert sorted(sets) == ["c10c/gaussian_noise/1", "c10c/gaussian_noise/3", "c10c/snow/1", "c10c/snow/3"]
    probs = {k: predict_probs(model, get(), 1000, torch.device("cpu")) for k, get in sets.items()}
    out = _corruption_table(probs, labels, 20)
    mean = np.array([0.4914, 0.4822, 0.4465]).reshape(1, 3, 1, 1)
    std = np.array([0.2470, 0.2435, 0.2616]).reshape(1, 3, 1, 1)
    accs: dict[str, list[float]] = {}
    for name in ("gaussian_noise", "snow"):
        for s in (1, 3):
            block = slice((s - 1) * 6, s * 6)
            x = (files[name][block].transpose(0, 3, 1, 2) / 255.0 - mean) / std
            p = probs_of(model, torch.as_tensor(x, dtype=torch.float32)).astype(np.float64)
            y = files["labels"][block]
            acc = float((p.argmax(1) == y).mean())
            nll = float(-np.log(p[np.arange(6), y]).mean())
            assert out["per_corruption"][name][str(s)]["accuracy"] == pytest.approx(acc)
            assert out["per_corruption"][name][str(s)]["nll"] == pytest.approx(nll, rel=1e-5)
            accs.setdefault(name, []).append(acc)
    s = out["summary"]
    assert s["c10c_noise_accuracy"] == pytest.approx(np.mean(accs["gaussian_noise"]))
    assert s["c10c_weather_accuracy"] == pytest.approx(np.mean(accs["snow"]))
    assert s["c10c_accuracy"] == pytest.approx(np.mean(accs["gaussian_noise"] + accs["snow"]))
    assert "c10c_blur_accuracy" not in s


def test_swag_collects_once_per_epoch_and_swa_metrics_use_the_mean(tmp_path):
    t = trainer(tmp_path, "methods.sgd.swag={rank = 2, start_epoch = 1, samples = 3}", "train.epochs=4")
    snapshots = []
    for e in range(1, 5):  # fit epoch by epoch (constant learning rate) to see the epoch-end weights
        t.cfg["train"]["epochs"] = e
        t.fit()
        snapshots.append(parameters_to_vector(t.model.parameters()).detach().clone())
    assert t.opt.n_collected == 3  # epochs 2, 3 and 4 (collection starts after start_epoch = 1)
    assert torch.allclose(t.opt.mean, torch.stack(snapshots[1:]).mean(0), rtol=0, atol=1e-13)
    metrics, details = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=0, device=torch.device("cpu"))
    swa = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
    vector_to_parameters(t.opt.mean, swa.parameters())
    xt, yt = load_digits("test", dtype=torch.float64)
    assert metrics["swa_accuracy"] == pytest.approx(float((probs_of(swa, xt).argmax(1) == yt.numpy()).mean()))
    assert {"bma_accuracy", "bma_nll", "accuracy"} <= set(metrics)


def test_batched_bma_uses_one_set_of_weight_samples(tmp_path):
    t = trainer(
        tmp_path,
        "methods.sgd.optimizer=bsam",
        "methods.sgd.hyperparameters={lr = 0.5}",
        "evaluation.batch_size=100",
        "evaluation.bma_samples=5",
    )
    t.fit()
    metrics, details = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=7, device=torch.device("cpu"))
    # one call on the whole test set with the generator seeded as the run's evaluation seeds it
    whole = t.opt.bayesian_model_average(
        t.model, t.data.x_test, samples=5, generator=torch.Generator().manual_seed(7)
    )
    y = t.data.y_test.numpy()
    p = whole.double().numpy()
    assert metrics["bma_accuracy"] == pytest.approx(float((p.argmax(1) == y).mean()))
    assert metrics["bma_nll"] == pytest.approx(float(-np.log(p[np.arange(len(y)), y]).mean()), rel=1e-10)
    assert math.ceil(len(t.data.y_test) / 100) == 4  # four batches, the same five weight samples


def test_sweep_plans_every_variant_and_checks_values(tmp_path):
    text = CONFIG + '[[methods]]\nname = "sam"\noptimizer = "sam"\n'
    cfg = load_config(config(tmp_path, text), ["seeds=[0, 1]", 'sweep={"data.label_noise" = [0.2, 0.4]}'])
    runs = plan_runs(cfg)
    assert len(runs) == 8
    assert [str(r.run_dir.relative_to(Path("runs"))) for r in runs[:3]] == [
        "ev/label_noise=0.2/sgd/seed0",
        "ev/label_noise=0.2/sgd/seed1",
        "ev/label_noise=0.2/sam/seed0",
    ]
    assert {r.cfg["data"]["label_noise"] for r in runs} == {0.2, 0.4} and all(
        r.cfg["sweep"] == {} for r in runs
    )
    with pytest.raises(
        ConfigError, match=r"sweep.data.label_noise = 1.5: data.label_noise must lie in \[0, 1\)"
    ):
        load_config(config(tmp_path, text), ['sweep={"data.label_noise" = [0.2, 1.5]}'])
    with pytest.raises(ConfigError, match="cannot be swept"):
        load_config(config(tmp_path, text), ['sweep={"seeds" = [[0], [1]]}'])


def test_epoch_valued_hyperparameters_and_per_method_epochs(tmp_path):
    t = trainer(
        tmp_path,
        "methods.sgd.optimizer=fsgld",
        "methods.sgd.epochs=3",
        "budget=0.5",
        'methods.sgd.hyperparameters={lr = 0.05, burn_in = "2 epochs", collect_every = "1 epoch"}',
    )
    n = math.ceil(len(load_digits("train")[1]) * 0.5)
    assert t.n == n and t.steps_per_epoch == math.ceil(n / 256) == 3
    # the method's 3 epochs, halved by the budget: ceil(1.5) = 2 epochs, so one epoch counts 2/3
    assert t.cfg["train"]["epochs"] == 2
    assert t.opt.burn_in == round(2 * 2 / 3 * 3) == 4 and t.opt.collect_every == round(2 / 3 * 3) == 2
    t.fit()
    assert t.opt.n_steps == 6 and len(t.opt.samples) == 1  # collected after step 6 only


def test_swag_model_average_recomputes_batchnorm_statistics_per_sample(tmp_path):
    t = trainer(
        tmp_path,
        "data.name=digits-image",
        "model.name=resnet",
        "model.kwargs={in_channels = 1, width = 4, blocks = [1]}",
        "train.epochs=3",
        "methods.sgd.swag={rank = 2, start_epoch = 0, diag_only = true, samples = 3}",
        "evaluation.batch_size=4000",
    )
    t.fit()
    metrics, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=5, device=torch.device("cpu"))
    # by hand: draw each SWAG-Diag sample, set the weights, recompute every BatchNorm's statistics
    # as the exact mean / unbiased variance over the training inputs (one batch, momentum None)
    model = model_factory("resnet", in_channels=1, width=4, blocks=[1]).double()
    model.load_state_dict(t.model.state_dict())
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    gen = torch.Generator().manual_seed(5)
    avg = 0.0
    for _ in range(3):
        vector_to_parameters(t.opt.sample_weights(gen, 1.0), model.parameters())
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        model.train()
        with torch.no_grad():
            model(t.data.x_train.double())
        model.eval()
        avg = avg + probs_of(model, t.data.x_test.double()) / 3
    y = t.data.y_test.numpy()
    assert metrics["bma_nll"] == pytest.approx(float(-np.log(avg[np.arange(len(y)), y]).mean()), rel=1e-9)
    assert metrics["bma_accuracy"] == pytest.approx(float((avg.argmax(1) == y).mean()))
