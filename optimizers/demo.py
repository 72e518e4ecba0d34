"""End-to-end demo: every method of the suite trains the same small MLP on scikit-learn digits.

``python -m optimizers.demo [--quick] [--methods sgd,sam,bsam,...] [--epochs E] [--seed S] [--out F]``

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, 10 classes), pixels scaled to [0, 1],
stratified 70/30 split with ``random_state=0``.  Out-of-distribution set: the test images with
their 64 pixels permuted by one fixed permutation (seed 0) -- same pixel statistics, no digit
shape.  Model: 64-64-10 tanh MLP (float32; with a dropout layer, p = 0.1, for MC-Dropout), the
same initialisation (``--seed``) for every method, mini-batches of 64 in a seeded order.

Each method's predictive distribution (its Bayesian model average where it has one: 32 posterior
samples for MFVI / VSAM / bSAM / VOGN / IVON / SGVB, 30 for SWAG and MC-Dropout, the stored
iterates for (F-)SGLD, 5 members for the ensembles, the probit GLM predictive for the Laplace
approximations) is scored by :func:`landscape.metrics.evaluate`: accuracy, NLL, ECE (20
equal-width bins), Brier score, AUROC of the maximum probability for telling right from wrong
predictions (misclassification) and test from OOD inputs.  Hyperparameters are ordinary choices for
this problem (listed in :func:`methods`), not tuned per method, except that VOGN (learning rate,
damping) and IVON (learning rate, initial Hessian) were given a few settings until they trained on
1257 examples.
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

import optimizers as O
from landscape import metrics
from landscape.io import atomic_write_json
from optimizers.bayes import (
    SWAG,
    DeepEnsemble,
    DiagLaplace,
    FlatSGLD,
    LastLayerLaplace,
    f_mc_dropout,
    f_swag,
    sam_factory,
    train_ensemble,
)
from optimizers.bayes.mc_dropout import mc_dropout_predict
from optimizers.bayes.sgvb import convert_to_bayesian, elbo_loss, sgvb_predict

__all__ = ["SUITE", "N_BINS", "load_data", "make_model", "ood_inputs", "methods", "train_one", "run_demo"]
__all__ += ["format_table", "main"]

N_BINS = 20  # ECE bins (landscape.metrics default)
OOD = "digits with pixels permuted (fixed permutation, seed 0)"


@dataclass
class Spec:
    """How a method is trained and how it predicts.

    ``build(model, n, steps_per_epoch, epochs)`` returns the optimizer (``kind="opt"`` / ``"vogn"``
    / ``"sgvb"`` / ``"flat_sgvb"`` / ``"dropout"``), the member optimizer factory (``"ensemble"``) or
    the optimizer of the network that is then Laplace-approximated (``"laplace_*"``).
    """

    build: Callable[..., Any]
    kind: str = "opt"
    predictive: str = "plain"
    create_graph: bool = False


def methods() -> dict[str, Spec]:
    """Every method of the demo, in table order."""

    sgd = dict(lr=0.1, momentum=0.9, weight_decay=5e-4)
    p = lambda m: m.parameters()  # noqa: E731
    half = lambda e: e // 2  # noqa: E731  SWAG / SGLD collect from the middle of training
    sgld = dict(seed=0)

    def swag(m, n, s, e, sam=False, diag=False):
        kw = dict(rank=20, collect="epoch", start_epoch=half(e), diag_only=diag, seed=0)
        if sam:
            return f_swag(p(m), rho=0.05, **kw, **sgd)
        return SWAG(torch.optim.SGD(p(m), **sgd), **kw)

    def sgld_opt(m, n, s, e, rho, **kw):
        return FlatSGLD(p(m), rho=rho, burn_in=s * half(e), collect_every=s, max_samples=e, **sgld, **kw)

    return {
        "sgd": Spec(lambda m, n, s, e: torch.optim.SGD(p(m), **sgd)),
        "adam": Spec(lambda m, n, s, e: torch.optim.Adam(p(m), lr=3e-3)),
        "sam": Spec(lambda m, n, s, e: O.SAM(p(m), torch.optim.SGD, rho=0.05, **sgd)),
        "asam": Spec(lambda m, n, s, e: O.ASAM(m.named_parameters(), torch.optim.SGD, rho=0.5, **sgd)),
        "fisher_sam": Spec(lambda m, n, s, e: O.FisherSAM(p(m), torch.optim.SGD, rho=0.1, eta=1.0, **sgd)),
        "random_sam": Spec(lambda m, n, s, e: O.RandomSAM(p(m), torch.optim.SGD, rho=0.05, seed=0, **sgd)),
        "mix_sam": Spec(lambda m, n, s, e: O.MixSAM(p(m), torch.optim.SGD, rho=0.05, seed=0, **sgd)),
        "vsam": Spec(
            lambda m, n, s, e: O.VariationalSAM(p(m), torch.optim.SGD, rho=0.05, num_data=n, seed=0, **sgd),
            predictive="posterior",
        ),
        "mfvi": Spec(lambda m, n, s, e: O.MFVI(p(m), lr=3e-3, num_data=n, seed=0), predictive="posterior"),
        "bsam": Spec(
            lambda m, n, s, e: O.BayesianSAM(p(m), lr=0.5, num_data=n, rho=0.01, prior_precision=1.0, seed=0),
            predictive="posterior",
        ),
        "vogn": Spec(
            lambda m, n, s, e: O.VOGN(p(m), lr=1e-3, num_data=n, prior_precision=1.0, damping=1e-2, seed=0),
            kind="vogn",
            predictive="posterior",
        ),
        "ivon": Spec(
            lambda m, n, s, e: O.IVON(p(m), lr=0.2, ess=n, hess_init=0.5, seed=0), predictive="posterior"
        ),
        "sgd_tracer": Spec(lambda m, n, s, e: O.SGDTracer(p(m), **sgd), create_graph=True),
        "adam_tracer": Spec(lambda m, n, s, e: O.AdamTracer(p(m), lr=3e-3), create_graph=True),
        "mc_dropout": Spec(lambda m, n, s, e: torch.optim.SGD(p(m), **sgd), kind="dropout"),
        "f_mc_dropout": Spec(lambda m, n, s, e: f_mc_dropout(p(m), rho=0.05, **sgd), kind="dropout"),
        "deep_ensemble": Spec(lambda m, n, s, e: lambda q: torch.optim.SGD(q, **sgd), kind="ensemble"),
        "f_deep_ensemble": Spec(lambda m, n, s, e: sam_factory(rho=0.05, **sgd), kind="ensemble"),
        "sgvb": Spec(lambda m, n, s, e: torch.optim.Adam(p(m), lr=3e-3), kind="sgvb"),
        "f_sgvb": Spec(
            lambda m, n, s, e: O.FlatSGVB(m, torch.optim.Adam, rho=0.05, num_data=n, lr=3e-3),
            kind="flat_sgvb",
        ),
        "sgvb_lrt": Spec(lambda m, n, s, e: torch.optim.Adam(p(m), lr=3e-3), kind="sgvb_lrt"),
        "f_sgvb_lrt": Spec(
            lambda m, n, s, e: O.FlatSGVB(m, torch.optim.Adam, rho=0.05, num_data=n, lr=3e-3),
            kind="flat_sgvb_lrt",
        ),
        "swag": Spec(lambda m, n, s, e: swag(m, n, s, e), predictive="swag"),
        "swag_diag": Spec(lambda m, n, s, e: swag(m, n, s, e, diag=True), predictive="swag"),
        "f_swag": Spec(lambda m, n, s, e: swag(m, n, s, e, sam=True), predictive="swag"),
        "f_swag_diag": Spec(lambda m, n, s, e: swag(m, n, s, e, sam=True, diag=True), predictive="swag"),
        "sgld": Spec(lambda m, n, s, e: sgld_opt(m, n, s, e, 0.0), predictive="sgld"),
        "f_sgld": Spec(lambda m, n, s, e: sgld_opt(m, n, s, e, 0.05), predictive="sgld"),
        "f_sgld_langevin": Spec(
            lambda m, n, s, e: sgld_opt(m, n, s, e, 0.05, lr=0.5, num_data=n), predictive="sgld"
        ),
        "laplace_diag": Spec(lambda m, n, s, e: torch.optim.SGD(p(m), **sgd), kind="laplace_diag"),
        "laplace_last_layer": Spec(lambda m, n, s, e: torch.optim.SGD(p(m), **sgd), kind="laplace_last"),
        "sam_laplace_last_layer": Spec(
            lambda m, n, s, e: O.SAM(p(m), torch.optim.SGD, rho=0.05, **sgd), kind="laplace_last"
        ),
    }


SUITE: tuple[str, ...] = tuple(methods())


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


def ood_inputs(x_test: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The OOD set: ``x_test`` with its pixels (columns) permuted by one fixed seeded permutation."""
    perm = torch.randperm(x_test.shape[1], generator=torch.Generator().manual_seed(seed))
    return x_test[:, perm]


def make_model(
    seed: int | None = 0, hidden: int = 64, dtype: torch.dtype = torch.float32, dropout: float = 0.0
) -> nn.Module:
    """64-``hidden``-10 tanh MLP (a dropout layer after the tanh if ``dropout > 0``); ``seed=None``
    draws the initialisation from torch's RNG as it is."""
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(64, hidden), nn.Tanh()]
    if dropout > 0:
        layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers, nn.Linear(hidden, 10)).to(dtype)


def _fit(name, spec, model, opt, data, epochs, seed, batch_size, progress) -> float:
    """The training loop shared by the single-network methods; returns the last mini-batch loss."""
    from tqdm.auto import tqdm

    Xtr, ytr = data
    n = len(ytr)
    gen = torch.Generator().manual_seed(seed)
    last = math.nan
    model.train()
    for _ in tqdm(range(epochs), desc=name, disable=not progress, leave=False):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            xb, yb = Xtr[idx], ytr[idx]

            def closure(xb=xb, yb=yb) -> torch.Tensor:
                if spec.kind == "vogn":  # per-example losses, no backward (VOGN's contract)
                    return F.cross_entropy(model(xb), yb, reduction="none")
                opt.zero_grad()
                out = model(xb)
                if spec.kind in ("sgvb", "sgvb_lrt"):
                    loss = elbo_loss(model, out, yb, n)
                else:  # FlatSGVB adds the KL itself
                    loss = F.cross_entropy(out, yb)
                loss.backward(create_graph=spec.create_graph)
                return loss

            loss = opt.step(closure)
            last = float(loss.detach().mean() if isinstance(loss, torch.Tensor) else loss)
        if hasattr(opt, "on_epoch_end"):  # SWAG (per-epoch collection), F-SGLD (lr schedule)
            opt.on_epoch_end()
    if spec.create_graph:  # drop any graph left in .grad
        for q in model.parameters():
            q.grad = None
    return last


def train_one(
    name: str,
    data: tuple[torch.Tensor, ...],
    epochs: int,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = False,
) -> dict[str, Any]:
    """Train a fresh model with method ``name``; return its test metrics, probabilities and timing.

    The row holds the :func:`landscape.metrics.evaluate` numbers (``n_bins=20``, with the OOD set),
    ``predictive`` (how the probabilities were formed), ``probs`` / ``probs_ood`` (the predictive
    probabilities on the test and OOD inputs), ``train_loss``, ``seconds``, ``epochs``, ``seed``.
    """

    suite = methods()
    if name not in suite:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(SUITE)}")
    spec = suite[name]
    Xtr, ytr, Xte, yte = data
    n = len(ytr)
    steps = math.ceil(n / batch_size)
    dt = Xtr.dtype
    model = make_model(seed, dtype=dt, dropout=0.1 if spec.kind == "dropout" else 0.0)
    if spec.kind.startswith(("sgvb", "flat_sgvb")):
        model = convert_to_bayesian(model, local_reparam=spec.kind.endswith("lrt"), seed=seed)
    t0 = time.perf_counter()
    last = math.nan
    if spec.kind == "ensemble":
        ens = DeepEnsemble(lambda: make_model(None, dtype=dt), num_members=5, seed=seed)
        hist = train_ensemble(ens, (Xtr, ytr), spec.build(None, n, steps, epochs), epochs,
                              batch_size=batch_size, seed=seed)  # fmt: skip
        last = float(hist["loss"][-1][-1])
    else:
        opt = spec.build(model, n, steps, epochs)
        last = _fit(name, spec, model, opt, (Xtr, ytr), epochs, seed, batch_size, progress)
    seconds = time.perf_counter() - t0
    model.eval()
    lap = None
    if spec.kind == "laplace_diag":
        lap = DiagLaplace(model, nn.CrossEntropyLoss(), (Xtr, ytr), chunk_size=256)
    elif spec.kind == "laplace_last":
        lap = LastLayerLaplace(model, nn.CrossEntropyLoss(), (Xtr, ytr))
    if lap is not None:
        lap.optimize_prior_precision()

    def predict(x: torch.Tensor) -> tuple[torch.Tensor, str]:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if spec.kind == "ensemble":
                return ens.predict(x), "ensemble-5"
            if spec.kind == "dropout":
                return mc_dropout_predict(model, x, samples=30, seed=seed), "MC-dropout-30"
            if spec.kind.startswith(("sgvb", "flat_sgvb")):
                return sgvb_predict(model, x, samples=32, seed=seed), "BMA-32"
            if lap is not None:
                return lap.predictive(x, link="probit"), f"Laplace-probit (delta={lap.prior_precision:.3g})"
            if spec.predictive == "posterior":
                return opt.bayesian_model_average(model, x, samples=32, generator=g), "BMA-32"
            if spec.predictive == "swag":
                return opt.bayesian_model_average(model, x, samples=30, generator=g), "SWAG-30"
            if spec.predictive == "sgld":
                return opt.bayesian_model_average(model, x), f"iterates-{len(opt.samples)}"
            return torch.softmax(model(x), dim=-1), "plain"

    probs, how = predict(Xte)
    probs_ood, _ = predict(ood_inputs(Xte))
    row: dict[str, Any] = {"method": name}
    row.update(metrics.evaluate(probs, yte, probs_ood=probs_ood, n_bins=N_BINS))
    row.update(predictive=how, train_loss=last, seconds=seconds, epochs=epochs, seed=seed, ood=OOD)
    row.update(probs=probs.detach(), probs_ood=probs_ood.detach())
    return row


def run_demo(
    names: Sequence[str] = SUITE, epochs: int = 20, seed: int = 0, progress: bool = False
) -> list[dict[str, Any]]:
    """Train with each method in ``names``; return one result row per method (see :func:`train_one`)."""
    unknown = [o for o in names if o not in SUITE]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(SUITE)}")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    data = load_data()
    return [train_one(o, data, epochs, seed=seed, progress=progress) for o in names]


COLUMNS = (
    ("accuracy", "acc"),
    ("nll", "NLL"),
    ("ece", "ECE"),
    ("brier", "Brier"),
    ("auroc_misclassification", "AUROC-mis"),
    ("auroc_ood_maxprob", "AUROC-OOD"),
)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: one line per method, the metrics of :data:`COLUMNS`, predictive, time."""
    head = (
        f"{'method':<23}" + "".join(f" {h:>9}" for _, h in COLUMNS) + f"  {'predictive':<34} {'time[s]':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        vals = "".join(f" {r[k]:9.4f}" for k, _ in COLUMNS)
        lines.append(f"{r['method']:<23}{vals}  {r['predictive']:<34} {r['seconds']:7.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optimizers.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 epochs (smoke test)")
    ap.add_argument(
        "--methods", "--optimizers", dest="methods", default=",".join(SUITE),
        help=f"comma-separated subset of {','.join(SUITE)}",
    )  # fmt: skip
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 20, 3 with --quick)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the results (without probabilities) as JSON")
    ap.add_argument("--progress", action="store_true", help="tqdm progress bars")
    args = ap.parse_args(argv)
    epochs = args.epochs if args.epochs is not None else (3 if args.quick else 20)
    names = [s.strip() for s in args.methods.split(",") if s.strip()]
    # tiny matmuls: more threads only add contention (this is the CLI, not a library call)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = run_demo(names, epochs=epochs, seed=args.seed, progress=args.progress)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
    print(f"digits, 64-64-10 tanh MLP, {epochs} epochs, seed {args.seed}; ECE with {N_BINS} bins; OOD: {OOD}")
    print(format_table(rows))
    if args.out:
        plain = [{k: v for k, v in r.items() if k not in ("probs", "probs_ood")} for r in rows]
        atomic_write_json(args.out, {"epochs": epochs, "seed": args.seed, "n_bins": N_BINS, "results": plain})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
