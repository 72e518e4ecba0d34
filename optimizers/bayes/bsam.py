"""Bayesian SAM / bSAM (Moellenhoff & Khan 2023, "SAM as an optimal relaxation of Bayes", Alg. 1).

The rule below is the published Alg. 1 (ICLR 2023) as the official code runs it; the equations and
where the code differs are in ``docs/methods/optimizers.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landscape.checks import check_range
from optimizers.batched_chunks import NotVectorisable, batched_reason, bsam_chunks
from optimizers.bayes.bsam_split import BSAMSplitStep
from optimizers.perturbation import accepts_chunk, bn_restore, bn_snapshot
from optimizers.posterior import (
    DiagonalGaussianPosterior,
    check_closure_loss,
    check_nonneg,
    check_num_data,
    check_positive,
    resolve_generator,
)
from optimizers.state import GeneratorStateMixin

__all__ = ["BayesianSAM"]


def _check_betas(name: str, betas: Any) -> None:
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"{name} must be two numbers in [0, 1), got {betas!r}")
    for j, b in enumerate(betas):
        check_range(f"{name}[{j}]", b, 0.0, 1.0, high_open=True)


def _mean_of_sums(sums: list[torch.Tensor | None], params: list[torch.Tensor], m: int) -> list[torch.Tensor]:
    """``sum / m`` per parameter (zeros where a parameter got no gradient); the sums themselves for
    ``m = 1`` (dividing by one is exact: no copy, no extra pass over the parameters)."""
    filled = [torch.zeros_like(p) if t is None else t for t, p in zip(sums, params)]
    return filled if m == 1 else torch._foreach_div(filled, m)


class BayesianSAM(BSAMSplitStep, DiagonalGaussianPosterior, GeneratorStateMixin, torch.optim.Optimizer):
    r"""bSAM: SAM with a learned diagonal-Gaussian posterior ``N(w, diag(1 / (N s)))``.

    State per parameter: mean ``w`` (the parameter), momentum ``g_m = 0``, precision ``s = s_init``.
    With ``delta = prior_precision / N`` and the batch split into ``m`` sub-batches, one step is
    (Alg. 1 of the paper)::

        for each sub-batch k:
            e_k  ~ N(0, 1 / (N s))                       # line 3; skipped with noise=False
            g_k  = grad L_k(w + e_k)                     # closure at the noisy point
            eps_k = rho * g_k / s                        # no normalisation
            g_eps,k = grad L_k(w + eps_k)                # closure at the mean plus eps (not w + e_k)
            h_k  = sqrt(s) * |g_k|
        g_eps, h = means over k
        g_m <- beta1 g_m + (1 - beta1) (g_eps + delta w)
        s   <- beta2 s   + (1 - beta2) (h + delta + damping)
        w   <- w - lr * g_m / s

    ``s_update_order="paper"`` (default) updates ``s`` before ``w`` as Alg. 1 is printed;
    ``"official"`` divides by the ``s`` from *before* the update, as the authors' JAX code does.
    The two agree to first order in ``1 - beta2``.

    ``noise=False`` is the paper's "bSAM w/o noise" ablation (App. F.5): ``g_k`` at ``w`` itself;
    the step is then deterministic.  Noise is drawn with ``self.generator`` per sub-batch,
    parameter by parameter in ``param_groups`` order,
    ``torch.randn(p.shape, generator, dtype=p.dtype, device=p.device) * (N s)^{-1/2}``.

    Weight decay: there is none besides the prior term ``delta w`` (``prior_precision`` plays that
    role); ``damping`` (gamma) regularises ``s`` only.

    Args:
        params: parameters or param groups (``lr``, ``rho``, ``betas``, ``prior_precision``,
            ``damping`` may be set per group).
        lr: step size alpha (official CIFAR setting 0.5 with warm-up and cosine decay).
        num_data: ``N``, the training-set size (times the augmentation factor if you use one;
            official CIFAR code: 4).
        rho: SAM radius scale; default 0.01 (authors' README, bSAM on CIFAR-10/100; 5e-5 on
            TinyImageNet).
        betas: ``(beta1, beta2)``; default ``(0.9, 0.999)`` (paper, Sec. 5).
        prior_precision: precision of the ``N(0, 1/prior_precision)`` prior;
            ``delta = prior_precision / N``.  Default 40: the authors' README command for bSAM
            with ResNet-18 on CIFAR-10 and CIFAR-100 (``--priorprec 40``, with ``--dafactor 4`` in
            ``N``) since their commit "fix hyperparams" (936eec1, July 2023), which changed it
            from 10 and the quoted bSAM result from 96.11 % to 95.95 %.  Their README uses 25 for
            ResNet-20 on TinyImageNet, which is also the ``--priorprec`` default of their
            ``train.py`` (and the SGD/SAM baselines' CIFAR value, weight decay ``25 / N``).
        damping: gamma, default 0.1 (paper).
        s_init: initial precision, default 1.0 (paper).
        noise: ``False`` gives the "bSAM w/o noise" ablation.
        m: sub-batches (m-sharpness, paper App. E.4, experiments use 8).  With ``m > 1`` the closure
            is called as ``closure(k)`` and computes the loss of sub-batch ``k`` (same contract as
            the SAM family, :mod:`optimizers.perturbation`; build it with ``make_closure``).
        s_update_order: ``"paper"`` or ``"official"`` (see above).
        seed, generator: randomness (see :func:`optimizers.posterior.resolve_generator`).
        model: optional module; BatchNorm running statistics are updated only by the first pass of
            each sub-batch (the pass at the noisy point), never by the pass at ``w + eps``.
        batched_m: with ``m > 1`` vectorise the sub-batches when the closure allows it (as the SAM
            family, :mod:`optimizers.batched_chunks`; ``self.last["m_sharpness"]`` says which ran);
            ``False`` forces the loop of ``2 m`` closure calls.

    ``self.last``: ``loss`` (mean over sub-batches of the first-pass loss, at ``w + e``),
    ``loss_perturbed`` (at ``w + eps``), ``grad_norm`` (``||g||``, mean over sub-batches),
    ``eps_norm``, ``noise_norm``, ``s_min/s_mean/s_max`` (after the update), ``posterior_std_mean``.
    The posterior for prediction: :meth:`posterior_std`, :meth:`sample`,
    :meth:`bayesian_model_average` (paper: 32 samples).
    """

    _group_keys = ("lr", "rho", "betas", "prior_precision", "damping")

    def __init__(
        self,
        params: Any,
        lr: float,
        num_data: int,
        rho: float = 0.01,  # official CIFAR setting
        betas: tuple[float, float] = (0.9, 0.999),  # paper Sec. 5
        prior_precision: float = 40.0,  # authors' README (after "fix hyperparams"), ResNet-18 CIFAR
        damping: float = 0.1,  # paper, gamma
        s_init: float = 1.0,  # paper
        noise: bool = True,
        m: int = 1,
        s_update_order: str = "paper",
        seed: int | None = None,
        generator: torch.Generator | None = None,
        model: nn.Module | None = None,
        batched_m: bool = True,
    ) -> None:
        check_nonneg("lr", lr)
        check_num_data(num_data)
        check_nonneg("rho", rho)
        check_nonneg("prior_precision", prior_precision)
        check_nonneg("damping", damping)
        check_positive("s_init", s_init)
        _check_betas("betas", betas)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m (number of sub-batches) must be an int >= 1, got {m!r}")
        if s_update_order not in ("paper", "official"):
            raise ValueError(f"s_update_order must be 'paper' or 'official', got {s_update_order!r}")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module or None, got {type(model).__name__}")
        defaults = dict(lr=lr, rho=rho, betas=tuple(betas), prior_precision=prior_precision, damping=damping)
        super().__init__(params, defaults)
        self.num_data = num_data
        self.s_init = float(s_init)
        self.noise = bool(noise)
        self.m = m
        self.s_update_order = s_update_order
        self.model = model
        first = next((p for g in self.param_groups for p in g["params"]), None)
        self.generator, self.seed = resolve_generator(
            seed, generator, first.device if first is not None else None
        )
        self.config = dict(
            lr=lr,
            num_data=num_data,
            rho=rho,
            betas=tuple(betas),
            prior_precision=prior_precision,
            damping=damping,
            s_init=s_init,
            noise=noise,
            m=m,
            s_update_order=s_update_order,
            seed=self.seed,
            batched_m=bool(batched_m),
        )
        self.batched_m = bool(batched_m)
        self._batched_failed: dict[int, str] = {}
        self.last: dict[str, Any] = {}

    # ----------------------------------------------------------------------------------------
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group; its hyperparameters (given or defaulted) are checked like the constructor's."""
        super().add_param_group(param_group)
        group, i = self.param_groups[-1], len(self.param_groups) - 1
        for key in ("lr", "rho", "prior_precision", "damping"):
            check_nonneg(f"{key} (param group {i})", group[key])
        _check_betas(f"betas (param group {i})", group["betas"])

    def _params(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _s(self, p: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        if "s" not in st:
            st["s"] = torch.full_like(p, self.s_init, memory_format=torch.preserve_format)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["step"] = 0
        return st["s"]

    def precision(self) -> dict[torch.Tensor, torch.Tensor]:
        """The precision vector ``s`` of every parameter (``s_init`` before the first step)."""
        return {p: self._s(p).detach().clone() for _, p in self._params()}

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``sqrt(1 / (N s))`` for every parameter (posterior ``N(w, diag(1/(N s)))``)."""
        return {p: torch.rsqrt(self.num_data * self._s(p).detach()) for _, p in self._params()}

    def _call(self, closure: Callable[..., Any], chunk: int | None) -> torch.Tensor:
        for _, p in self._params():
            p.grad = None
        with torch.enable_grad():
            loss = closure() if chunk is None else closure(chunk)
        return check_closure_loss(loss, "BayesianSAM").detach()

    def _sequential(
        self, closure: Callable[..., Any], pairs: list, s_list: list[torch.Tensor]
    ) -> dict[str, Any]:
        """The ``2 m`` closure calls one sub-batch after another; the sums the update needs.

        ``g_eps_sum[i]`` / ``h_sum[i]`` are ``None`` for a parameter that got no gradient.  The
        diagnostics (squared norms) stay 0-d tensors on the parameters' device: no host read.
        """
        params = [p for _, p in pairs]
        chunks: list[int | None] = [None] if self.m == 1 else list(range(self.m))
        g_eps_sum: list[torch.Tensor | None] = [None] * len(params)
        h_sum: list[torch.Tensor | None] = [None] * len(params)
        losses, losses_eps = [], []
        zero = params[0].new_zeros(()) if params else torch.zeros(())
        eps_sq = noise_sq = gnorm = zero
        noise_std = self._noise_std(s_list) if params and self.noise else []
        sqrt_s = torch._foreach_sqrt(s_list) if params else []
        for k in chunks:
            saved = [p.detach().clone() for p in params]
            # pass 1: gradient at the noisy point w + e_k (at w without noise)
            try:
                if params and self.noise:
                    noise_sq = noise_sq + self._add_noise(params, noise_std)
                losses.append(self._call(closure, k))
            finally:
                if params:  # no_grad: an exception may have left grad mode on while unwinding
                    with torch.no_grad():
                        torch._foreach_copy_(params, saved)
            idx = [i for i, p in enumerate(params) if p.grad is not None]
            grads = [params[i].grad for i in idx]  # fresh tensors: _call sets .grad to None first
            # pass 2: gradient at the mean plus eps_k = rho g_k / s
            snap = bn_snapshot(self.model)
            try:
                if idx:
                    e2, g_norm = self._ascend(pairs, s_list, idx, grads)
                    eps_sq, gnorm = eps_sq + e2, gnorm + g_norm
                losses_eps.append(self._call(closure, k))
            finally:
                if params:  # no_grad: an exception may have left grad mode on while unwinding
                    with torch.no_grad():
                        torch._foreach_copy_(params, saved)
                bn_restore(snap)
            for i, p in enumerate(params):
                if p.grad is not None:
                    g_eps_sum[i] = p.grad if g_eps_sum[i] is None else g_eps_sum[i].add_(p.grad)
            for i, hi in zip(idx, self._curvature(sqrt_s, idx, grads)):
                h_sum[i] = hi if h_sum[i] is None else h_sum[i].add_(hi)
        return dict(
            g_eps_sum=g_eps_sum,
            h_sum=h_sum,
            losses=losses,
            losses_eps=losses_eps,
            eps_sq=eps_sq,
            noise_sq=noise_sq,
            gnorm=gnorm,
        )

    def _update(self, pairs: list, s_list: list[torch.Tensor], g_eps_sum: list, h_sum: list) -> None:
        """Momentum, precision and mean updates of Alg. 1, group by group with ``foreach`` ops.

        A parameter with neither sum (no gradient in any pass) is left alone.
        """
        m, n = self.m, self.num_data
        by_group: dict[int, list[int]] = {}
        for i, (group, _) in enumerate(pairs):
            if g_eps_sum[i] is not None or h_sum[i] is not None:
                by_group.setdefault(id(group), []).append(i)
        for idx in by_group.values():
            group = pairs[idx[0]][0]
            ps = [pairs[i][1] for i in idx]
            ss = [s_list[i] for i in idx]
            g_eps = _mean_of_sums([g_eps_sum[i] for i in idx], ps, m)
            h = _mean_of_sums([h_sum[i] for i in idx], ps, m)
            gms = [self.state[p]["exp_avg"] for p in ps]
            beta1, beta2 = group["betas"]
            delta = group["prior_precision"] / n
            target = torch._foreach_mul(ps, delta)
            torch._foreach_add_(target, g_eps)  # g_eps + delta w
            torch._foreach_mul_(gms, beta1)
            torch._foreach_add_(gms, target, alpha=1.0 - beta1)
            h_target = torch._foreach_add(h, delta)
            torch._foreach_add_(h_target, group["damping"])  # h + delta + damping
            if self.s_update_order == "official":
                torch._foreach_addcdiv_(ps, gms, ss, value=-group["lr"])
            torch._foreach_mul_(ss, beta2)
            torch._foreach_add_(ss, h_target, alpha=1.0 - beta2)
            if self.s_update_order != "official":
                torch._foreach_addcdiv_(ps, gms, ss, value=-group["lr"])
            for p, g in zip(ps, g_eps):
                self.state[p]["step"] += 1
                p.grad = g  # the descent gradient actually used (readable by callers)

    def _finish(self, pairs: list, s_list: list[torch.Tensor], sums: dict[str, Any]) -> torch.Tensor:
        """The update from the sums of the passes, and ``self.last``; returns the mean loss at ``w``."""
        self._update(pairs, s_list, sums["g_eps_sum"], sums["h_sum"])
        m = self.m
        loss, self.last = self._step_summary(
            sums["losses"],
            "s",
            s_list,
            std=lambda all_s: torch.rsqrt(self.num_data * all_s),
            loss_perturbed=torch.stack(sums["losses_eps"]).mean(),
            grad_norm=sums["gnorm"] / m,
            eps_norm=(sums["eps_sq"] / m).sqrt(),
            noise_norm=(sums["noise_sq"] / m).sqrt(),
        )
        return loss

    # ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """One bSAM step: ``2 m`` closure calls.  Returns the mean first-pass loss.

        Without a closure after :meth:`first_step`: :meth:`second_step` (returns ``None``).
        """
        if closure is None and self._split is not None:  # a step begun with first_step()
            self.second_step()
            return None
        if closure is None or not callable(closure):
            raise ValueError(
                "BayesianSAM.step needs a closure that zeroes grads, runs forward and backward and returns "
                "the loss (with m > 1: closure(chunk) computing the loss of sub-batch `chunk`); or run "
                "the two passes yourself around noise_step(), first_step() and second_step()"
            )
        if self.m > 1 and not accepts_chunk(closure):
            raise TypeError(
                f"with m={self.m} the closure must accept a sub-batch index, e.g. "
                "`def closure(chunk=None)`, and compute the loss on sub-batch `chunk` "
                "(see optimizers.perturbation.make_closure)"
            )
        pairs = self._params()
        params = [p for _, p in pairs]
        s_list = [self._s(p) for p in params]
        mode = batched_reason(self, closure) if self.m > 1 else ""
        sums = None
        if mode == "batched":
            try:
                sums = bsam_chunks(self, closure, pairs, s_list)
            except NotVectorisable as exc:
                self._batched_failed[id(closure.model)] = str(exc)
                mode = f"sequential: {exc}"
        if sums is None:
            sums = self._sequential(closure, pairs, s_list)
        loss = self._finish(pairs, s_list, sums)
        if mode:
            self.last["m_sharpness"] = self.config["m_sharpness"] = mode
        return loss
