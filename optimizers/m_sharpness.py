"""m-sharpness: the per-chunk gradients of ``m`` sub-batches, by an engine chosen once per step.

m-sharpness (Foret et al. 2021, Sec. 4.1) needs, per step, the gradient of every sub-batch ``k`` at
``w`` (bSAM: at ``w + e_k``) and then at its own perturbed point ``w + eps_k``. :func:`choose_engine`
picks how, in one place (as ``torch.optim.sgd`` picks ``_single_tensor`` / ``_multi_tensor`` /
``_fused``), and records it in ``opt.config["m_sharpness"]`` / ``["m_sharpness_engine"]``:

* ``loop``: ``2 m`` closure calls, chunk by chunk (any closure, any model): the optimizer's two
  halves (``first_step`` / ``second_step``) around ``closure(k)``, a stack of one chunk each;
* ``direct`` (:mod:`optimizers.chunk_direct`): chains of ``nn.Linear`` / ``nn.Conv2d`` layers and
  per-example modules (MLPs, LeNet-5), one plain forward/backward per pass (~1.2x a plain pass);
* ``vmap`` (:mod:`optimizers.chunk_vmap`): any other model, one ``vmap`` per pass (~2.5x).

:func:`chunk_gradients` is the one per-chunk gradient function of the vectorised engines, used by
the SAM family (:mod:`optimizers.perturbation`) and bSAM (:mod:`optimizers.bayes.bsam`); every
perturbation rule is written once for a stack of chunks ``[m, *p.shape]``. The vectorised engines
need the model, loss and sub-batches: :class:`optimizers.closure.ChunkClosure` or any closure
with ``model``, ``loss_fn``, ``x_chunks``, ``y_chunks``. Results equal the loop's to rounding (the
tests compare every update with the loop in float64).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap
from torch.utils._pytree import tree_map

from optimizers.chunk_direct import DirectChunks, check_input, plan
from optimizers.chunk_vmap import VmapChunks, bn_with_stats

__all__ = [
    "ChunkEngine",
    "NotVectorisable",
    "choose_engine",
    "chunk_gradients",
    "chunk_losses",
    "chunk_norms",
    "chunk_sums",
    "per_chunk",
    "flat_cross_entropy",
    "summarise",
    "summarise_stacked",
]


class NotVectorisable(Exception):
    """The vectorised engines cannot reproduce the loop for this model/closure (message: why)."""


# ---- stacks of chunks: the helpers every perturbation rule uses ------------------------------------
def chunk_norms(stacked: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[m]``: the Euclidean norm of slice ``k`` of all tensors in ``stacked`` (each ``[m, ...]``)
    together; for a stack of one chunk a 0-d tensor, by ``optimizers.perturbation.global_norm``'s
    operations (the loop's bits). Per-chunk values are ``[m]``, or 0-d for one chunk: they
    broadcast against a stack through :func:`per_chunk`."""
    if not stacked:
        return torch.zeros(())
    if stacked[0].shape[0] == 1:
        return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(list(stacked), 2.0)), 2.0)
    if len(stacked) == 1:
        return torch.linalg.vector_norm(stacked[0].reshape(stacked[0].shape[0], -1), 2.0, dim=1)
    flat = torch.cat([t.reshape(t.shape[0], -1) for t in stacked], 1)  # one norm, not one per tensor
    return torch.linalg.vector_norm(flat, 2.0, dim=1)


def chunk_sums(stacked: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[m]`` (0-d for one chunk): the sum of slice ``k`` of all tensors in ``stacked`` together."""
    if not stacked:
        return torch.zeros(())
    if stacked[0].shape[0] == 1:  # one chunk: the per-tensor sums, then their sum (the loop's order)
        return torch.stack([t.sum() for t in stacked]).sum()
    return torch.stack([t.reshape(t.shape[0], -1).sum(1) for t in stacked]).sum(0)


def per_chunk(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-chunk ``values`` (``[m]``, or 0-d for one chunk) shaped to scale the chunks of ``like``."""
    return values if values.dim() == 0 else values.view(-1, *([1] * (like.dim() - 1)))


# ---- the choice ------------------------------------------------------------------------------------
def _rows(t: Any) -> int:
    """``len(t)`` (a tensor's ``shape[0]`` without ``Tensor.__len__``'s Python overhead)."""
    return t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else len(t)


def _loop_reason(opt: Any, closure: Any) -> str:
    """Why ``opt.step(closure)`` must take the loop ("": a vectorised engine may run)."""
    if not getattr(opt, "batched_m", True):
        return "batched_m=False"
    if getattr(opt, "passes", 2) != 2:
        return "one-pass method"
    if not all(hasattr(closure, a) for a in ("model", "loss_fn", "x_chunks", "y_chunks")):
        return "opaque closure (build it with make_closure to vectorise)"
    if getattr(closure, "batched_unavailable", None):
        return closure.batched_unavailable
    xs, ys = closure.x_chunks, closure.y_chunks
    if len(xs) != opt.m or len(ys) != opt.m:
        return f"closure has {len(xs)} sub-batches, optimizer m={opt.m}"
    if len({_rows(x) for x in xs}) != 1 or len({_rows(y) for y in ys}) != 1:
        return f"uneven sub-batches (batch of {sum(len(x) for x in xs)} with m={opt.m})"
    model = closure.model
    if not isinstance(model, nn.Module):
        return "closure.model is not an nn.Module"
    own = getattr(opt, "model", None)
    if own is not None and own is not model:
        return "the optimizer's model= is not the closure's model"
    if own is None and bn_with_stats(model):
        return "BatchNorm in train mode without model= (the loop updates it in both passes)"
    return opt._batched_failed.get(id(model), "")


def choose_engine(opt: Any, closure: Any, params: list[torch.Tensor]) -> tuple[ChunkEngine | None, str]:
    """The m-sharpness engine of this step: ``(engine, "batched")`` for ``direct`` / ``vmap``, or
    ``(None, "sequential: why")`` for the loop (and ``(None, "")`` for ``m = 1``).

    ``opt.batched_engine`` (default ``"auto"``; ``"vmap"`` forces that engine) and ``opt.batched_m``
    steer it; ``opt.config["m_sharpness_engine"]`` records the vectorised engine built. A model found
    not vectorisable is remembered (``opt._batched_failed``) and takes the loop from then on.
    """
    if opt.m == 1:
        return None, ""
    why = _loop_reason(opt, closure)
    if why:
        return None, f"sequential: {why}"
    try:
        engine = ChunkEngine(closure.model, closure.loss_fn, params, closure.x_chunks, closure.y_chunks,
                             getattr(opt, "batched_engine", "auto"))  # fmt: skip
    except NotVectorisable as exc:
        return None, fail(opt, closure, exc)
    opt.config["m_sharpness_engine"] = engine.name
    return engine, "batched"


def fail(opt: Any, closure: Any, exc: NotVectorisable) -> str:
    """Remember that ``closure.model`` is not vectorisable; the mode the step records."""
    opt._batched_failed[id(closure.model)] = str(exc)
    return f"sequential: {exc}"


class ChunkEngine:
    """A vectorised engine for the ``m`` sub-batches ``x_chunks`` / ``y_chunks`` of ``model``.

    ``params``: the tensors to differentiate (each a parameter of ``model``; the model's other
    parameters are constants). ``engine``: ``"auto"`` (``direct`` where :func:`optimizers.chunk_direct.plan`
    accepts the model and input, ``vmap`` otherwise) or ``"vmap"``; ``self.name`` says which one runs.
    """

    def __init__(self, model, loss_fn, params, x_chunks, y_chunks, engine: str = "auto") -> None:
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
        leaves, self.direct_unavailable = plan(model) if engine == "auto" else (None, f"engine={engine!r}")
        if leaves is not None and isinstance(x_chunks[0], torch.Tensor):
            self.direct_unavailable = check_input(leaves, x_chunks[0])
            leaves = None if self.direct_unavailable else leaves
        self.impl: DirectChunks | VmapChunks
        if leaves is not None:  # no BatchNorm, no buffer the forward pass could mutate
            ids = {id(p): n for p, n in zip(params, self.names)}
            self.impl, self.name = DirectChunks(leaves, ids, self.m, torch.cat(list(x_chunks))), "direct"
        else:
            self.impl, self.name = VmapChunks(model, self.names, torch.stack(list(x_chunks))), "vmap"

    def losses(self, outputs, outputs_and_losses) -> tuple[torch.Tensor, Any]:
        """``(losses [m], extra)`` of a vectorised pass (see :func:`chunk_losses`)."""
        return chunk_losses(
            self.loss_fn, self.ys, self.y_list, outputs=outputs, outputs_and_losses=outputs_and_losses
        )

    def losses_of(self, outs: torch.Tensor) -> torch.Tensor:
        """The ``m`` losses of the direct engine's outputs ``[m b, ...]``."""
        o3 = outs.reshape(self.m, outs.shape[0] // self.m, *outs.shape[1:])
        return self.losses(lambda: (o3, None), lambda: (vmap(self.loss_fn)(o3, self.ys), None))[0]

    def apply_bn_updates(self, bn_stats: dict) -> None:
        """The loop's ``m`` running-statistics updates, from the per-chunk statistics of pass 1."""
        if bn_stats:
            self.impl.apply_bn_updates(bn_stats)


def chunk_gradients(
    engine: ChunkEngine, points: Sequence[torch.Tensor], *, stacked: bool, reduce: bool = False
) -> tuple[list[torch.Tensor], torch.Tensor, dict]:
    """``(grads, losses [m], BatchNorm statistics)`` of the ``m`` sub-batch losses.

    ``points``: one tensor per parameter, shared by all chunks (``stacked=False``) or stacked
    ``[m, ...]`` per chunk; ``grads``: ``[m, ...]`` per parameter, or with ``reduce`` their sum over
    the chunks. The model's running statistics are not touched (:meth:`ChunkEngine.apply_bn_updates`).
    Raises :class:`NotVectorisable` where the engine cannot run this model.
    """
    named = {n: t.detach() for n, t in zip(engine.names, points)}
    try:
        with torch.enable_grad():
            if engine.name == "direct":
                g, losses = engine.impl.grads(named, stacked, reduce, engine.losses_of)
                bn_stats: dict = {}
            else:
                g, losses, bn_stats, mutated = engine.impl.grads(
                    named, stacked, engine.loss_fn, engine.ys, engine.losses
                )
                if mutated:
                    raise NotVectorisable(
                        f"the forward pass mutates buffer(s) {mutated[:3]} (not BatchNorm statistics)"
                    )
                if reduce:
                    g = {n: t.sum(0) for n, t in g.items()}
    except NotVectorisable:
        raise
    except Exception as exc:  # vmap/functional_call cannot run this model: fall back to the loop
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotVectorisable(f"vmap failed ({type(exc).__name__}: {msg[:160]})") from exc
    return [g[n] for n in engine.names], losses, bn_stats


_USED: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, ...], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _unused_parameters(model: nn.Module, loss_fn, params, names: list[str], x, y) -> list[str]:
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


# ---- the m losses of one vectorised pass ------------------------------------------------------------
#: per loss function: does ``loss_fn`` run under ``vmap``?  Learnt on first use.
_LOSS_IN_VMAP: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def chunk_losses(
    loss_fn: Any,
    ys: torch.Tensor | None,
    y_list: Sequence[Any],
    *,
    outputs: Callable[[], tuple[Any, Any]],
    outputs_and_losses: Callable[[], tuple[torch.Tensor, Any]],
) -> tuple[torch.Tensor, Any]:
    """``(losses [m], extra)`` of a vectorised pass, fastest way first: one ``reduction="none"``
    call on the ``m b`` rows (:func:`flat_cross_entropy`), the loss under ``vmap``, ``m`` calls.

    ``outputs()`` runs the pass and returns ``(outputs [m, b, ...], extra)``; ``outputs_and_losses()``
    runs it with ``loss_fn`` inside ``vmap`` and returns ``(losses [m], extra)``. ``ys``: the targets
    stacked ``[m, b, ...]`` (``None`` if they cannot be stacked), ``y_list`` the ``m`` targets."""
    m = len(y_list)
    flat = flat_cross_entropy(loss_fn) if ys is not None else None
    outs = extra = None
    if flat is not None:  # (1): one call on the m b rows
        outs, extra = outputs()
        losses = flat(outs, ys)
        if losses is not None:
            return losses, extra
    elif ys is not None and _loss_in_vmap(loss_fn) is not False:  # (2): the loss under vmap
        try:
            losses, extra = outputs_and_losses()
        except Exception:  # noqa: BLE001 - e.g. a loss reading values on the host: (3)
            _remember_loss_in_vmap(loss_fn, False)
        else:
            ok = losses.shape == (m,)
            _remember_loss_in_vmap(loss_fn, ok)
            if ok:
                return losses, extra
    if outs is None:  # (3): chunk by chunk, as the loop calls it
        outs, extra = outputs()
    losses = torch.stack([loss_fn(tree_map(lambda t, k=k: t[k], outs), y) for k, y in enumerate(y_list)])
    return losses, extra


def _loss_in_vmap(loss_fn: Any) -> bool | None:
    try:
        return _LOSS_IN_VMAP.get(loss_fn)
    except TypeError:  # not weakly referenceable (a builtin): try every time
        return None


def _remember_loss_in_vmap(loss_fn: Any, ok: bool) -> None:
    try:
        _LOSS_IN_VMAP[loss_fn] = ok
    except TypeError:
        pass


def flat_cross_entropy(loss_fn: Any) -> Callable[[Any, torch.Tensor], torch.Tensor | None] | None:
    """``f(outs, ys) -> [m]`` for a plain ``nn.CrossEntropyLoss`` with mean reduction, else ``None``:
    the mean over each sub-batch's counted examples (weighted by ``weight[y]``) from one
    ``reduction="none"`` call (76 us against 199 us under ``vmap``, 187 us for ``m`` calls, MLP, 8
    chunks of 32). ``f`` gives ``None`` unless ``outs [m, b, C]`` and targets ``[m, b]`` / ``[m, b, C]``.
    """
    if type(loss_fn) is not nn.CrossEntropyLoss or loss_fn.reduction != "mean":
        return None
    weight, ignore, smoothing = loss_fn.weight, loss_fn.ignore_index, loss_fn.label_smoothing

    def losses(outs: Any, ys: torch.Tensor) -> torch.Tensor | None:
        if not isinstance(outs, torch.Tensor) or outs.dim() != 3:
            return None
        m, b, c = outs.shape
        classes = not ys.is_floating_point()
        if (classes and ys.shape != (m, b)) or (not classes and ys.shape != outs.shape):
            return None
        flat_y = ys.reshape(m * b) if classes else ys.reshape(m * b, c)
        per = F.cross_entropy(outs.reshape(m * b, c), flat_y, weight=weight, ignore_index=ignore,
                              reduction="none", label_smoothing=smoothing).view(m, b)  # fmt: skip
        if not classes:  # probability targets: the plain mean over the b examples
            return per.sum(1) / b
        if weight is not None:  # sum_i w_{y_i} l_i / sum_i w_{y_i} over the counted examples
            counted = ys != ignore
            denom = torch.where(counted, weight[ys.clamp(0, c - 1)], torch.zeros((), dtype=per.dtype))
            return per.sum(1) / denom.sum(1)
        return per.sum(1) / (ys != ignore).sum(1).to(per.dtype)

    return losses


# ---- the per-chunk records of a step ------------------------------------------------------------
def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-level values: the mean over chunks (the value itself for one chunk); plus ``per_chunk``."""
    if len(records) == 1:
        return dict(records[0])
    out: dict[str, Any] = {}
    for key in records[0]:
        vals = [r[key] for r in records]
        if all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in vals):
            out[key] = torch.stack([v.to(vals[0].dtype) for v in vals]).mean()
        else:
            out[key] = vals[-1]
    out["per_chunk"] = records
    return out


def summarise_stacked(stacked: dict[str, torch.Tensor]) -> dict[str, Any]:
    """:func:`summarise` of the records whose values are the slices of ``stacked`` (each ``[m]``)."""
    keys, vals = list(stacked), list(stacked.values())
    first = vals[0]
    if all(v.dtype == first.dtype and v.device == first.device and v.dim() == 1 for v in vals):
        table = torch.stack(vals)  # [keys, m]: a handful of operations instead of two per key
        out: dict[str, Any] = dict(zip(keys, table.mean(1).unbind(0)))
        cells = table.t().reshape(-1).unbind(0)
        n = len(keys)
        out["per_chunk"] = [dict(zip(keys, cells[k * n : (k + 1) * n])) for k in range(table.shape[1])]
        return out
    out = {key: v.mean() for key, v in stacked.items()}
    out["per_chunk"] = [dict(zip(keys, vs)) for vs in zip(*(v.unbind(0) for v in vals))]
    return out
