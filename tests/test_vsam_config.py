"""``configs/vsam_cifar10_wrn.toml``: VSAM's ``sigma_lr`` keeps ``Sigma`` (and so ``||eps||``) bounded.

With ``sigma_lr = 0.01`` read as a rate on ``sigma`` itself, the config's VSAM run diverged on a
GPU (WRN-28-10, budget 0.01: training loss 3.41 -> 6.92, then NaN model-average probabilities).
``sigma`` starts at ``sigma_0 = rho / sqrt(p)``, where one step of ``dJ/dsigma`` multiplies it by
``1 + sigma_lr p / (N rho^2)`` (entropy term) and the data term can overshoot zero. The config now
sets ``sigma_lr = 0.01 rho^2 / p``: plain gradient descent with rate 0.01 on ``sigma / sigma_0``.

Per coordinate, one step of ``VariationalSAM`` is (``c = sigma_lr k / N``, ``k = kl_weight``,
``d = sqrt(p) sigma g^2 / sqrt(g' Sigma g)`` with ``0 <= d <= sqrt(p) |g_i| <= sqrt(p) ||g||``)::

    sigma' = | sigma (1 - sigma_lr k / (N s0^2)) - sigma_lr d + c / sigma |

so while ``L_t = L_{t-1} (1 - sigma_lr k / (N s0^2)) - sigma_lr sqrt(p) ||g_{t-1}||`` stays positive,
``L_t <= sigma <= U_t`` with ``U_t = max(L + c / L, U + c / U)`` (``sigma + c / sigma`` is convex) and
``sqrt(p) L_t <= ||eps_t|| <= sqrt(p) U_t``. The tests check the recorded ``sigma_min``,
``sigma_max`` and ``eps_norm`` of the config's VSAM run (a small WRN on the digits) against these
bounds built from the recorded gradient norms, and the training losses against SAM's: at a nearly
constant isotropic ``Sigma`` VSAM's step is SAM's with ``rho = sqrt(p) sigma_0`` and weight decay
``5e-4 + k / (N s0^2)``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from experiments.config import load_config
from experiments.train import Trainer
from landscape.models import count_parameters, model_factory
from tests.runner_helpers import cpu_trainer, planned_run

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "vsam_cifar10_wrn.toml"
RHO = 0.05
# the config, shrunk: a WRN-10-1 (p = 77,562) on the 1,438 training digits, 10 epochs of 12 steps
TINY = [
    "data.name=digits-image",
    "data.augmentation=none",
    "model.name=wrn",
    "model.kwargs={depth = 10, widen_factor = 1, in_channels = 1, num_classes = 10}",
    "budget=1",
    "seeds=[0]",
    "device=cpu",
    "precision=float32",
    "train.epochs=10",
    "evaluation.every=0",
    "progress=false",
]


def _trainer(method: str, tmp: Path, overrides: list[str]) -> Trainer:
    cfg = load_config(CONFIG, [*overrides, f"out_dir={tmp}"])
    return cpu_trainer(planned_run(cfg, method), seed=0)


def _fit(trainer: Trainer) -> tuple[list[dict[str, float]], list[float]]:
    """Train the run to its last epoch; ``opt.last`` of every step and the per-epoch training losses."""
    records: list[dict[str, float]] = []
    trainer.opt.register_step_post_hook(
        lambda opt, args, kwargs: records.append({k: float(v) for k, v in opt.last.items()})
    )
    trainer.fit()
    return records, [row["train_loss"] for row in trainer.history]


@pytest.fixture(scope="module")
def sam_reference(tmp_path_factory) -> list[float]:
    """Per-epoch training losses of the config's SAM with weight decay 5e-4 + 1/N (VSAM's prior
    term ``kl_weight mu / (N prior_std^2)`` at ``kl_weight = prior_std = 1``)."""
    n = 1438
    wd = f"methods.sam.hyperparameters.weight_decay={5e-4 + 1.0 / n!r}"
    trainer = _trainer("sam", tmp_path_factory.mktemp("sam"), [*TINY, wd])
    assert trainer.n == n
    return _fit(trainer)[1]


def test_config_sigma_lr_is_001_in_units_of_the_initial_std():
    cfg = load_config(CONFIG)
    (vsam,) = [m for m in cfg["methods"] if m["name"] == "vsam"]
    hp = vsam["hyperparameters"]
    with torch.device("meta"):
        p = count_parameters(model_factory(cfg["model"]["name"], **cfg["model"]["kwargs"]))
    assert p == 36_479_194 and hp["rho"] == RHO
    # sigma_lr = 0.01 sigma_0^2 = 0.01 rho^2 / p: the step on sigma / sigma_0 has rate 0.01
    assert hp["sigma_lr"] == pytest.approx(0.01 * RHO**2 / p, rel=1e-3, abs=0)
    # the first step's entropy factor 1 + sigma_lr p / (N rho^2) at N = 50,000 is 1 + 0.01 / N
    assert hp["sigma_lr"] * p / (50_000 * RHO**2) == pytest.approx(0.01 / 50_000, rel=1e-3, abs=0)
    # ... where sigma_lr = 0.01 (the value that diverged) gives 2,919
    assert 1 + 0.01 * p / (50_000 * RHO**2) == pytest.approx(2919.3, abs=0.05)


@pytest.mark.parametrize("old", [False, True], ids=["config_sigma_lr", "sigma_lr_0.01"])
def test_one_sigma_step_equals_the_hand_computed_rule_float64(old, tmp_path):
    # the config's VSAM on a 64-32-10 tanh MLP (p = 2,410) and the 1,438 digits, float64
    over = [
        "data.name=digits",
        "data.augmentation=none",
        "model.name=mlp",
        "model.kwargs={sizes = [64, 32, 10]}",
    ]
    over += ["budget=1", "seeds=[0]", "device=cpu", "precision=float64"]
    if old:
        over.append("methods.vsam.hyperparameters.sigma_lr=0.01")
    trainer = _trainer("vsam", tmp_path, over)
    model, opt, n = trainer.model, trainer.opt, trainer.n
    params = list(model.parameters())
    p = sum(q.numel() for q in params)
    lr = opt.param_groups[0]["sigma_lr"]
    group = opt.param_groups[0]
    assert (p, n) == (2410, 1438) and group["kl_weight"] == group["prior_std"] == 1.0
    x, y = trainer.x_train[:128], trainer.y_train[:128]
    # g = grad of the label-smoothed mean loss at mu, by hand
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)(model(x), y)
    g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params)])
    s0 = RHO / math.sqrt(p)
    d = math.sqrt(p) * s0 * g * g / ((s0 * s0 * g * g).sum().sqrt() + 1e-12)
    expected = (s0 - lr * (d + s0 / n - 1.0 / (n * s0))).abs()
    opt.step(trainer.closures(x, y, len(y), trainer.scaler))
    got = torch.cat([opt.state[q]["sigma"].reshape(-1) for q in params])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=0.0)
    # coordinates without gradient (the first layer's weights on the 3 always-zero pixels) get the
    # entropy and prior terms alone: sigma_1 / sigma_0 = 1 + lr (p / (N rho^2) - 1 / N)
    dead = (trainer.x_train == 0).all(0)
    assert int(dead.sum()) == 3
    ratio = opt.state[params[0]]["sigma"][:, dead] / s0
    factor = 1 + lr * (p / (n * RHO**2) - 1.0 / n)
    torch.testing.assert_close(ratio, torch.full_like(ratio, factor), rtol=1e-12, atol=0.0)
    if old:  # sigma grows 3.6- to 7.7-fold in one step
        assert factor == pytest.approx(7.70375, abs=1e-5) and float(got.min()) / s0 > 3.5
    else:  # every sigma moves by less than 4.6e-10 sigma_0, the dead coordinates' growth
        assert factor - 1 == pytest.approx(4.594e-10, rel=1e-3, abs=0)
        top = pytest.approx(factor - 1, rel=1e-6, abs=0)
        assert 0 < float(got.min()) / s0 - 1 <= float(got.max()) / s0 - 1 == top


def _bounds(records: list[dict[str, float]], sigma0: float, p: int, lr: float, n: int) -> list[tuple]:
    """``(L_t, U_t)`` after every step, from the recorded gradient norms (module docstring)."""
    c = lr / n  # kl_weight = prior_std = 1
    lo = hi = sigma0
    out = []
    for rec in records:
        lo, hi = lo * (1 - lr / n) - lr * math.sqrt(p) * rec["grad_norm"], max(lo + c / lo, hi + c / hi)
        assert lo > 0, "the closed-form bounds hold while L_t > 0"
        out.append((lo, hi))
    return out


@pytest.mark.parametrize("rule", [False, True], ids=["config_sigma_lr", "0.01_rho2_over_p_of_this_model"])
def test_config_vsam_run_keeps_sigma_and_eps_bounded_and_trains_like_sam(rule, tmp_path, sam_reference):
    over = list(TINY)
    if rule:  # the config's rule for another model (its comment: 0.01 rho^2 / p)
        over.append(f"methods.vsam.hyperparameters.sigma_lr={0.01 * RHO**2 / 77_562!r}")
    trainer = _trainer("vsam", tmp_path, over)
    p, n = sum(q.numel() for q in trainer.params), trainer.n
    lr = trainer.opt.param_groups[0]["sigma_lr"]
    sigma0 = float(trainer.opt.state[trainer.params[0]]["sigma"].flatten()[0])
    assert p == 77_562 and sigma0 == pytest.approx(RHO / math.sqrt(p), rel=1e-7)
    records, losses = _fit(trainer)
    assert len(records) == 120 and len(losses) == 10
    # sigma and ||eps|| stay within 0.1 % of sigma_0 and rho (at sigma_lr = 0.01 the mean sigma ends
    # hundreds of times sigma_0 and the training loss stays near ln 10: docs/make_vsam_sigma_growth.py)
    assert max(rec["sigma_max"] for rec in records) < 1.001 * sigma0
    assert max(rec["eps_norm"] for rec in records) < 1.001 * RHO
    # the losses are SAM's (weight decay 5e-4 + 1/N) to 5e-3 per epoch, and fall from 1.68 to 0.55
    assert losses == pytest.approx(sam_reference, abs=5e-3)
    assert losses[0] == pytest.approx(1.683, abs=0.01) and losses[-1] < 0.6
    for t, (rec, (lo, hi)) in enumerate(zip(records, _bounds(records, sigma0, p, lr, n))):
        assert lo * (1 - 1e-5) <= rec["sigma_min"] <= rec["sigma_max"] <= hi * (1 + 1e-5), t
        assert math.sqrt(p) * lo * (1 - 1e-5) <= rec["eps_norm"] <= math.sqrt(p) * hi * (1 + 1e-5), t
