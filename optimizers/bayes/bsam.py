"""Bayesian SAM / bSAM (Moellenhoff & Khan 2023, "SAM as an optimal relaxation of Bayes", Alg. 1).

The rule below is the published Alg. 1 (ICLR 2023) as the official code runs it; the equations and
where the code differs are in ``docs/methods/optimizers.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from landscape.checks import check_int, check_range
from optimizers.bayes.bsam_split import BSAMSplitStep, FlatState
from optimizers.bn_state import bn_restore, bn_snapshot
from optimizers.closure import accepts_chunk, check_closure_grads
from optimizers.m_sharpness import (
    NotVectorisable,
    choose_engine,
    chunk_gradients,
    chunk_norms,
    fail,
)
from optimizers.posterior import (
    DiagonalGaussianPosterior,
    check_closure_loss,
    check_nonneg,
    check_num_data,
    check_positive,
    resolve_generator,
)
from optimizers.state import GeneratorStateMixin
from optimizers.step_protocol import IDLE, OPEN, check_finite

__all__ = ["BayesianSAM"]


def _check_betas(name: str, betas: Any) -> None:
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise ValueError(f"{name} must be two numbers in [0, 1), got {betas!r}")
    for j, b in enumerate(betas):
        check_range(f"{name}[{j}]", b, 0.0, 1.0, high_open=True)


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

    ``state[p]``: ``s``, ``exp_avg`` (``g_m``) and ``step``; ``s`` and ``exp_avg`` are views into one
    flat buffer per param group, dtype and device, so that each elementwise operation of a step is
    one kernel (:class:`optimizers.bayes.bsam_split.FlatState`); a state dict holds them per
    parameter as ``torch.optim``'s do, and one with separate tensors per parameter loads as well.

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
            family, :func:`optimizers.m_sharpness.chunk_gradients`; ``self.last["m_sharpness"]`` says
            which ran);
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
        m = check_int("m (number of sub-batches)", m, minimum=1)
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
        """Add a group; the hyperparameters it sets itself are checked like the constructor's (the
        defaults were checked once, there)."""
        self._expect("add_param_group()", IDLE)
        given = set(param_group)
        super().add_param_group(param_group)
        group, i = self.param_groups[-1], len(self.param_groups) - 1
        for key in ("lr", "rho", "prior_precision", "damping"):
            if key in given:
                check_nonneg(f"{key} (param group {i})", group[key])
        if "betas" in given:
            _check_betas(f"betas (param group {i})", group["betas"])

    def _params(self) -> list[tuple[dict[str, Any], torch.Tensor]]:
        return [(g, p) for g in self.param_groups for p in g["params"] if p.requires_grad]

    def precision(self) -> dict[torch.Tensor, torch.Tensor]:
        """The precision vector ``s`` of every parameter (``s_init`` before the first step)."""
        fs = self._flat()
        return {p: s.detach().clone() for p, s in zip(fs.params, fs.s_views)}

    def posterior_std(self) -> dict[torch.Tensor, torch.Tensor]:
        """``sqrt(1 / (N s))`` for every parameter (posterior ``N(w, diag(1/(N s)))``)."""
        fs = self._flat()
        return {p: torch.rsqrt(self.num_data * s.detach()) for p, s in zip(fs.params, fs.s_views)}

    def _call(
        self, closure: Callable[..., Any], params: list[torch.Tensor], chunk: int | None
    ) -> torch.Tensor:
        for p in params:
            p.grad = None
        with torch.enable_grad():
            loss = closure() if chunk is None else closure(chunk)
        loss = check_closure_loss(loss, "BayesianSAM").detach()
        check_closure_grads(params, "BayesianSAM")
        return loss

    def _loop(self, closure: Callable[..., Any], fs: FlatState) -> dict[str, Any]:
        """The loop engine: per sub-batch the pieces of :meth:`noise_step` (``_add_noise``), the
        closure, :meth:`first_step` (``_ascend``), the closure, ``w`` restored; the sums the update
        (:meth:`second_step`'s ``_update``) needs.

        ``g_eps`` / ``h``: flat sums per bucket; ``active``: which parameters got a gradient in some
        pass.  The diagnostics are 0-d tensors on the parameters' device: no host read.
        """
        params = fs.params
        chunks: list[int | None] = [None] if self.m == 1 else list(range(self.m))
        g_eps: list[torch.Tensor] | None = None
        h: list[torch.Tensor] | None = None
        active = [False] * len(params)
        losses, losses_eps, gnorm, eps_n, noise_n = [], [], [], [], []
        fs.save()
        for k in chunks:
            # pass 1: gradient at the noisy point w + e_k (at w without noise)
            try:
                if params and self.noise:
                    noise_n.append(self._add_noise(fs))
                losses.append(self._call(closure, params, k))
            except BaseException:
                with torch.no_grad():  # an exception may have left grad mode on while unwinding
                    fs.restore()
                raise
            grads = [p.grad for p in params]  # fresh tensors: _call sets .grad to None first
            # pass 2: gradient at the mean plus eps_k = rho g_k / s (w + e_k is overwritten)
            snap = bn_snapshot(self.model)
            try:
                up = self._ascend(fs, grads) if params else None
                if up is not None:
                    hk, e_k, g_k = up
                    eps_n.append(e_k)
                    gnorm.append(g_k)
                    h = hk if h is None else [a.add_(b) for a, b in zip(h, hk)]
                losses_eps.append(self._call(closure, params, k))
            finally:
                with torch.no_grad():
                    fs.restore()
                bn_restore(snap)
            grads2 = [p.grad for p in params]
            if g_eps is None:  # m = 1: the scratch buffer (p.grad stays the gradient itself)
                g_eps = [fs.gather(b, grads2, scratch=self.m == 1) for b in fs.buckets]
            else:
                g_eps = [a.add_(fs.gather(b, grads2, scratch=True)) for a, b in zip(g_eps, fs.buckets)]
            active = [a or g is not None or g2 is not None for a, g, g2 in zip(active, grads, grads2)]
        if h is None:  # no gradient in any first pass
            h = [b.saved.new_zeros(b.saved.shape) for b in fs.buckets]
        return dict(
            g_eps=g_eps, h=h, active=active, losses=losses, losses_eps=losses_eps,
            gnorm=gnorm, eps=eps_n, noise=noise_n,
        )  # fmt: skip

    def _chunk_step(self, engine: Any, closure: Any, fs: FlatState) -> dict[str, Any] | None:
        """The vectorised engines: the ``m`` gradients ``g_k`` at ``w + e_k`` in one pass of
        :func:`optimizers.m_sharpness.chunk_gradients`, ``eps_k = rho g_k / s``, the sum of the
        ``m`` gradients at ``w + eps_k`` in another; the sums :meth:`_loop` returns, or ``None``
        (generator restored) after recording why the loop must run. Noise ``e_k`` is drawn chunk
        by chunk, parameter by parameter, from ``self.generator``, as the loop draws it."""
        params, s_list, m = fs.params, fs.s_views, engine.m
        gen_state = self.generator.get_state()
        w = [p.detach() for p in params]
        noise_sq = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
        points = w
        if self.noise:
            std = torch._foreach_rsqrt(torch._foreach_mul(s_list, float(self.num_data)))
            draws = [
                [
                    torch.randn(p.shape, generator=self.generator, dtype=p.dtype, device=p.device)
                    for p in params
                ]
                for _ in range(m)
            ]
            noise = [torch.stack([draws[k][i] for k in range(m)]).mul_(sd) for i, sd in enumerate(std)]
            noise_sq = torch.stack([e.square().sum() for e in noise]).sum()
            points = torch._foreach_add(w, noise)
        try:
            grads, losses, bn_stats = chunk_gradients(engine, points, stacked=self.noise)
            eps = [grp["rho"] * gk / s for (grp, _), gk, s in zip(fs.pairs, grads, s_list)]
            eps_sq = torch.stack([e.square().sum() for e in eps]).sum()
            g_eps, losses_eps, _ = chunk_gradients(
                engine, torch._foreach_add(w, eps), stacked=True, reduce=True
            )
        except NotVectorisable as exc:
            self.generator.set_state(gen_state)
            fail(self, closure, exc)
            return None
        engine.apply_bn_updates(bn_stats)
        fs.save()
        h = [(s.sqrt() * gk.abs()).sum(0) for s, gk in zip(s_list, grads)]
        return dict(
            g_eps=[fs.gather(b, g_eps) for b in fs.buckets],
            h=[fs.gather(b, h) for b in fs.buckets],
            active=[True] * len(params),
            losses=list(losses),
            losses_eps=list(losses_eps),
            grad_norm=chunk_norms(grads).sum() / m,
            eps_norm=(eps_sq / m).sqrt(),
            noise_norm=(noise_sq / m).sqrt(),
        )

    def _update(
        self,
        fs: FlatState,
        g_eps: list[torch.Tensor],
        h: list[torch.Tensor],
        active: list[bool],
        set_grads: bool,
    ) -> None:
        """Momentum, precision and mean updates of Alg. 1 on the flat buffers, bucket by bucket.

        ``g_eps`` / ``h``: the sums over the ``m`` sub-batches per bucket (this method's to change).
        A parameter that got no gradient in any pass (``active`` false) is left alone, its state
        too.  ``p.grad`` becomes the descent gradient actually used (``set_grads=False``: only where
        it is ``None``, the gradient of the last pass being that gradient already).
        """
        m, n = self.m, self.num_data
        written: list[int] = []
        for b, ge, hb in zip(fs.buckets, g_eps, h):
            act = [active[i] for i in b.pos]
            if not any(act):
                continue
            keep = [] if all(act) else [
                (sv, sv.clone(), mv, mv.clone())
                for a, sv, mv in zip(act, b.views(b.s), b.views(b.exp_avg)) if not a
            ]  # fmt: skip
            group = b.group
            if m > 1:
                ge.div_(m)
                hb.div_(m)
            beta1, beta2 = group["betas"]
            delta = group["prior_precision"] / n
            target = torch.mul(b.saved, delta).add_(ge)  # g_eps + delta w
            b.exp_avg.mul_(beta1).add_(target, alpha=1.0 - beta1)
            hb.add_(delta).add_(group["damping"])  # h + delta + damping
            if self.s_update_order == "official":
                torch.addcdiv(b.saved, b.exp_avg, b.s, value=-group["lr"], out=b.point)
            b.s.mul_(beta2).add_(hb, alpha=1.0 - beta2)
            if self.s_update_order != "official":
                torch.addcdiv(b.saved, b.exp_avg, b.s, value=-group["lr"], out=b.point)
            for sv, s_old, mv, m_old in keep:
                sv.copy_(s_old)
                mv.copy_(m_old)
            grads = b.views(ge) if set_grads or not all(p.grad is not None for p in b.params) else None
            for j, (i, p) in enumerate(zip(b.pos, b.params)):
                if act[j]:
                    written.append(i)
                    self.state[p]["step"] += 1
                    if grads is not None and (set_grads or p.grad is None):
                        p.grad = grads[j]
        fs.write(None if len(written) == len(fs.params) else written)

    def _finish(
        self,
        fs: FlatState,
        losses: list[torch.Tensor],
        losses_eps: list[torch.Tensor],
        gnorm: list[torch.Tensor] | torch.Tensor,
        eps: list[torch.Tensor] | torch.Tensor,
        noise: list[torch.Tensor] | torch.Tensor,
    ) -> torch.Tensor:
        """``self.last`` after the update; returns the mean loss at ``w``.  ``gnorm``, ``eps``,
        ``noise``: the per-pass norms (the means over sub-batches of ``||g||``, and the root mean
        squares of ``||eps||``, ``||e||``, are taken here), or these means already."""
        m = self.m
        zero = fs.params[0].new_zeros(()) if fs.params else torch.zeros(())

        def mean(xs: list[torch.Tensor]) -> torch.Tensor:
            return xs[0] if len(xs) == 1 else torch.stack(xs).mean()

        def rms(xs: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
            if isinstance(xs, torch.Tensor):
                return xs
            if m == 1 and len(xs) == 1:
                return xs[0]
            return (torch.stack(xs).square().sum() / m).sqrt() if xs else zero

        if isinstance(gnorm, list):  # the mean over sub-batches (dividing by one is exact: skipped)
            total = (gnorm[0] if len(gnorm) == 1 else torch.stack(gnorm).sum()) if gnorm else zero
            gnorm = total if m == 1 else total / m
        if not fs.buckets:
            s = torch.ones(1)
            std = torch.rsqrt(self.num_data * s)
        elif len(fs.buckets) == 1:
            s, std = fs.buckets[0].s, self._noise_std(fs)[0]  # std: also the next step's noise scale
        else:
            s, std = torch.cat([b.s for b in fs.buckets]), torch.cat(self._noise_std(fs))
        s_min, s_max = torch.aminmax(s)
        loss = mean(losses)
        self.last = dict(  # 0-d tensors on the parameters' device: read (float()) only when needed
            loss=loss,
            loss_perturbed=mean(losses_eps),
            grad_norm=gnorm,
            eps_norm=rms(eps),
            noise_norm=rms(noise),
            s_min=s_min,
            s_mean=s.mean(),
            s_max=s_max,
            posterior_std_mean=std.mean(),
        )
        return loss

    # ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[..., Any] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        """One bSAM step: ``2 m`` closure calls.  Returns the mean first-pass loss.

        Without a closure after :meth:`first_step`: :meth:`second_step` (returns ``None``).
        """
        if closure is None and self.step_state == OPEN:  # a step begun with first_step()
            self.second_step()
            return None
        self._expect("step()" if closure is None else "step(closure)", IDLE)
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
        fs = self._flat()
        engine, mode = choose_engine(self, closure, fs.params) if self.m > 1 else (None, "")
        sums = self._chunk_step(engine, closure, fs) if engine is not None else None
        if sums is None:
            if engine is not None:  # the engine failed on this model: the loop, from now on
                mode = f"sequential: {self._batched_failed[id(closure.model)]}"
            sums = self._loop(closure, fs)
        first = sums["gnorm"] if "gnorm" in sums else [sums["grad_norm"]]
        check_finite(self, first, sums["g_eps"], self._points(), sums["losses"])
        self._update(fs, sums["g_eps"], sums["h"], sums["active"], set_grads=self.m > 1)
        if "grad_norm" in sums:
            norms = (sums["grad_norm"], sums["eps_norm"], sums["noise_norm"])
        else:
            norms = (sums["gnorm"], sums["eps"], sums["noise"])
        loss = self._finish(fs, sums["losses"], sums["losses_eps"], *norms)
        if mode:
            self.last["m_sharpness"] = self.config["m_sharpness"] = mode
        return loss
