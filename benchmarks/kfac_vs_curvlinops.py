"""KFAC factors and inverse products: ``ls.kfac`` vs curvlinops 3.0.1's ``KFACLinearOperator``.

ResNet-20 (CIFAR-shaped, one batch) and the 2-layer transformer of ``benchmarks/_models.py`` (one
batch of token sequences), float32, mean cross-entropy, eval mode.  Both libraries get the same
parameters: every ``Conv2d``/``Linear`` weight and bias the forward calls as a module (BatchNorm,
LayerNorm, embeddings and the attention projections, which ``nn.MultiheadAttention`` applies with
``F.linear``, are left out), weight and bias as separate blocks (curvlinops' default).  Timed: the
minimum of ``--repeat`` runs after one untimed run, ours and curvlinops' alternately (on a shared
machine the minimum and the alternation keep other load out of the ratios):

* ``factors_s``: computing the Kronecker factors (``ls.kfac(obj)``; curvlinops'
  ``compute_kronecker_factors()``), for ``--fisher-types`` (default type-2 and mc with one draw);
* ``inverse_setup_s``: exact damping (``inverse(1e-3)`` / ``KFACInverseLinearOperator(...,
  use_exact_damping=True)``) up to and including its first product (the eigendecompositions);
* ``inverse_product_s``: one more inverse-vector product.

``ratio`` columns divide ours by curvlinops' of the same model and type (the issue's target:
factors at most 1.0x on CPU).  ``max_rel_diff`` checks both compute the same matrix: the relative
difference of the two KFAC products on a random vector (type-2 only: the mc draws differ).

    python benchmarks/kfac_vs_curvlinops.py [--quick] [--threads 1] [--batch-size 64]
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import landscape as ls  # noqa: E402
from benchmarks._models import make_problem  # noqa: E402
from benchmarks._runner import base_argparser, report  # noqa: E402


def _called_layers(model: nn.Module, x: torch.Tensor) -> list[str]:
    """Names of the ``Linear``/``Conv2d`` modules the forward calls (as modules)."""
    called = []
    hooks = [
        m.register_forward_hook(lambda mod, i, o, n=n: called.append(n))
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv2d))
    ]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return list(dict.fromkeys(called))


def _timed(ours, theirs, repeat: int) -> tuple[float, float, object, object]:
    """Minimum wall times of ``ours()`` and ``theirs()``, run alternately ``repeat`` times after one
    untimed run each (alternation and the minimum: the machine's other load falls on both), and
    their last results."""
    out_o, out_t = ours(), theirs()
    t_o, t_t = [], []
    for _ in range(repeat):
        for fn, times in ((ours, t_o), (theirs, t_t)):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
            out_o, out_t = (out, out_t) if fn is ours else (out_o, out)
    return min(t_o), min(t_t), out_o, out_t


def _rows(name: str, args) -> list[dict]:
    import curvlinops as cl

    prob = make_problem(name, quick=args.quick, batch_size=args.batch_size)
    layers = _called_layers(prob.model, prob.x)
    keep = tuple(f"{n}." for n in layers)
    names = [n for n, _ in prob.model.named_parameters() if n.startswith(keep)]
    data = [(prob.x, prob.y)]
    obj = ls.Objective(prob.model, prob.loss_fn, data, params=names)
    theirs_model = copy.deepcopy(prob.model)
    pdict = dict(theirs_model.named_parameters())
    params = [pdict[n] for n in names]
    v = torch.randn(obj.num_params, generator=torch.Generator().manual_seed(0))
    rows = []
    for ft in args.fisher_types:

        def ours(ft=ft):
            return ls.kfac(obj, fisher_type=ft, separate_bias=True)

        def theirs(ft=ft):
            op = cl.KFACLinearOperator(
                theirs_model, prob.loss_fn, params, data, check_deterministic=False, fisher_type=ft,
                separate_weight_and_bias=True, num_data=len(prob.y),
            )  # fmt: skip
            op.compute_kronecker_factors()
            return op

        t_ours, t_theirs, op, top = _timed(ours, theirs, args.repeat)
        diff = float((op @ v - top @ v).norm() / (top @ v).norm()) if ft == "type-2" else None

        def inv_ours(op=op):
            op._eig_cache.clear()  # the factors' eigendecompositions are timed, as curvlinops'
            inv = op.inverse(1e-3)
            return inv, inv @ v

        def inv_theirs(top=top):
            inv = cl.KFACInverseLinearOperator(top, damping=1e-3, use_exact_damping=True)
            return inv, inv @ v

        ti_ours, ti_theirs, (inv_o, _), (inv_t, _) = _timed(inv_ours, inv_theirs, args.repeat)
        tp_ours, tp_theirs, _, _ = _timed(
            lambda inv_o=inv_o: inv_o @ v, lambda inv_t=inv_t: inv_t @ v, args.repeat
        )
        common = {"model": name, "fisher_type": ft, "params": obj.num_params, "layers": len(layers)}
        rows.append(
            {
                **common,
                "library": "landscape",
                "factors_s": t_ours,
                "inverse_setup_s": ti_ours,
                "inverse_product_s": tp_ours,
                "factors_ratio": t_ours / t_theirs,
                "inverse_setup_ratio": ti_ours / ti_theirs,
                "inverse_product_ratio": tp_ours / tp_theirs,
                "max_rel_diff": diff,
            }
        )
        rows.append(
            {
                **common,
                "library": "curvlinops",
                "factors_s": t_theirs,
                "inverse_setup_s": ti_theirs,
                "inverse_product_s": tp_theirs,
            }
        )
        print(rows[-2])
    return rows


def main() -> None:
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=None, help="default: 128 (ResNet-20), 64 (transformer)")
    ap.add_argument("--models", default="resnet20,transformer")
    ap.add_argument("--fisher-types", default="type-2,mc")
    args = ap.parse_args()
    args.fisher_types = args.fisher_types.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        rows += _rows(name, args)
    cols = ["model", "fisher_type", "library", "params", "factors_s", "factors_ratio", "inverse_setup_s",
            "inverse_setup_ratio", "inverse_product_s", "inverse_product_ratio", "max_rel_diff"]  # fmt: skip
    config = {k: v for k, v in vars(args).items() if k != "out"}
    report(
        "kfac_cpu_quick" if args.quick else "kfac_cpu", rows, config=config, columns=cols, out_dir=args.out
    )


if __name__ == "__main__":
    main()
