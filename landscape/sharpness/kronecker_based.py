"""Kronecker-factored sharpness: the trace and the largest eigenvalue of KFAC / EKFAC, exact from their
factors (no sampling, no Lanczos).

KFAC (Martens & Grosse 2015, "Optimizing neural networks with Kronecker-factored approximate
curvature", Sec. 3-5; Grosse & Martens 2016 for ``Conv2d``) approximates the GGN (type-2 Fisher) or
the empirical Fisher ``G`` in two steps:

1. **block-diagonal across layers**: the curvature between the parameters of two different layers
   is dropped, ``G ~ blockdiag_l(G_ll)``;
2. **Kronecker within a layer**: each block is replaced by ``G_l kron A_l``, the product of the
   second moment of the back-propagated output gradients and that of the layer inputs (their
   expectations are taken separately, Martens & Grosse 2015, eq. 2 -> 3).

Step 1 leaves the trace unchanged (the trace only sees the diagonal blocks), so the error of
:func:`kfac_trace` against ``Tr G`` is step 2's alone; for ``lambda_max`` step 1 gives
``max_l lambda_max(G_ll) <= lambda_max(G)`` (Cauchy interlacing), so :func:`kfac_lambda_max`
estimates a lower bound of the full matrix's top eigenvalue through an approximation of it.
EKFAC (George et al. 2018, eq. 10) refits the diagonal in KFAC's eigenbasis to the exact second
moments of the per-example gradients; since the basis is orthonormal, with ``fisher_type="type-2"``
its trace is the exact ``Tr G`` restricted to the selected layers (``tests/test_sharpness_kfac.py``
checks it against the dense GGN); its top eigenvalue is still an approximation. The measured errors
on three networks are in ``docs/methods/sharpness.md`` (``docs/make_kfac_error.py``).

Every measure costs one pass over the data for the factors (EKFAC: two), counted as ``gradient``
evaluations, and ``O(sum_l d_l^3)`` for the factors' eigendecompositions.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from landscape.curvature.kfac import EKFACOperator, KFACOperator
from landscape.sharpness.common import Ctx, check_choice, check_positive

__all__ = ["ekfac_lambda_max", "ekfac_trace", "kfac_lambda_max", "kfac_trace", "kronecker_params"]

#: fisher types a deterministic measure accepts ("mc" draws labels: it would need an error bar)
_FISHER_TYPES = ("type-2", "empirical")
_OTHER_PARAMS = ("error", "skip")


def kronecker_params(obj: Any) -> list[str]:
    """The selected parameters of ``obj`` that KFAC factorises: weights and biases of ``nn.Linear`` and
    ``nn.Conv2d`` layers (in ``obj.param_names`` order)."""
    names = []
    for n in obj.param_names:
        prefix, _, leaf = n.rpartition(".")
        module = obj.model.get_submodule(prefix)
        if isinstance(module, (nn.Linear, nn.Conv2d)) and leaf in ("weight", "bias"):
            names.append(n)
    return names


def _operator(
    ctx: Ctx, cls: type, fisher_type: str, kfac_approx: str, other_params: str, chunk_size: int | None
) -> tuple[KFACOperator, dict[str, Any]]:
    check_choice("fisher_type", fisher_type, _FISHER_TYPES)
    check_choice("kfac_approx", kfac_approx, ("expand", "reduce"))
    check_choice("other_params", other_params, _OTHER_PARAMS)
    if chunk_size is not None:
        check_positive("chunk_size", chunk_size, integer=True)
    obj = ctx.obj
    skipped: list[str] = []
    if other_params == "skip":
        keep = kronecker_params(obj)
        skipped = [n for n in obj.param_names if n not in keep]
        if not keep:
            raise ValueError(
                "KFAC: no selected parameter belongs to an nn.Linear or nn.Conv2d layer; select some "
                "with Objective(..., params=...) or use a measure of the whole Hessian (hessian_trace)"
            )
        if skipped:
            obj = obj.subset(keep)
    op = cls(obj, fisher_type=fisher_type, kfac_approx=kfac_approx, chunk_size=chunk_size)
    ctx.counts["gradient"] += 2 if cls is EKFACOperator else 1
    cfg = dict(
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        other_params=other_params,
        chunk_size=chunk_size,
        method=op.name,
    )
    info = {
        "num_params_factorised": obj.num_params,
        "skipped_params": skipped,
        "blocks": [b.name for b in op.blocks()],
    }
    return op, {"config": cfg, "info": info}


def _trace(ctx: Ctx, cls: type, **kw: Any) -> dict[str, Any]:
    op, meta = _operator(ctx, cls, **kw)
    per_block = {}
    for b in op.blocks():
        if cls is EKFACOperator:
            per_block[b.name] = float(b.diag.sum())
        else:
            per_block[b.name] = float(b.left.trace() * (1.0 if b.right is None else b.right.trace()))
    value = float(op.trace())
    extra = {
        **meta["info"],
        "trace_per_param": value / meta["info"]["num_params_factorised"],
        "block_traces": per_block,
    }
    return {"value": value, "stderr": None, "config": meta["config"], "extra": extra}


def _lambda_max(ctx: Ctx, cls: type, k: int, **kw: Any) -> dict[str, Any]:
    check_positive("k", k, integer=True)
    op, meta = _operator(ctx, cls, **kw)
    if k > op.shape[0]:
        raise ValueError(f"k = {k} exceeds the {op.shape[0]} factorised parameters; pass k <= {op.shape[0]}")
    top = op.eigenvalues(k)
    blocks = {name: float(ev[0]) for name, ev in op.layer_eigenvalues(1).items()}
    extra = {**meta["info"], "top": top.tolist(), "block_lambda_max": blocks}
    return {"value": float(top[0]), "stderr": None, "config": {**meta["config"], "k": k}, "extra": extra}


def kfac_trace(
    ctx: Ctx,
    *,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    other_params: str = "error",
    chunk_size: int | None = 16,
) -> dict[str, Any]:
    """``Tr K = sum_l tr(G_l) tr(A_l)`` of KFAC (module docstring; Martens & Grosse 2015, eq. 3 and
    ``tr(A kron B) = tr A tr B``), deterministic, from one pass over the data.

    Approximates ``Tr G`` of the GGN (``fisher_type="type-2"``) or of the empirical Fisher
    (``"empirical"``): exact across layers (the trace sees only the diagonal blocks), approximate
    within a layer (the Kronecker factorisation of each block's expectation). ``kfac_approx``:
    ``"expand"`` / ``"reduce"`` for weight sharing (:mod:`landscape.curvature.kfac`).
    ``other_params="error"`` refuses parameters outside ``nn.Linear`` / ``nn.Conv2d`` (BatchNorm,
    LayerNorm, embeddings) by name; ``"skip"`` measures the others only (``extra["skipped_params"]``).
    ``extra``: the per-block traces and ``trace_per_param``.
    """
    return _trace(
        ctx,
        KFACOperator,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        other_params=other_params,
        chunk_size=chunk_size,
    )


def kfac_lambda_max(
    ctx: Ctx,
    *,
    k: int = 1,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    other_params: str = "error",
    chunk_size: int | None = 16,
) -> dict[str, Any]:
    """Largest eigenvalue of KFAC, ``max_l lambda_max(G_l) lambda_max(A_l)`` (the spectrum of a
    Kronecker product is the products of its factors' eigenvalues, that of a block-diagonal matrix
    the union of its blocks'), exact from the factors.

    Approximates ``lambda_max(G)`` of the GGN / empirical Fisher through the block-diagonal
    approximation (whose top eigenvalue is a lower bound of ``lambda_max(G)``) and the Kronecker
    factorisation of each block (Martens & Grosse 2015, Sec. 3). ``k > 1``: the top ``k`` in
    ``extra["top"]``; ``extra["block_lambda_max"]`` per block. Other options as :func:`kfac_trace`.
    """
    return _lambda_max(
        ctx,
        KFACOperator,
        k,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        other_params=other_params,
        chunk_size=chunk_size,
    )


def ekfac_trace(
    ctx: Ctx,
    *,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    other_params: str = "error",
    chunk_size: int | None = 16,
) -> dict[str, Any]:
    """``Tr`` of EKFAC (George et al. 2018, eq. 10): the sum of the refitted diagonal, two passes over
    the data. The basis is orthonormal and the refit is the exact second moment of the per-example
    gradients in it, so this equals the exact ``Tr G`` of the selected ``Linear``/``Conv2d``
    parameters (type-2: the GGN; ``"empirical"``: the empirical Fisher) -- a deterministic
    alternative to Hutchinson; needs one loss term per example. Options as :func:`kfac_trace`."""
    return _trace(
        ctx,
        EKFACOperator,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        other_params=other_params,
        chunk_size=chunk_size,
    )


def ekfac_lambda_max(
    ctx: Ctx,
    *,
    k: int = 1,
    fisher_type: str = "type-2",
    kfac_approx: str = "expand",
    other_params: str = "error",
    chunk_size: int | None = 16,
) -> dict[str, Any]:
    """Largest eigenvalue of EKFAC, the largest refitted diagonal entry over the blocks (George et al.
    2018); approximates ``lambda_max(G)`` as :func:`kfac_lambda_max` does, with the diagonal refitted
    in KFAC's eigenbasis. Options as :func:`kfac_lambda_max`."""
    return _lambda_max(
        ctx,
        EKFACOperator,
        k,
        fisher_type=fisher_type,
        kfac_approx=kfac_approx,
        other_params=other_params,
        chunk_size=chunk_size,
    )
