"""Perturbation-based sharpness: worst case (SAM/ASAM/FSAM neighbourhoods, one-step, PGD, Auto-PGD,
m-sharpness), average case, Keskar's box sharpness, filter-normalised directions and the
adversarial-perturbation robustness curve.

Every perturbation is ``delta = c * u`` (``c`` the per-parameter scale); constraints and noise are
isotropic in ``u``, so adaptive measures (``c = |w|``) are exactly invariant to function-preserving
rescalings of a ReLU network (Kwon et al. 2021, ASAM, Sec. 3).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from landscape.checks import check_nonnegative, check_probability
from landscape.sharpness.common import (
    Ctx,
    check_choice,
    check_positive,
    make_generator,
    make_scale,
    per_example_gradients,
    split_data,
    sub_batch_weights,
)

SOLVERS = ("one_step", "pgd", "apgd")


# --------------------------------------------------------------------------------------------
# the inner maximisation  max_{||u||_p <= rho} L(w0 + c * u) - L(w0)
# --------------------------------------------------------------------------------------------
def _project(u: torch.Tensor, rho: float, p: float) -> torch.Tensor:
    if p == 2:
        n = float(u.norm())
        return u if n <= rho else u * (rho / n)
    return u.clamp(-rho, rho)


def _steepest(gu: torch.Tensor, p: float) -> torch.Tensor:
    """Unit steepest-ascent direction for the norm ``p`` (dual-norm maximiser of ``<gu, .>``)."""
    if p == 2:
        n = float(gu.norm())
        return gu / n if n > 0 else torch.zeros_like(gu)
    return gu.sign()


def _random_start(ctx: Ctx, gen: torch.Generator, rho: float, p: float) -> torch.Tensor:
    if p == 2:  # uniform in the ball
        z = ctx.randn(gen)
        r = float(torch.rand((), generator=gen, dtype=torch.float64)) ** (1.0 / ctx.p)
        return z * (rho * r / float(z.norm()))
    return (2 * ctx.rand(gen) - 1) * rho


class _Inner:
    """``phi(u) = L(w0 + c * u)`` and its gradient ``c * grad L`` in normalised coordinates."""

    def __init__(self, ctx: Ctx, c: torch.Tensor):
        self.ctx, self.c = ctx, c
        self.best, self.best_u = -math.inf, None
        self.loss0: float | None = None

    def _track(self, value: float, u: torch.Tensor) -> None:
        if value > self.best:
            self.best, self.best_u = value, u.clone()

    def value_grad(self, u: torch.Tensor) -> tuple[float, torch.Tensor]:
        value, g = self.ctx.loss_grad(self.ctx.w0 + self.c * u)
        if self.loss0 is None and not bool(torch.any(u)):
            self.loss0 = value
        self._track(value, u)
        return value, self.c * g

    def value(self, u: torch.Tensor) -> float:
        value = self.ctx.loss(self.ctx.w0 + self.c * u)
        self._track(value, u)
        return value


def _checkpoints(iterations: int) -> set[int]:
    """Auto-PGD checkpoints ``w_j = ceil(p_j N)``: ``p_0 = 0, p_1 = 0.22,
    p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06)`` (Croce & Hein 2020, Sec. 3.2)."""
    ps = [0.0, 0.22]
    while ps[-1] < 1.0:
        ps.append(ps[-1] + max(ps[-1] - ps[-2] - 0.03, 0.06))
    return {math.ceil(q * iterations) for q in ps if 0 < q <= 1.0}


def _apgd(inner: _Inner, u0: torch.Tensor, rho: float, p: float, iterations: int, momentum: float) -> None:
    """Auto-PGD (Croce & Hein 2020, Alg. 1) as used for m-sharpness by Andriushchenko et al. 2023:
    initial step ``2 rho``, momentum ``0.75``, step halving (and restart from the best point) at the
    checkpoints when fewer than 75 % of the steps since the last checkpoint increased the loss or
    when neither the step nor the best value changed since the last checkpoint."""
    checkpoints = _checkpoints(iterations)
    eta = 2.0 * rho
    x_prev = u0
    f_prev, g_prev = inner.value_grad(u0)
    best_f, best_x, best_g = f_prev, u0, g_prev
    x = _project(u0 + eta * _steepest(g_prev, p), rho, p)
    f, g = inner.value_grad(x)
    successes = int(f > f_prev)
    if f > best_f:
        best_f, best_x, best_g = f, x, g
    last_eta_reduced, best_at_last = False, f_prev
    for k in range(1, iterations):
        z = _project(x + eta * _steepest(g, p), rho, p)
        x_new = _project(x + momentum * (z - x) + (1 - momentum) * (x - x_prev), rho, p)
        f_new, g_new = inner.value_grad(x_new)
        successes += int(f_new > f)
        x_prev, x, f, g = x, x_new, f_new, g_new
        if f > best_f:
            best_f, best_x, best_g = f, x, g
        if k + 1 in checkpoints:
            too_few = successes < 0.75 * max(1, k + 1 - _prev_checkpoint(checkpoints, k + 1))
            stalled = (not last_eta_reduced) and best_f == best_at_last
            reduced = too_few or stalled
            if reduced:
                eta /= 2.0
                x_prev, x, g, f = best_x, best_x, best_g, best_f
            last_eta_reduced, best_at_last, successes = reduced, best_f, 0


def _prev_checkpoint(checkpoints: set[int], k: int) -> int:
    earlier = [c for c in checkpoints if c < k]
    return max(earlier) if earlier else 0


def _pgd(inner: _Inner, u0: torch.Tensor, rho: float, p: float, iterations: int, step: float) -> None:
    """Projected steepest ascent with a fixed step (normalised gradient for p = 2, sign for p = inf;
    Madry et al. 2018); the best evaluated point is kept."""
    u = u0
    for _ in range(iterations):
        _, gu = inner.value_grad(u)
        u = _project(u + step * _steepest(gu, p), rho, p)
    inner.value(u)


def _solve(
    ctx: Ctx,
    c: torch.Tensor,
    rho: float,
    p: float,
    solver: str,
    iterations: int,
    restarts: int,
    step: float | None,
    momentum: float,
    gen: torch.Generator,
) -> tuple[float, float, torch.Tensor]:
    """Returns ``(L0, max L(w0 + c u), u*)``."""
    inner = _Inner(ctx, c)
    zero = torch.zeros_like(ctx.w0)
    if solver == "one_step":
        # SAM's linearisation (Foret et al. 2021, eq. 2): u = rho * argmax_{||u||_p<=1} <c g, u>
        loss0, gu = inner.value_grad(zero)
        inner.best, inner.best_u = -math.inf, None  # the value reported is at the one-step point
        inner.value(rho * _steepest(gu, p))
        return loss0, inner.best, inner.best_u
    for r in range(restarts):
        u0 = zero if r == 0 else _random_start(ctx, gen, rho, p)
        if solver == "pgd":
            _pgd(inner, u0, rho, p, iterations, step if step is not None else 2.5 * rho / iterations)
        else:
            _apgd(inner, u0, rho, p, iterations, momentum)
    loss0 = inner.loss0  # restart 0 starts at u = 0
    return loss0, max(inner.best, loss0), inner.best_u if inner.best >= loss0 else zero


def _normalised_logits_objective(obj):
    """The same objective with the loss applied to per-example L2-normalised logits
    ``f(x) / ||f(x)||_2`` (Andriushchenko et al. 2023, Sec. 4: removes the output-scale degree of
    freedom from sharpness)."""
    loss_fn = obj.loss_fn

    def normalised_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        norm = out.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return loss_fn(out / norm, y)

    data = [(x, y) for x, y, _ in obj.batches()]
    return type(obj)(
        obj.model,
        normalised_loss,
        data,
        params=list(obj.param_names),
        reduction=obj.reduction,
        mode=obj.mode,
        dtype=obj.dtype,
        device=obj.device,
    )


def worst_case(
    ctx: Ctx,
    *,
    rho: float = 0.05,
    p: float | str = 2,
    scale: str | torch.Tensor | None = None,
    adaptive: bool = False,
    eta: float = 0.0,
    fisher: str = "empirical",
    solver: str = "apgd",
    iterations: int = 20,
    restarts: int = 1,
    step: float | None = None,
    momentum: float = 0.75,
    m: int | None = None,
    logit_normalization: bool = False,
    seed: int | torch.Generator | None = 0,
    _scale_override: tuple[torch.Tensor, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Worst-case sharpness ``max_{||delta / c||_p <= rho} L(w + delta) - L(w)``.

    SAM (Foret et al. 2021, eq. 1) for ``c = 1``; ASAM (Kwon et al. 2021, eq. 8) for
    ``c = |w| + eta`` (``adaptive=True`` or ``scale="adaptive"``); a Fisher geometry for
    ``scale="fisher"``. Solvers: ``"one_step"`` (SAM's first-order solution ``u = rho g/||g||`` or
    ``rho sign(g)``, then the exact loss there), ``"pgd"`` (projected steepest ascent, step
    ``2.5 rho / iterations`` unless ``step``), ``"apgd"`` (Auto-PGD, Croce & Hein 2020, with the
    m-sharpness settings of Andriushchenko et al. 2023: 20 iterations, momentum 0.75, initial step
    ``2 rho``, step halving at checkpoints). ``pgd``/``apgd`` start from ``u = 0`` (their first step is
    the one-step point) and further ``restarts`` from uniform random points; the best evaluated point
    is returned, so the value is ``>= 0``. ``m``: m-sharpness (Foret et al. 2021, Sec. 4;
    Andriushchenko et al. 2023, eq. 3): the data are split into consecutive sub-batches of ``m``
    examples and the value is the weighted mean of the per-sub-batch worst cases.
    """
    if isinstance(p, str):
        p = {"2": 2, "inf": math.inf, "linf": math.inf}.get(p.lower(), p)
    if p not in (2, math.inf):
        raise ValueError(f"p must be 2 or inf (float('inf') or 'inf'), got {p!r}")
    check_positive("rho", rho)
    check_choice("solver", solver, SOLVERS)
    check_positive("iterations", iterations, integer=True)
    check_positive("restarts", restarts, integer=True)
    check_probability("momentum", momentum)
    if step is not None:
        check_positive("step", step)
    if m is not None:
        check_positive("m", m, integer=True)
    if adaptive and scale not in (None, "adaptive"):
        raise ValueError(f"adaptive=True conflicts with scale={scale!r}; pass only one of them")
    if adaptive:
        scale = "adaptive"
    gen, seed_value = make_generator(seed)
    obj = ctx.obj
    if logit_normalization:
        obj = _normalised_logits_objective(obj)
        ctx = ctx.child(obj)
    c, scale_cfg = (
        _scale_override if _scale_override is not None else make_scale(ctx, scale, eta, fisher=fisher)
    )
    cfg: dict[str, Any] = dict(
        rho=rho,
        p="inf" if p == math.inf else 2,
        **scale_cfg,
        solver=solver,
        iterations=iterations if solver != "one_step" else 1,
        restarts=restarts if solver != "one_step" else 1,
        m=m,
        logit_normalization=logit_normalization,
        seed=seed_value,
    )
    if solver == "pgd":
        cfg["step"] = step if step is not None else 2.5 * rho / iterations
    if solver == "apgd":
        cfg.update(momentum=momentum, initial_step=2 * rho)
    if m is None:
        loss0, best, u = _solve(ctx, c, rho, p, solver, iterations, restarts, step, momentum, gen)
        delta = c * u
        extra = {"loss": loss0, "perturbed_loss": best, "delta_norm": float(delta.norm())}
        return {"value": best - loss0, "stderr": None, "config": cfg, "extra": extra}
    batches = split_data(obj, m)
    weights = sub_batch_weights(obj, [len(y) for _, y in batches])
    rises = []
    for x, y in ctx.tqdm(batches, desc="m-sharpness", leave=False):
        sub = ctx.child(obj.with_data([(x, y)]))
        loss0, best, _ = _solve(sub, c, rho, p, solver, iterations, restarts, step, momentum, gen)
        rises.append(best - loss0)
    value = float(sum(w * r for w, r in zip(weights, rises)))
    extra = {"num_sub_batches": len(batches), "sub_batch_values": rises}
    return {"value": value, "stderr": None, "config": cfg, "extra": extra}


def fisher_worst_case(
    ctx: Ctx,
    *,
    gamma: float = 0.1,
    eta: float = 1.0,
    fisher: str = "gradient",
    solver: str = "apgd",
    iterations: int = 20,
    restarts: int = 1,
    step: float | None = None,
    momentum: float = 0.75,
    m: int | None = None,
    logit_normalization: bool = False,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Fisher worst case ``max_{delta^T F~ delta <= gamma^2} L(w + delta) - L(w)`` (Kim et al. 2022,
    FSAM paper eq. 8) with ``F~ = I + eta diag(f)`` as in FSAM's implementation (``1/(1 + eta f)`` is
    its inverse, paper Sec. 3 "we add a small positive regulariser"): ``f = g^2`` (``fisher="gradient"``,
    paper eq. 12, the default as in Alg. 1) or the empirical diagonal (``"empirical"``, eq. 11).
    ``solver="one_step"`` is the closed form of eq. 10, ``delta = gamma F~^{-1} g / sqrt(g^T F~^{-1} g)``.
    Solved as ``worst_case`` with ``c = (1 + eta f)^{-1/2}`` and ``rho = gamma``.
    """
    check_positive("gamma", gamma)
    check_positive("eta", eta, allow_zero=True)
    check_choice("fisher", fisher, ("gradient", "empirical"))
    if fisher == "gradient":
        f = ctx.gradient() ** 2
    else:
        f = per_example_gradients(ctx, square_sum=True)
    c = (1.0 + eta * f).rsqrt()
    out = worst_case(
        ctx,
        rho=gamma,
        p=2,
        solver=solver,
        iterations=iterations,
        restarts=restarts,
        step=step,
        momentum=momentum,
        m=m,
        logit_normalization=logit_normalization,
        seed=seed,
        _scale_override=(c, {"scale": "fisher_fsam", "eta": eta, "fisher": fisher}),
    )
    cfg = out["config"]
    cfg.pop("rho")
    out["config"] = {"gamma": gamma, **cfg}
    return out


# --------------------------------------------------------------------------------------------
# Keskar et al. 2017
# --------------------------------------------------------------------------------------------
def keskar(
    ctx: Ctx,
    *,
    epsilon: float = 1e-3,
    subspace: int | None = None,
    iterations: int = 10,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Keskar et al. 2017 (Sec. 2.2.2, metric 3):
    ``phi = 100 (max_{y in C_eps} L(w + A y) - L(w)) / (1 + L(w))`` with the box
    ``C_eps = {|y_i| <= eps (|(A^+ w)_i| + 1)}``; ``A = I`` (full space, ``subspace=None``) or a
    random ``p x subspace`` Gaussian matrix. The maximisation is L-BFGS-B (scipy, float64) on ``-L``
    from ``y = 0`` with ``iterations`` iterations (the paper: 10); the largest loss evaluated is
    used (every evaluated point is inside the box).
    """
    from scipy.optimize import minimize

    check_positive("epsilon", epsilon)
    check_positive("iterations", iterations, integer=True)
    gen, seed_value = make_generator(seed)
    w0 = ctx.w0
    if subspace is None:
        a = None
        y_ref = w0
    else:
        check_positive("subspace", subspace, integer=True)
        a = torch.randn(ctx.p, subspace, generator=gen, dtype=torch.float64).to(w0)
        y_ref = torch.linalg.pinv(a) @ w0
    bound = (epsilon * (y_ref.abs() + 1)).detach().cpu().double().numpy()
    loss0 = ctx.loss()
    best = [loss0]

    def fun(y_np: np.ndarray) -> tuple[float, np.ndarray]:
        y_np = np.clip(y_np, -bound, bound)
        y = torch.from_numpy(y_np).to(w0)
        delta = y if a is None else a @ y
        loss, g = ctx.loss_grad(w0 + delta)
        best[0] = max(best[0], loss)
        gy = g if a is None else a.T @ g
        return -loss, -gy.detach().cpu().double().numpy()

    res = minimize(
        fun,
        np.zeros_like(bound),
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(-bound, bound)),
        options={"maxiter": iterations},
    )
    value = 100.0 * (best[0] - loss0) / (1.0 + loss0)
    cfg = dict(epsilon=epsilon, subspace=subspace, iterations=iterations, solver="L-BFGS-B", seed=seed_value)
    extra = {"loss": loss0, "max_loss": best[0], "lbfgs_iterations": int(res.nit)}
    return {"value": value, "stderr": None, "config": cfg, "extra": extra}


# --------------------------------------------------------------------------------------------
# robustness to adversarial parameter perturbation (FSAM paper Sec. 5.4, Fig. 4)
# --------------------------------------------------------------------------------------------
DEFAULT_ALPHAS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0)


def perturbation_robustness(
    ctx: Ctx,
    *,
    alphas: tuple[float, ...] | list[float] = DEFAULT_ALPHAS,
    noise_samples: int = 5,
    seed: int | torch.Generator | None = 0,
) -> dict[str, Any]:
    """Loss and accuracy after ``w + alpha g/||g||`` (adversarial parameter perturbation, Sun et al.
    2021, as in the FSAM paper Sec. 5.4 with ``alpha`` from 0.1 to 5.0), and after Gaussian noise of
    the same norm ``w + alpha xi/||xi||`` (mean over ``noise_samples`` draws) for comparison.
    The curves are in ``extra``; ``value`` is the mean adversarial loss rise over the grid."""
    if isinstance(alphas, (str, bytes)) or not hasattr(alphas, "__iter__"):
        raise TypeError(f"alphas must be a list of finite numbers >= 0, got {alphas!r}")
    alphas = [check_nonnegative(f"alphas[{i}]", a) for i, a in enumerate(alphas)]
    if not alphas:
        raise ValueError("alphas is empty: pass a non-empty list of finite numbers >= 0")
    check_positive("noise_samples", noise_samples, integer=True)
    gen, seed_value = make_generator(seed)
    loss0, g = ctx.loss_grad()
    base = ctx.evaluate()
    gn = float(g.norm())
    if gn == 0:
        raise ValueError("the gradient is exactly zero: the adversarial direction g/||g|| is undefined")
    direction = g / gn
    noise = [ctx.randn(gen) for _ in range(noise_samples)]
    noise = [xi / xi.norm() for xi in noise]
    adv_loss, adv_acc, noise_loss, noise_loss_std, noise_acc = [], [], [], [], []
    for a in ctx.tqdm(alphas, desc="alpha grid", leave=False):
        r = ctx.evaluate(ctx.w0 + a * direction)
        adv_loss.append(r["loss"])
        adv_acc.append(r["accuracy"])
        rs = [ctx.evaluate(ctx.w0 + a * xi) for xi in noise]
        ls_ = torch.tensor([x["loss"] for x in rs], dtype=torch.float64)
        noise_loss.append(float(ls_.mean()))
        noise_loss_std.append(float(ls_.std()) if len(rs) > 1 else 0.0)
        noise_acc.append(None if rs[0]["accuracy"] is None else float(np.mean([x["accuracy"] for x in rs])))
    value = float(np.mean([v - loss0 for v in adv_loss]))
    extra = dict(
        alphas=alphas,
        loss=loss0,
        accuracy=base["accuracy"],
        adversarial_loss=adv_loss,
        adversarial_accuracy=adv_acc,
        noise_loss=noise_loss,
        noise_loss_std=noise_loss_std,
        noise_accuracy=noise_acc,
        gradient_norm=gn,
    )
    cfg = dict(alphas=alphas, noise_samples=noise_samples, seed=seed_value)
    return {"value": value, "stderr": None, "config": cfg, "extra": extra}
