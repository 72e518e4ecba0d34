"""Runner features the five papers' protocols need, against hand computations: SWAG collected every
k steps (bSAM App. G.1), SWAG and SWAG-Diag evaluated from one run (flat-seeking BNNs), the
C-1-output likelihood (bSAM App. G.1: 784-500-300-9), initial weights from a file
(``model.checkpoint``) and SGLD started from them (the flat-seeking BNN authors' code)."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

import experiments.train as train_mod
from experiments.config import ConfigError, load_config, resolve_config
from experiments.ensembles import sample_contexts
from experiments.evaluate import evaluate_run
from experiments.initial_weights import load_initial_weights, read_safetensors
from experiments.logits import append_zero_logit
from experiments.parallel import DistContext
from experiments.run_identity import fingerprint
from experiments.runner import plan_runs, run_one
from experiments.train import Trainer, build_model
from landscape.data import load_digits
from landscape.models import model_factory
from optimizers.bayes.swag import SWAG
from tests.runner_helpers import cpu_trainer, planned_run

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CPU = torch.device("cpu")
CONFIG = """
name = "pp"
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


def _cfg(tmp: Path, *overrides: str) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "pp.toml"
    path.write_text(CONFIG)
    return load_config(path, [f"out_dir={tmp / 'runs'}", *overrides])


def _trainer(tmp: Path, *overrides: str) -> Trainer:
    return cpu_trainer(planned_run(_cfg(tmp, *overrides)), seed=0, fingerprint="pp")


def _flat(model) -> torch.Tensor:
    return parameters_to_vector(model.parameters()).detach().clone()


@pytest.fixture
def record_weights(monkeypatch):
    """``weights[k]``: the weights after ``k`` optimizer steps (the runner's STEP_HOOK runs before
    step ``k + 1`` with ``k`` steps done)."""
    weights: dict[int, torch.Tensor] = {}
    holder: dict = {}

    def hook(step: int) -> None:
        weights[step] = _flat(holder["model"])

    monkeypatch.setattr(train_mod, "STEP_HOOK", hook)
    return weights, holder


# ----------------------------------------------------------------------- 1. SWAG every k steps
def test_swag_collects_every_k_steps_the_hand_moments(tmp_path, record_weights):
    weights, holder = record_weights
    t = _trainer(
        tmp_path,
        "methods.sgd.swag={rank = 2, start_epoch = 1, collect_every = 3, samples = 2}",
        "train.epochs=3",
    )
    holder["model"] = t.model
    spe = t.steps_per_epoch
    assert spe == math.ceil(len(t.data.y_train) / 256) == 6  # 1,438 digits, batch 256
    t.fit()
    total = 3 * spe
    weights[total] = _flat(t.model)
    steps = [s for s in range(spe + 1, total + 1) if (s - spe) % 3 == 0]  # after epoch 1, every 3rd
    assert steps == [9, 12, 15, 18] and t.opt.n_collected == 4 and t.opt.config["collect_every"] == 3
    w = torch.stack([weights[s] for s in steps])
    torch.testing.assert_close(t.opt.mean, w.mean(0), rtol=0, atol=1e-14)
    torch.testing.assert_close(t.opt.sq_mean, w.square().mean(0), rtol=0, atol=1e-14)
    running = torch.cumsum(w, 0) / torch.arange(1, 5, dtype=w.dtype)[:, None]
    torch.testing.assert_close(t.opt.deviations, (w - running)[-2:].T, rtol=0, atol=1e-13)
    # collect_every = 0 (the default): once per epoch, as before
    t0 = _trainer(tmp_path / "b", "methods.sgd.swag={rank = 2, start_epoch = 1}", "train.epochs=3")
    assert t0.opt.config["collect_every"] == spe


def test_swag_keys_are_checked_and_old_fingerprints_kept():
    base = {"methods": [{"optimizer": "sgd", "swag": {"rank": 3}}]}
    cfg = resolve_config(base)
    assert cfg["methods"][0]["swag"]["collect_every"] == 0 and cfg["methods"][0]["swag"]["evaluate"] == []
    older = copy.deepcopy(cfg)  # a config from before these keys: the same fingerprint
    for key in ("collect_every", "evaluate"):
        del older["methods"][0]["swag"][key]
    for key in ("logits", "checkpoint", "checkpoint_strict", "checkpoint_sha256"):
        del older["model"][key]
    assert fingerprint(older, training_only=False) == fingerprint(cfg, training_only=False)
    for swag in ({"rank": 3, "collect_every": 5}, {"rank": 3, "evaluate": ["swag", "swag_diag"]}):
        other = resolve_config({"methods": [{"optimizer": "sgd", "swag": swag}]})
        assert fingerprint(other, training_only=False) != fingerprint(cfg, training_only=False)
    c1 = resolve_config({**base, "model": {"logits": "c-1"}})
    assert fingerprint(c1, training_only=True) != fingerprint(cfg, training_only=True)
    for swag, match in (
        ({"collect_every": -1}, "collect_every must be >= 0"),
        ({"evaluate": ["swag", "swa"]}, "distinct posteriors among"),
        ({"evaluate": ["swag_diag", "swag_diag"]}, "distinct posteriors among"),
        ({"diag_only": True, "evaluate": ["swag"]}, "set diag_only = false"),
    ):
        with pytest.raises(ConfigError, match=match):
            resolve_config({"methods": [{"optimizer": "sgd", "swag": swag}]})
    with pytest.raises(ConfigError, match="model.logits must be one of"):
        resolve_config({**base, "model": {"logits": "c-2"}})
    with pytest.raises(ConfigError, match="64 hex digits"):
        resolve_config({**base, "model": {"checkpoint": "w.pt", "checkpoint_sha256": "abc"}})


# ------------------------------------------------------------- 2. SWAG and SWAG-Diag, one run
def _swag_with_moments(p: int = 5, k: int = 4) -> tuple[torch.nn.Module, SWAG]:
    model = torch.nn.Linear(p - 1, 1).double()
    swag = SWAG(torch.optim.SGD(model.parameters(), lr=0.1), rank=k)
    gen = torch.Generator().manual_seed(3)
    for _ in range(6):
        vector_to_parameters(torch.randn(p, generator=gen, dtype=torch.float64) * 2, model.parameters())
        swag.collect()
    vector_to_parameters(torch.zeros(p, dtype=torch.float64), model.parameters())
    return model, swag


def _drawn(model, contexts) -> torch.Tensor:
    out = []
    for make in contexts:
        with make():
            out.append(_flat(model))
    return torch.stack(out)


def test_swag_diag_samples_follow_the_hand_formula_and_the_diagonal_covariance():
    model, swag = _swag_with_moments()
    mean, sd, dev = swag.mean, swag.variance.sqrt(), swag.deviations
    kw = dict(samples=3, scale=0.5, seed=11, device=CPU)
    diag = _drawn(model, sample_contexts(swag, model, diag_only=True, **kw))
    full = _drawn(model, sample_contexts(swag, model, diag_only=False, **kw))
    gen = torch.Generator().manual_seed(11)  # by hand: Maddox et al. eq. 1 (paper convention)
    for s in range(3):
        z1 = torch.randn(5, generator=gen, dtype=torch.float64)
        torch.testing.assert_close(diag[s], mean + 0.5 * sd * z1, rtol=0, atol=1e-15)
    gen = torch.Generator().manual_seed(11)
    for s in range(3):
        z1 = torch.randn(5, generator=gen, dtype=torch.float64)
        z2 = torch.randn(4, generator=gen, dtype=torch.float64)
        hand = mean + 0.5 * (sd * z1 / math.sqrt(2) + dev @ z2 / math.sqrt(2 * 3))
        torch.testing.assert_close(full[s], hand, rtol=0, atol=1e-14)
    # many draws: the empirical covariance of SWAG-Diag is diag(scale^2 Sigma_diag)
    many = _drawn(
        model, sample_contexts(swag, model, diag_only=True, samples=3000, scale=1.0, seed=1, device=CPU)
    )
    cov = torch.cov(many.T)
    torch.testing.assert_close(cov.diagonal(), swag.variance, rtol=0.1, atol=0)  # 4 standard errors
    off = cov - torch.diag(cov.diagonal())
    assert off.abs().max() < 0.1 * swag.variance.max()
    assert torch.equal(_flat(model), torch.zeros(5, dtype=torch.float64))  # weights put back


def test_swag_and_swag_diag_from_one_run_land_in_the_metrics(tmp_path):
    t = _trainer(
        tmp_path,
        'methods.sgd.swag={rank = 2, start_epoch = 1, samples = 4, evaluate = ["swag", "swag_diag"]}',
        "train.epochs=4",
    )
    t.fit()
    metrics, details = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=7, device=CPU)
    for k in ("accuracy", "nll", "ece", "brier"):
        assert metrics[f"swag_{k}"] == metrics[f"bma_{k}"]  # the first listed is bma_*
        assert f"swag_diag_{k}" in metrics
    # by hand: the SWAG-Diag model average of 4 samples mean + sd * z1 from a generator seeded 7
    xt, yt = load_digits("test", dtype=torch.float64)
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
    gen = torch.Generator().manual_seed(7)
    avg = torch.zeros(len(yt), 10, dtype=torch.float64)
    for _ in range(4):
        z1 = torch.randn(t.opt.mean.shape, generator=gen, dtype=torch.float64)
        vector_to_parameters(t.opt.mean + t.opt.variance.sqrt() * z1, model.parameters())
        with torch.no_grad():
            avg += torch.softmax(model(xt), 1) / 4
    nll = float(-torch.log(avg[torch.arange(len(yt)), yt]).mean())
    acc = float((avg.argmax(1) == yt).double().mean())
    assert metrics["swag_diag_nll"] == pytest.approx(nll, rel=1e-10)
    assert metrics["swag_diag_accuracy"] == pytest.approx(acc, abs=1e-12)
    assert details["bma_swag_diag"]["nll"] == metrics["swag_diag_nll"]
    assert metrics["swag_diag_nll"] != metrics["swag_nll"]


# --------------------------------------------------------------------------- 3. C-1 outputs
def test_c_minus_1_logits_give_the_hand_softmax_and_keep_the_state_dict(tmp_path):
    cfg = _cfg(tmp_path, "model.logits=c-1", "model.kwargs.sizes=[64, 12, 9]")
    model = build_model(cfg, 0, torch.float64, CPU)
    plain = model_factory("mlp", seed=0, sizes=[64, 12, 9], activation="tanh").double()
    assert list(model.state_dict()) == list(plain.state_dict())  # the network's own keys
    for k, v in model.state_dict().items():
        assert torch.equal(v, plain.state_dict()[k])
    x, y = load_digits("train", dtype=torch.float64)
    x, y = x[:50], y[:50]
    with torch.no_grad():
        out, f = model(x), plain(x)
    assert out.shape == (50, 10) and torch.equal(out[:, :9], f) and torch.all(out[:, 9] == 0)
    fn = f.numpy()  # p(c) = exp(f_c) / (1 + sum_j exp f_j), p(C-1) = 1 / (1 + sum_j exp f_j)
    denom = 1.0 + np.exp(fn).sum(1)
    num = np.where(y.numpy() < 9, np.exp(fn[np.arange(50), np.minimum(y.numpy(), 8)]), 1.0)
    hand = float(np.mean(-np.log(num / denom)))
    assert float(F.cross_entropy(out, y)) == pytest.approx(hand, rel=1e-12)
    assert append_zero_logit(model) is model and model(x).shape == (50, 10)  # applied once
    # bSAM's 784-500-300-9 MLP: 784*500+500 + 500*300+300 + 300*9+9 = 545,509 parameters
    mnist = model_factory("mlp-mnist", num_classes=9, device="meta")
    assert sum(p.numel() for p in append_zero_logit(mnist).parameters()) == 545_509


def test_c_minus_1_run_trains_and_evaluates_through_the_zero_logit(tmp_path):
    t = _trainer(tmp_path, "model.logits=c-1", "model.kwargs.sizes=[64, 12, 9]", "train.epochs=2")
    t.fit()
    metrics, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=0, device=CPU)
    plain = model_factory("mlp", sizes=[64, 12, 9], activation="tanh").double()
    plain.load_state_dict(t.model.state_dict())
    xt, yt = load_digits("test", dtype=torch.float64)
    with torch.no_grad():
        f = plain(xt)
    p = torch.softmax(torch.cat([f, torch.zeros(len(yt), 1, dtype=f.dtype)], 1), 1)
    assert metrics["nll"] == pytest.approx(float(-torch.log(p[torch.arange(len(yt)), yt]).mean()), rel=1e-10)
    assert metrics["accuracy"] > 0.5  # it learnt all 10 classes from 9 outputs
    with pytest.raises(ConfigError, match=r"needs C - 1 = 9 .*sizes = \[64, 12, 9\]"):
        _trainer(tmp_path / "b", "model.logits=c-1")  # 10 outputs


# ------------------------------------------------------------------- 4. initial checkpoint
def _save_mlp(path: Path, sizes=(64, 12, 10), seed: int = 123) -> torch.nn.Module:
    model = model_factory("mlp", seed=seed, sizes=list(sizes), activation="tanh").double()
    torch.save(model.state_dict(), path)
    return model


def _write_safetensors(path: Path, state: dict) -> None:
    """The format by hand: u64 little-endian header length, JSON header, raw bytes."""
    header, blobs, offset = {}, [], 0
    for name, t in state.items():
        raw = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F64", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_a_run_at_lr_0_evaluates_exactly_the_checkpoint(tmp_path):
    ck = tmp_path / "init.pt"
    ref = _save_mlp(ck)
    out = tmp_path / "runs"
    cfg = _cfg(tmp_path, f"model.checkpoint={json.dumps(str(ck))}", "train.lr=0")
    run = plan_runs(cfg)[0]
    sha = hashlib.sha256(ck.read_bytes()).hexdigest()
    assert run.cfg["model"]["checkpoint_sha256"] == sha
    metrics = run_one(run, device=CPU, ctx=DistContext())
    xt, yt = load_digits("test", dtype=torch.float64)
    with torch.no_grad():
        p = torch.softmax(ref(xt), 1)
    assert metrics["nll"] == pytest.approx(float(-torch.log(p[torch.arange(len(yt)), yt]).mean()), rel=1e-12)
    assert metrics["accuracy"] == pytest.approx(float((p.argmax(1) == yt).double().mean()), abs=1e-12)
    res = json.loads((run.run_dir / "results.json").read_text())
    assert res["config"]["model"]["checkpoint_sha256"] == sha
    assert (
        res["effective"]["initial_weights"]["loaded"] == 4
        and not res["effective"]["initial_weights"]["missing"]
    )
    assert out.is_dir()
    # a changed file is a different run; a pinned hash that does not match is refused
    _save_mlp(ck, seed=124)
    again = plan_runs(cfg)[0]
    assert fingerprint(again.cfg, training_only=True) != fingerprint(run.cfg, training_only=True)
    with pytest.raises(ConfigError, match="is not the one the config names"):
        plan_runs(
            _cfg(tmp_path, f"model.checkpoint={json.dumps(str(ck))}", f'model.checkpoint_sha256="{sha}"')
        )


def test_safetensors_are_read_without_a_dependency(tmp_path):
    ref = model_factory("mlp", seed=5, sizes=[64, 12, 10], activation="tanh").double()
    path = tmp_path / "w.safetensors"
    _write_safetensors(path, ref.state_dict())
    state = read_safetensors(path)
    assert all(torch.equal(state[k], v) for k, v in ref.state_dict().items())
    model = model_factory("mlp", seed=0, sizes=[64, 12, 10], activation="tanh").double()
    load_initial_weights(model, path)
    assert torch.equal(_flat(model), _flat(ref))


def test_safetensors_match_the_reference_reader(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    state = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1, -2], dtype=torch.int64),
    }
    st.save_file(state, str(tmp_path / "r.safetensors"))
    got = read_safetensors(tmp_path / "r.safetensors")
    assert set(got) == {"a", "b"} and all(torch.equal(got[k], v) for k, v in state.items())


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # the raw pickle's protocol
def test_files_that_carry_code_or_do_not_fit_are_refused(tmp_path):
    model = model_factory("mlp", seed=0, sizes=[64, 12, 10], activation="tanh").double()
    evil = tmp_path / "evil.pt"
    torch.save({"1.weight": torch.zeros(12, 64), "x": _Payload()}, evil)
    with pytest.raises(ConfigError, match="pickled Python objects"):
        load_initial_weights(model, evil)
    raw = tmp_path / "raw.pkl"
    raw.write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ConfigError, match="model.checkpoint"):
        load_initial_weights(model, raw)
    other = tmp_path / "other.pt"
    _save_mlp(other, sizes=(64, 16, 10))
    with pytest.raises(ConfigError, match=r"shapes differ: 1\.weight \(16, 64\) in the file vs \(12, 64\)"):
        load_initial_weights(model, other)
    with pytest.raises(ConfigError, match="does not exist"):
        load_initial_weights(model, tmp_path / "missing.pt")


def test_non_strict_loading_keeps_the_seeded_head(tmp_path):
    ck = tmp_path / "five.pt"
    src = _save_mlp(ck, sizes=(64, 12, 5))  # a network for 5 classes: its head does not fit
    cfg = _cfg(tmp_path, f"model.checkpoint={json.dumps(str(ck))}", "model.checkpoint_strict=false")
    notes: dict = {}
    with pytest.warns(UserWarning, match="kept the seeded initialisation"):
        model = build_model(cfg, 0, torch.float64, CPU, notes=notes)
    seeded = model_factory("mlp", seed=0, sizes=[64, 12, 10], activation="tanh").double()
    assert torch.equal(model.state_dict()["1.weight"], src.state_dict()["1.weight"])
    assert torch.equal(model.state_dict()["3.weight"], seeded.state_dict()["3.weight"])
    note = notes["initial_weights"]
    assert note["loaded"] == 2 and [r.split()[0] for r in note["reshaped"]] == ["3.weight", "3.bias"]
    with pytest.raises(ConfigError, match="checkpoint_strict = false"):
        build_model({**cfg, "model": {**cfg["model"], "checkpoint_strict": True}}, 0, torch.float64, CPU)


# ------------------------------------------------------------------ 5. SGLD from a checkpoint
def test_sgld_starts_from_the_checkpoint_with_the_hand_first_step(tmp_path, record_weights):
    weights, holder = record_weights
    ck = tmp_path / "trained.pt"
    ref = _save_mlp(ck)
    t = _trainer(
        tmp_path,
        f"model.checkpoint={json.dumps(str(ck))}",
        "methods.sgd.optimizer=fsgld",
        "methods.sgd.hyperparameters={lr = 0.05, rho = 0.0, temperature = 0.0, burn_in = 6}",
        "train.epochs=2",
    )
    holder["model"] = t.model
    t.fit()
    assert torch.equal(weights[0], _flat(ref))  # the chain starts at the file's weights
    # the first step by hand (Langevin mode, rho 0, T 0: no noise): w - lr (grad L + lambda w / N)
    n = len(t.data.y_train)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:256]
    w = _flat(ref).requires_grad_(True)
    model = model_factory("mlp", sizes=[64, 12, 10], activation="tanh").double()
    loss = F.cross_entropy(
        torch.func.functional_call(model, _split(model, w), (t.x_train[idx],)), t.y_train[idx]
    )
    (g,) = torch.autograd.grad(loss, w)
    torch.testing.assert_close(weights[1], (w - 0.05 * (g + 1.0 * w / n)).detach(), rtol=0, atol=1e-14)
    assert len(t.opt.samples) == 2 * t.steps_per_epoch - 6  # every step after the burn-in
    metrics, _ = evaluate_run(t.model, t.opt, t.data, t.cfg, seed=0, device=CPU)
    assert "bma_nll" in metrics


def _split(model, flat: torch.Tensor) -> dict:
    out, i = {}, 0
    for name, p in model.named_parameters():
        out[name] = flat[i : i + p.numel()].view_as(p)
        i += p.numel()
    return out


def test_c_minus_1_sharpness_is_that_of_the_hand_loss(tmp_path):
    from experiments.data import _subset
    from experiments.evaluate import _sharpness

    t = _trainer(
        tmp_path,
        "model.logits=c-1",
        "model.kwargs.sizes=[64, 4, 9]",
        'evaluation.sharpness=["lambda_max"]',
        "evaluation.sharpness_subset=100",
    )
    got = _sharpness(t.model, t.data, t.cfg, CPU, False)["rows"]["lambda_max"]["value"]
    # by hand: the dense Hessian of the mean cross-entropy of softmax([f(x; w), 0]) on the subset
    idx = _subset(len(t.data.y_train), 100)
    x, y = t.data.x_train[idx].double(), t.data.y_train[idx]
    plain = model_factory("mlp", sizes=[64, 4, 9], activation="tanh").double()
    w0 = _flat(t.model)

    def loss(w):
        f = torch.func.functional_call(plain, _split(plain, w), (x,))
        return F.cross_entropy(torch.cat([f, torch.zeros(len(y), 1, dtype=f.dtype)], 1), y)

    top = float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, w0))[-1])
    assert got == pytest.approx(top, rel=1e-4)
