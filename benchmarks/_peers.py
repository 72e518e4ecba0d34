"""The peers of the product benchmark, called the way their documentation shows, and the plain floor.

Every builder takes a :class:`benchmarks._models.Problem` and a flat probe ``v`` (parameters in
``model.parameters()`` order, the layout of every library here) and returns ``(product, info)``:
``product()`` computes one matrix-vector product and returns it flat.  Each library gets its own
deep copy of the model (PyHessian leaves a ``create_graph`` gradient in ``.grad``).

Scaling conventions (one batch of ``B`` examples, mean cross-entropy): PyHessian, curvlinops and
hessian-eigenthings all compute the curvature of the batch-mean loss, as ``landscape`` does, so the
products are compared as they come.  curvlinops' MC Fisher draws its labels with
``softmax(f).multinomial(S, replacement=True, generator)`` seeded with ``seed``, as
``landscape.fisher`` does: with the same seed both draw the same labels.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.func import functional_call, jvp, vjp

from benchmarks._models import Problem

Product = Callable[[], torch.Tensor]


def flat(ts) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def split(v: torch.Tensor, params) -> list[torch.Tensor]:
    out, off = [], 0
    for p in params:
        out.append(v[off : off + p.numel()].view_as(p))
        off += p.numel()
    return out


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


# ------------------------------------------------------------------------------------ anchor
def gradient(pr: Problem, v: torch.Tensor) -> tuple[Product, dict]:
    """One plain gradient: forward + ``torch.autograd.grad`` on the model (the time anchor)."""
    model = pr.model
    params = _params(model)

    def product() -> torch.Tensor:
        return flat(torch.autograd.grad(pr.loss_fn(model(pr.x), pr.y), params))

    return product, {}


# ------------------------------------------------------------------------------------ PyHessian
def pyhessian(pr: Problem, v: torch.Tensor) -> tuple[Product, dict]:
    """PyHessian's HVP as its power iteration calls it: ``hessian_vector_product(gradsH, params, v)``
    on the gradient graph built (``create_graph=True``) at construction."""
    from pyhessian import hessian
    from pyhessian.utils import hessian_vector_product

    model = copy.deepcopy(pr.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ph = hessian(model, pr.loss_fn, data=(pr.x, pr.y), cuda=pr.x.device.type == "cuda")
    vs = split(v, ph.params)

    def product() -> torch.Tensor:
        return flat(hessian_vector_product(ph.gradsH, ph.params, vs))

    return product, {"object": ph}


# ------------------------------------------------------------------------------------ curvlinops
def curvlinops_operator(kind: str, pr: Problem, model: torch.nn.Module | None = None, **kw: Any):
    import curvlinops as cl

    cls = {
        "hessian": cl.HessianLinearOperator,
        "ggn": cl.GGNLinearOperator,
        "ef": cl.EFLinearOperator,
        "mc": cl.FisherMCLinearOperator,
    }[kind]
    model = model if model is not None else copy.deepcopy(pr.model)
    # the determinism probe costs extra products at construction; the benchmark checks results itself
    return cls(model, pr.loss_fn, _params(model), [(pr.x, pr.y)], check_deterministic=False, **kw)


def curvlinops(kind: str, **kw: Any) -> Callable[[Problem, torch.Tensor], tuple[Product, dict]]:
    def build(pr: Problem, v: torch.Tensor) -> tuple[Product, dict]:
        op = curvlinops_operator(kind, pr, **kw)
        return (lambda: op @ v), {"object": op}

    return build


# ------------------------------------------------------------------------------------ eigenthings
def eigenthings_operator(kind: str, pr: Problem, model: torch.nn.Module | None = None):
    import hessian_eigenthings as he

    model = model if model is not None else copy.deepcopy(pr.model)
    data = [(pr.x, pr.y)]
    if kind == "hessian":
        return he.HessianOperator(model, data, he.supervised_loss(pr.loss_fn))
    if kind == "ggn":
        return he.GGNOperator(model, data, he.supervised_forward, he.supervised_loss_of_output(pr.loss_fn))
    return he.EmpiricalFisherOperator(model, data, he.supervised_per_sample_loss(pr.loss_fn))


def eigenthings(kind: str) -> Callable[[Problem, torch.Tensor], tuple[Product, dict]]:
    def build(pr: Problem, v: torch.Tensor) -> tuple[Product, dict]:
        op = eigenthings_operator(kind, pr)
        return (lambda: op.matvec(v)), {"object": op}

    return build


# ------------------------------------------------------------------------------------ the floor
def ggn_floor(pr: Problem, v: torch.Tensor) -> tuple[Product, dict]:
    """The plain GGN product: ``torch.func.jvp`` of the network, the closed-form cross-entropy
    output Hessian ``(diag(p) - p p^T) / B`` (Martens 2020, Sec. 9.2) and the ``vjp`` of the forward
    graph kept from construction -- nothing else (no checks, no bookkeeping)."""
    model = pr.model
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    theta = {n: p.detach() for n, p in model.named_parameters()}
    bufs = {n: b.detach() for n, b in model.named_buffers()}

    def f(sel):
        return functional_call(model, ({**theta, **sel}, bufs), (pr.x,))

    sel = {n: theta[n] for n in names}
    out, vjp_fn = vjp(f, sel)
    prob = torch.softmax(out.detach(), dim=1)
    scale = 1.0 / out.shape[0]
    tangent = dict(zip(names, split(v, [theta[n] for n in names])))

    def product() -> torch.Tensor:
        _, jv = jvp(f, (sel,), (tangent,))
        pu = prob * jv
        (g,) = vjp_fn(scale * (pu - prob * pu.sum(dim=1, keepdim=True)))
        return flat(g[n] for n in names)

    return product, {}


# ------------------------------------------------------------------------------------ spectra
class _Counter:
    """A flat matvec with a product counter (for the algorithms that take a plain function)."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.fn, self.matvecs = fn, 0

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        self.matvecs += 1 if v.ndim == 1 else v.shape[1]
        return self.fn(v)


def _chunked_curvlinops(op, chunk: int):
    """curvlinops' trace estimators multiply all probes in one ``A @ G`` (one vmapped product over
    every column: memory grows with the budget); this view multiplies ``chunk`` columns at a time
    and counts them."""
    from curvlinops._torch_base import PyTorchLinearOperator

    class Chunked(PyTorchLinearOperator):
        SELF_ADJOINT = True

        def __init__(self) -> None:
            super().__init__(op._in_shape, op._out_shape)
            self.matvecs = 0

        def _matmat(self, X):
            k = X[0].shape[-1]
            self.matvecs += k
            parts = [op._matmat([x[..., s : s + chunk] for x in X]) for s in range(0, k, chunk)]
            return [torch.cat([p[i] for p in parts], dim=-1) for i in range(len(X))]

        @property
        def device(self):
            return op.device

        @property
        def dtype(self):
            return op.dtype

    return Chunked()


def _topk_error(est, ref: torch.Tensor, k: int) -> float:
    """``max_i min_j |est_j - ref_i| / |ref_i|`` over the ``k`` reference eigenvalues of largest
    magnitude: is each of them found (eigenvalues of similar magnitude and opposite sign make an
    element-wise comparison of sorted lists meaningless)."""
    est = torch.as_tensor(est, dtype=torch.float64).reshape(-1).cpu()
    if est.numel() < k:
        return float("nan")
    ref = ref[:k].cpu()
    return float(((est[None, :] - ref[:, None]).abs().min(dim=1).values / ref.abs()).max())


def _eigsh(A_scipy, k: int, budget: int, seed: int):
    """scipy's ARPACK Lanczos (curvlinops' documented eigensolver) capped near ``budget`` products:
    a Krylov space of ``ncv = (budget + k) // 2`` and one implicit restart (about
    ``2 ncv - k`` products); the eigenvalues converged by then (possibly fewer than ``k``)."""
    import numpy as np
    from scipy.sparse.linalg import ArpackNoConvergence, eigsh

    n = A_scipy.shape[0]
    ncv = int(min(n - 1, max(k + 2, (budget + k) // 2)))
    v0 = np.random.default_rng(seed).standard_normal(n)
    try:
        return eigsh(A_scipy, k=k, which="LM", ncv=ncv, maxiter=1, v0=v0, return_eigenvectors=False)
    except ArpackNoConvergence as err:
        return err.eigenvalues


def spectra(
    pr: Problem,
    obj,
    *,
    budgets: dict[str, int],
    ref_matvecs: int,
    seed: int = 0,
    chunk: int = 8,
    exact_limit: int = 1000,
    progress: Callable[[str], None] = print,
) -> tuple[list[dict], dict]:
    """Top-1 / top-5 eigenvalues (largest magnitude) and the trace of the Hessian at equal matvec
    budgets, per library, against a long reference run of ``landscape.eigenvalues`` (thick-restart
    Lanczos) and ``landscape.trace`` (exact when ``p <= exact_limit``, else XTrace with ``ref_matvecs``,
    Hutch++ if XTrace breaks down)."""
    import time

    import hessian_eigenthings as he
    import scipy.sparse.linalg  # noqa: F401 - imported before timing
    from curvlinops import hutchinson_trace, hutchpp_trace, xtrace

    import landscape as ls

    p = obj.num_params
    dtype, dev = pr.x.dtype if pr.x.is_floating_point() else next(pr.model.parameters()).dtype, pr.x.device
    progress("  spectra: reference run")
    ours = ls.hessian(obj)
    t0 = time.perf_counter()
    ref = ls.eigenvalues(
        ours,
        k=5,
        which="largest_magnitude",
        tol=1e-9,
        max_matvecs=ref_matvecs,
        seed=seed + 100,
        return_vectors=False,
    )
    ref_vals = ref.values.to(torch.float64).cpu()
    ref_vals = ref_vals[torch.argsort(ref_vals.abs(), descending=True)]
    tr_method = "exact" if p <= exact_limit else "xtrace"
    try:
        if tr_method == "exact":
            ref_tr = ls.trace(ours, method="exact")
        else:
            ref_tr = ls.trace(ours, method="xtrace", rtol=0.0, max_matvecs=ref_matvecs, seed=seed + 100)
    except RuntimeError:  # XTrace's leave-one-out solve can break down on a low-rank operator
        tr_method = "hutchpp"
        ref_tr = ls.trace(ours, method="hutchpp", rtol=0.0, max_matvecs=ref_matvecs, seed=seed + 100)
    reference = {
        "eigenvalues": ref_vals.tolist(),
        "eigen_residuals": ref.residuals.tolist() if ref.residuals is not None else None,
        "eigen_converged": ref.converged,
        "eigen_matvecs": ref.matvecs,
        "trace": float(ref_tr.value),
        "trace_stderr": float(ref_tr.stderr),
        "trace_method": tr_method,
        "seconds": time.perf_counter() - t0,
    }
    ph_obj = pyhessian(pr, torch.zeros(p, dtype=dtype, device=dev))[1]["object"]
    he_op = eigenthings_operator("hessian", pr)
    cl_op = curvlinops_operator("hessian", pr)

    def he_counted():
        c = _Counter(he_op.matvec)
        return he.LambdaOperator(c, size=p, device=dev, dtype=he_op.dtype), c

    def with_dtype(fn):  # PyHessian draws its probes with torch.randn in the default dtype
        def run():
            old = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                return fn()
            finally:
                torch.set_default_dtype(old)

        return run

    rows: list[dict] = []

    def record(task, method, budget, fn, k=None):
        torch.manual_seed(seed)
        t = time.perf_counter()
        try:
            est, used = fn()
            err = None
        except Exception as e:  # noqa: BLE001 - a failing peer is a result, not a crash
            est, used, err = None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        secs = time.perf_counter() - t
        if est is None:
            rel = float("nan")
        elif k is not None:
            rel = _topk_error(est, ref_vals, k)
        else:
            rel = abs(float(est) - reference["trace"]) / abs(reference["trace"])
        est_list = torch.as_tensor(est, dtype=torch.float64).reshape(-1).tolist() if est is not None else None
        rows.append(
            {
                "task": task,
                "method": method,
                "budget": budget,
                "matvecs": used,
                "seconds": secs,
                "estimate": est_list,
                "rel_error": rel,
                "error": err,
            }
        )
        progress(f"  {task:16s} {method:40s} matvecs={used} rel_err={rel:.3g} ({secs:.1f}s)")

    for task, k in (("top-1 eigenvalue", 1), ("top-5 eigenvalues", 5)):
        M = budgets["eig1" if k == 1 else "eig5"]

        def ours_lanczos(k=k, M=M):
            r = ls.eigenvalues(
                ls.hessian(obj),
                k=k,
                which="largest_magnitude",
                tol=1e-12,
                max_matvecs=M,
                seed=seed,
                return_vectors=False,
            )
            return r.values, r.matvecs

        def ours_power(k=k, M=M):
            r = ls.power_iteration(
                ls.hessian(obj), k=k, tol=1e-12, max_matvecs=M, seed=seed, return_vectors=False
            )
            return r.values, r.matvecs

        def ph_power(k=k, M=M):
            vals, _ = ph_obj.eigenvalues(maxIter=M // k, tol=0.0, top_n=k)
            return vals, k * (M // k)

        def he_lanczos(k=k, M=M):
            op, c = he_counted()
            r = he.lanczos(op, k=k, max_iter=min(M, p - 1), which="LM", seed=seed)
            return r.eigenvalues, c.matvecs

        def he_power(k=k, M=M):
            op, c = he_counted()
            r = he.deflated_power_iteration(op, k=k, max_iter=M // k, tol=0.0, seed=seed)
            return r.eigenvalues, c.matvecs

        def cl_eigsh(k=k, M=M):
            A = _chunked_curvlinops(cl_op, chunk).to_scipy()
            c = _Counter(A.matvec)
            from scipy.sparse.linalg import LinearOperator

            vals = _eigsh(LinearOperator(A.shape, matvec=c, dtype=A.dtype), k, M, seed)
            if len(vals) < k:
                raise RuntimeError(
                    f"ARPACK converged {len(vals)} of {k} eigenvalues within {c.matvecs} matvecs"
                )
            return vals, c.matvecs

        record(task, "landscape eigenvalues (Lanczos)", M, ours_lanczos, k)
        record(task, "landscape power_iteration", M, ours_power, k)
        record(task, "pyhessian eigenvalues (power)", M, with_dtype(ph_power), k)
        record(task, "eigenthings lanczos", M, he_lanczos, k)
        record(task, "eigenthings deflated_power_iteration", M, he_power, k)
        record(task, "curvlinops + scipy eigsh (ARPACK)", M, cl_eigsh, k)

    M = budgets["trace"]
    for method in ("hutchinson", "hutchpp", "xtrace"):

        def ours_tr(method=method):
            r = ls.trace(ls.hessian(obj), method=method, rtol=0.0, max_matvecs=M, seed=seed)
            return r.value, r.matvecs

        record("trace", f"landscape trace ({method})", M, ours_tr)

    def ph_tr():
        # PyHessian stops when |mean - previous| / (previous + 1e-6) < tol: with a negative running
        # mean that ratio is negative, so it can stop after two probes even with tol=0
        vals = ph_obj.trace(maxIter=M, tol=0.0)
        return sum(vals) / len(vals), len(vals)

    record("trace", "pyhessian trace (Hutchinson)", M, with_dtype(ph_tr))

    def he_tr(method):
        op, c = he_counted()
        if method == "hutchinson":
            return he.hutchinson(op, num_samples=M, seed=seed).estimate, c.matvecs
        return he.hutch_plus_plus(op, num_matvecs=M, seed=seed).estimate, c.matvecs

    record("trace", "eigenthings hutchinson", M, lambda: he_tr("hutchinson"))
    record("trace", "eigenthings hutch++", M, lambda: he_tr("hutch++"))
    for name, fn in (
        ("hutchinson_trace", hutchinson_trace),
        ("hutchpp_trace", hutchpp_trace),
        ("xtrace", xtrace),
    ):

        def cl_tr(fn=fn, name=name):
            A = _chunked_curvlinops(cl_op, chunk)
            m = M - M % 3 if name == "hutchpp_trace" else M  # Hutch++ wants a multiple of 3
            m = m - m % 2 if name == "xtrace" else m  # XTrace wants an even number
            return float(fn(A, m)), A.matvecs

        record("trace", f"curvlinops {name}", M, cl_tr)
    for g in ph_obj.model.parameters() if hasattr(ph_obj, "model") else []:
        g.grad = None
    return rows, reference
