"""The cached Hessian graph of one batch as sub-graphs over its examples (``graph_chunks=`` of
:class:`~landscape.curvature.hessian.HessianOperator`).

A cached graph holds the forward activations and the first backward's tensors ``S`` between
products, and the second backward adds the adjoints of every forward activation at once (about
``0.6 S`` on ResNet-20): the peak is ``1.6 S``.  When the loss is a sum over examples that do not
interact, ``H = sum_c H_c`` over sub-batches ``c`` with weights ``w |c| / |B|`` (mean reduction) and
the graph can be kept as ``k`` sub-graphs: the same saved tensors, but a product's adjoints live for
one sub-graph at a time (peak ``S (1 + 0.6 / k)``), at the same arithmetic.  ``graph_chunks="auto"``
splits on CPU into sub-batches of at least ``GRAPH_CHUNK = 16`` examples (at most
``MAX_GRAPH_CHUNKS = 4``) when the first sub-graph's saved tensors (the weights among them) are at
least three times the parameters' bytes (otherwise the ``k`` held gradients would cost more than the
adjoints saved; the 1.9M-parameter MLP keeps one graph) and at least ``MIN_SUBGRAPH_BYTES = 1 MiB``
(a smaller working set fits the cache unsplit, and each sub-graph costs a backward pass of its own;
``benchmarks/bench_graph_chunks.py`` times both sides: split, the digits MLPs' products took longer
below that size, a small CNN's were faster above it), and only after checking that the example
losses add up: the weighted sub-batch losses must equal the batch loss to ``8 sqrt(n) eps``; a model
or loss that couples examples (train-mode BatchNorm, a class-weighted mean, a contrastive loss)
keeps one graph and ``graph_chunks_reason`` says why.  A random forward (even
``stochastic="fixed"``: its masks depend on the batch shape) is never split.  ResNet-20, 128
CIFAR-shaped images, CPU: peak memory of a product 609 -> 472 MB at 4 sub-graphs, and 0.85x the
time of one graph (smaller working sets); WRN-16-4 on 32 images: 446 -> 405 MB at 2.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from landscape.inputs import _map_inputs

GRAPH_CHUNK = 16  # "auto" graph splitting: examples per sub-graph, at least
MAX_GRAPH_CHUNKS = 4
MIN_SUBGRAPH_BYTES = 2**20  # "auto" graph splitting: saved bytes of the first sub-graph, at least


def split_graph(op: Any, b: Any) -> tuple[list, int, str | None]:
    """``(graphs, k, reason)``: the gradient graph of the batch ``b`` of the Hessian operator ``op``
    as ``k`` sub-graphs (``op._build_graph``), and why not more (``None``: as asked)."""
    x, y, w, bufs = b.x, b.y, b.w, b.bufs
    k, why = _chunks_wanted(op, int(y.shape[0]))
    if k == 1:
        return [op._build_graph(x, y, w, bufs)], 1, why
    parts = _sub_batches(op, x, y, w, k)
    records: list[dict] = [{} for _ in parts]
    param_bytes = sum(t.numel() * t.element_size() for t in op._theta.values())
    graphs: list = []
    fallback: str | None = None
    try:
        for part, rec in zip(parts, records):
            graphs.append(op._build_graph(*part, bufs, record=rec))
            if op.graph_chunks == "auto" and rec is records[0]:
                fallback = _too_small(rec["saved_bytes"], param_bytes)
                if fallback is not None:
                    break
    except Exception as err:  # noqa: BLE001 - e.g. an input that is not batch-first
        if op.graph_chunks != "auto":
            raise
        fallback = f"a sub-batch failed ({type(err).__name__}: {str(err)[:120]}): one graph"
    if fallback is None:
        fallback = _losses_disagree(op, b, k, [r["loss"] for r in records])
    if fallback is not None:
        graphs.clear()  # free the sub-graphs before the whole batch's graph is built
        return [op._build_graph(x, y, w, bufs)], 1, fallback
    return graphs, k, why


def _too_small(saved: int, param_bytes: int) -> str | None:
    """Why a first sub-graph that saves ``saved`` bytes is not worth splitting (``None``: it is)."""
    if saved < 3 * param_bytes:
        return (
            f"activations small against the parameters ({saved / 2**20:.1f} MB saved per sub-graph, "
            f"{param_bytes / 2**20:.1f} MB of parameters): one graph"
        )
    if saved < MIN_SUBGRAPH_BYTES:
        return (
            f"a sub-graph would save {saved / 2**20:.2f} MB, under {MIN_SUBGRAPH_BYTES / 2**20:g} MB: its "
            "working set fits the cache unsplit, and every sub-graph costs a backward pass: one graph"
        )
    return None


def _losses_disagree(op: Any, b: Any, k: int, losses: list[float]) -> str | None:
    """Why the weighted sub-batch ``losses`` do not add up to the batch loss (``None``: they do, to
    ``8 sqrt(n) eps``); an explicit ``graph_chunks`` raises instead."""
    with torch.no_grad():
        full = float(op.objective.batch_loss(op._full(op._theta), b.bufs, b.x, b.y, b.w))
    total = sum(losses)
    scale = max(abs(full), sum(abs(v) for v in losses))
    if abs(total - full) <= 8.0 * math.sqrt(int(b.y.shape[0])) * torch.finfo(op.dtype).eps * scale:
        return None
    msg = (
        f"the {k} sub-batch losses add up to {total:.9g}, the batch loss is {full:.9g}: the model or "
        "loss couples the examples of a batch (e.g. a class-weighted mean, a loss over pairs)"
    )
    if op.graph_chunks != "auto":
        raise ValueError(f"graph_chunks={op.graph_chunks}: {msg}; use graph_chunks=1")
    return msg + ": one graph"


def _chunks_wanted(op: Any, n: int) -> tuple[int, str | None]:
    """Number of sub-graphs to try for a batch of ``n`` examples, and why not more."""
    obj = op.objective
    if op.graph_chunks != "auto":
        k = min(int(op.graph_chunks), n)
    elif op.device.type != "cpu":
        return 1, "graph_chunks='auto' splits graphs on CPU only"
    else:
        k = min(MAX_GRAPH_CHUNKS, n // GRAPH_CHUNK)
        if k < 2:
            return 1, f"a batch of {n} examples (splitting needs {2 * GRAPH_CHUNK})"
    if k < 2:
        return 1, None
    coupled = None
    if obj.random_forward:
        coupled = "the forward draws random numbers (its masks depend on the batch shape)"
    elif obj.batch_coupled:
        coupled = f"BatchNorm layer(s) {obj.batch_coupled} use batch statistics (mode='train')"
    elif torch.finfo(op.dtype).bits < 32:
        coupled = f"{op.dtype} is too coarse to check that the example losses add up"
    if coupled is None:
        return k, None
    if op.graph_chunks != "auto":
        raise ValueError(f"graph_chunks={op.graph_chunks}: {coupled}; use graph_chunks=1")
    return 1, coupled + ": one graph"


def _sub_batches(op: Any, x: Any, y: torch.Tensor, w: float, k: int) -> list[tuple]:
    """``k`` contiguous sub-batches with weights ``w |c| / n`` (mean reduction) or ``w`` (sum)."""
    n = int(y.shape[0])
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    out, start = [], 0
    for size in sizes:
        sl = slice(start, start + size)
        wc = w * size / n if op.objective.reduction == "mean" else w
        out.append((_map_inputs(x, lambda t, sl=sl: t[sl]), y[sl], wc))
        start += size
    return out
