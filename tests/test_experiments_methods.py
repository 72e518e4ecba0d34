"""VOGN, SGVB / F-SGVB and MC-Dropout as methods of the experiment runner, against hand-written
loops: the runner's steps equal the optimizers stepped by hand on the same batches (bit for bit in
float64), its model averages equal hand-drawn weight samples / dropout masks from the same seeds,
a crashed SGVB run resumes bit-identically (the Bayesian layers' noise generator is checkpointed),
and bad combinations end in a ConfigError naming the fix."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import experiments.train as train_mod
from experiments.cli import main
from experiments.config import ConfigError, load_config
from experiments.evaluate import evaluate_run
from experiments.parallel import DistContext
from experiments.train import BAYES_SEED_OFFSET, OPT_SEED_OFFSET, Trainer
from landscape.data import load_digits
from landscape.models import model_factory
from optimizers import VOGN, FlatSGVB, convert_to_bayesian, mc_dropout_predict
from optimizers.bayes import kl_divergence
from optimizers.bayes.sgvb import bayes_layers
from tests.runner_helpers import cpu_trainer, planned_run

CONFIG = """
name = "bm"
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
batch_size = 512
lr = 0.2
schedule = "constant"
[[methods]]
name = "m"
optimizer = "sgd"
[evaluation]
every = 0
sharpness = []
bma_samples = 3
"""

SIZES = [64, 12, 10]
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def trainer(tmp: Path, *overrides: str, ctx: DistContext | None = None) -> Trainer:
    path = tmp / "bm.toml"
    path.write_text(CONFIG)
    cfg = load_config(path, [f"out_dir={tmp / 'runs'}", *overrides])
    return cpu_trainer(planned_run(cfg), seed=0, ctx=ctx, fingerprint="m")


def batches(n: int, bs: int, epochs: int, seed: int = 0):
    """The runner's data order: ``randperm(n)`` per epoch from a generator seeded with the seed."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen)
        for i in range(0, n, bs):
            yield perm[i : i + bs]


def scores(probs: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    p, t = probs.double().numpy(), y.numpy()
    return float((p.argmax(1) == t).mean()), float(-np.log(p[np.arange(len(t)), t]).mean())


def test_vogn_steps_equal_vogn_stepped_by_hand_and_its_bma_uses_the_posterior(tmp_path):
    hyper = "methods.m.hyperparameters={lr = 0.01, mc_samples = 2, prior_precision = 10.0}"
    t = trainer(tmp_path, "methods.m.optimizer=vogn", hyper, "train.batch_size=128")
    t.fit()
    x, y = load_digits("train", dtype=torch.float64)
    model = model_factory("mlp", sizes=SIZES, activation="tanh", seed=0).double()
    opt = VOGN(  # model=: the per-example moments of one backward pass, as the runner's VOGN
        model.parameters(),
        lr=0.01,
        num_data=len(y),
        mc_samples=2,
        prior_precision=10.0,
        seed=OPT_SEED_OFFSET,
        model=model,
    )
    for idx in batches(len(y), 128, 1):
        opt.step(lambda idx=idx: F.cross_entropy(model(x[idx]), y[idx], reduction="none"))
    assert t.counters["step"] == math.ceil(len(y) / 128) == 12
    for (name, a), b in zip(t.model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    for a, b in zip(t.model.parameters(), model.parameters()):
        assert torch.equal(t.opt.state[a]["s"], opt.state[b]["s"])
    # BMA: three weight samples w = mu + sigma z with VOGN's posterior std, z from the seed-7 generator
    metrics, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=7, device=CPU)
    gen = torch.Generator().manual_seed(7)
    std = opt.posterior_std()
    xt, yt = load_digits("test", dtype=torch.float64)
    avg = torch.zeros(len(yt), 10, dtype=torch.float64)
    mu = [p.detach().clone() for p in model.parameters()]
    for _ in range(3):
        with torch.no_grad():
            for p, m in zip(model.parameters(), mu):
                p.copy_(m + std[p] * torch.randn(p.shape, generator=gen, dtype=p.dtype))
            avg += torch.softmax(model(xt), 1) / 3
    acc, nll = scores(avg, yt)
    assert metrics["bma_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert metrics["bma_nll"] == pytest.approx(nll, rel=1e-12)


def bayes_model(seed: int = 0, **kw) -> nn.Module:
    base = model_factory("mlp", sizes=SIZES, activation="tanh", seed=seed).double()
    return convert_to_bayesian(base, generator=torch.Generator().manual_seed(seed + BAYES_SEED_OFFSET), **kw)


def test_flat_sgvb_steps_equal_flat_sgvb_stepped_by_hand_and_its_bma_uses_weight_samples(tmp_path):
    t = trainer(
        tmp_path,
        "methods.m.optimizer=fsgvb",
        "methods.m.hyperparameters={rho = 0.05, geometry = true}",
        "methods.m.bayesian={init_std = 0.01, prior_std = 0.5, kl_weight = 0.3}",
    )
    t.fit()
    x, y = load_digits("train", dtype=torch.float64)
    model = bayes_model(init_std=0.01, prior_std=0.5)
    opt = FlatSGVB(model, torch.optim.SGD, 0.05, num_data=len(y), geometry=True, kl_weight=0.3, lr=0.2)
    for idx in batches(len(y), 512, 1):

        def closure(idx=idx):
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])  # the NLL: FlatSGVB adds the KL itself
            loss.backward()
            return loss

        opt.step(closure)
    for (name, a), b in zip(t.model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    assert t.opt_args["kl_weight"] == 0.3 and t.opt_args["num_data"] == len(y)
    # point metrics: the mean network; BMA: weight samples mu + softplus(rho) eps drawn layer by
    # layer (weight, then bias) from the evaluation seed, on a plain MLP holding the sampled weights
    metrics, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=3, device=CPU)
    xt, yt = load_digits("test", dtype=torch.float64)
    plain = model_factory("mlp", sizes=SIZES, activation="tanh").double()
    linears = [m for m in plain.modules() if isinstance(m, nn.Linear)]
    layers = bayes_layers(model)

    def load(sample: bool, gen: torch.Generator | None = None) -> None:
        with torch.no_grad():
            for lin, layer in zip(linears, layers):
                for target, (mu, rho) in zip((lin.weight, lin.bias), layer.mean_std_pairs()):
                    eps = torch.randn(mu.shape, generator=gen, dtype=mu.dtype) if sample else 0
                    target.copy_(mu + F.softplus(rho) * eps if sample else mu)

    load(False)
    acc, nll = scores(torch.softmax(plain(xt), 1).detach(), yt)
    assert metrics["accuracy"] == pytest.approx(acc, abs=1e-12) and metrics["nll"] == pytest.approx(nll)
    gen = torch.Generator().manual_seed(3)
    avg = torch.zeros(len(yt), 10, dtype=torch.float64)
    for _ in range(3):
        load(True, gen)
        with torch.no_grad():
            avg += torch.softmax(plain(xt), 1) / 3
    acc, nll = scores(avg, yt)
    assert metrics["bma_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert metrics["bma_nll"] == pytest.approx(nll, rel=1e-12)
    assert metrics["bma_nll"] != pytest.approx(metrics["nll"], rel=1e-6)  # the samples differ from the mean


def test_sgvb_with_sgd_minimises_the_elbo_by_hand_and_resumes_bit_identically(tmp_path):
    cfg = tmp_path / "bm.toml"
    cfg.write_text(
        CONFIG.replace("epochs = 1", "epochs = 3").replace("batch_size = 512", "batch_size = 256")
        + "[methods.bayesian]\nlocal_reparam = true\nkl_weight = 0.5\n"
    )
    args = lambda out: ["run", str(cfg), f"out_dir={out}"]  # noqa: E731
    assert main(args(tmp_path / "a")) == 0

    def crash(step: int) -> None:
        if step == 10:  # mid-epoch 2 of 3 (6 steps per epoch)
            raise RuntimeError("simulated crash")

    train_mod.STEP_HOOK = crash
    try:
        with pytest.raises(SystemExit):
            main(args(tmp_path / "b"))
    finally:
        train_mod.STEP_HOOK = None
    run_b = tmp_path / "b" / "bm" / "m" / "seed0"
    assert torch.load(run_b / "checkpoint.pt", weights_only=True)["counters"]["epoch"] == 1
    assert main(args(tmp_path / "b")) == 0
    a = torch.load(tmp_path / "a" / "bm" / "m" / "seed0" / "checkpoint.pt", weights_only=True)
    b = torch.load(run_b / "checkpoint.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"]
    )
    # by hand: SGVB-LRT, SGD on the negative ELBO per datum nll + kl_weight KL / N (3 epochs)
    x, y = load_digits("train", dtype=torch.float64)
    model = bayes_model(local_reparam=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    for idx in batches(len(y), 256, 3):
        opt.zero_grad()
        (F.cross_entropy(model(x[idx]), y[idx]) + 0.5 * kl_divergence(model) / len(y)).backward()
        opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(a["model"][k], v), k


def test_mc_dropout_trains_with_seeded_masks_and_predicts_with_the_mc_average(tmp_path):
    t = trainer(
        tmp_path,
        "model.kwargs={sizes = [64, 12, 10], activation = 'tanh', dropout = 0.3}",
        "methods.m.mc_dropout={samples = 5}",
        "evaluation.batch_size=150",
    )
    t.fit()
    # training: SGD with dropout masks from torch's global RNG seeded with the run's seed
    x, y = load_digits("train", dtype=torch.float64)
    model = model_factory("mlp", sizes=SIZES, activation="tanh", dropout=0.3, seed=0).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for idx in batches(len(y), 512, 1):
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    for (name, a), b in zip(t.model.named_parameters(), model.parameters()):
        assert torch.equal(a, b), name
    before = torch.get_rng_state()
    metrics, details = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=11, device=CPU)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG is untouched
    # the predictive by hand: eval mode with dropout on, the global RNG seeded with 11, 5 passes
    # over the test set in batches of 150
    xt, yt = load_digits("test", dtype=torch.float64)
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    total = torch.zeros(len(yt), 10, dtype=torch.float64)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(11)
        for _ in range(5):
            total += torch.cat([torch.softmax(model(xt[i : i + 150]), 1) for i in range(0, len(yt), 150)])
    acc, nll = scores(total / 5, yt)
    assert metrics["bma_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert metrics["bma_nll"] == pytest.approx(nll, rel=1e-12)
    # one batch holding the whole set: the library's mc_dropout_predict with the same seed
    t.cfg["evaluation"]["batch_size"] = 1000
    metrics_one, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=11, device=CPU)
    acc, nll = scores(mc_dropout_predict(model, xt, 5, seed=11), yt)
    assert metrics_one["bma_nll"] == pytest.approx(nll, rel=1e-12)
    model.eval()
    point_acc, point_nll = scores(torch.softmax(model(xt), 1).detach(), yt)  # dropout off
    assert metrics["nll"] == pytest.approx(point_nll, rel=1e-12) and metrics["bma_nll"] != pytest.approx(
        point_nll
    )


BAD = [
    (["methods.m.optimizer=vogn", "precision=fp16"], "fp16 loss scaling cannot be applied"),
    (["methods.m.optimizer=fsgvb"], "trains Bayesian layers: add a bayesian table"),
    (
        [
            "methods.m.optimizer=fsgvb",
            "methods.m.bayesian={init_std = 0.01}",
            "methods.m.hyperparameters={kl_weight = 2.0}",
        ],
        "in the method's bayesian table",
    ),  # fmt: skip
    (["methods.m.optimizer=bsam", "methods.m.bayesian={kl_weight = 1.0}"], "learns a posterior of its own"),
    (["methods.m.optimizer=ivon", "methods.m.mc_dropout={samples = 3}"], "learns a posterior of its own"),
    (["methods.m.optimizer=sgvb"], 'with a bayesian table: optimizer = "adam"'),
    (["methods.m.optimizer=mc_dropout"], "mc_dropout = { samples = 30 }"),
    (["methods.m.optimizer=deep_ensemble"], "ensemble = { members = 5 }"),
    (["methods.m.mc_dropout={samples = 3}", "methods.m.ensemble={members = 2}"], "at most one of swag"),
    (["methods.m.mc_dropout={samples = 0}"], "mc_dropout.samples must be >= 1"),
    (["methods.m.bayesian={prior_std = -1.0}"], "prior_std and init_std must be > 0"),
    (["methods.m.bayesian={prior = 1.0}"], "unknown config key 'methods[0].bayesian.prior'"),
    (["methods.m.mc_dropout={samples = 3}"], "set model.kwargs.dropout = 0.1"),
    (
        ["methods.m.optimizer=vogn", "model.kwargs={sizes = [64, 12, 10], norm = 'batch'}"],
        'model.kwargs.norm = "group" or "none"',
    ),  # fmt: skip
]


@pytest.mark.parametrize("overrides,fragment", BAD)
def test_bad_method_combinations_name_the_fix(tmp_path, overrides, fragment):
    with pytest.raises(ConfigError) as exc:
        trainer(tmp_path, *overrides)
    assert fragment in str(exc.value)


def test_data_parallel_refusals_come_before_any_collective(tmp_path):
    dp = DistContext(rank=0, world=2, mode="data_parallel")
    with pytest.raises(ConfigError, match='use distributed.mode = "grid"'):
        trainer(tmp_path, "methods.m.optimizer=vogn", ctx=dp)
    local = DistContext(rank=0, world=2, mode="data_parallel", perturbation="local")
    with pytest.raises(ConfigError, match='perturbation = "local": per-device perturbations'):
        trainer(
            tmp_path,
            "methods.m.optimizer=sam",
            "distributed.perturbation=local",
            "distributed.sync_batchnorm=true",
            "model.kwargs={sizes = [64, 12, 10], norm = 'batch'}",
            ctx=local,
        )


def test_the_cli_reports_a_bad_combination_in_one_line(tmp_path, capsys):
    path = tmp_path / "bm.toml"
    path.write_text(CONFIG)
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path), f"out_dir={tmp_path}", "methods.m.optimizer=vogn", "precision=fp16"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: method 'm' (vogn)") and "bf16" in err[0]


def test_fingerprints_of_configs_without_the_new_keys_are_unchanged():
    """Runs fingerprinted before the method tables, sync_batchnorm, train.min_lr,
    train.divergence_factor, train.compile, train.log_every and the SWAG sampling convention existed
    are still recognised:
    the hash of a resolved config equals sha256 of the JSON of the same config without those keys
    (the earlier formula), and a configuration that uses one of them hashes differently."""
    import copy
    import hashlib
    import json

    from experiments.config import resolve_config
    from experiments.run_identity import fingerprint

    cfg = resolve_config({"methods": [{"optimizer": "sam", "swag": {"rank": 3}}]})
    earlier = copy.deepcopy(cfg)
    del earlier["distributed"]["sync_batchnorm"]
    del earlier["train"]["min_lr"]
    del earlier["data"]["allow_test_as_train"]
    del earlier["train"]["divergence_factor"]
    del earlier["train"]["compile"]
    del earlier["train"]["log_every"]
    del earlier["methods"][0]["swag"]["convention"]
    for key in ("collect_every", "evaluate"):
        del earlier["methods"][0]["swag"][key]
    for key in ("logits", "checkpoint", "checkpoint_strict", "checkpoint_sha256"):
        del earlier["model"][key]
    for key in ("autoaugment", "cutout"):
        del earlier["data"][key]
    del earlier["evaluation"]["save_predictions"]
    del earlier["slurm"]  # how a run is submitted: never part of its identity
    for key in ("bayesian", "mc_dropout", "ensemble", "laplace"):
        del earlier["methods"][0][key]
    keep = {
        k: v
        for k, v in earlier.items()
        if k not in ("progress", "out_dir", "device", "threads", "paper", "name")
    }
    text = json.dumps(keep, sort_keys=True, default=str)
    assert fingerprint(cfg, training_only=False) == hashlib.sha256(text.encode()).hexdigest()[:16]
    other = resolve_config({"methods": [{"optimizer": "sam", "mc_dropout": {"samples": 2}}]})
    synced = resolve_config(
        {"methods": [{"optimizer": "sam", "swag": {"rank": 3}}], "distributed": {"sync_batchnorm": True}}
    )
    annealed = resolve_config(
        {"methods": [{"optimizer": "sam", "swag": {"rank": 3}}], "train": {"min_lr": 0.01}}
    )
    coded = resolve_config({"methods": [{"optimizer": "sam", "swag": {"rank": 3, "convention": "code"}}]})
    unguarded = resolve_config(
        {"methods": [{"optimizer": "sam", "swag": {"rank": 3}}], "train": {"divergence_factor": 0}}
    )
    compiled = resolve_config(
        {"methods": [{"optimizer": "sam", "swag": {"rank": 3}}], "train": {"compile": "default"}}
    )
    variants = (cfg, other, synced, annealed, coded, unguarded, compiled)
    assert len({fingerprint(c, training_only=False) for c in variants}) == 7
    logged = resolve_config(
        {"methods": [{"optimizer": "sam", "swag": {"rank": 3}}], "train": {"log_every": 5}}
    )
    assert fingerprint(logged, training_only=False) == fingerprint(cfg, training_only=False)  # logging only


def test_a_misconfigured_method_is_refused_before_any_run_of_the_grid_trains(tmp_path, capsys):
    path = tmp_path / "bm.toml"
    path.write_text(CONFIG + '[[methods]]\nname = "mcd"\noptimizer = "sgd"\nmc_dropout = { samples = 4 }\n')
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path), f"out_dir={tmp_path / 'runs'}"])
    assert exc.value.code == 2
    assert "mc_dropout needs a model with dropout layers" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # the first method ('m', plain SGD) did not start
