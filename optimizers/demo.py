"""End-to-end demo: every optimizer of the suite trains the same small MLP on scikit-learn digits.

``python -m optimizers.demo [--quick] [--optimizers sgd,sam,bsam,...] [--epochs E] [--seed S] [--out F]``

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, 10 classes), pixels scaled to [0, 1],
stratified 70/30 split with ``random_state=0``.  Model: 64-64-10 tanh MLP (float32), the same
initialisation (``--seed``) for every optimizer, mini-batches of 64 in a seeded order.  Reported per
optimizer: test accuracy, NLL and ECE (15 bins) of the predictive distribution -- the Bayesian
methods (MFVI, VariationalSAM, bSAM: 32 posterior samples; F-SWAG: 30 SWAG samples; F-SGLD: the
stored iterates) use their Bayesian model average, the others the plain softmax of the trained
network -- plus the wall time.  Hyperparameters are ordinary choices for this problem (listed in
``SUITE``), not tuned per method.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from landscape import metrics

__all__ = ["SUITE", "load_data", "make_model", "train_one", "run_demo", "format_table", "main"]


@dataclass
class Spec:
    build: Callable[[nn.Module, int, int], Any]  # (model, num_data, steps_per_epoch * epochs) -> optimizer
    predictive: str = "plain"  # plain | posterior | swag | sgld
    create_graph: bool = False


def _suite() -> dict[str, Spec]:
    import optimizers as O
    from optimizers.bayes import FlatSGLD, f_swag

    sgd = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
    p = lambda m: m.parameters()  # noqa: E731
    return {
        "sgd": Spec(lambda m, n, t: torch.optim.SGD(p(m), **sgd)),
        "adam": Spec(lambda m, n, t: torch.optim.Adam(p(m), lr=3e-3)),
        "sam": Spec(lambda m, n, t: O.SAM(p(m), torch.optim.SGD, rho=0.05, **sgd)),
        "asam": Spec(lambda m, n, t: O.ASAM(p(m), torch.optim.SGD, rho=0.5, **sgd)),
        "fisher_sam": Spec(lambda m, n, t: O.FisherSAM(p(m), torch.optim.SGD, rho=0.1, eta=1.0, **sgd)),
        "random_sam": Spec(lambda m, n, t: O.RandomSAM(p(m), torch.optim.SGD, rho=0.05, seed=0, **sgd)),
        "mix_sam": Spec(lambda m, n, t: O.MixSAM(p(m), torch.optim.SGD, rho=0.05, seed=0, **sgd)),
        "vsam": Spec(
            lambda m, n, t: O.VariationalSAM(p(m), torch.optim.SGD, rho=0.05, num_data=n, seed=0, **sgd),
            "posterior",
        ),
        "mfvi": Spec(lambda m, n, t: O.MFVI(p(m), lr=3e-3, num_data=n, init_std=1e-3, seed=0), "posterior"),
        "bsam": Spec(
            lambda m, n, t: O.BayesianSAM(p(m), lr=0.5, num_data=n, rho=0.01, prior_precision=1.0, seed=0),
            "posterior",
        ),
        "sgd_tracer": Spec(lambda m, n, t: O.SGDTracer(p(m), **sgd), create_graph=True),
        "adam_tracer": Spec(lambda m, n, t: O.AdamTracer(p(m), lr=3e-3), create_graph=True),
        "f_swag": Spec(
            lambda m, n, t: f_swag(
                p(m), rho=0.05, rank=10, start_step=t // 2, collect_every=5, seed=0, **sgd
            ),
            "swag",
        ),
        "f_swag_diag": Spec(
            lambda m, n, t: f_swag(
                p(m), rho=0.05, rank=10, start_step=t // 2, collect_every=5, diag_only=True, seed=0, **sgd
            ),
            "swag",
        ),
        "f_sgld": Spec(
            lambda m, n, t: FlatSGLD(
                p(m), lr=0.5, num_data=n, rho=0.05, burn_in=t // 2, collect_every=10, seed=0
            ),
            "sgld",
        ),
    }


SUITE: tuple[str, ...] = tuple(
    "sgd adam sam asam fisher_sam random_sam mix_sam vsam mfvi bsam sgd_tracer adam_tracer f_swag "
    "f_swag_diag f_sgld".split()
)


def load_data(
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits, pixels in [0, 1], stratified 70/30 split (``random_state=0``)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X / 16.0, y, test_size=0.3, random_state=0, stratify=y)
    t = lambda a, d: torch.as_tensor(a, dtype=d)  # noqa: E731
    return t(Xtr, dtype), t(ytr, torch.long), t(Xte, dtype), t(yte, torch.long)


def make_model(seed: int = 0, hidden: int = 64, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10)).to(dtype)


def train_one(
    name: str,
    data: tuple[torch.Tensor, ...],
    epochs: int,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = False,
) -> dict[str, Any]:
    """Train a fresh model with optimizer ``name``; return its test metrics and timing."""
    suite = _suite()
    if name not in suite:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(SUITE)}")
    spec = suite[name]
    Xtr, ytr, Xte, yte = data
    n = len(ytr)
    model = make_model(seed, dtype=Xtr.dtype)
    steps_per_epoch = math.ceil(n / batch_size)
    opt = spec.build(model, n, steps_per_epoch * epochs)
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    last_loss = float("nan")
    from tqdm.auto import tqdm

    for _ in tqdm(range(epochs), desc=name, disable=not progress, leave=False):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            xb, yb = Xtr[idx], ytr[idx]

            def closure(xb=xb, yb=yb) -> torch.Tensor:
                opt.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward(create_graph=spec.create_graph)
                return loss

            loss = opt.step(closure)
            last_loss = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
    seconds = time.perf_counter() - t0
    if spec.create_graph:  # drop any graph left in .grad
        for q in model.parameters():
            q.grad = None
    model.eval()
    with torch.no_grad():
        if spec.predictive == "posterior":
            probs = opt.bayesian_model_average(
                model, Xte, samples=32, generator=torch.Generator().manual_seed(seed)
            )
            how = "BMA-32"
        elif spec.predictive == "swag":
            probs = opt.bayesian_model_average(
                model, Xte, samples=30, generator=torch.Generator().manual_seed(seed)
            )
            how = "SWAG-30"
        elif spec.predictive == "sgld":
            probs = opt.bayesian_model_average(model, Xte)
            how = f"iterates-{len(opt.samples)}"
        else:
            probs = torch.softmax(model(Xte), dim=-1)
            how = "plain"
    return dict(
        optimizer=name,
        accuracy=metrics.accuracy(probs, yte),
        nll=metrics.nll(probs, yte),
        ece=metrics.ece(probs, yte, n_bins=15),
        predictive=how,
        train_loss=last_loss,
        seconds=seconds,
        epochs=epochs,
        seed=seed,
    )


def run_demo(
    optimizers: Sequence[str] = SUITE, epochs: int = 20, seed: int = 0, progress: bool = False
) -> list[dict[str, Any]]:
    """Train with each optimizer in ``optimizers``; return one result dict per optimizer."""
    unknown = [o for o in optimizers if o not in SUITE]
    if unknown:
        raise ValueError(f"unknown optimizer(s) {unknown}; choose from {', '.join(SUITE)}")
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    data = load_data()
    return [train_one(o, data, epochs, seed=seed, progress=progress) for o in optimizers]


def format_table(rows: list[dict[str, Any]]) -> str:
    head = f"{'optimizer':<12} {'acc':>6} {'NLL':>7} {'ECE':>7} {'predictive':<13} {'time[s]':>7}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['optimizer']:<12} {r['accuracy']:6.4f} {r['nll']:7.4f} {r['ece']:7.4f} "
            f"{r['predictive']:<13} {r['seconds']:7.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optimizers.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 epochs (smoke test)")
    ap.add_argument(
        "--optimizers", default=",".join(SUITE), help=f"comma-separated subset of {','.join(SUITE)}"
    )
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 20, 3 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results as JSON to this file")
    ap.add_argument("--progress", action="store_true", help="tqdm progress bars")
    args = ap.parse_args(argv)
    # tiny matmuls: more threads only add contention (this is the CLI, not a library call)
    epochs = args.epochs if args.epochs is not None else (3 if args.quick else 20)
    names = [s.strip() for s in args.optimizers.split(",") if s.strip()]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = run_demo(names, epochs=epochs, seed=args.seed, progress=args.progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
    print(f"digits, 64-64-10 tanh MLP, {epochs} epochs, seed {args.seed}")
    print(format_table(rows))
    if args.out:
        from landscape.io import atomic_write_json

        atomic_write_json(args.out, {"epochs": epochs, "seed": args.seed, "results": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
