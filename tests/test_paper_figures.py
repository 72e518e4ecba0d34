"""The papers' figures from run directories (``experiments.paper_figures``) against hand
computations on tiny digits runs trained here: FSAM Fig. 4's curve equals a direct evaluation of
the checkpoint's network at ``w + alpha g/||g||``; flat-BNN Fig. 2's bins equal numpy binning of the
stored probabilities (and the runs' own ECE); flat-BNN Fig. 1's centre equals the loss of the SWAG
sample rebuilt by hand from the checkpoint's moments (Maddox et al. 2019, eq. 1 with the
"paper" convention) and its samples are reproducible from the seed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from experiments.cli import main
from experiments.config import load_config
from experiments.data import prepare_data
from landscape.models import model_factory
from sharpscape.command import main as sharpscape_main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ALPHAS = [0.1, 0.5, 1.0, 2.0]
SUBSET = 100
CONFIG = f"""
name = "pf"
seeds = [0]
device = "cpu"
threads = 1
progress = false
precision = "float64"
[data]
name = "digits"
limit_train = 120
limit_test = 150
[model]
name = "mlp"
kwargs = {{ sizes = [64, 12, 10], activation = "tanh" }}
[train]
epochs = 2
batch_size = 60
lr = 0.2
schedule = "constant"
[[methods]]
name = "sgd"
optimizer = "sgd"
[[methods]]
name = "fsam"
optimizer = "fsam"
hyperparameters = {{ rho = 0.1, eta = 1.0 }}
[[methods]]
name = "swag"
optimizer = "sgd"
swag = {{ rank = 3, start_epoch = 0, samples = 4 }}
[[methods]]
name = "f_swag"
optimizer = "sam"
hyperparameters = {{ rho = 0.05 }}
swag = {{ rank = 3, start_epoch = 0, samples = 4, scale = 0.5 }}
[evaluation]
every = 0
sharpness = ["perturbation_robustness"]
sharpness_subset = {SUBSET}
save_predictions = true
sharpness_options = {{ perturbation_robustness = {{ alphas = {ALPHAS}, noise_samples = 1 }} }}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Four tiny runs (SGD, FSAM, SWAG, F-SWAG: 2 epochs of 2 steps), trained once for the module."""
    tmp = tmp_path_factory.mktemp("paper_figures")
    cfg = tmp / "pf.toml"
    cfg.write_text(CONFIG)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["run", str(cfg), f"out_dir={tmp / 'runs'}"]) == 0
    finally:
        torch.set_num_threads(old)
    return tmp / "runs" / "pf"


def _cfg(run_dir: Path) -> dict:
    return load_config(run_dir / "config.toml")


def _network(run_dir: Path) -> tuple[nn.Module, dict]:
    """The run's MLP with the checkpoint's weights, built by hand (float64)."""
    blob = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
    model.load_state_dict(blob["model"])
    return model.eval(), blob


def _subset_indices(n: int, k: int) -> torch.Tensor:
    """The runner's sharpness subset: the first k of a permutation seeded with SUBSET_SEED."""
    from experiments.data import SUBSET_SEED

    if k >= n:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(SUBSET_SEED))[:k].sort().values


def _figure(name: str, *args: str, out: Path) -> dict:
    assert main(["figure", name, *args, "--out", str(out), "--no-progress"]) == 0
    assert (out / f"{name}.png").stat().st_size > 10_000
    return json.loads((out / f"{name}.json").read_text())


def test_fsam_fig4_curve_equals_direct_evaluation_at_w_plus_alpha_unit_gradient(runs, tmp_path):
    data = _figure("fsam_fig4", str(runs / "sgd"), str(runs / "fsam"), out=tmp_path)
    assert [c["label"] for c in data["curves"]] == ["sgd", "fsam"]
    assert data["config"]["figure"] == "fsam_fig4"
    for curve in data["curves"]:
        run_dir = runs / curve["label"] / "seed0"
        model, _ = _network(run_dir)
        d = prepare_data(_cfg(run_dir), 0)
        idx = _subset_indices(len(d.y_train), SUBSET)
        x, y = d.x_train[idx].double(), d.y_train[idx]
        params = list(model.parameters())
        loss = nn.functional.cross_entropy(model(x), y)
        g = parameters_to_vector(torch.autograd.grad(loss, params)).detach()
        loss = loss.detach()
        w = parameters_to_vector(params).detach().clone()
        assert curve["alphas"] == ALPHAS
        for a, acc, lo in zip(ALPHAS, curve["adversarial_accuracy"], curve["adversarial_loss"]):
            vector_to_parameters(w + a * g / g.norm(), params)
            with torch.no_grad():
                out = model(x)
            assert acc == pytest.approx(float((out.argmax(1) == y).double().mean()), abs=1e-12)
            assert lo == pytest.approx(float(nn.functional.cross_entropy(out, y)), rel=1e-9)
        vector_to_parameters(w, params)
        assert curve["loss_unperturbed"] == pytest.approx(float(loss), rel=1e-9)
        assert curve["adversarial_accuracy_stderr"] == [None] * len(ALPHAS)  # one seed: no error bar


def _numpy_bins(p: np.ndarray, y: np.ndarray, n_bins: int = 20) -> tuple[np.ndarray, ...]:
    """Guo et al. (2017) bins ((k-1)/n, k/n] of the top-label confidence, written with numpy."""
    conf, pred = p.max(axis=1), p.argmax(axis=1)
    b = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    count = np.bincount(b, minlength=n_bins)
    csum = np.bincount(b, weights=conf, minlength=n_bins)
    asum = np.bincount(b, weights=(pred == y).astype(float), minlength=n_bins)
    with np.errstate(invalid="ignore"):
        return count, csum / count, asum / count


def test_flatbnn_fig2_bins_equal_numpy_binning_of_the_stored_probabilities(runs, tmp_path):
    data = _figure("flatbnn_fig2", str(runs / "swag"), str(runs / "f_swag"), str(runs / "sgd"), out=tmp_path)
    assert [(p["label"], p["predictive"]) for p in data["panels"]] == [
        ("swag", "bma"), ("f_swag", "bma"), ("sgd", "point")
    ]  # fmt: skip
    for panel in data["panels"]:
        run_dir = runs / panel["label"] / "seed0"
        with np.load(run_dir / "predictions.npz", allow_pickle=False) as z:
            p, y = z[panel["predictive"]], z["labels"]
        assert p.shape == (150, 10)
        count, conf, acc = _numpy_bins(p, y)
        np.testing.assert_array_equal(panel["count"], count)
        full = count > 0
        np.testing.assert_allclose(np.array(panel["confidence"], dtype=float)[full], conf[full], rtol=1e-12)
        np.testing.assert_allclose(np.array(panel["accuracy"], dtype=float)[full], acc[full], rtol=1e-12)
        assert all(v is None for v, n in zip(panel["gap"], count) if n == 0)
        ece = float(np.sum(count[full] / count.sum() * np.abs(conf[full] - acc[full])))
        assert panel["ece"] == pytest.approx(ece, rel=1e-12)
        metrics = json.loads((run_dir / "metrics.json").read_text())
        key = "bma_ece" if panel["predictive"] == "bma" else "ece"
        assert panel["ece"] == pytest.approx(metrics[key], rel=1e-12)  # the runner's own ECE
    # the model average is not the point prediction: two different predictives were binned
    with np.load(runs / "swag" / "seed0" / "predictions.npz", allow_pickle=False) as z:
        assert np.abs(z["bma"] - z["point"]).max() > 1e-4


def _swag_sample_by_hand(opt_state: dict, scale: float, gen: torch.Generator) -> torch.Tensor:
    """Maddox et al. (2019) eq. 1, "paper" convention: mean + scale (sd z1 / sqrt 2 + D z2 / sqrt(2(K-1)))."""
    mean, sq = opt_state["mean"].double(), opt_state["sq_mean"].double()
    devs = torch.stack(list(opt_state["devs"]), dim=1).double()
    k = devs.shape[1]
    sd = (sq - mean**2).clamp_min(1e-30).sqrt()
    z1 = torch.randn(mean.shape, generator=gen, dtype=torch.float64)
    z2 = torch.randn((k,), generator=gen, dtype=torch.float64)
    return mean + scale * (sd * z1 / math.sqrt(2) + devs @ z2 / math.sqrt(2 * (k - 1)))


def test_flatbnn_fig1_centre_is_the_loss_of_the_hand_drawn_swag_sample_and_seeded(runs, tmp_path):
    args = [str(runs / "swag"), str(runs / "f_swag"), "--samples", "2", "--grid", "3", "--subset", "64"]
    data = _figure("flatbnn_fig1", *args, "--seed", "5", out=tmp_path / "a")
    assert [(p["label"], p["sample"]) for p in data["panels"]] == [
        ("swag", 0), ("swag", 1), ("f_swag", 0), ("f_swag", 1)
    ]  # fmt: skip
    assert data["coords"] == [-1.0, 0.0, 1.0]
    for label, scale in (("swag", 1.0), ("f_swag", 0.5)):
        run_dir = runs / label / "seed0"
        model, blob = _network(run_dir)
        assert blob["optimizer"]["n_collected"] >= 2
        d = prepare_data(_cfg(run_dir), 0)
        gen = torch.Generator().manual_seed(5)
        mean = blob["optimizer"]["mean"].double()
        for panel in [p for p in data["panels"] if p["label"] == label]:
            w = _swag_sample_by_hand(blob["optimizer"], scale, gen)
            assert panel["swag"]["scale"] == scale
            assert panel["weights_norm"] == pytest.approx(float(w.norm()), rel=1e-12)
            assert panel["distance_to_mean"] == pytest.approx(float((w - mean).norm()), rel=1e-10)
            idx = torch.tensor(panel["subset_indices"])
            assert len(idx) == 64 and len(set(idx.tolist())) == 64
            vector_to_parameters(w, model.parameters())
            with torch.no_grad():
                loss = float(nn.functional.cross_entropy(model(d.x_train[idx].double()), d.y_train[idx]))
            assert panel["centre_loss"] == pytest.approx(loss, rel=1e-10)
            assert panel["loss"][1][1] == pytest.approx(loss, rel=1e-10)
            assert np.isfinite(panel["loss"]).all()
    again = _figure("flatbnn_fig1", *args[1:], "--seed", "5", out=tmp_path / "b")  # F-SWAG alone
    assert [p["weights_sha256"] for p in again["panels"]] == [p["weights_sha256"] for p in data["panels"][2:]]
    assert [p["loss"] for p in again["panels"]] == [p["loss"] for p in data["panels"][2:]]


def test_errors_name_the_config_key_and_sharpscape_dispatches_run_figures(runs, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["figure", "flatbnn_fig1", str(runs / "sgd"), "--out", str(tmp_path)])
    assert exc.value.code == 2
    assert "methods.<name>.swag" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["figure", "fsam_fig4", str(runs / "sgd"), "--measure", "lambda_max", "--out", str(tmp_path)])
    assert "evaluation.sharpness" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["figure", "flatbnn_fig1", str(runs / "swag"), "--grid", "4", "--out", str(tmp_path)])
    assert "grid must be odd" in capsys.readouterr().err
    assert (
        sharpscape_main(["figures", "flatbnn_fig2", "--runs", str(runs / "sgd"), "--out", str(tmp_path)]) == 0
    )
    data = json.loads((tmp_path / "flatbnn_fig2.json").read_text())
    metrics = json.loads((runs / "sgd" / "seed0" / "metrics.json").read_text())
    assert data["panels"][0]["ece"] == pytest.approx(metrics["ece"], rel=1e-12)
    assert data["config"]["runs"] == [str(runs / "sgd" / "seed0")]
