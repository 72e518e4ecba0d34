"""Vectorised m-sharpness: the ``m`` sub-batches' gradients in two passes instead of ``2 m``.

m-sharpness (Foret et al. 2021, Sec. 4.1) needs, per step, the gradient of every sub-batch ``k`` at
``w`` and then at its own perturbed point ``w + eps_k``.  The sequential loop of
:mod:`optimizers.perturbation` runs ``2 m`` small forward/backward passes through the closure; here
the ``m`` gradients at ``w`` are one pass over the stacked sub-batches (parameters shared), and the
descent gradient ``sum_k grad L_k(w + eps_k)`` one pass with per-chunk parameters stacked
``[m, ...]`` (``reduce=True``: only the sum is formed).  Two engines compute the passes:

* ``direct`` (:mod:`optimizers.chunk_direct`): a chain of ``nn.Linear`` / ``nn.Conv2d`` layers,
  pooling and per-example modules (MLPs, LeNet-5) in one plain forward/backward, the weight
  gradients from the layers' (input, output-gradient) products -- about 1.2x a plain
  forward/backward per pass on the MLP;
* ``vmap``: any other model, one ``vmap`` over ``torch.func.functional_call`` per pass (parameters
  ``in_dims=None`` or ``0``) -- about 2.5x on the same MLP.

``opt.config["m_sharpness_engine"]`` records which one ran (``opt.batched_engine = "vmap"`` forces
the second).  A method with ``_perturbation_batched`` (SAM, ASAM, Fisher-SAM) computes the ``m``
perturbations at once; for the others ``_perturbation`` runs chunk by chunk with ``p.grad`` set to
chunk ``k``'s gradient, so every two-pass method of the SAM family gets this path unchanged.

This needs the model, loss and sub-batches, which an opaque closure hides: :class:`ChunkClosure`
(what :func:`optimizers.perturbation.make_closure` returns) is still ``closure(chunk)`` and also
carries ``model``, ``loss_fn``, ``x_chunks``, ``y_chunks``.  Any closure with these attributes
qualifies; ``batched_unavailable`` (a string) tells the optimizer why it must not vectorise one.

BatchNorm in train mode (``vmap`` engine): each chunk is normalised with its own statistics (``vmap``
gives exactly that).  Running statistics are reproduced as the loop leaves them (one EMA update per chunk, in
chunk order, from the pass at ``w`` only): the vmapped pass runs with per-chunk scratch buffers and
``momentum=None`` on a fresh ``num_batches_tracked = 0``, so each scratch buffer receives exactly
the chunk's statistics ``s_k``; the ``m`` updates ``r <- (1 - f) r + f s_k`` (``f = momentum``, or
``1 / num_batches_tracked`` for cumulative averages) are then applied in order.  Any other buffer
that the forward pass mutates cannot be reproduced: the optimizer falls back to the loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from optimizers.chunk_direct import DirectChunks, check_input, plan
from optimizers.chunk_losses import chunk_losses

__all__ = [
    "chunk_norms",
    "ChunkClosure",
    "NotVectorisable",
    "ChunkVectoriser",
    "batched_reason",
    "perturbation_chunks",
]


def chunk_norms(stacked: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[m]``: the Euclidean norm of slice ``k`` of all tensors in ``stacked`` (each ``[m, ...]``)
    together, i.e. ``optimizers.perturbation.global_norm`` of chunk ``k``'s tensors."""
    if len(stacked) == 1:
        return torch.linalg.vector_norm(stacked[0].reshape(stacked[0].shape[0], -1), 2.0, dim=1)
    flat = torch.cat([t.reshape(t.shape[0], -1) for t in stacked], 1)  # one norm, not one per tensor
    return torch.linalg.vector_norm(flat, 2.0, dim=1)


class NotVectorisable(Exception):
    """The batched path cannot reproduce the loop for this model/closure (message: the reason)."""


class ChunkClosure:
    """``closure(chunk=None)`` for ``loss_fn(model(x), y)`` that also exposes what it computes.

    ``chunk=None``: the whole batch; ``chunk=k``: sub-batch ``torch.tensor_split(., m)[k]``.
    Attributes: ``optimizer``, ``model``, ``loss_fn``, ``inputs``, ``targets``, ``m``, ``x_chunks``,
    ``y_chunks``, ``batched_unavailable`` (``None``, or why the optimizer must not vectorise).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        m: int,
        batched_unavailable: str | None = None,
    ) -> None:
        self.optimizer, self.model, self.loss_fn = optimizer, model, loss_fn
        self.inputs, self.targets, self.m = inputs, targets, m
        self.x_chunks = torch.tensor_split(inputs, m)
        self.y_chunks = torch.tensor_split(targets, m)
        self.batched_unavailable = batched_unavailable

    def __call__(self, chunk: int | None = None) -> torch.Tensor:
        self.optimizer.zero_grad()
        if chunk is None:
            x, y = self.inputs, self.targets
        else:
            x, y = self.x_chunks[chunk], self.y_chunks[chunk]
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach()


def _bn_with_stats(model: nn.Module) -> list[tuple[str, _BatchNorm]]:
    """BatchNorm layers that update running statistics in the next forward pass."""
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, _BatchNorm)
        and mod.training
        and mod.track_running_stats
        and mod.running_mean is not None
    ]


def _rows(t: Any) -> int:
    """``len(t)`` (a tensor's ``shape[0]`` without ``Tensor.__len__``'s Python overhead)."""
    return t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else len(t)


def batched_reason(opt: Any, closure: Any) -> str:
    """``"batched"`` if ``opt.step(closure)`` may take the vectorised path, else ``"sequential: why"``."""
    if not getattr(opt, "batched_m", True):
        return "sequential: batched_m=False"
    if getattr(opt, "passes", 2) != 2:
        return "sequential: one-pass method"
    if not all(hasattr(closure, a) for a in ("model", "loss_fn", "x_chunks", "y_chunks")):
        return "sequential: opaque closure (build it with make_closure to vectorise)"
    if getattr(closure, "batched_unavailable", None):
        return f"sequential: {closure.batched_unavailable}"
    xs, ys = closure.x_chunks, closure.y_chunks
    if len(xs) != opt.m or len(ys) != opt.m:
        return f"sequential: closure has {len(xs)} sub-batches, optimizer m={opt.m}"
    if len({_rows(x) for x in xs}) != 1 or len({_rows(y) for y in ys}) != 1:
        return f"sequential: uneven sub-batches (batch of {sum(len(x) for x in xs)} with m={opt.m})"
    model = closure.model
    if not isinstance(model, nn.Module):
        return "sequential: closure.model is not an nn.Module"
    own = getattr(opt, "model", None)
    if own is not None and own is not model:
        return "sequential: the optimizer's model= is not the closure's model"
    if own is None and _bn_with_stats(model):
        return "sequential: BatchNorm in train mode without model= (the loop updates it in both passes)"
    cached = getattr(opt, "_batched_failed", {}).get(id(model))
    if cached:
        return f"sequential: {cached}"
    return "batched"


class ChunkVectoriser:
    """Per-chunk losses and gradients of ``loss_fn(model(x_k), y_k)`` for all ``k`` in one pass.

    ``params``: the tensors to differentiate (the optimizer's trainable parameters; each must be a
    parameter of ``model``); the model's other parameters are constants.  ``engine``: ``"auto"``
    (:class:`optimizers.chunk_direct.DirectChunks` for a chain of linear layers and per-example
    modules, ``vmap`` otherwise) or ``"vmap"``; ``self.engine`` says which one runs.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        params: Sequence[torch.Tensor],
        x_chunks: Sequence[torch.Tensor],
        y_chunks: Sequence[torch.Tensor],
        engine: str = "auto",
    ) -> None:
        names = {id(p): n for n, p in model.named_parameters()}
        missing = [tuple(p.shape) for p in params if id(p) not in names]
        if missing:
            raise NotVectorisable(f"optimizer parameters not in closure.model (shapes {missing[:3]})")
        self.model, self.loss_fn, self.m = model, loss_fn, len(x_chunks)
        self.names = [names[id(p)] for p in params]
        unused = _unused_parameters(model, loss_fn, params, self.names, x_chunks[0], y_chunks[0])
        if unused:  # the loop leaves their .grad None (the base optimizer skips them); vmap gives 0
            raise NotVectorisable(f"parameters the loss does not use ({', '.join(unused[:3])})")
        self.y_list = list(y_chunks)
        self.ys = torch.stack(self.y_list) if all(isinstance(y, torch.Tensor) for y in self.y_list) else None
        # the engine without vmap (optimizers.chunk_direct) where the model allows it
        leaves, self.direct_unavailable = plan(model) if engine == "auto" else (None, f"engine={engine!r}")
        if leaves is not None and isinstance(x_chunks[0], torch.Tensor):
            self.direct_unavailable = check_input(leaves, x_chunks[0])
            leaves = None if self.direct_unavailable else leaves
        self.direct = self.xs = None
        self.bn: list[tuple[str, _BatchNorm]] = []
        if leaves is not None:  # no BatchNorm, no buffer the forward pass could mutate
            ids = {id(p): n for p, n in zip(params, self.names)}
            self.direct = DirectChunks(leaves, ids, self.m, torch.cat(list(x_chunks)))
            self.engine = "direct"
            return
        self.engine = "vmap"
        diff = set(self.names)
        self.const = {n: p.detach() for n, p in model.named_parameters() if n not in diff}
        self.bn = _bn_with_stats(model)
        stat_names = {f"{n}.{b}" if n else b for n, _ in self.bn for b in ("running_mean", "running_var")}
        nbt_names = {f"{n}.num_batches_tracked" if n else "num_batches_tracked" for n, _ in self.bn}
        self.other = {n: b for n, b in model.named_buffers() if n not in stat_names and n not in nbt_names}
        self.xs = torch.stack(list(x_chunks))

    def _prefix(self, name: str, buf: str) -> str:
        return f"{name}.{buf}" if name else buf

    def _losses_of(self, outs: torch.Tensor) -> torch.Tensor:
        """The ``m`` losses of the direct engine's outputs ``[m b, ...]``."""
        o3 = outs.reshape(self.m, outs.shape[0] // self.m, *outs.shape[1:])
        losses, _ = chunk_losses(
            self.loss_fn,
            self.ys,
            self.y_list,
            outputs=lambda: (o3, None),
            outputs_and_losses=lambda: (vmap(self.loss_fn)(o3, self.ys), None),
        )
        return losses

    def grads(
        self, params: dict[str, torch.Tensor], stacked: bool, reduce: bool = False
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """``(grads [m, ...] by name, losses [m], {bn name: (mean [m, C], var [m, C])})``.

        ``params`` shared by all chunks (``stacked=False``) or stacked ``[m, ...]`` per chunk;
        ``reduce``: the sum of the ``m`` gradients instead (shape of the parameter).
        Running statistics of the model are not touched (see :meth:`apply_bn_updates`).
        """
        if self.direct is not None:
            g, losses = self.direct.grads(params, stacked, reduce, self._losses_of)
            return g, losses, {}
        g, losses, bn_stats = self._vmapped_grads(params, stacked)
        if reduce:
            g = {n: t.sum(0) for n, t in g.items()}
        return g, losses, bn_stats

    def _vmapped_grads(
        self, params: dict[str, torch.Tensor], stacked: bool
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        m = self.m
        scratch: dict[str, torch.Tensor] = {}
        counters: dict[str, torch.Tensor] = {}
        for name, mod in self.bn:
            for b in ("running_mean", "running_var"):
                buf = getattr(mod, b)
                scratch[self._prefix(name, b)] = torch.zeros(
                    (m, *buf.shape), dtype=buf.dtype, device=buf.device
                )
            nbt = mod.num_batches_tracked
            counters[self._prefix(name, "num_batches_tracked")] = torch.zeros_like(nbt)
        other = {n: b.clone() for n, b in self.other.items()}
        versions = {n: b._version for n, b in other.items()}
        model, loss_fn, const = self.model, self.loss_fn, self.const

        fixed = {**const, **counters, **other}  # unbatched: captured, not mapped

        def forward(batched, x):  # batched: the parameters and the BatchNorm scratch buffers
            out = functional_call(model, {**batched, **fixed}, (x,))
            return out, {n: batched[n] for n in scratch}  # scratch now holds the chunk's statistics

        def forward_loss(batched, x, y):  # the chunk's loss too: one vmapped loss call, not m
            out, stats = forward(batched, x)
            return loss_fn(out, y), stats

        # one leaf [m, ...] per parameter (shared weights: a stride-0 expansion, no copy); chunk k's
        # loss depends on slice k only, so the gradient of the summed losses is the m gradients
        leaves = [
            (t.detach() if stacked else t.detach().expand(m, *t.shape)).requires_grad_()
            for t in params.values()
        ]
        momenta = [mod.momentum for _, mod in self.bn]
        try:
            for _, mod in self.bn:
                mod.momentum = None  # factor 1 / num_batches_tracked = 1: scratch <- chunk statistics
            batched = {**dict(zip(params, leaves)), **scratch}
            losses, stats = chunk_losses(
                loss_fn,
                self.ys,
                self.y_list,
                outputs=lambda: vmap(forward)(batched, self.xs),
                outputs_and_losses=lambda: vmap(forward_loss)(batched, self.xs, self.ys),
            )
            grads = torch.autograd.grad(losses.sum(), leaves)
        finally:
            for (_, mod), mu in zip(self.bn, momenta):
                mod.momentum = mu
        g = dict(zip(params, grads))
        changed = [n for n, b in other.items() if b._version != versions[n]]
        if changed:
            raise NotVectorisable(
                f"the forward pass mutates buffer(s) {changed[:3]} (not BatchNorm statistics)"
            )
        bn_stats = {
            name: (stats[self._prefix(name, "running_mean")], stats[self._prefix(name, "running_var")])
            for name, _ in self.bn
        }
        return g, losses.detach(), bn_stats

    @torch.no_grad()
    def apply_bn_updates(self, bn_stats: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """The ``m`` running-statistics updates of the loop, chunk by chunk, from per-chunk stats."""
        for name, mod in self.bn:
            means, vars_ = bn_stats[name]
            for k in range(self.m):
                mod.num_batches_tracked.add_(1)
                f = 1.0 / float(mod.num_batches_tracked) if mod.momentum is None else mod.momentum
                mod.running_mean.copy_(means[k] * f + mod.running_mean * (1.0 - f))
                mod.running_var.copy_(vars_[k] * f + mod.running_var * (1.0 - f))


_USED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _unused_parameters(
    model: nn.Module, loss_fn: Callable, params: Sequence[torch.Tensor], names: list[str], x, y
) -> list[str]:
    """Names of ``params`` the loss of one sub-batch does not depend on (``autograd.grad`` gives
    ``None``): probed once per model and parameter list, with the RNG forked and every buffer
    restored, so the probe changes nothing the loop would see."""
    key = tuple(id(p) for p in params)
    per_model = _USED.setdefault(model, {})
    if key not in per_model:
        snap = [(b, b.detach().clone()) for b in model.buffers()]
        devices = [x.device] if x.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                loss = loss_fn(model(x), y)
                grads = torch.autograd.grad(loss, list(params), allow_unused=True)
        except Exception as exc:  # noqa: BLE001 - the model cannot run this way: let the loop decide
            raise NotVectorisable(f"probe failed ({type(exc).__name__})") from exc
        finally:
            with torch.no_grad():
                for b, saved in snap:
                    b.copy_(saved)
        per_model[key] = tuple(n for n, g in zip(names, grads) if g is None)
    return list(per_model[key])


def _vectorised(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except NotVectorisable:
        raise
    except Exception as exc:  # vmap/functional_call cannot run this model: fall back to the loop
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotVectorisable(f"vmap failed ({type(exc).__name__}: {msg[:160]})") from exc


def _vectoriser(opt: Any, closure: Any, params: list[torch.Tensor]) -> ChunkVectoriser:
    """The step's :class:`ChunkVectoriser`; ``opt.batched_engine`` (default ``"auto"``) picks the
    engine, and ``opt.config["m_sharpness_engine"]`` records the one that runs."""
    engine = getattr(opt, "batched_engine", "auto")
    vec = ChunkVectoriser(closure.model, closure.loss_fn, params, closure.x_chunks, closure.y_chunks, engine)
    config = getattr(opt, "config", None)
    if isinstance(config, dict):
        config["m_sharpness_engine"] = vec.engine
    return vec


def perturbation_chunks(opt: Any, closure: Any) -> dict[str, torch.Tensor]:
    """The batched m-sharpness step of a two-pass :class:`PerturbationOptimizer` up to the base step.

    Sets ``p.grad`` to the descent gradient ``1/m sum_k grad L_k(w + eps_k)`` and returns the
    per-chunk values the loop records (``loss``, the hook's diagnostics, ``loss_perturbed``), each
    stacked ``[m]``.  Raises :class:`NotVectorisable` (before the model's statistics are touched) to
    request the loop.
    """
    pairs = opt._all_pairs()
    params = [p for _, p in pairs]
    vec = _vectoriser(opt, closure, params)
    with torch.enable_grad():
        w = {n: p.detach() for n, p in zip(vec.names, params)}
        g, losses, bn_stats = _vectorised(lambda: vec.grads(w, stacked=False))
    hook = getattr(opt, "_perturbation_batched", None)
    batched = hook(pairs, [g[n] for n in vec.names]) if hook is not None else None
    if batched is not None:  # all m perturbations in one pass
        eps_st, diag = batched
        stacked = {"loss": losses, **diag}
        points = dict(zip(vec.names, torch._foreach_add([p.detach() for p in params], list(eps_st))))
    else:  # the method's hook chunk by chunk, with p.grad set to chunk k's gradient
        diags: list[dict[str, Any]] = []
        eps_all: list[list[torch.Tensor]] = []
        for k in range(vec.m):
            for p, n in zip(params, vec.names):
                p.grad = g[n][k]
            eps, d = opt._perturbation(pairs)
            diags.append(d)
            eps_all.append(list(eps))
        for p in params:
            p.grad = None
        stacked = {"loss": losses, **{key: torch.stack([d[key] for d in diags]) for key in diags[0]}}
        points = {
            n: torch.stack([p.detach() + eps_all[k][i] for k in range(vec.m)])
            for i, (p, n) in enumerate(zip(params, vec.names))
        }
    with torch.enable_grad():
        g_eps, losses_eps, _ = _vectorised(lambda: vec.grads(points, stacked=True, reduce=True))
    stacked["loss_perturbed"] = losses_eps
    descent = [g_eps[n] for n in vec.names]
    torch._foreach_div_(descent, float(vec.m))
    for p, d in zip(params, descent):
        p.grad = d
    vec.apply_bn_updates(bn_stats)
    return stacked


def bsam_chunks(opt: Any, closure: Any, pairs: list, s_list: list[torch.Tensor]) -> dict[str, Any]:
    """The ``2 m`` passes of a bSAM step vectorised (``optimizers.bayes.bsam``), same arithmetic.

    Noise ``e_k`` is drawn chunk by chunk, parameter by parameter, from ``opt.generator`` as the loop
    does; ``g_k`` at ``w + e_k`` and ``g_eps,k`` at ``w + rho g_k / s`` are one vmap each.  Returns
    the sums the loop accumulates (diagnostics as 0-d tensors).  Raises :class:`NotVectorisable`
    before any state is touched.
    """
    params = [p for _, p in pairs]
    vec = _vectoriser(opt, closure, params)
    m = vec.m
    gen_state = opt.generator.get_state()
    zero = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
    noise_sq = zero
    if opt.noise:
        std = torch._foreach_rsqrt(torch._foreach_mul(s_list, float(opt.num_data)))
        draws = [
            [torch.randn(p.shape, generator=opt.generator, dtype=p.dtype, device=p.device) for p in params]
            for _ in range(m)
        ]
        noise = [torch.stack([draws[k][i] for k in range(m)]).mul_(sd) for i, sd in enumerate(std)]
        noise_sq = torch.stack([e.square().sum() for e in noise]).sum()
        points = {name: p.detach() + e for p, name, e in zip(params, vec.names, noise)}
    else:  # the same weights for every chunk
        points = {name: p.detach() for p, name in zip(params, vec.names)}
    try:
        with torch.enable_grad():
            g, losses, bn_stats = _vectorised(lambda: vec.grads(points, stacked=opt.noise))
            grads = [g[name] for name in vec.names]
            eps = [grp["rho"] * gk / s for (grp, _), gk, s in zip(pairs, grads, s_list)]
            eps_sq = torch.stack([e.square().sum() for e in eps]).sum()
            gnorm = chunk_norms(grads).sum()
            points2 = {name: p.detach() + e for p, name, e in zip(params, vec.names, eps)}
            g_eps, losses_eps, _ = _vectorised(lambda: vec.grads(points2, stacked=True, reduce=True))
    except NotVectorisable:
        opt.generator.set_state(gen_state)
        raise
    vec.apply_bn_updates(bn_stats)
    return dict(
        g_eps_sum=[g_eps[name] for name in vec.names],
        h_sum=[(s.sqrt() * gk.abs()).sum(0) for s, gk in zip(s_list, grads)],
        losses=list(losses),
        losses_eps=list(losses_eps),
        eps_sq=eps_sq,
        noise_sq=noise_sq,
        gnorm=gnorm,
    )
