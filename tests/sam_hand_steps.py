"""Hand-written float64 references for the SAM family: problems as plain functions of a flat
parameter vector, SGD/Adam updates written out, and the reference trajectory of each method."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from optimizers import ASAM, SAM, FisherSAM, MixSAM, RandomSAM, VariationalSAM
from tests.references import make_classification_data, make_mlp

DT = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)
GUARD = 1e-12


# --------------------------------------------------------------------------------------------
# tiny problems: a module, and the same loss as a hand-written function of a flat vector
# --------------------------------------------------------------------------------------------
def _logreg_problem(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Linear(4, 1).to(DT)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(18, 4, generator=g, dtype=DT)
    y = (torch.rand(18, generator=g) < 0.5).to(DT)

    def module_loss(out, t):
        return F.binary_cross_entropy_with_logits(out.squeeze(-1), t)

    def flat_loss(theta, xb, yb):
        w, b = theta[:4], theta[4]
        z = xb @ w + b
        return (torch.log1p(torch.exp(-z.abs())) + z.clamp(min=0) - yb * z).mean()

    return model, x, y, module_loss, flat_loss


def _mlp_problem(seed: int = 0):
    model = make_mlp((4, 6, 3), seed=seed)
    x, y = make_classification_data(n=18, d=4, n_classes=3, seed=seed + 1)

    def flat_loss(theta, xb, yb):
        w1 = theta[:24].reshape(6, 4)
        b1 = theta[24:30]
        w2 = theta[30:48].reshape(3, 6)
        b2 = theta[48:51]
        out = torch.tanh(xb @ w1.T + b1) @ w2.T + b2
        return (torch.logsumexp(out, dim=1) - out[torch.arange(len(yb)), yb]).mean()

    return model, x, y, F.cross_entropy, flat_loss


PROBLEMS = {"logreg": _logreg_problem, "mlp": _mlp_problem}


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _weight_mask(model: nn.Module) -> torch.Tensor:
    """1 for entries of weight tensors (dim > 1), 0 for 1-D tensors (ASAM's default scaling rule)."""
    return torch.cat([torch.full((p.numel(),), float(p.dim() > 1), dtype=DT) for p in model.parameters()])


def _grad(flat_loss, theta, xb, yb):
    t = theta.detach().clone().requires_grad_(True)
    loss = flat_loss(t, xb, yb)
    (g,) = torch.autograd.grad(loss, t)
    return loss.detach(), g


def _batches(x, y, steps):
    # a different batch each step (cyclic thirds of the data)
    n = len(y) // 3
    return [(x[(i % 3) * n : (i % 3 + 1) * n], y[(i % 3) * n : (i % 3 + 1) * n]) for i in range(steps)]


class _HandSGD:
    """torch.optim.SGD(lr, momentum, weight_decay) with dampening 0, written out."""

    def __init__(self, lr, momentum=0.0, weight_decay=0.0):
        self.lr, self.mom, self.wd, self.buf = lr, momentum, weight_decay, None

    def __call__(self, theta, d):
        d = d + self.wd * theta
        if self.mom:
            self.buf = d.clone() if self.buf is None else self.mom * self.buf + d
            d = self.buf
        return theta - self.lr * d


class _HandAdam:
    """torch.optim.Adam(lr, betas, eps, weight_decay) (L2 form), written out."""

    def __init__(self, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = self.v = None
        self.t = 0

    def __call__(self, theta, d):
        d = d + self.wd * theta
        self.t += 1
        self.m = (1 - self.b1) * d if self.m is None else self.b1 * self.m + (1 - self.b1) * d
        self.v = (1 - self.b2) * d * d if self.v is None else self.b2 * self.v + (1 - self.b2) * d * d
        mhat = self.m / (1 - self.b1**self.t)
        vhat = self.v / (1 - self.b2**self.t)
        return theta - self.lr * mhat / (vhat.sqrt() + self.eps)


def _hand_base(base: str):
    if base == "sgd":
        return torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2), _HandSGD(0.1, 0.9, 1e-2)
    return torch.optim.Adam, dict(lr=0.01, weight_decay=1e-2), _HandAdam(0.01, weight_decay=1e-2)


def _randn_like_params(gen, model):
    return torch.cat([torch.randn(p.shape, generator=gen, dtype=DT).reshape(-1) for p in model.parameters()])


# --------------------------------------------------------------------------------------------
# hand references of each method: return eps from (theta, g) (and per-method state)
# --------------------------------------------------------------------------------------------
def _ref_trajectory(method, model, flat_loss, batches, hand_step, hp, chunks=1):
    """Run ``len(batches)`` hand-computed steps from the model's current parameters."""
    theta = _flat(model)
    p = theta.numel()
    mask = _weight_mask(model)
    gen = torch.Generator().manual_seed(hp.get("seed", 0))
    sigma = torch.full_like(theta, hp.get("rho", 0.05) / math.sqrt(p))
    records = []
    for xb, yb in batches:
        descent = torch.zeros_like(theta)
        sig_data = torch.zeros_like(theta)
        xs, ys = torch.tensor_split(xb, chunks), torch.tensor_split(yb, chunks)
        rec = {}
        for xc, yc in zip(xs, ys):
            if method == "random_sam":
                z = _randn_like_params(gen, model)
                eps = hp["rho"] / math.sqrt(p) * z
                loss_eps, g_eps = _grad(flat_loss, theta + eps, xc, yc)
                descent += g_eps + 2 * hp.get("alpha", 0.0) * theta
                rec = {"eps": eps, "loss": loss_eps}
                continue
            loss, g = _grad(flat_loss, theta, xc, yc)
            if method == "sam":
                eps = hp["rho"] * g / (g.norm() + GUARD)
            elif method == "asam":
                t = (
                    (theta.abs() + hp["eta"]) * mask + (1 - mask)
                    if not hp.get("scale_all")
                    else theta.abs() + hp["eta"]
                )
                eps = hp["rho"] * t * t * g / ((t * g).norm() + GUARD)
            elif method == "fisher_sam":
                f = 1 + hp["eta"] * g * g if "fisher" not in hp else hp["fisher"](theta)
                eps = hp["rho"] * (g / f) / (torch.sqrt((g * g / f).sum()) + GUARD)
                rec["fisher_quadratic"] = (g * g / f).sum()
            elif method == "mix_sam":
                z = _randn_like_params(gen, model)
                u = math.sqrt(p) * g / (g.norm() + GUARD) + hp["kappa"] * z
                eps = hp["rho"] * u / (u.norm() + GUARD)
            elif method == "vsam":
                quad = (g * sigma**2 * g).sum()
                eps = math.sqrt(p) * sigma**2 * g / (quad.sqrt() + GUARD)
                sig_data += math.sqrt(p) * sigma * g * g / (quad.sqrt() + GUARD)
                rec["sigma_before"] = sigma.clone()
            else:  # pragma: no cover
                raise AssertionError(method)
            loss_eps, g_eps = _grad(flat_loss, theta + eps, xc, yc)
            descent += g_eps
            rec.update(eps=eps, g=g, loss=loss, loss_eps=loss_eps)
        descent /= chunks
        if method == "vsam":
            prior_prec = hp["kl_weight"] / (hp["num_data"] * hp["prior_std"] ** 2)
            descent = descent + prior_prec * theta
            grad_sigma = sig_data / chunks + prior_prec * sigma - hp["kl_weight"] / (hp["num_data"] * sigma)
            sigma = (sigma - hp["sigma_lr"] * grad_sigma).abs()
            rec["sigma"] = sigma.clone()
        theta = hand_step(theta, descent)
        records.append(rec)
    return theta, records


def _make_opt(method, model, base_cls, base_kw, hp, m=1):
    kw = {k: v for k, v in hp.items() if k not in ("fisher", "fisher_param")}
    if method == "sam":
        return SAM(model.parameters(), base_cls, rho=kw["rho"], m=m, **base_kw)
    if method == "asam":
        return ASAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "fisher_sam":
        fisher = hp.get("fisher")
        if fisher is not None:
            # the same analytic diagonal, as a param -> tensor callable
            def fisher_fn(p):
                return hp["fisher_param"](p)

            return FisherSAM(model.parameters(), base_cls, fisher=fisher_fn, m=m, **kw, **base_kw)
        return FisherSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "random_sam":
        return RandomSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "mix_sam":
        return MixSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    if method == "vsam":
        return VariationalSAM(model.parameters(), base_cls, m=m, **kw, **base_kw)
    raise AssertionError(method)


HP = {
    "sam": {"rho": 0.05},
    "asam": {"rho": 0.5, "eta": 0.01},
    "fisher_sam": {"rho": 0.1, "eta": 1.0},
    "random_sam": {"rho": 0.05, "alpha": 0.01, "seed": 3},
    "mix_sam": {"rho": 0.05, "kappa": 1.0, "seed": 4},
    "vsam": {"rho": 0.05, "num_data": 18, "prior_std": 1.0, "sigma_lr": 0.01, "kl_weight": 1.0},
}


def _module_closure(opt, model, loss_fn, xb, yb):
    def closure(chunk=None):
        opt.zero_grad()
        if chunk is None:
            xc, yc = xb, yb
        else:
            xc, yc = torch.tensor_split(xb, opt.m)[chunk], torch.tensor_split(yb, opt.m)[chunk]
        loss = loss_fn(model(xc), yc)
        loss.backward()
        return loss

    return closure


def _run_opt(opt, model, loss_fn, batches):
    losses = []
    for xb, yb in batches:
        losses.append(opt.step(_module_closure(opt, model, loss_fn, xb, yb)))
    return losses


def _recording_closure(opt, model, loss_fn, x, y, log):
    def closure():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        log.append((_flat(model), torch.cat([p.grad.reshape(-1) for p in model.parameters()])))
        return loss

    return closure
