"""G-TRACER: SGD-TRACER and Adam-TRACER (Williams & Roberts 2023, "G-TRACER: Expected sharpness
optimization", Alg. 1 and eq. 58).

The loss is augmented by the trace-ratio penalty ``T(w) = rho <g^2, 1/(f_bar + delta)>`` with
``g = grad L_B(w)`` and ``f_bar`` an exponential moving average of ``g^2`` held constant in the
derivative, so the update direction is

    d = g + 2 rho H (g / (f_bar + delta))                                   (Alg. 1, eq. 58)

followed by ``f_bar <- (1 - beta) f_bar + beta g^2``.  ``d`` is handed to a base optimizer: SGD
(momentum, weight decay, Nesterov allowed) for :class:`SGDTracer`, Adam for :class:`AdamTracer`.
``f_bar`` is initialised with the first step's ``g^2`` so the first penalty is not divided by a
zero EMA (Alg. 1 initialises ``f_0`` without giving a value).

Hessian-vector product ``H v`` with ``v = g / (f_bar + delta)``:

* ``hvp="exact"`` (default): double backward.  As in Hessian-based optimizers such as AdaHessian,
  the closure must call ``loss.backward(create_graph=True)`` so that the gradients carry their
  graph; ``H v = d<g, v>/dw`` is then one more backward pass.  The graph is freed after the step:
  every ``.grad`` is replaced by the detached direction ``d`` that the base optimizer used.
* ``hvp="finite_difference"``: ``H v ~ (grad L(w + h v) - grad L(w)) / h`` (two first-order passes,
  works with any closure and where double backward is unsupported).  ``h = fd_step / ||v||`` so
  that the probe moves the weights by ``fd_step`` in norm; the default
  ``fd_step = sqrt(eps_dtype) * (1 + ||w||)`` is the standard forward-difference step (Nocedal &
  Wright, *Numerical Optimization*, 2nd ed., eq. 8.6 and Sec. 8.1 on Hessian-vector products):
  it balances truncation (``O(h)``) and round-off (``O(eps / h)``) errors.

Default constants.  The paper states none: Alg. 1 calls ``delta`` "a small positive constant",
eq. 58 (from which Alg. 1 is summarised) has no ``delta`` at all, and the experiments (Sec. 2.4:
SGD with momentum, initial learning rate 0.1, cosine decay; Adam-TRACER for BERT fine-tuning at
2e-5) report accuracy against ``rho`` in Fig. 1 without listing ``rho``, ``delta`` or ``beta``.
The penalty the paper motivates is the trace ratio ``rho <g^2, 1/f_bar>``, invariant to affine
reparameterisations (Sec. 2.3), so the defaults put most coordinates in that regime,
``f_bar >> delta``:

* ``delta = 1e-8``: small against the squared gradients of ordinary networks.  On the digits demo
  (64-64-10 tanh MLP, batches of 64, SGD-TRACER lr 0.1, momentum 0.9, weight decay 5e-4) 83 % of the 4810
  coordinates -- 89 % of those with a nonzero gradient; 256 first-layer weights only see
  always-zero pixels -- have ``f_bar > delta`` after 5 steps (85 % after 10 epochs; ``f_bar``
  quantiles 10/50/90 %: 6e-9, 1.8e-5, 6e-5).  At the former default ``delta = 1e-2`` no
  coordinate does and the penalty is ``(rho / delta) ||g||^2``, a plain gradient-norm penalty.
  Networks whose per-coordinate squared gradients are smaller (``f_bar ~ ||g||^2 / p``) need a
  smaller ``delta`` for the same regime: ``self.last["fbar_above_delta"]`` reports the fraction.
* ``rho = 1e-6``: in this regime ``||2 rho H v||`` is no longer bounded by ``2 (rho/delta) ||H|| ||g||``
  in a useful way (``v = g / f_bar ~ 1 / |g|``), so ``rho`` was set by measurement on the same
  problem: ``||2 rho H v|| / ||g||`` has median 0.08 and maximum 2.3 over 10 epochs (test accuracy
  0.974; Adam-TRACER lr 3e-3: 0.06 / 2.4, 0.965); ``rho = 1e-5`` gave median 0.45, maximum 23 and
  accuracy 0.963; with ``rho = 1e-4`` and ``1e-3`` training failed (chance accuracy).
* ``beta = 0.01``: the EMA weight of the newest ``g^2``.  A horizon of ~100 steps makes ``f_bar`` a
  smooth estimate of the diagonal empirical Fisher over a fraction of an epoch, like Adam's
  second-moment EMA (whose weight is ``1 - beta2 = 0.001``) but quicker to follow the start of
  training.

The former defaults ``rho = 1e-3``, ``delta = 1e-2`` (``rho / delta = 0.1``, the damped
gradient-norm regime: correction median 0.25, maximum 0.70, accuracy 0.972 on the same problem)
remain available by passing them.

Rare features and ``max_correction_ratio``.  The per-coordinate ratio ``g_i^2 / (f_bar_i + delta)``
has no upper bound: a coordinate whose gradient is usually tiny (``f_bar_i <~ delta``) and then
jumps gets ``v_i = g_i / (f_bar_i + delta)`` up to ``g_i / delta``.  This is how the label-noise
digits miniature's seed 1 (tanh 64-128-128-10, batch 32, lr 0.05, momentum 0.9, 40 % flipped
labels) diverges: the first-layer weights of a standardised corner pixel that is on in one
training image carry nearly all of ``||v||``, and the correction jumps to hundreds, then thousands
of times ``||g||``.  ``docs/make_gtracer_divergence.py`` replays that run step by step; its numbers
are on the methods page (G-TRACER, "Rare features").  The method
is followed as published: the paper clips nothing, but its convergence theorem (App. A.3, eqs.
71 and 76) assumes ``||rho grad T||^2 <= kappa ||g||^2 + zeta`` with ``kappa < 1``, and the bound
on the bias it derives this from (eq. 68) grows as ``(rho / delta)^2``; ``rho / delta = 100`` at
the defaults.
``max_correction_ratio=c`` (default ``None``, the paper's rule) rescales the correction to
``min(1, c ||g|| / ||2 rho H v||) * 2 rho H v``, one factor for all parameters, which makes the
assumption hold with ``kappa = c^2, zeta = 0``; for ``c < 1`` the direction also stays a descent
direction of the batch loss, ``<g, d> >= (1 - c) ||g||^2``.  With ``c = 1`` the miniature's seed 1
trains, the bound acting on a small fraction of its steps (the same script and page).  Without a
bound a ``RuntimeWarning`` names the step and the ratio when it first exceeds 10, and again at 100,
1,000, ...; a non-finite loss, gradient or correction raises ``FloatingPointError`` before
anything (parameters, ``f_bar``, the base optimizer's state) changes.

``self.last``: ``step``, ``loss``, ``penalty`` (``T(w)``), ``grad_norm`` (``||g||``), ``hv_norm``
(``||H v||``), ``correction_norm`` (``||2 rho H v||``, before any bound), ``correction_ratio``
(``||2 rho H v|| / ||g||``), ``correction_scale`` (the bound's factor, 1 when it does not act),
``fbar_min/mean/max``, ``fbar_above_delta`` (fraction of coordinates with ``f_bar > delta`` after
the update), ``hvp``, ``fd_h``.  The ``f_bar`` statistics are 0-d tensors on the parameters' device
(read with ``float()`` when needed); the numbers the step decides on (finiteness, norms, penalty)
come back to the host in one transfer per step, the only synchronisation of an exact-HVP step on a
GPU (the finite-difference step reads ``||v||`` and ``||w||`` for its step size too).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landscape.checks import check_range
from optimizers.perturbation import bn_restore, bn_snapshot
from optimizers.posterior import check_closure_loss, check_nonneg, check_positive
from optimizers.state import check_state_dict, tag_state_dict

__all__ = ["SGDTracer", "AdamTracer", "TracerBase"]

#: Without ``max_correction_ratio``, a ``RuntimeWarning`` when the correction first exceeds this
#: multiple of ``||g||`` (an order of magnitude beyond the ratio 1 that the convergence theorem of
#: Williams & Roberts 2023, App. A.3, eqs. 71 and 76, assumes: kappa < 1), and again each time it
#: reaches a further power of 10 (so a divergence shows as a short run of warnings).
WARN_RATIO = 10.0


def _max_ratio(
    gds: list[torch.Tensor], fbars: list[torch.Tensor], params: list[torch.Tensor], group_of: dict
) -> float:
    """The largest per-coordinate penalty term ``g_i^2 / (f_bar_i + delta)`` (for the warning)."""
    return max(
        float((gd.square() / (fb + group_of[p]["delta"])).max()) for gd, fb, p in zip(gds, fbars, params)
    )


class TracerBase(torch.optim.Optimizer):
    """Shared machinery of :class:`SGDTracer` and :class:`AdamTracer` (any base optimizer works)."""

    def __init__(
        self,
        params: Any,
        base_optimizer: type[torch.optim.Optimizer],
        lr: float,
        rho: float = 1e-6,
        beta: float = 0.01,
        delta: float = 1e-8,
        hvp: str = "exact",
        fd_step: float | None = None,
        model: nn.Module | None = None,
        max_correction_ratio: float | None = None,
        **base_kwargs: Any,
    ) -> None:
        check_nonneg("lr", lr)
        check_nonneg("rho", rho)
        check_range("beta (EMA weight of the newest g^2)", beta, 0.0, 1.0, low_open=True)
        check_positive("delta", delta)
        if hvp not in ("exact", "finite_difference"):
            raise ValueError(f"hvp must be 'exact' or 'finite_difference', got {hvp!r}")
        if fd_step is not None:
            check_positive("fd_step", fd_step)
        if max_correction_ratio is not None:
            check_positive("max_correction_ratio (bound on ||2 rho H v|| / ||g||)", max_correction_ratio)
        defaults = dict(lr=lr, rho=rho, beta=beta, delta=delta, **base_kwargs)
        super().__init__(params, defaults)
        self.base_optimizer = base_optimizer(self.param_groups, lr=lr, **base_kwargs)
        self.param_groups = self.base_optimizer.param_groups
        self.hvp = hvp
        self.fd_step = fd_step
        self.model = model
        self.max_correction_ratio = None if max_correction_ratio is None else float(max_correction_ratio)
        self._warn_above = WARN_RATIO  # the next ratio that warns (see WARN_RATIO)
        self.steps = 0  # steps taken (saved in the state dict), named in the warnings and in `last`
        self.config = dict(
            base_optimizer=base_optimizer.__name__,
            lr=lr,
            rho=rho,
            beta=beta,
            delta=delta,
            hvp=hvp,
            fd_step=fd_step,
            max_correction_ratio=max_correction_ratio,
            **base_kwargs,
        )
        self.last: dict[str, Any] = {}

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; its hyperparameters (given or defaulted) are checked like the constructor's."""
        super().add_param_group(param_group)
        group, i = self.param_groups[-1], len(self.param_groups) - 1
        check_nonneg(f"lr (param group {i})", group["lr"])
        check_nonneg(f"rho (param group {i})", group["rho"])
        check_range(f"beta (param group {i})", group["beta"], 0.0, 1.0, low_open=True)
        check_positive(f"delta (param group {i})", group["delta"])

    # state lives in self.state (f_bar), the base optimizer keeps its own (momentum / Adam moments)
    def _params_with_grad(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.grad is not None]

    def _call(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        # torch warns that backward(create_graph=True) ties each parameter to its .grad in a
        # reference cycle; the step breaks it (every .grad is detached before it returns), so the
        # warning the closure's double-backward convention triggers says nothing to the user
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Using backward\(\) with create_graph=True")
            return check_closure_loss(closure(), type(self).__name__)

    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:  # type: ignore[override]
        """One TRACER step: closure at ``w`` (+ one more at ``w + h v`` for finite differences)."""
        if closure is None:
            raise ValueError(
                f"{type(self).__name__}.step needs a closure that zeroes grads, runs forward and backward "
                "and returns the loss"
            )
        loss = self._call(closure)
        params = self._params_with_grad()
        if not params:
            raise ValueError("no parameter received a gradient: did the closure call loss.backward()?")
        grads = [p.grad for p in params]
        if self.hvp == "exact" and not any(gr.requires_grad for gr in grads):
            for p in params:
                p.grad = p.grad.detach()
            raise RuntimeError(
                f"{type(self).__name__}(hvp='exact') needs the gradient graph: call "
                "loss.backward(create_graph=True) in the closure (AdaHessian convention), or use "
                "hvp='finite_difference' with a plain closure"
            )
        group_of = {p: g for g in self.param_groups for p in g["params"]}
        vs, gds, fbars, created, penalty_terms = [], [], [], [], []
        for p, gr in zip(params, grads):
            group = group_of[p]
            state = self.state[p]
            gd = gr.detach()
            if "f_bar" not in state:
                state["f_bar"] = gd.square().clone()  # initialised with the first step's g^2
                created.append(p)
            fb = state["f_bar"]
            denom = fb + group["delta"]
            vs.append(gd / denom)
            gds.append(gd)
            fbars.append(fb)
            penalty_terms.append((gd.square() / denom).sum())
        fd_h = None
        try:
            if self.hvp == "exact":
                inner = sum((gr * v).sum() for gr, v in zip(grads, vs) if gr.requires_grad)
                hvs = torch.autograd.grad(inner, params, allow_unused=True)
                hvs = [torch.zeros_like(p) if h is None else h.detach() for p, h in zip(params, hvs)]
            else:
                hvs, fd_h = self._fd_hvp(closure, params, gds, vs)
        finally:
            for p in params:
                if p.grad is not None:
                    p.grad = p.grad.detach()
        corrs = [2.0 * group_of[p]["rho"] * hv for p, hv in zip(params, hvs)]
        with torch.no_grad():
            # what the host decides on (finiteness, the correction bound, the warning), read back in
            # one transfer: one synchronisation per step on a GPU instead of one per number
            k = len(params)
            sums = [t.square().sum() for t in (*hvs, *corrs, *gds)]
            flags = [torch.isfinite(t).all() for t in (*gds, *corrs)]
            dev = loss.device
            host = torch.stack(
                [
                    t.to(device=dev, dtype=torch.float64)
                    for t in (loss.detach(), *penalty_terms, *sums, *flags)
                ]
            )
            values = host.tolist()
        loss_value, ok = values[0], values[1 + 4 * k :]
        pen, hv2, c2, g2 = (values[1 + i * k : 1 + (i + 1) * k] for i in range(4))
        finite = math.isfinite(loss_value) and all(f == 1.0 for f in ok)
        if not finite:  # leave parameters, f_bar and the base optimizer's state as they were
            for p, gd in zip(params, gds):
                p.grad = gd
            for p in created:
                del self.state[p]["f_bar"]
                if not self.state[p]:
                    del self.state[p]
            n_g = sum(int((~torch.isfinite(gd)).sum()) for gd in gds)
            n_c = sum(int((~torch.isfinite(c)).sum()) for c in corrs)
            raise FloatingPointError(
                f"{type(self).__name__}: non-finite step (loss {loss_value}, {n_g} non-finite "
                f"gradient entries, {n_c} non-finite entries of the correction 2 rho H v); the parameters, "
                "f_bar and the base optimizer's state were left unchanged. Lower the learning rate or rho, "
                "raise delta, or bound the correction with max_correction_ratio=1"
            )
        penalty = 0.0
        for p, term in zip(params, pen):
            penalty += group_of[p]["rho"] * term
        hv_sq, corr_sq, g_sq = sum(hv2), sum(c2), sum(g2)
        grad_norm, corr_norm = math.sqrt(g_sq), math.sqrt(corr_sq)
        ratio = corr_norm / grad_norm if grad_norm > 0 else (math.inf if corr_norm > 0 else 0.0)
        scale = 1.0
        if self.max_correction_ratio is not None and ratio > self.max_correction_ratio:
            scale = self.max_correction_ratio * grad_norm / corr_norm
        elif self.max_correction_ratio is None and ratio > self._warn_above:
            while ratio > self._warn_above:
                self._warn_above *= 10.0
            warnings.warn(
                f"{type(self).__name__} step {self.steps + 1}: the TRACER correction ||2 rho H v|| = "
                f"{corr_norm:.4g} is {ratio:.3g} times the gradient norm ||g|| = {grad_norm:.4g}; the "
                "convergence theorem of Williams & Roberts (2023, App. A.3) assumes a ratio below 1. The "
                "largest per-coordinate term g_i^2/(f_bar_i + delta) is "
                f"{_max_ratio(gds, fbars, params, group_of):.3g}: values far above 1 come from coordinates "
                "whose gradient jumps far above its running average f_bar (e.g. rare input features), "
                "values near or below 1 from a large rho/delta. Pass max_correction_ratio=1 to bound the "
                "correction, or raise delta / lower rho. (Warned again only if the ratio exceeds "
                f"{self._warn_above:.0f}.)",
                RuntimeWarning,
                stacklevel=3,  # step() is wrapped by torch.optim's hooks: point at the caller
            )
        above = []
        with torch.no_grad():
            for p, gd, corr, fb in zip(params, gds, corrs, fbars):
                group = group_of[p]
                p.grad = gd + (corr if scale == 1.0 else corr * scale)
                fb.mul_(1.0 - group["beta"]).add_(gd.square(), alpha=group["beta"])
                above.append((fb > group["delta"]).sum())
            self.base_optimizer.step()
        self.steps += 1
        all_fb = torch.cat([fb.reshape(-1) for fb in fbars])
        self.last = dict(  # the f_bar statistics (after the update) stay 0-d tensors on the device
            step=self.steps,
            loss=loss_value,
            penalty=penalty,
            grad_norm=grad_norm,
            hv_norm=math.sqrt(hv_sq),
            correction_norm=corr_norm,
            correction_ratio=ratio,
            correction_scale=scale,
            fbar_min=all_fb.min(),
            fbar_mean=all_fb.mean(),
            fbar_max=all_fb.max(),
            fbar_above_delta=torch.stack(above).sum().double() / all_fb.numel(),
            hvp=self.hvp,
            fd_h=fd_h,
        )
        return loss.detach()

    @torch.no_grad()
    def _fd_hvp(
        self,
        closure: Callable[[], torch.Tensor],
        params: list[torch.Tensor],
        gds: list[torch.Tensor],
        vs: list[torch.Tensor],
    ) -> tuple[list[torch.Tensor], float]:
        gds = [g.clone() for g in gds]  # the closure overwrites .grad
        v_norm = math.sqrt(sum(float(v.square().sum()) for v in vs))
        if self.fd_step is None:
            w_norm = math.sqrt(sum(float(p.detach().square().sum()) for p in params))
            eps = torch.finfo(params[0].dtype).eps
            step = math.sqrt(eps) * (1.0 + w_norm)
        else:
            step = self.fd_step
        h = step / (v_norm + 1e-12)
        saved = [p.detach().clone() for p in params]
        bn_saved = bn_snapshot(self.model)
        try:
            for p, v in zip(params, vs):
                p.add_(v, alpha=h)
            self._call(closure)
            g2 = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        finally:
            for p, old in zip(params, saved):
                p.copy_(old)
            bn_restore(bn_saved)
        for p, g in zip(params, gds):
            p.grad = g
        return [(b - a) / h for a, b in zip(gds, g2)], h


class SGDTracer(TracerBase):
    """SGD-TRACER (Williams & Roberts 2023, Alg. 1): the TRACER direction fed to ``torch.optim.SGD``.

    ``SGDTracer(params, lr, rho=1e-6, beta=0.01, delta=1e-8, hvp="exact", fd_step=None,
    model=None, max_correction_ratio=None, momentum=0, dampening=0, weight_decay=0, nesterov=False)``.
    Weight decay is applied by SGD, outside the penalty.  ``model`` (optional) lets the
    finite-difference pass leave BatchNorm running statistics untouched.  See the module docstring
    for the rule, the defaults and ``max_correction_ratio``.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        rho: float = 1e-6,
        beta: float = 0.01,
        delta: float = 1e-8,
        hvp: str = "exact",
        fd_step: float | None = None,
        model: nn.Module | None = None,
        max_correction_ratio: float | None = None,
        **sgd_kwargs: Any,
    ) -> None:
        super().__init__(
            params,
            torch.optim.SGD,
            lr,
            rho,
            beta,
            delta,
            hvp,
            fd_step,
            model,
            max_correction_ratio,
            **sgd_kwargs,
        )


class AdamTracer(TracerBase):
    """Adam-TRACER (Williams & Roberts 2023, Sec. 2.2): the TRACER direction fed to ``torch.optim.Adam``.

    ``AdamTracer(params, lr=1e-3, rho=1e-6, beta=0.01, delta=1e-8, hvp="exact", fd_step=None,
    model=None, max_correction_ratio=None, betas=(0.9, 0.999), eps=1e-8, weight_decay=0)``.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        rho: float = 1e-6,
        beta: float = 0.01,
        delta: float = 1e-8,
        hvp: str = "exact",
        fd_step: float | None = None,
        model: nn.Module | None = None,
        max_correction_ratio: float | None = None,
        **adam_kwargs: Any,
    ) -> None:
        super().__init__(
            params,
            torch.optim.Adam,
            lr,
            rho,
            beta,
            delta,
            hvp,
            fd_step,
            model,
            max_correction_ratio,
            **adam_kwargs,
        )


def _tracer_state_dict(self: TracerBase) -> dict[str, Any]:
    sd = {"tracer": torch.optim.Optimizer.state_dict(self), "base": self.base_optimizer.state_dict()}
    sd["base_optimizer_class"] = type(self.base_optimizer).__name__
    sd["steps"] = self.steps
    return tag_state_dict(sd, self, self.param_groups)


def _tracer_load_state_dict(self: TracerBase, state_dict: dict[str, Any]) -> None:
    state_dict = check_state_dict(state_dict, self, self.param_groups, required=("tracer", "base"))
    base_cls = state_dict.get("base_optimizer_class")
    if base_cls is not None and base_cls != type(self.base_optimizer).__name__:
        raise ValueError(
            f"{type(self).__name__}.load_state_dict: the state dict's base optimizer is {base_cls}, "
            f"this one's is {type(self.base_optimizer).__name__}"
        )
    torch.optim.Optimizer.load_state_dict(self, state_dict["tracer"])
    self.base_optimizer.load_state_dict(state_dict["base"])
    self.param_groups = self.base_optimizer.param_groups
    self.steps = int(state_dict.get("steps", 0))  # state dicts saved before the counter: 0


TracerBase.state_dict = _tracer_state_dict  # type: ignore[method-assign]
TracerBase.load_state_dict = _tracer_load_state_dict  # type: ignore[method-assign]
