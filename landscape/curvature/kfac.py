"""KFAC and EKFAC: Kronecker-factored approximations of the GGN / Fisher of an :class:`~landscape.Objective`.

For every ``nn.Linear`` and ``nn.Conv2d`` layer with selected parameters the curvature block of its
weight ``W`` (``[d_out, d_in]``, a ``Conv2d`` kernel flattened to ``[c_out, c_in/groups k1 k2]``)
and bias is approximated by a Kronecker product ``G kron A`` (Martens & Grosse 2015, "Optimizing
neural networks with Kronecker-factored approximate curvature", eqs. 1-3; Grosse & Martens 2016,
"A Kronecker-factored approximate Fisher matrix for convolution layers", for ``Conv2d``):

* ``A = (1/N) sum_n (1/S_n) sum_s a_ns a_ns^T``: the layer inputs ``a`` (for ``Conv2d`` the unfolded
  patches, ``torch.nn.functional.unfold``), with a trailing ``1`` when weight and bias form one block
  (the bias is the weight of an input column of ones);
* ``G = c sum_n sum_s sum_j g_nsj g_nsj^T``: the gradients ``g`` of the loss with respect to the layer
  output, back-propagated from output vectors ``u_j`` that depend on ``fisher_type``:

  - ``"type-2"``: the columns of a square root ``S`` of each loss term's output Hessian,
    ``S S^T = d^2 l / d f^2`` (cross-entropy: ``S = diag(sqrt p) - p sqrt(p)^T``; MSE:
    ``sqrt(2 s) I``; BCE-with-logits: ``diag(sqrt(s p (1 - p)))``, ``s = 1/C`` for a mean over the
    ``C`` outputs of a term, else ``1``), so ``sum_j g_j g_j^T`` is the GGN's output factor
    ``J^T H J`` seen at the layer (Martens & Grosse 2015, Sec. 5; Botev et al. 2017, "Practical
    Gauss-Newton optimisation for deep learning", Sec. 3);
  - ``"mc"``: the gradients of each term's negative log-likelihood at ``samples`` labels drawn from
    the model's predictive (:mod:`landscape.curvature.likelihoods`), averaged over draws: an
    unbiased estimate of ``"type-2"`` (Martens & Grosse 2015, Sec. 5);
  - ``"empirical"``: the gradients at the data's own labels.

  ``c = 1/(N m)`` for ``reduction="mean"`` (``m`` loss terms per example: positions of the output's
  extra dimensions; for MSE/BCE the outputs of a term's last dimension enter through ``s``) and
  ``c = 1`` for ``"sum"``, the normalisation of curvlinops' ``KFACLinearOperator``, under which the
  exact cases below equal the GGN of the same loss.

Weight sharing (sequence positions of a ``Linear`` on ``[B, T, d_in]``, the output positions of a
``Conv2d``): ``kfac_approx="expand"`` treats every position ``s`` as an example of its own
(``S_n = T`` above, gradients of all positions in ``G``); ``"reduce"`` first averages the inputs and
sums the output gradients over positions (``S_n = 1``) (Eschenhagen et al. 2023, "Kronecker-factored
approximate curvature for modern neural network architectures", Sec. 3, eqs. 9 and 13).  For deep
linear networks with MSE loss each is exact -- its blocks equal the GGN's diagonal blocks -- in its
own setting: "expand" when every position is a loss term, "reduce" when the positions are averaged
before the loss (their Sec. 3.1-3.2; ``tests/test_kfac.py``).  ``Conv2d`` with ``groups > 1``
averages the input over the channel groups (as curvlinops: an approximation).

EKFAC (George et al. 2018, "Fast approximate natural gradient descent in a Kronecker-factored
eigenbasis", eq. 10) keeps KFAC's eigenbasis ``Q_G kron Q_A`` and refits the diagonal to the exact
second moment of the per-example gradients in it, ``D = c sum_n sum_j (Q_G^T G_nj Q_A)^2`` with
``G_nj = sum_s g_nsj a_ns^T`` (all positions, whatever ``kfac_approx``), as curvlinops'
``EKFACLinearOperator``; it needs a second pass over the data (the eigenbasis first) and, as there,
one loss term per example (outputs ``[B, C]``).

The factors are computed once, at construction, with forward hooks on the layers in one pass over
the data (two for EKFAC): the hook keeps each layer's input and the gradient edge of its output
(``torch.autograd.graph.get_gradient_edge``, so an in-place activation after the layer does not
change what is differentiated), and one backward pass per block of output vectors
(``is_grads_batched``) computes the gradients with respect to the layer outputs only, not the
parameters'.  Under ``torch.distributed`` the factor sums are summed over ranks before they are
normalised, and products are not summed again.  Layers with parameters but no Kronecker form
(BatchNorm, LayerNorm, Embedding, ...) are refused by name: select the parameters of the others with
``Objective(..., params=...)`` (or ``obj.subset(...)``).  The algebra of the factors (inverse with
exact or factor-wise damping, log-determinant, trace, eigenvalues) is in
:mod:`landscape.curvature.kronecker`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.graph import get_gradient_edge

from landscape.curvature.base import product_kernels
from landscape.curvature.kronecker import (
    KroneckerBlock,
    KroneckerInverse,
    KroneckerOperator,
    check_damping,
    inverse_block,
    singular,
)
from landscape.curvature.likelihoods import infer_likelihood, nll_output_gradients, sample_targets
from landscape.objective import Objective

__all__ = ["FISHER_TYPES", "KFAC_APPROX", "KFACOperator", "EKFACOperator", "kfac", "ekfac"]

FISHER_TYPES = ("type-2", "mc", "empirical")
KFAC_APPROX = ("expand", "reduce")
SUPPORTED_LOSSES = (nn.CrossEntropyLoss, nn.MSELoss, nn.BCEWithLogitsLoss)


@dataclass
class _Layer:
    """A ``Linear``/``Conv2d`` layer with selected parameters: where they sit in the flat vector."""

    name: str
    module: nn.Module
    conv: bool
    d_out: int
    d_in: int  # columns of the flattened weight
    weight: int | None  # offset of the weight in the flat vector (None: not selected)
    bias: int | None  # offset of the bias (None: not selected or absent)
    joint: bool  # weight and bias as one block (A with a column of ones)


def _loss_kind(loss_fn: Any) -> str:
    if isinstance(loss_fn, nn.CrossEntropyLoss):
        if loss_fn.weight is not None:
            raise ValueError(
                "KFAC: CrossEntropyLoss with class weights has no per-term output Hessian of the supported "
                "form; use CrossEntropyLoss() without weight="
            )
        return "cross_entropy"
    if isinstance(loss_fn, nn.MSELoss):
        return "mse"
    if isinstance(loss_fn, nn.BCEWithLogitsLoss):
        if loss_fn.weight is not None or loss_fn.pos_weight is not None:
            raise ValueError("KFAC: BCEWithLogitsLoss with weight/pos_weight is not supported; drop them")
        return "bce_logits"
    raise ValueError(
        f"KFAC supports nn.CrossEntropyLoss, nn.MSELoss and nn.BCEWithLogitsLoss (as curvlinops), got "
        f"{type(loss_fn).__name__}; for another loss use ls.ggn(obj) or ls.fisher(obj)"
    )


def _find_layers(obj: Objective, separate_bias: bool) -> list[_Layer]:
    """The layers of the selected parameters, in the order of the flat vector; a ValueError names a
    parameter outside a ``Linear``/``Conv2d`` layer and how to exclude it."""
    offsets, off = {}, 0
    for n, numel in zip(obj.param_names, obj.param_numels):
        offsets[n] = off
        off += numel
    found: dict[str, dict[str, Any]] = {}
    for n in obj.param_names:
        prefix, _, leaf = n.rpartition(".")
        module = obj.model.get_submodule(prefix)
        if not isinstance(module, (nn.Linear, nn.Conv2d)) or leaf not in ("weight", "bias"):
            raise ValueError(
                f"KFAC has no Kronecker form for parameter {n!r} of layer {prefix or '<model>'!r} "
                f"({type(module).__name__}): only nn.Linear and nn.Conv2d weights and biases are "
                f"supported; leave it out of the parameter selection, e.g. "
                f"obj.subset(lambda name: not name.startswith({prefix + '.' if prefix else n!r}))"
            )
        found.setdefault(prefix, {"module": module})[leaf] = offsets[n]
    layers = []
    for name, d in found.items():
        m = d["module"]
        if isinstance(m, nn.Conv2d):
            if m.padding_mode != "zeros":
                raise ValueError(
                    f"KFAC: Conv2d layer {name!r} has padding_mode={m.padding_mode!r}; only 'zeros' is "
                    "supported (its patches are those of F.unfold); exclude the layer with params="
                )
            _conv_padding(m, name)
        w, b = d.get("weight"), d.get("bias")
        d_in = int(m.weight[0].numel())
        layers.append(
            _Layer(
                name,
                m,
                isinstance(m, nn.Conv2d),
                int(m.weight.shape[0]),
                d_in,
                w,
                b,
                w is not None and b is not None and not separate_bias,
            )
        )
    return layers


def _conv_padding(m: nn.Conv2d, name: str) -> tuple[int, int]:
    """The symmetric integer padding of ``m`` (``"same"``/``"valid"`` resolved)."""
    if not isinstance(m.padding, str):
        return tuple(int(p) for p in m.padding)
    if m.padding == "valid":
        return (0, 0)
    pads = []
    for k, d in zip(m.kernel_size, m.dilation):
        total = d * (k - 1)
        if total % 2:
            raise ValueError(
                f"KFAC: Conv2d layer {name!r} with padding='same' pads unequally (kernel {k}, dilation "
                f"{d}); use an odd kernel or explicit integer padding"
            )
        pads.append(total // 2)
    return tuple(pads)


def _averaged_patches(x: torch.Tensor, m: nn.Conv2d, padding: tuple[int, int]) -> torch.Tensor:
    """``[B, c_in k1 k2]``: the unfolded patches of ``x`` averaged over the output positions, without
    unfolding: per spatial dimension ``P[k, i] = #{o : o s + k d - p = i} / O`` and the average is
    ``x[b, c, i, j] P1[k1, i] P2[k2, j]`` (the index-pattern form of Dangel 2023, "Convolutions and
    more as einsum", used by curvlinops' KFAC-reduce)."""
    pats = []
    for size, k, s, p, d in zip(x.shape[-2:], m.kernel_size, m.stride, padding, m.dilation):
        n_out = (size + 2 * p - d * (k - 1) - 1) // s + 1
        pos = (
            torch.arange(n_out, device=x.device)[None, :] * s
            + torch.arange(k, device=x.device)[:, None] * d
            - p
        )
        hits = pos[:, :, None] == torch.arange(size, device=x.device)[None, None, :]
        pats.append(hits.sum(1).to(x.dtype) / n_out)
    return torch.einsum("bcij,ki,lj->bckl", x, pats[0], pats[1]).flatten(1)


def _group_mean(x: torch.Tensor, m: nn.Conv2d) -> torch.Tensor:
    if m.groups == 1:
        return x
    B, C = x.shape[:2]
    return x.reshape(B, m.groups, C // m.groups, *x.shape[2:]).mean(1)


def _input_rows(layer: _Layer, x: torch.Tensor, approx: str, ones: bool) -> tuple[torch.Tensor, int]:
    """``(rows, S)``: the layer inputs as rows ``[R, c]`` for ``A`` and the positions ``S`` per example
    they are divided by (module docstring)."""
    m = layer.module
    if layer.conv:
        if x.ndim != 4:
            raise ValueError(
                f"KFAC: Conv2d layer {layer.name!r} needs batched [B, C, H, W] inputs, got {tuple(x.shape)}"
            )
        x = _group_mean(x, m)
        pad = _conv_padding(m, layer.name)
        if approx == "reduce":
            rows, scale = _averaged_patches(x, m, pad), 1
        else:
            P = F.unfold(x, m.kernel_size, dilation=m.dilation, padding=pad, stride=m.stride)
            rows, scale = P.transpose(1, 2).reshape(-1, P.shape[1]), P.shape[2]
    else:
        a = x.reshape(x.shape[0], -1, layer.d_in)
        rows, scale = (a.mean(1), 1) if approx == "reduce" else (a.reshape(-1, layer.d_in), a.shape[1])
    if ones:
        rows = torch.cat([rows, rows.new_ones(rows.shape[0], 1)], dim=1)
    return rows, scale


def _example_inputs(layer: _Layer, x: torch.Tensor, ones: bool) -> torch.Tensor:
    """``[B, S, c]``: the layer inputs per example and position (patches for ``Conv2d``)."""
    m = layer.module
    if layer.conv:
        x = _group_mean(x, m)
        P = F.unfold(
            x, m.kernel_size, dilation=m.dilation, padding=_conv_padding(m, layer.name), stride=m.stride
        )
        a = P.transpose(1, 2)
    else:
        a = x.reshape(x.shape[0], -1, layer.d_in)
    if ones:
        a = torch.cat([a, a.new_ones(*a.shape[:2], 1)], dim=2)
    return a


def _output_gradients(layer: _Layer, g: torch.Tensor) -> torch.Tensor:
    """``[K, B, S, d_out]``: the gradients with respect to the layer output per vector, example and
    position."""
    K, B = g.shape[:2]
    if layer.conv:
        return g.reshape(K, B, layer.d_out, -1).transpose(2, 3)
    return g.reshape(K, B, -1, layer.d_out)


class KFACOperator(KroneckerOperator):
    """KFAC ``blockdiag_l(G_l kron A_l)`` of the GGN / Fisher (module docstring), on the operator base.

    Args:
        objective: the :class:`~landscape.Objective` (loss ``CrossEntropyLoss``, ``MSELoss`` or
            ``BCEWithLogitsLoss``, reduction ``"mean"`` or ``"sum"``); every selected parameter must
            be the weight or bias of an ``nn.Linear`` or ``nn.Conv2d``.
        params: the point (default: the objective's current parameters).
        fisher_type: ``"type-2"`` (GGN, default), ``"mc"`` or ``"empirical"``.
        kfac_approx: ``"expand"`` (default) or ``"reduce"`` for inputs with weight-sharing dimensions.
        samples, seed: ``"mc"``: labels drawn per example, and the seed of their generator (on the CPU,
            so draws do not depend on the device; they differ from curvlinops' draws).
        separate_bias: ``False`` (default): weight and bias of a layer are one block (``A`` with a
            column of ones); ``True``: two blocks, the bias's being ``G`` alone (curvlinops'
            ``separate_weight_and_bias=True``).
        chunk_size: output vectors back-propagated at once (``is_grads_batched``); ``None``: all.
        max_memory: as for every operator (:mod:`landscape.curvature.memory`).
    """

    name = "kfac"

    def __init__(
        self,
        objective: Objective,
        params: Any = None,
        *,
        fisher_type: str = "type-2",
        kfac_approx: str = "expand",
        samples: int = 1,
        seed: int = 0,
        separate_bias: bool = False,
        chunk_size: int | None = 16,
        max_memory: int | float | str | None = None,
    ) -> None:
        if fisher_type not in FISHER_TYPES:
            raise ValueError(f"fisher_type must be one of {FISHER_TYPES}, got {fisher_type!r}")
        if kfac_approx not in KFAC_APPROX:
            raise ValueError(f"kfac_approx must be one of {KFAC_APPROX}, got {kfac_approx!r}")
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
            raise ValueError(f"samples must be a positive int, got {samples!r}")
        if samples != 1 and fisher_type != "mc":
            raise ValueError(
                f"samples={samples} is for fisher_type='mc' only; leave it at 1 for {fisher_type!r}"
            )
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        if not isinstance(objective, Objective):
            raise TypeError(f"expected a landscape.Objective, got {type(objective).__name__}")
        self._loss = _loss_kind(objective.loss_fn)
        if getattr(objective.loss_fn, "reduction", None) != objective.reduction:
            raise ValueError(
                f"KFAC: the loss reduces with {objective.loss_fn.reduction!r} but the Objective with "
                f"{objective.reduction!r}; build the Objective with reduction='auto'"
            )
        self.likelihood = infer_likelihood(objective.loss_fn) if fisher_type == "mc" else None
        super().__init__(objective, params, max_memory=max_memory)
        self.fisher_type = fisher_type
        self.kfac_approx = kfac_approx
        self.samples = samples
        self.seed = seed
        self.separate_bias = separate_bias
        self.chunk_size = chunk_size
        self._layers = _find_layers(objective, separate_bias)
        self._targets: list[torch.Tensor] = []
        self._terms: int | None = None
        self._eig_cache: dict[int, tuple] = {}  # id(factor) -> its eigendecomposition
        self._factors = self._compute_factors()
        self._blocks = self._make_blocks()

    # ------------------------------------------------------------------ one pass over the data
    def _generator(self) -> torch.Generator:
        rank = int(getattr(self.objective, "rank", 0))  # every rank draws its own labels
        return torch.Generator().manual_seed(self.seed + 1_000_003 * rank)

    def _forward(self, full: dict, bufs: dict, x: Any) -> tuple[torch.Tensor, dict[str, tuple]]:
        """The batch output and, per layer, its input and the gradient edge of its output."""
        rec: dict[str, tuple] = {}

        def hook(layer: _Layer):
            def fn(module, inputs, output):
                if layer.name in rec:
                    raise ValueError(
                        f"KFAC: layer {layer.name!r} is called more than once per forward (a shared "
                        "layer); its Kronecker factors are not defined here: exclude it with params="
                    )
                if not isinstance(output, torch.Tensor) or not output.requires_grad:
                    raise ValueError(
                        f"KFAC: the output of layer {layer.name!r} does not depend on its parameters"
                    )
                rec[layer.name] = (inputs[0].detach(), get_gradient_edge(output))

            return fn

        handles = [layer.module.register_forward_hook(hook(layer)) for layer in self._layers]
        try:
            out = self.objective.call(full, bufs, x)
        finally:
            for h in handles:
                h.remove()
        missing = [layer.name for layer in self._layers if layer.name not in rec]
        if missing:
            raise ValueError(
                f"KFAC: layers {missing} are not called by the model's forward; exclude them with params="
            )
        return out, rec

    def _terms_per_example(self, out: torch.Tensor) -> int:
        if out.ndim < 2:
            raise ValueError(
                "KFAC needs outputs of shape [B, C, ...] (at least 2-D, as curvlinops), got "
                f"{tuple(out.shape)}"
            )
        m = math.prod(out.shape[2:]) if self._loss == "cross_entropy" else math.prod(out.shape[1:-1])
        if self._terms is not None and m != self._terms:
            raise ValueError(
                f"KFAC: every example must have the same number of loss terms ({self._terms} and {m} seen)"
            )
        self._terms = m
        return m

    def _columns(self, k: int, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``[K, *out.shape]``: the output vectors ``u_j`` whose back-propagated gradients enter ``G``,
        at the unit scale of ``c`` (module docstring)."""
        o = out.detach()
        ce = self._loss == "cross_entropy"
        C = int(o.shape[1] if ce else o.shape[-1])
        mean = self.objective.reduction == "mean"
        s = 1.0 / C if (mean and not ce) else 1.0
        if self.fisher_type == "type-2":
            o2 = o.movedim(1, -1).reshape(-1, C) if ce else o.reshape(-1, C)
            eye = torch.eye(C, dtype=o.dtype, device=o.device)
            if ce:
                p = torch.softmax(o2, dim=1)
                cols = p.sqrt().T[:, :, None] * (eye[:, None, :] - p[None])  # column c: sqrt(p_c) (e_c - p)
            elif self._loss == "mse":
                cols = math.sqrt(2.0 * s) * eye[:, None, :].expand(C, o2.shape[0], C)
            else:
                sig = torch.sigmoid(o2)
                cols = eye[:, None, :] * (s * sig * (1 - sig)).sqrt().T[:, :, None]
            if ce:
                return cols.reshape(C, o.shape[0], *o.shape[2:], C).movedim(-1, 2)
            return cols.reshape(C, *o.shape)
        if self.fisher_type == "mc":
            t = self._targets[k]
            u = nll_output_gradients(o, t, self.likelihood).reshape(t.shape[0], *o.shape)
            return u * math.sqrt(s)
        with torch.enable_grad():
            leaf = o.clone().requires_grad_(True)
            (r,) = torch.autograd.grad(self.objective.loss_fn(leaf, y), leaf)
        if mean:  # back to one term's loss (sum over its outputs), times sqrt(s) as the other types
            r = r * (o.shape[0] * self._terms * (C if not ce else 1)) * math.sqrt(s)
        return r.unsqueeze(0)

    def _backward(self, out: torch.Tensor, rec: dict, cols: torch.Tensor):
        """Per block of output vectors: the gradients with respect to every layer output,
        ``{layer: [k, *layer_output.shape]}``."""
        edges = [rec[layer.name][1] for layer in self._layers]
        K = int(cols.shape[0])
        step = K if self.chunk_size is None else self.chunk_size
        for start in range(0, K, step):
            U = cols[start : start + step]
            last = start + step >= K
            if U.shape[0] == 1:
                gs = torch.autograd.grad(out, edges, U[0], retain_graph=not last, allow_unused=True)
                gs = [None if g is None else g.unsqueeze(0) for g in gs]
            else:
                gs = torch.autograd.grad(
                    out, edges, U, retain_graph=not last, is_grads_batched=True, allow_unused=True
                )
            yield {layer.name: g for layer, g in zip(self._layers, gs)}

    def _batches_with_records(self):
        """One pass: ``(k, x, y, out, rec)`` per batch, under the product kernels and the objective's mode."""
        obj = self.objective
        full = self._full({n: t.detach().requires_grad_(True) for n, t in self._theta.items()})
        with obj.evaluating(), product_kernels(), torch.enable_grad():
            bufs = obj.buffers()
            for k, (x, y, _) in enumerate(obj.batches()):
                out, rec = self._forward(full, bufs, x)
                self._terms_per_example(out)
                yield k, x, y, out, rec

    def _scale(self) -> float:
        """``c / S``: the normalisation of the gradient sums (module docstring)."""
        N = self.objective.num_examples
        c = 1.0 / (N * self._terms) if self.objective.reduction == "mean" else 1.0
        return c / self.samples

    def _compute_factors(self) -> dict[str, dict[str, torch.Tensor | None]]:
        """``{layer: {"A": ..., "G": ...}}`` in one pass over the data (module docstring)."""
        A: dict[str, torch.Tensor] = {}
        G: dict[str, torch.Tensor] = {}
        gen = self._generator() if self.fisher_type == "mc" else None
        for k, _x, y, out, rec in self._batches_with_records():
            for layer in self._layers:
                if layer.weight is not None:
                    rows, S = _input_rows(layer, rec[layer.name][0], self.kfac_approx, layer.joint)
                    part = rows.T @ rows / S
                    A[layer.name] = part if layer.name not in A else A[layer.name].add_(part)
            if gen is not None:
                t = sample_targets(out, self.likelihood, self.samples, gen)
                dtype = torch.long if self.likelihood == "categorical" else out.dtype
                self._targets.append(t.to(device=out.device, dtype=dtype))
            cols = self._columns(k, out, y)
            for gs in self._backward(out, rec, cols):
                for layer in self._layers:
                    g = gs[layer.name]
                    if g is None:
                        continue
                    g = _output_gradients(layer, g)
                    g = g.sum(2) if self.kfac_approx == "reduce" else g
                    g = g.reshape(-1, layer.d_out)
                    part = g.T @ g
                    G[layer.name] = part if layer.name not in G else G[layer.name].add_(part)
            del out, rec, cols
        N, c = self.objective.num_examples, self._scale()
        factors = {}
        for layer in self._layers:
            a = A.get(layer.name)
            g = G.get(layer.name)
            if g is None:
                g = torch.zeros(layer.d_out, layer.d_out, dtype=self.dtype, device=self.device)
            g = self.objective.all_reduce(g) * c
            a = None if a is None else self.objective.all_reduce(a) / N
            factors[layer.name] = {"A": a, "G": g}
        return factors

    # ------------------------------------------------------------------ blocks
    def _index(self, layer: _Layer, part: str) -> torch.Tensor:
        dev = self.device
        rows = torch.arange(layer.d_out, device=dev)[:, None]
        if part == "bias":
            return (layer.bias + rows).reshape(-1)
        w = layer.weight + rows * layer.d_in + torch.arange(layer.d_in, device=dev)[None, :]
        if part == "joint":
            w = torch.cat([w, layer.bias + rows], dim=1)
        return w.reshape(-1)

    def _parts(self, layer: _Layer) -> list[tuple[str, str]]:
        """``(block name, part)`` of a layer: one joint block, or a weight and/or a bias block."""
        if layer.joint:
            return [(layer.name, "joint")]
        parts = []
        if layer.weight is not None:
            parts.append((f"{layer.name}.weight" if layer.bias is not None else layer.name, "weight"))
        if layer.bias is not None:
            parts.append((f"{layer.name}.bias" if layer.weight is not None else layer.name, "bias"))
        return parts

    def _make_blocks(self) -> list[KroneckerBlock]:
        blocks = []
        for layer in self._layers:
            f = self._factors[layer.name]
            for name, part in self._parts(layer):
                cols = 1 if part == "bias" else layer.d_in + (part == "joint")
                right = None if part == "bias" else f["A"]
                blocks.append(
                    KroneckerBlock(
                        name, self._index(layer, part), layer.d_out, cols, left=f["G"], right=right
                    )
                )
        return blocks

    def factors(self) -> dict[str, dict[str, torch.Tensor | None]]:
        """``{layer name: {"A": input factor (None if only the bias is selected), "G": gradient factor}}``
        (``A`` includes the column of ones when weight and bias are one block)."""
        return self._factors

    # ------------------------------------------------------------------ algebra
    def _eigh(self, factor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The eigendecomposition of a factor, once per factor (a weight and a separate bias block
        share their ``G``)."""
        if id(factor) not in self._eig_cache:
            self._eig_cache[id(factor)] = tuple(torch.linalg.eigh(factor))
        return self._eig_cache[id(factor)]

    def _eig(self, b: KroneckerBlock):
        """``(l_G, Q_G, l_A, Q_A)`` of a factor-form block."""
        lg, qg = self._eigh(b.left)
        la, qa = (None, None) if b.right is None else self._eigh(b.right)
        return lg, qg, la, qa

    def _eigen_grid(self, b: KroneckerBlock) -> torch.Tensor:
        """``[d_out, c]``: the block's eigenvalues ``l_G,i l_A,j`` (products of the factors')."""
        lg, _, la, _ = self._eig(b)
        return lg[:, None] if la is None else lg[:, None] * la[None, :]

    def trace(self) -> torch.Tensor:
        """``sum_blocks tr(G) tr(A)`` (``tr(A kron B) = tr(A) tr(B)``)."""
        total = torch.zeros((), dtype=self.dtype, device=self.device)
        for b in self.blocks():
            total = total + b.left.trace() * (1.0 if b.right is None else b.right.trace())
        return total

    def logdet(self, damping: float = 0.0) -> torch.Tensor:
        """``log det(K + damping I) = sum_blocks sum_ij log(l_ij + damping)`` over the eigenvalues of each
        block (:meth:`eigenvalues`); a ValueError when some ``l_ij + damping <= 0``."""
        damping = check_damping(damping, "exact", 0.0)
        total = torch.zeros((), dtype=self.dtype, device=self.device)
        for b in self.blocks():
            den = self._eigen_grid(b) + damping
            if singular(den):
                raise ValueError(
                    f"log det: block {b.name!r} has an eigenvalue <= -damping ({damping:g}) or at rounding "
                    "level, the matrix is singular there; pass damping > 0"
                )
            total = total + den.log().sum()
        return total

    def layer_eigenvalues(self, k: int | None = None) -> dict[str, torch.Tensor]:
        """``{block name: its eigenvalues, largest first}`` (top ``k``; ``None``: all), exact from the
        factors."""
        out = {}
        for b in self.blocks():
            ev = self._eigen_grid(b).reshape(-1).sort(descending=True).values
            out[b.name] = ev if k is None else ev[:k]
        return out

    def eigenvalues(self, k: int | None = None) -> torch.Tensor:
        """The eigenvalues of the whole block-diagonal matrix, largest first (top ``k``; ``None``: all):
        the union of the blocks' (a block-diagonal matrix's spectrum is its blocks')."""
        if k is not None and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be a positive int or None, got {k!r}")
        ev = torch.cat([self._eigen_grid(b).reshape(-1) for b in self.blocks()]).sort(descending=True).values
        return ev if k is None else ev[:k]

    def _inverse_block(
        self, b: KroneckerBlock, damping: float, heuristic: str, min_damping: float
    ) -> KroneckerBlock:
        return inverse_block(b, self._eig(b), damping, heuristic, min_damping)

    def inverse(
        self, damping: float, heuristic: str = "exact", min_damping: float = 1e-8
    ) -> KroneckerInverse:
        """The damped inverse as an operator (:mod:`landscape.curvature.kronecker`):

        * ``heuristic="exact"``: ``(K + damping I)^-1`` through the factors' eigendecompositions;
        * ``"pi"``: ``(G + sqrt(damping)/pi I)^-1 kron (A + pi sqrt(damping) I)^-1`` per block
          (Martens & Grosse 2015, Sec. 6.3; each factor damping at least ``min_damping``);
        * ``"factor"``: ``(G + damping I)^-1 kron (A + damping I)^-1`` (curvlinops' default).
        """
        damping = check_damping(damping, heuristic, min_damping)
        blocks = [self._inverse_block(b, damping, heuristic, min_damping) for b in self.blocks()]
        return KroneckerInverse(
            self, blocks, {"damping": damping, "heuristic": heuristic, "min_damping": min_damping}
        )

    def _extra_config(self) -> dict[str, Any]:
        return {
            "fisher_type": self.fisher_type,
            "kfac_approx": self.kfac_approx,
            "samples": self.samples,
            "seed": self.seed if self.fisher_type == "mc" else None,
            "likelihood": self.likelihood,
            "separate_bias": self.separate_bias,
            "terms_per_example": self._terms,
            "layers": [layer.name for layer in self._layers],
        }


class EKFACOperator(KFACOperator):
    """EKFAC: KFAC's eigenbasis ``Q_G kron Q_A`` with the diagonal refitted to the per-example
    gradients (module docstring; George et al. 2018, eq. 10); arguments as :class:`KFACOperator`.
    Needs outputs ``[B, C]`` (one loss term per example) and a forward without coupling between
    examples (e.g. BatchNorm in eval mode)."""

    name = "ekfac"
    _uses_per_example = True

    def _compute_factors(self):
        factors = super()._compute_factors()
        if self._terms != 1:
            raise ValueError(
                f"EKFAC needs one loss term per example (outputs [B, C]), got {self._terms} per example: "
                "its per-example gradients would mix terms; use ls.kfac(obj) for sequence outputs"
            )
        return factors

    def _make_blocks(self) -> list[KroneckerBlock]:
        kfac_blocks = super()._make_blocks()
        bases = {
            b.name: (torch.linalg.eigh(b.left)[1], None if b.right is None else torch.linalg.eigh(b.right)[1])
            for b in kfac_blocks
        }
        diag = self._refit(bases)
        return [
            KroneckerBlock(
                b.name,
                b.index,
                b.d_out,
                b.cols,
                q_left=bases[b.name][0],
                q_right=bases[b.name][1],
                diag=diag[b.name],
            )
            for b in kfac_blocks
        ]

    def _refit(self, bases: dict[str, tuple]) -> dict[str, torch.Tensor]:
        """``D = c sum_n sum_j (Q_G^T G_nj Q_A)^2`` per block, in a second pass over the data."""
        E: dict[str, torch.Tensor] = {}
        for k, _x, y, out, rec in self._batches_with_records():
            acts = {}
            for layer in self._layers:
                if layer.weight is not None:
                    acts[layer.name] = _example_inputs(layer, rec[layer.name][0], layer.joint)
            cols = self._columns(k, out, y)
            for gs in self._backward(out, rec, cols):
                for layer in self._layers:
                    g = gs[layer.name]
                    if g is None:
                        continue
                    g = _output_gradients(layer, g)  # [K, B, S, d_out]
                    for name, part in self._parts(layer):
                        qg, qa = bases[name]
                        part_e = _rotated_square_sum(
                            g @ qg, None if part == "bias" else acts[layer.name] @ qa
                        )
                        E[name] = part_e if name not in E else E[name].add_(part_e)
            del out, rec, cols, acts
        c = self._scale()
        out = {}
        for b_layer in self._layers:
            for name, part in self._parts(b_layer):
                cols = 1 if part == "bias" else b_layer.d_in + (part == "joint")
                e = E.get(name)
                if e is None:
                    e = torch.zeros(b_layer.d_out, cols, dtype=self.dtype, device=self.device)
                out[name] = self.objective.all_reduce(e) * c
        return out

    def _eigen_grid(self, b: KroneckerBlock) -> torch.Tensor:
        return b.diag

    def trace(self) -> torch.Tensor:
        """``sum`` of the refitted diagonal (the basis is orthonormal)."""
        return sum(
            (b.diag.sum() for b in self.blocks()), torch.zeros((), dtype=self.dtype, device=self.device)
        )

    def _inverse_block(
        self, b: KroneckerBlock, damping: float, heuristic: str, min_damping: float
    ) -> KroneckerBlock:
        if heuristic != "exact":
            raise ValueError(
                f"EKFAC's inverse is exact damping only (its diagonal is not a Kronecker product), got "
                f"heuristic={heuristic!r}; use heuristic='exact'"
            )
        den = b.diag + damping
        if singular(den):
            raise ValueError(
                f"block {b.name!r}: a refitted eigenvalue plus the damping is <= 0; pass damping > 0"
            )
        return KroneckerBlock(
            b.name, b.index, b.d_out, b.cols, q_left=b.q_left, q_right=b.q_right, diag=1.0 / den
        )


def _rotated_square_sum(gr: torch.Tensor, ar: torch.Tensor | None) -> torch.Tensor:
    """``sum_{j,n} (sum_s gr[j, n, s, :] ar[n, s, :]^T)^2`` (``[d_out, c]``; ``ar`` ``None``: a bias,
    ``[d_out, 1]``): the squared rotated per-example gradients, one vector ``j`` at a time."""
    if ar is None:
        return gr.sum(2).square().sum((0, 1))[:, None]
    if gr.shape[2] == 1:  # no weight sharing: (g a^T)^2 = g^2 (a^2)^T, summed over examples
        return torch.einsum("jno,nc->oc", gr[:, :, 0].square(), ar[:, 0].square())
    total = None
    for gj in gr:
        pe = gj.transpose(1, 2) @ ar  # [B, d_out, c]: the rotated per-example gradients
        part = pe.square_().sum(0)
        total = part if total is None else total.add_(part)
    return total


def kfac(
    objective: Objective,
    *,
    params: Any = None,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    samples: int = 1,
    seed: int = 0,
    separate_bias: bool = False,
    chunk_size: int | None = 16,
    max_memory: int | float | str | None = None,
) -> KFACOperator:
    """KFAC of the GGN (``fisher_type="type-2"``), the Monte-Carlo (``"mc"``) or the empirical Fisher
    (``"empirical"``) as an operator with its algebra (``inverse``, ``logdet``, ``trace``,
    ``eigenvalues``); see :class:`KFACOperator`."""
    return KFACOperator(
        objective,
        params,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        samples=samples,
        seed=seed,
        separate_bias=separate_bias,
        chunk_size=chunk_size,
        max_memory=max_memory,
    )


def ekfac(
    objective: Objective,
    *,
    params: Any = None,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    samples: int = 1,
    seed: int = 0,
    separate_bias: bool = False,
    chunk_size: int | None = 16,
    max_memory: int | float | str | None = None,
) -> EKFACOperator:
    """EKFAC (George et al. 2018): KFAC's eigenbasis with the diagonal refitted to the per-example
    gradients; arguments as :func:`kfac` (see :class:`EKFACOperator`)."""
    return EKFACOperator(
        objective,
        params,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        samples=samples,
        seed=seed,
        separate_bias=separate_bias,
        chunk_size=chunk_size,
        max_memory=max_memory,
    )
