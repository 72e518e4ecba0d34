"""The Fisher of the loss's own likelihood (issue 23): ``E[F] = G`` for every supported loss,
reduction and output shape, and the empirical Fisher's two conventions against dense references.

References are independent of the library: the dense GGN ``sum_b w_b J_b^T H_out,b J_b`` with the
output Hessian of the loss by ``torch.func.hessian`` (``tests/references.py``), and empirical
Fishers from per-example / per-term parameter gradients by ``torch.func.grad``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import landscape as ls
from landscape.curvature import likelihoods
from tests import references as ref

DT = torch.float64


class _Head(nn.Module):
    """A small MLP whose output is reshaped to ``[B, *shape]`` (sequence outputs when ``shape`` has
    more than one entry)."""

    def __init__(self, d: int, shape: tuple[int, ...], seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.l1 = nn.Linear(d, 5).to(DT)
        self.l2 = nn.Linear(5, math.prod(shape)).to(DT)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=DT) * 0.7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(x))).reshape(x.shape[0], *self.shape)


def _targets(kind: str, shape: tuple[int, ...], n: int, g: torch.Generator) -> torch.Tensor:
    if kind == "ce":
        return torch.randint(0, shape[0], (n, *shape[1:]), generator=g)
    if kind == "bce":
        return torch.randint(0, 2, (n, *shape), generator=g).to(DT)
    return torch.randn((n, *shape), generator=g, dtype=DT)


LOSSES = {"ce": nn.CrossEntropyLoss, "mse": nn.MSELoss, "bce": nn.BCEWithLogitsLoss}
CASES = [
    # (loss, reduction, output shape per example)
    ("ce", "mean", (4,)),
    ("ce", "sum", (4,)),
    ("ce", "mean", (3, 5)),  # (N, C, L) sequence outputs
    ("ce", "sum", (3, 2, 2)),
    ("mse", "mean", (3,)),
    ("mse", "sum", (3,)),
    ("mse", "mean", (2, 5)),
    ("mse", "mean", ()),
    ("bce", "mean", (2,)),
    ("bce", "sum", (2,)),
    ("bce", "mean", (2, 3)),
]


def _problem(kind: str, reduction: str, shape: tuple[int, ...], n: int = 10, d: int = 3):
    g = torch.Generator().manual_seed(1)
    model = _Head(d, shape)
    x = torch.randn(n, d, generator=g, dtype=DT)
    y = _targets(kind, shape, n, g)
    loss = LOSSES[kind](reduction=reduction)
    batches = [(x[:6], y[:6]), (x[6:], y[6:])]  # two uneven batches
    return model, loss, batches


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(("kind", "reduction", "shape"), CASES, ids=lambda v: str(v))
def test_mc_fisher_expectation_is_the_ggn(kind, reduction, shape):
    """3,000 label draws per example: the dense Monte-Carlo Fisher is within 8 % of the dense GGN
    (relative Frobenius error); before issue 23 MSE mean with C = 3 gave 0.67 G, BCE with two outputs
    0.5 G and sequence outputs down to 1/1089 G or an error."""
    model, loss, batches = _problem(kind, reduction, shape)
    G = ref.dense_ggn(model, loss, batches, reduction=reduction)
    obj = ls.Objective(model, loss, batches)
    F = ls.fisher(obj, samples=3000, seed=0).to_dense()
    assert _rel(F, G) < 0.08, _rel(F, G)
    # not a lucky scale: the trace ratio is 1 within the Monte-Carlo error
    assert abs(float(F.trace() / G.trace()) - 1) < 0.05


@pytest.mark.parametrize(("kind", "reduction", "shape"), [CASES[2], CASES[6], CASES[9]], ids=str)
def test_mc_fisher_per_example_method_equals_output_space(kind, reduction, shape):
    """The two methods draw the same labels and must give the same matrix (rounding only)."""
    model, loss, batches = _problem(kind, reduction, shape)
    obj = ls.Objective(model, loss, batches)
    a = ls.fisher(obj, samples=7, seed=3).to_dense()
    b = ls.fisher(obj, samples=7, seed=3, method="per_example").to_dense()
    assert _rel(b, a) < 1e-12


def test_mc_fisher_exact_expectation_for_sequence_cross_entropy():
    """Cross-entropy on (N, C, L): the expectation over the labels, summed exactly over all C^L label
    sequences of each example (probability-weighted outer products of the per-example gradients of
    the summed loss), equals the GGN to rounding."""
    model, loss, batches = _problem("ce", "mean", (3, 2))
    G = ref.dense_ggn(model, loss, batches, reduction="mean")
    x = torch.cat([b[0] for b in batches])
    n, (C, L) = len(x), (3, 2)
    with torch.no_grad():
        p = torch.softmax(model(x), dim=1)  # [n, C, L]
    exact = torch.zeros_like(G)
    for labels in torch.cartesian_prod(*[torch.arange(C)] * L):
        y = labels.expand(n, L)
        gs = ref.per_example_gradients(model, nn.CrossEntropyLoss(reduction="sum"), [(x, y)])
        w = p.gather(1, y.unsqueeze(1)).squeeze(1).prod(dim=1)  # P(labels | x_n)
        exact += (gs * w[:, None]).T @ gs
    exact /= n * L  # a = 1 / (N m), m = L positions per example
    assert _rel(exact, G) < 1e-10


def test_gaussian_likelihood_has_the_mse_variance():
    out = torch.zeros(20000, 1, dtype=DT)
    t = likelihoods.sample_targets(out, "gaussian", 1, torch.Generator().manual_seed(0))
    assert abs(float(t.var()) - 0.5) < 0.02  # (f - y)^2 = -log N(y | f, 1/2) + const
    u = likelihoods.nll_output_gradients(out, t, "gaussian")
    assert abs(float((u**2).mean()) - 2.0) < 0.08  # E[u^2] = d^2 (f - y)^2 / df^2 = 2


def test_likelihood_errors_name_the_fix():
    model, _, batches = _problem("ce", "mean", (4,))
    with pytest.raises(ValueError, match="pos_weight"):
        ls.fisher(ls.Objective(model, nn.BCEWithLogitsLoss(pos_weight=torch.ones(4, dtype=DT)),
                               [(b[0], torch.zeros(len(b[0]), 4, dtype=DT)) for b in batches]))  # fmt: skip
    with pytest.raises(ValueError, match="likelihood must be one of"):
        ls.fisher(ls.Objective(model, nn.CrossEntropyLoss(), batches), likelihood="poisson")
    with pytest.raises(ValueError, match="class dimension"):
        likelihoods.terms_per_example("categorical", ())


# ---- empirical Fisher: the two conventions ------------------------------------------------------


def _term_gradients(model, kind, batches) -> torch.Tensor:
    """``[N * L, p]``: gradients of the sum-reduced loss of each loss term, the terms being the
    positions between the batch dimension and the class dimension 1 (cross-entropy) or the last
    dimension (MSE, BCE)."""
    names = ref.param_names(model)
    theta0 = ref.flatten_params(model, names)
    F = nn.functional
    rows = []
    for x, y in batches:
        for i in range(len(x)):

            def terms(theta, i=i, x=x, y=y):
                out = torch.func.functional_call(model, ref._unflatten(model, names, theta), (x[i : i + 1],))
                if kind == "ce":  # [1, C, *extra] -> [L, C], labels [L]
                    o = out.movedim(1, -1).reshape(-1, out.shape[1])
                    return F.cross_entropy(o, y[i].reshape(-1), reduction="none")
                C = out.shape[-1] if out.ndim > 1 else 1
                o, t = out.reshape(-1, C), y[i : i + 1].reshape(-1, C)
                fn = F.mse_loss if kind == "mse" else F.binary_cross_entropy_with_logits
                return fn(o, t, reduction="none").sum(dim=1)

            rows.append(torch.func.jacrev(terms)(theta0))
    return torch.cat(rows)


@pytest.mark.parametrize(("kind", "reduction", "shape"), CASES, ids=str)
def test_empirical_fisher_conventions_against_dense_references(kind, reduction, shape):
    model, loss, batches = _problem(kind, reduction, shape)
    obj = ls.Objective(model, loss, batches)
    n = sum(len(b[0]) for b in batches)
    # per example (Kunstner et al.): gradient of the loss of example n alone, c = 1/N or 1
    want = ref.dense_empirical_fisher(model, loss, batches, reduction=reduction)
    assert _rel(ls.empirical_fisher(obj).to_dense(), want) < 1e-10
    # per loss term (curvlinops' EFLinearOperator): sum-reduced gradient per term, 1/R with R = N m
    G = _term_gradients(model, kind, batches)
    m = likelihoods.terms_per_example("categorical" if kind == "ce" else "gaussian", shape)
    c = 1.0 / (n * m) if reduction == "mean" else 1.0
    got = ls.empirical_fisher(obj, per="loss_term").to_dense()
    assert _rel(got, c * G.T @ G) < 1e-10
    if len(shape) == 1 and kind != "ce" and reduction == "mean":  # [B, C] MSE/BCE: a factor C apart
        assert _rel(got, shape[0] * want) < 1e-10


def test_empirical_fisher_loss_term_refusals():
    model, loss, batches = _problem("ce", "mean", (4,))
    obj = ls.Objective(model, loss, batches)
    with pytest.raises(ValueError, match="per='loss_term' needs method='output_space'"):
        ls.empirical_fisher(obj, per="loss_term", method="per_example")
    with pytest.raises(ValueError, match="per must be one of"):
        ls.empirical_fisher(obj, per="output")
    data = [(b[0], torch.zeros(len(b[0]), 4, dtype=DT)) for b in batches]
    huber = ls.Objective(model, nn.HuberLoss(), data)
    with pytest.raises(ValueError, match="use per='example'"):
        ls.empirical_fisher(huber, per="loss_term")


def test_mc_fisher_trace_measure_is_unbiased_for_the_ggn_trace():
    """``sharpness(..., "fisher_trace", kind="mc")``: mean over draws within 3 stderr of ``Tr G``."""
    model, loss, batches = _problem("mse", "mean", (2, 3))
    G = ref.dense_ggn(model, loss, batches, reduction="mean")
    obj = ls.Objective(model, loss, batches)
    res = ls.sharpness(obj, "fisher_trace", kind="mc", samples=400, seed=0)
    trace = float(G.trace())
    assert abs(res.value - trace) < 3 * res.stderr + 1e-12, (res.value, trace, res.stderr)
    assert res.stderr < 0.05 * float(G.trace())
