"""Cross-check with curvlinops (installed by ``benchmarks/install_peers.sh``; the slow CI stage):
on every loss, reduction and output shape of ``tests/test_fisher_likelihoods.py`` our GGN and
curvlinops' agree to rounding, our ``per="loss_term"`` empirical Fisher equals curvlinops'
``EFLinearOperator``, and both Monte-Carlo Fishers (different label draws) lie within 8 % of the GGN
with 2,000 samples.  (curvlinops needs outputs of at least two dimensions: the ``[B]`` case is ours
alone.)"""

from __future__ import annotations

import pytest
import torch

import landscape as ls
from tests.test_fisher_likelihoods import CASES, _problem, _rel

cl = pytest.importorskip("curvlinops")

pytestmark = pytest.mark.slow


def _dense(op, p: int) -> torch.Tensor:
    return op @ torch.eye(p, dtype=torch.float64)


def _curvlinops(cls, model, loss, batches, **kw):
    params = [p for p in model.parameters() if p.requires_grad]
    return cls(model, loss, params, batches, check_deterministic=False, **kw)


@pytest.mark.parametrize(("kind", "reduction", "shape"), [c for c in CASES if c[2]], ids=str)
def test_ggn_empirical_and_mc_fisher_agree_with_curvlinops(kind, reduction, shape):
    model, loss, batches = _problem(kind, reduction, shape)
    obj = ls.Objective(model, loss, batches)
    p = obj.num_params
    G = _dense(_curvlinops(cl.GGNLinearOperator, model, loss, batches), p)
    assert _rel(ls.ggn(obj).to_dense(), G) < 1e-10
    ef = _dense(_curvlinops(cl.EFLinearOperator, model, loss, batches), p)
    assert _rel(ls.empirical_fisher(obj, per="loss_term").to_dense(), ef) < 1e-10
    theirs = _dense(_curvlinops(cl.FisherMCLinearOperator, model, loss, batches, mc_samples=2000, seed=1), p)
    ours = ls.fisher(obj, samples=2000, seed=1).to_dense()
    assert _rel(theirs, G) < 0.08 and _rel(ours, G) < 0.08, (_rel(theirs, G), _rel(ours, G))
