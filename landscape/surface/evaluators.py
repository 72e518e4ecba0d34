"""Grid-point evaluators: one ``functional_call`` pass per point (loop), the linear first layer
computed once (linear_first_layer) and chunks of points under ``torch.func.vmap`` (vmap)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from landscape.inputs import _num_correct, _tensors

__all__ = ["data_fingerprint", "loss_fingerprint", "model_hash"]


# ------------------------------------------------------------------------------------- utilities


def _hash_tensors(named: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for n in sorted(named):
        t = named[n].detach().cpu().contiguous()
        h.update(n.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def model_hash(model: nn.Module) -> str:
    """Short sha256 of a model's parameters and buffers (names, dtypes, shapes, bytes)."""
    return _hash_tensors({**dict(model.named_parameters()), **dict(model.named_buffers())})


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def data_fingerprint(obj) -> tuple[str, int]:
    """Short sha256 of the objective's inputs and targets, and the bytes they occupy (converted to
    the objective's dtype/device, as the evaluators hold them).

    One hash per stream (each input tensor, by position or key, and the targets) over the batches
    in order, so the fingerprint depends on the examples and their order but not on how they are
    cut into batches; dtypes and per-example shapes are hashed too.
    """
    streams: dict[str, tuple[Any, list[int], str]] = {}
    nbytes = 0
    for x, y, _ in obj.batches():
        named = (
            {f"input[{k!r}]": v for k, v in x.items()}
            if isinstance(x, Mapping)
            else {f"input[{i}]": v for i, v in enumerate(_tensors(x))}
        )
        named["targets"] = y
        for key, t in named.items():
            h, rows, meta = streams.setdefault(key, (hashlib.sha256(), [0], f"{t.dtype}{tuple(t.shape[1:])}"))
            if meta != f"{t.dtype}{tuple(t.shape[1:])}":  # per-example shape changes: hash it in
                h.update(f"|{t.dtype}{tuple(t.shape[1:])}|".encode())
            h.update(_tensor_bytes(t))
            rows[0] += int(t.shape[0]) if t.ndim else 1
            nbytes += t.numel() * t.element_size()
    total = hashlib.sha256()
    for key in sorted(streams):
        h, rows, meta = streams[key]
        total.update(f"{key}:{meta}:{rows[0]}:{h.hexdigest()};".encode())
    return total.hexdigest()[:16], nbytes


def _defining(value: Any) -> bool:
    """Values that define what a loss computes (numbers, strings, tensors, tuples of them, other
    functions); mutable containers and other objects are taken as state (e.g. a call counter) and
    left out of the fingerprint."""
    if value is None or isinstance(
        value, (bool, int, float, str, bytes, np.generic, torch.Tensor, np.ndarray)
    ):
        return True
    if isinstance(value, tuple):
        return all(_defining(v) for v in value)
    return isinstance(value, (nn.Module, functools.partial)) or hasattr(value, "__code__")


def _feed_callable(h: Any, fn: Any, depth: int = 0) -> None:
    """Hash what determines a loss function's values: its class and defining attributes
    (nn.Module: also its parameters and buffers), a function's qualified name, bytecode and captured
    defining values, a partial's arguments."""
    if depth > 4:
        h.update(b"<deep>")
        return
    if isinstance(fn, torch.Tensor):
        h.update(f"tensor{fn.dtype}{tuple(fn.shape)}".encode())
        h.update(_tensor_bytes(fn))
    elif isinstance(fn, np.ndarray):
        _feed_callable(h, torch.from_numpy(np.ascontiguousarray(fn)), depth)
    elif fn is None or isinstance(fn, (bool, int, float, str, bytes, np.generic)):
        h.update(repr(fn).encode())
    elif isinstance(fn, (tuple, list)):
        h.update(f"{type(fn).__name__}{len(fn)}(".encode())
        for v in fn:
            _feed_callable(h, v, depth + 1)
        h.update(b")")
    elif isinstance(fn, Mapping):
        for k in sorted(fn, key=repr):
            h.update(repr(k).encode())
            _feed_callable(h, fn[k], depth + 1)
    elif isinstance(fn, functools.partial):
        h.update(b"partial:")
        _feed_callable(h, fn.func, depth + 1)
        _feed_callable(h, list(fn.args), depth + 1)
        _feed_callable(h, dict(fn.keywords), depth + 1)
    elif isinstance(fn, nn.Module):
        h.update(f"module:{type(fn).__module__}.{type(fn).__qualname__}".encode())
        simple = {
            k: v for k, v in vars(fn).items() if not k.startswith("_") and k != "training" and _defining(v)
        }
        _feed_callable(h, simple, depth + 1)
        _feed_callable(h, {**dict(fn.named_parameters()), **dict(fn.named_buffers())}, depth + 1)
    elif hasattr(fn, "__code__"):
        code = fn.__code__
        h.update(f"function:{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}".encode())
        h.update(code.co_code)
        consts = [c for c in code.co_consts if c is None or isinstance(c, (bool, int, float, str, bytes))]
        h.update(repr(consts).encode())
        h.update(repr(code.co_names).encode())
        for cell in getattr(fn, "__closure__", None) or ():  # captured variables (e.g. a weight)
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if _defining(value):
                _feed_callable(h, value, depth + 1)
    else:  # another callable object: its class and simple attributes
        h.update(f"object:{type(fn).__module__}.{type(fn).__qualname__}".encode())
        attrs = getattr(fn, "__dict__", {})
        _feed_callable(
            h, {k: v for k, v in attrs.items() if not k.startswith("_") and _defining(v)}, depth + 1
        )


def loss_fingerprint(loss_fn: Any) -> str:
    """Short sha256 of a loss function (see :func:`_feed_callable` for what is hashed)."""
    h = hashlib.sha256()
    _feed_callable(h, loss_fn)
    return h.hexdigest()[:16]


def _bn_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _point(base: Mapping[str, torch.Tensor], dirs, c: Sequence[float], names) -> dict[str, torch.Tensor]:
    """``theta + c1 d1 + c2 d2`` on ``names``, always with the same expression (zero coords give
    ``theta`` bit for bit)."""
    out = {}
    for n in names:
        t = base[n]
        for ci, d in zip(c, dirs):
            if n in d:
                t = torch.add(t, d[n], alpha=ci)  # t + ci * d in one pass; ci = 0 leaves t exact
        out[n] = t
    return out


# ------------------------------------------------------------------------------------ evaluators


class _Evaluator:
    """Evaluates points ``c`` (tuples of coordinates) -> ``(loss, correct or None)``."""

    name = "loop"
    want_accuracy = True

    @staticmethod
    def _perturbed_numel(obj, dirs) -> int:
        names = {n for d in dirs for n in d}
        tensors = {**obj.all_params(), **obj.buffers()}
        return sum(tensors[n].numel() for n in names if n in tensors)

    @classmethod
    def workspace_bytes(cls, obj, dirs, bn_policy: str, n_points: int, batch_points: int, data_bytes: int):
        """Bytes this evaluator allocates on ``obj.device`` beyond the model (an estimate made
        before anything is allocated) and a short description of the largest part."""
        item = torch.empty((), dtype=obj.dtype).element_size()
        per_point = cls._perturbed_numel(obj, dirs) * item
        if bn_policy != "eval":
            per_point += sum(t.numel() * t.element_size() for t in obj.buffers().values())
        cached = data_bytes if isinstance(obj.data, (list, tuple)) else 0
        return cached + 2 * per_point, "the perturbed parameters of one point and the data"

    def __init__(self, obj, dirs, bn_policy: str):
        self.obj = obj
        self.model = obj.model
        self.dirs = dirs
        self.bn_policy = bn_policy
        self.params = obj.all_params()
        self.buffers = obj.buffers()
        self.pnames = [n for n in self.params if any(n in d for d in dirs)]
        self.bnames = [n for n in self.buffers if any(n in d for d in dirs)]
        # data held in memory (a batch or a list of batches) is converted once and reused; a
        # DataLoader is re-iterated at every point (memory stays flat for large data sets)
        self._cached = list(obj.batches()) if isinstance(obj.data, (list, tuple)) else None

    @property
    def batches(self):
        return self._cached if self._cached is not None else self.obj.batches()

    def _state(self, c):
        p = dict(self.params)
        p.update(_point(self.params, self.dirs, c, self.pnames))
        b = (
            {n: t.clone() for n, t in self.buffers.items()}
            if self.bn_policy != "eval"
            else dict(self.buffers)
        )
        b.update(_point(self.buffers, self.dirs, c, self.bnames))
        return p, b

    def _recompute_bn(self, p, b) -> None:
        """Re-estimate BatchNorm running statistics at this point: cumulative average of the
        per-batch statistics over the data (as ``torch.optim.swa_utils.update_bn``)."""
        bns = _bn_modules(self.model)
        saved = [(m, m.momentum, m.training) for _, m in bns]
        try:
            for name, m in bns:
                pre = f"{name}." if name else ""
                if m.track_running_stats:
                    b[pre + "running_mean"] = torch.zeros_like(b[pre + "running_mean"])
                    b[pre + "running_var"] = torch.ones_like(b[pre + "running_var"])
                    b[pre + "num_batches_tracked"] = torch.zeros_like(b[pre + "num_batches_tracked"])
                m.momentum = None
                m.training = True
            for x, _, _ in self.batches:
                self.obj.call(p, b, x)
        finally:
            for m, mom, tr in saved:
                m.momentum = mom
                m.training = tr

    def evaluate(self, points: Sequence[tuple[float, ...]]) -> list[tuple[float, float | None]]:
        out = []
        for c in points:
            p, b = self._state(c)
            if self.bn_policy == "recompute":
                self._recompute_bn(p, b)
            out.append(self._score((self.obj.call(p, b, x), y, w) for x, y, w in self.batches))
        return out

    def _score(self, outputs) -> tuple[float, float | None]:
        """Weighted loss and accuracy (None when the targets are not class labels) of the model
        outputs over the whole data: ``outputs`` yields ``(outputs, targets, batch weight)``."""
        obj = self.obj
        total = torch.zeros((), dtype=obj.dtype, device=obj.device)
        correct = torch.zeros((), dtype=torch.float64, device=obj.device)
        classify = self.want_accuracy
        for o, y, w in outputs:
            total = total + w * obj.loss_fn(o, y)
            if classify:
                k = _num_correct(o, y)
                if k is None:
                    classify = False
                else:
                    correct = correct + k
        return float(total), float(correct) / obj.num_examples if classify else None


class _LinearFirstEvaluator(_Evaluator):
    """``nn.Sequential`` whose first parametrised module is a ``Linear`` on the (flattened) input:
    ``Linear(Z; W + sum_i c_i D_i, b + sum_i c_i e_i) = (Z W^T + b) + sum_i c_i (Z D_i^T + e_i)``,
    so the three products are computed once per batch and combined per point."""

    name = "linear_first_layer"

    @classmethod
    def workspace_bytes(cls, obj, dirs, bn_policy: str, n_points: int, batch_points: int, data_bytes: int):
        base, _ = super().workspace_bytes(obj, dirs, bn_policy, n_points, batch_points, data_bytes)
        k = cls.split(obj.model)
        first = list(obj.model)[k]
        names = [f"{k}.weight", f"{k}.bias"]
        touched = sum(1 for d in dirs if any(n in d for n in names))
        item = torch.empty((), dtype=obj.dtype).element_size()
        pre = obj.num_examples * first.out_features * (1 + touched) * item
        desc = (
            f"the first layer's outputs for all {obj.num_examples} examples, once plus once per "
            f"direction ({1 + touched} x [{obj.num_examples}, {first.out_features}])"
        )
        return base + pre, desc

    @staticmethod
    def split(model: nn.Module) -> int | None:
        """Index of the first Linear when everything before it is parameter-free and stateless."""
        if not isinstance(model, nn.Sequential):
            return None
        stateless = (nn.Flatten, nn.Identity, nn.Unflatten)
        for i, m in enumerate(model):
            if isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward:
                return i
            if not isinstance(m, stateless):
                return None
        return None

    def __init__(self, obj, dirs, bn_policy: str):
        super().__init__(obj, dirs, bn_policy)
        k = self.split(self.model)
        if k is None:
            raise ValueError(
                "strategy 'linear_first_layer' needs an nn.Sequential starting with Flatten/Linear"
            )
        mods = list(self.model)
        self.prefix = mods[:k]
        self.rest = nn.Sequential(*mods[k + 1 :])
        # per module of the rest: plain nn.Linear -> F.linear (what its forward does), stateless
        # modules called directly, anything else through functional_call with its own entries
        self.kinds = []
        for j, mod in enumerate(self.rest):
            hooked = bool(mod._forward_hooks or mod._forward_pre_hooks)
            if type(mod) is nn.Linear and not hooked:
                self.kinds.append(("linear", f"{j}.weight", f"{j}.bias" if mod.bias is not None else None))
            elif (
                not hooked
                and next(iter(mod.parameters()), None) is None
                and next(iter(mod.buffers()), None) is None
            ):
                self.kinds.append(("plain", None, None))
            else:
                self.kinds.append(("call", f"{j}.", None))
        first = f"{k}."
        wn, bn = first + "weight", first + "bias"
        has_bias = bn in self.params

        def rename(n: str) -> str | None:
            head, _, tail = n.partition(".")
            i = int(head)
            return f"{i - k - 1}.{tail}" if i > k else None

        self.rename = rename
        self.first_names = [wn] + ([bn] if has_bias else [])
        self.rest_p = {rename(n): t for n, t in self.params.items() if rename(n) is not None}
        self.rest_b = {rename(n): t for n, t in self.buffers.items() if rename(n) is not None}
        self.rest_pnames = [n for n in self.pnames if rename(n) is not None]
        self.rest_bnames = [n for n in self.bnames if rename(n) is not None]
        W = self.params[wn]
        bias = self.params[bn] if has_bias else None
        self.pre = []  # per batch: (A0, [P_i or None], y, w)
        with torch.no_grad():
            for x, y, w in self.batches:
                z = x
                for m in self.prefix:
                    z = m(z)
                a0 = F.linear(z, W, bias)
                ps = []
                for d in dirs:
                    if wn in d or (has_bias and bn in d):
                        dw = d.get(wn, torch.zeros_like(W))
                        db = d.get(bn) if has_bias else None
                        ps.append(F.linear(z, dw, db))
                    else:
                        ps.append(None)
                self.pre.append((a0, ps, y, w))

    def _run_rest(self, a, p, b):
        for mod, (kind, x1, x2) in zip(self.rest, self.kinds):
            if kind == "linear":
                a = F.linear(a, p[x1], None if x2 is None else p[x2])
            elif kind == "plain":
                a = mod(a)
            else:
                n = len(x1)
                sp = {k[n:]: v for k, v in p.items() if k.startswith(x1)}
                sb = {k[n:]: v for k, v in b.items() if k.startswith(x1)}
                a = functional_call(mod, (sp, sb), (a,))
        return a

    def evaluate(self, points):
        out = []
        for c in points:
            p = dict(self.rest_p)
            for n, t in _point(self.params, self.dirs, c, self.rest_pnames).items():
                p[self.rename(n)] = t
            b = dict(self.rest_b)
            for n, t in _point(self.buffers, self.dirs, c, self.rest_bnames).items():
                b[self.rename(n)] = t
            out.append(self._score(self._outputs(c, p, b)))
        return out

    def _outputs(self, c, p, b):
        """Model outputs at point ``c``, batch by batch, from the precomputed first-layer terms."""
        for a0, ps, y, w in self.pre:
            a = a0
            for ci, pi in zip(c, ps):
                if pi is not None:
                    a = torch.add(a, pi, alpha=ci)
            yield self._run_rest(a, p, b), y, w


class _VmapEvaluator(_Evaluator):
    """Chunks of points in one ``torch.func.vmap`` over stacked parameter dicts."""

    name = "vmap"

    @classmethod
    def workspace_bytes(cls, obj, dirs, bn_policy: str, n_points: int, batch_points: int, data_bytes: int):
        base, _ = super().workspace_bytes(obj, dirs, bn_policy, n_points, batch_points, data_bytes)
        chunk = max(1, min(batch_points, n_points))
        item = torch.empty((), dtype=obj.dtype).element_size()
        stacked = chunk * cls._perturbed_numel(obj, dirs) * item * (1 + len(dirs))
        desc = f"{chunk} stacked copies of the perturbed parameters per vmap call (batch_points)"
        return base + stacked, desc

    def evaluate(self, points):
        obj = self.obj
        cs = torch.as_tensor(np.asarray(points, dtype=np.float64), dtype=obj.dtype, device=obj.device)
        nb = cs.shape[0]
        stacked: dict[str, torch.Tensor] = {}
        for n in self.pnames + self.bnames:
            base = self.params[n] if n in self.params else self.buffers[n]
            t = base.unsqueeze(0).expand(nb, *base.shape)
            for i, d in enumerate(self.dirs):
                if n in d:
                    t = t + cs[:, i].reshape(nb, *([1] * base.ndim)) * d[n].unsqueeze(0)
            stacked[n] = t
        static_p = {n: t for n, t in self.params.items() if n not in stacked}
        static_b = {n: t for n, t in self.buffers.items() if n not in stacked}

        def f(sp, x, y):
            p = {**static_p, **{n: v for n, v in sp.items() if n in self.params}}
            b = {**static_b, **{n: v for n, v in sp.items() if n in self.buffers}}
            o = self.obj.call(p, b, x)
            return obj.loss_fn(o, y), o

        vf = torch.func.vmap(f, in_dims=(0, None, None))
        total = torch.zeros(nb, dtype=obj.dtype, device=obj.device)
        correct = torch.zeros(nb, dtype=torch.float64, device=obj.device)
        classify = self.want_accuracy
        for x, y, w in self.batches:
            lk, o = vf(stacked, x, y)
            total = total + w * lk
            if classify:
                ks = [_num_correct(o[i], y) for i in range(nb)]
                if any(k is None for k in ks):
                    classify = False
                else:
                    correct = correct + torch.stack(ks)
        tl = total.tolist()
        cl = (correct / obj.num_examples).tolist() if classify else [None] * nb
        return list(zip(tl, cl))


# ----------------------------------------------------------------------------------------- surface
