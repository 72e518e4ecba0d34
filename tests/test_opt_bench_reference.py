"""The benchmark's anchor (``ReferenceSAM`` in benchmarks/bench_optimizers.py) computes the same
updates as ``optimizers.SAM`` and as a hand-computed SAM step, so the timing comparison is like for like."""

from __future__ import annotations

import copy

import torch
from torch.nn import functional as F

from benchmarks.bench_optimizers import ReferenceSAM
from optimizers import SAM
from tests.references import make_classification_data, make_mlp


def test_reference_sam_matches_sam_and_hand_step():
    model = make_mlp((4, 6, 3), seed=0)
    x, y = make_classification_data(n=12, seed=0)
    kw = dict(lr=0.1, momentum=0.9, weight_decay=1e-3)
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    oa = ReferenceSAM(a.parameters(), torch.optim.SGD, rho=0.05, **kw)
    ob = SAM(b.parameters(), torch.optim.SGD, rho=0.05, **kw)
    for mod, opt in ((a, oa), (b, ob)):
        for _ in range(3):

            def closure(mod=mod, opt=opt):
                opt.zero_grad()
                loss = F.cross_entropy(mod(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    # one hand-computed step (plain SGD, no momentum) from the initial weights as an absolute anchor
    c = copy.deepcopy(model)
    oc = ReferenceSAM(c.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    params = list(c.parameters())
    g = torch.autograd.grad(F.cross_entropy(c(x), y), params)
    gn = torch.sqrt(sum((t * t).sum() for t in g)) + 1e-12
    shifted = copy.deepcopy(c)
    with torch.no_grad():
        for p, t in zip(shifted.parameters(), g):
            p.add_(0.05 * t / gn)
    ge = torch.autograd.grad(F.cross_entropy(shifted(x), y), list(shifted.parameters()))
    expected = torch.cat([(p.detach() - 0.1 * t).reshape(-1) for p, t in zip(params, ge)])

    def closure_c():
        oc.zero_grad()
        loss = F.cross_entropy(c(x), y)
        loss.backward()
        return loss

    oc.step(closure_c)
    torch.testing.assert_close(flat(c), expected, rtol=1e-10, atol=1e-12)
    # ReferenceSAM restores by subtraction (not bit exact): close, not equal
    torch.testing.assert_close(flat(a), flat(b), rtol=1e-10, atol=1e-12)
