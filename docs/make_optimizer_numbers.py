"""The numbers ``docs/methods/optimizers.md`` quotes from small, exact computations: closed-form
schedule values and single steps of a few optimizers on tiny float64 problems.

    python docs/make_optimizer_numbers.py [--out docs/figures]   # a few seconds on one CPU thread

Writes ``optimizer_numbers.json`` to ``--out``:

* ``f_sgld``: the F-SGLD authors' schedules (``optimizers.bayes.sgld``; flat_bnn's
  ``sgld/train_sgld.py``): ``official_lr`` at epochs 0, 1, 10, ``official_noise_std`` at steps 0
  and 117,300 (300 epochs of 391 CIFAR batches), the SGLD baseline's ``polynomial_lr`` at steps 0
  and 1000 with its proportional noise (factor 0.1) and the Langevin noise
  ``sqrt(2 * 0.2 / 50,000)`` (Welling & Teh 2011, eq. 4 with step ``eta / N``).
* ``vsam_one_step``: one ``VariationalSAM`` step from ``sigma_0 = rho / sqrt(p)`` at ``sigma_lr =
  0.01``, ``rho = 0.05`` on a 4-8-3 tanh MLP (seed 0, ``p = 67``) and 40 Gaussian points (seed 0),
  the set-up of ``tests/test_fidelity.py``: the mean sigma of this package's reading (a step on
  sigma) for ``N = 40`` and ``N = 50,000``, and of Alg. 3 read as a step on Sigma (Ujváry et al.
  2022) for ``N = 40``.
* ``vsam_wrn28_10``: ``sigma_0 = rho / sqrt(p)`` and the scaled rate ``0.01 rho^2 / p`` of
  ``configs/vsam_cifar10_wrn.toml`` for WRN-28-10 (``p`` counted on the meta device).
* ``asam_layernorm``: the relative difference of ASAM's first perturbation between the authors'
  name rule (scale every parameter named ``weight``) and the shape rule (``dim > 1``) on the 4-6-3
  LayerNorm MLP of ``tests/test_fidelity.py`` (gamma drawn in [0.1, 2]; and at gamma = 1, beta = 0).
* ``tracer_digits``: the fraction of coordinates with ``f_bar > delta`` after 5 SGD-TRACER steps at
  the defaults on the digits demo (``optimizers.demo``; lr 0.1, momentum 0.9, weight decay 5e-4,
  batches of 64), of all coordinates and of those with a nonzero gradient.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from landscape.io import atomic_write_json  # noqa: E402
from landscape.models import model_factory  # noqa: E402
from optimizers import ASAM, SGDTracer, VariationalSAM  # noqa: E402
from optimizers.bayes.sgld import official_lr, official_noise_std, polynomial_lr  # noqa: E402

DT = torch.float64


def gaussian_data(n: int, d: int = 4, n_classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs and uniform labels from one generator (as ``tests/references.py``)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=DT), torch.randint(0, n_classes, (n,), generator=g)


def tanh_mlp(sizes: tuple[int, ...], seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers).to(DT)


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def f_sgld() -> dict[str, float]:
    poly0 = polynomial_lr(0)
    return {
        "official_lr_0": official_lr(0),
        "official_lr_1": official_lr(1),
        "official_lr_10": official_lr(10),
        "official_noise_0": official_noise_std(0),
        "official_noise_117300": official_noise_std(117_300),
        "polynomial_lr_0": poly0,
        "polynomial_lr_1000": polynomial_lr(1000),
        "polynomial_noise_0": 0.1 * poly0,
        "polynomial_noise_0_over_official_noise_0": 0.1 * poly0 / official_noise_std(0),
        "polynomial_lr_0_over_official_lr_1": poly0 / official_lr(1),
        "langevin_noise_lr02_n50000": math.sqrt(2 * 0.2 / 50_000),
    }


def vsam_one_step() -> dict[str, float]:
    """Both readings of one sigma step (Alg. 3 on Sigma, ours on sigma), as tests/test_fidelity.py."""
    rho, lr = 0.05, 0.01
    x, y = gaussian_data(40)
    base = tanh_mlp((4, 8, 3))
    w = [p.detach().clone().requires_grad_(True) for p in base.parameters()]
    names = [n for n, _ in base.named_parameters()]
    loss = F.cross_entropy(torch.func.functional_call(base, dict(zip(names, w)), (x,)), y)
    g = flat(torch.autograd.grad(loss, w))
    p = g.numel()
    sig0 = rho / math.sqrt(p)
    quad = (g * g).sum() * sig0**2
    out: dict[str, float] = {"p": p, "sigma_0": sig0}
    for n in (40, 50_000):
        # Alg. 3 as written: dJ/dSigma = sqrt(p) g^2 / (2 sqrt(g'Sg)) + 1/(2N) - 1/(2N Sigma)
        big = sig0**2 - lr * (math.sqrt(p) * g * g / (2 * quad.sqrt()) + 1 / (2 * n) - 1 / (2 * n * sig0**2))
        model = tanh_mlp((4, 8, 3))
        opt = VariationalSAM(model.parameters(), torch.optim.SGD, rho=rho, num_data=n, sigma_lr=lr, lr=0.0)

        def closure(opt=opt, model=model):
            opt.zero_grad()
            batch_loss = F.cross_entropy(model(x), y)
            batch_loss.backward()
            return batch_loss

        opt.step(closure)
        sigma = flat(opt.posterior_std().values())
        out[f"sigma_reading_mean_sigma_n{n}"] = float(sigma.mean())
        out[f"alg3_sigma_reading_negative_n{n}"] = int((big < 0).sum())
        if n == 40:
            out[f"alg3_sigma_reading_mean_sigma_n{n}"] = float(big.sqrt().mean())
    return out


def vsam_wrn28_10(rho: float = 0.05, rate: float = 0.01) -> dict[str, float]:
    with torch.device("meta"):
        p = sum(q.numel() for q in model_factory("wrn28-10", num_classes=10).parameters())
    return {"p": p, "sigma_0": rho / math.sqrt(p), "scaled_sigma_lr": rate * rho**2 / p}


def ln_mlp(gamma_random: bool, seed: int = 0) -> nn.Module:
    """4-6-3 MLP with a LayerNorm, its gamma drawn in [0.1, 2] and beta ~ N(0, 0.25) (or 1, 0)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Tanh(), nn.Linear(6, 3)).to(DT)
    if gamma_random:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            model[1].weight.copy_(0.1 + 1.9 * torch.rand(6, generator=g, dtype=DT))
            model[1].bias.copy_(0.5 * torch.randn(6, generator=g, dtype=DT))
    return model


def asam_perturbation(scale: str, gamma_random: bool, x, y) -> torch.Tensor:
    """ASAM's first perturbation, read off the parameters its second pass sees (lr 0)."""
    model = ln_mlp(gamma_random)
    opt = ASAM(model.named_parameters(), torch.optim.SGD, rho=0.5, eta=0.01, lr=0.0, scale=scale)
    w0 = flat(model.parameters())
    seen: list[torch.Tensor] = []

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        seen.append(flat(model.parameters()))
        return loss

    opt.step(closure)
    return seen[1] - w0


def asam_layernorm() -> dict[str, float]:
    x, y = gaussian_data(20, seed=3)
    out = {}
    for key, gamma_random in (("gamma_random", True), ("gamma_one", False)):
        by_name = asam_perturbation("weight_name", gamma_random, x, y)
        by_shape = asam_perturbation("dim>1", gamma_random, x, y)
        out[f"relative_difference_{key}"] = float((by_name - by_shape).norm() / by_shape.norm())
    return out


def tracer_digits(steps: int = 5) -> dict[str, float]:
    from optimizers.demo import load_data, make_model

    xtr, ytr, _, _ = load_data(dtype=DT)
    model = make_model(0, dtype=DT)
    opt = SGDTracer(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(0))
    for k in range(steps):
        idx = perm[64 * k : 64 * (k + 1)]

        def closure(idx=idx):
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward(create_graph=True)
            return loss

        opt.step(closure)
    fbar = flat(opt.state[p]["f_bar"] for p in model.parameters())
    delta = opt.param_groups[0]["delta"]
    return {
        "steps": steps,
        "coordinates": fbar.numel(),
        "fraction_above_delta": float((fbar > delta).double().mean()),
        "fraction_above_delta_of_nonzero": float((fbar > delta).sum() / (fbar > 0).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "figures"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    result: dict[str, Any] = {
        "f_sgld": f_sgld(),
        "vsam_one_step": vsam_one_step(),
        "vsam_wrn28_10": vsam_wrn28_10(),
        "asam_layernorm": asam_layernorm(),
        "tracer_digits": tracer_digits(),
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }
    path = atomic_write_json(Path(args.out) / "optimizer_numbers.json", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
