"""The error of the KFAC sharpness measures against the exact GGN trace and lambda_max, three networks.

    python docs/make_kfac_error.py [--out docs/figures/kfac_error.json] [--quick]   # ~2 min, 2 cores

Networks on the 8x8 scikit-learn digits (``landscape.data.load_digits``; 1,438 training images),
each at its seeded initialisation and after a short training (``--epochs`` of SGD with momentum,
batch 64): a tanh MLP 64-32-10, LeNet-5 (``lenet5-digits``) and a small ResNet (``resnet`` of the
zoo: width 8, one block per stage, BatchNorm in eval mode; its BatchNorm parameters have no
Kronecker form and are left out of every quantity here).  All curvature in float64 on the first
``--examples`` training images, mean cross-entropy.

* Exact ``Tr G``: ``(1/N) sum_n ||S_n^T J_n||_F^2`` from the per-example Jacobians ``J_n`` of the
  logits (``torch.func.jacrev``) and the square root ``S_n = diag(sqrt p) - p sqrt(p)^T`` of the
  softmax cross-entropy's output Hessian -- no sampling, no library curvature code.
* Exact ``lambda_max(G)``: ``eigvalsh`` of the dense ``G = (1/N) sum_n J_n^T H_n J_n`` when the
  network has at most ``--dense-max`` parameters; else Lanczos on ``ls.ggn`` (``ls.eigenvalues``),
  whose residual ``||G v - lambda v||`` bounds the distance of ``lambda`` to the spectrum
  (``"error_bar"``).
* KFAC: ``ls.sharpness(obj, "kfac_trace")`` / ``"kfac_lambda_max"`` (Martens & Grosse 2015:
  block-diagonal across layers, Kronecker within) and EKFAC's (George et al. 2018), with the
  relative errors ``(kfac - exact) / exact``; ``block_diagonal_lambda_max`` (the largest eigenvalue of
  the exact GGN's layer blocks, dense networks only) separates the two steps of the approximation.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import landscape as ls  # noqa: E402
from landscape.data import load_digits  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402
from landscape.models import model_factory  # noqa: E402
from landscape.sharpness.kronecker_based import kronecker_params  # noqa: E402

DT = torch.float64
#: name -> (model factory name, keyword arguments, image input)
NETWORKS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "mlp": ("mlp", {"sizes": (64, 32, 10), "activation": "tanh"}, False),
    "lenet5": ("lenet5-digits", {"num_classes": 10}, True),
    "resnet": ("resnet", {"in_channels": 1, "num_classes": 10, "width": 8, "blocks": (1, 1, 1)}, True),
}


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> list[float]:
    """SGD (lr 0.05, momentum 0.9, batch 64) in float32; the mean training loss per epoch."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn, losses = nn.CrossEntropyLoss(), []
    model.train()
    for _ in range(epochs):
        perm, total = torch.randperm(len(y), generator=gen), 0.0
        for s in range(0, len(y), 64):
            i = perm[s : s + 64]
            opt.zero_grad()
            loss = loss_fn(model(x[i]), y[i])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(i)
        losses.append(total / len(y))
    model.eval()
    return losses


def jacobian_rows(model: nn.Module, names: list[str], x: torch.Tensor, chunk: int = 32):
    """Per chunk of examples: ``(J [b, C, p], logits [b, C])`` with respect to the parameters
    ``names`` (flattened in that order), BatchNorm in eval mode."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    theta = torch.cat([params[n].detach().reshape(-1) for n in names])
    shapes = [params[n].shape for n in names]

    def f(t: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
        parts, off = {}, 0
        for n, s in zip(names, shapes):
            k = int(torch.tensor(s).prod()) if len(s) else 1
            parts[n] = t[off : off + k].reshape(s)
            off += k
        return torch.func.functional_call(model, ({**params, **parts}, buffers), (xb,))

    for s in range(0, len(x), chunk):
        xb = x[s : s + chunk]
        J = torch.func.jacrev(f)(theta, xb)  # [b, C, p]
        yield J.detach(), f(theta, xb).detach()


def exact_ggn(model: nn.Module, names: list[str], x: torch.Tensor, dense: bool) -> dict[str, Any]:
    """Exact ``Tr G`` and, with ``dense``, the dense ``G`` (module docstring)."""
    N, tr, G = len(x), 0.0, None
    for J, out in jacobian_rows(model, names, x):
        p = torch.softmax(out, 1)
        eye = torch.eye(p.shape[1], dtype=DT)
        S = p.sqrt()[:, :, None] * (eye[None] - p[:, None, :])  # [b, c, C]: rows sqrt(p_c)(e_c - p)
        M = torch.einsum("bcd,bdp->bcp", S, J)  # S_n^T J_n (S symmetric in the GGN: S S^T = H)
        tr += float(M.square().sum()) / N
        if dense:
            Mf = M.reshape(-1, M.shape[-1])
            part = Mf.T @ Mf / N
            G = part if G is None else G.add_(part)
    return {"trace": tr, "G": G}


def block_sizes(model: nn.Module, names: list[str]) -> list[int]:
    """Parameters per layer (weight and bias together), in ``names`` order."""
    sizes: dict[str, int] = {}
    params = dict(model.named_parameters())
    for n in names:
        sizes[n.rpartition(".")[0]] = sizes.get(n.rpartition(".")[0], 0) + params[n].numel()
    return list(sizes.values())


def measure(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dense_max: int, seed: int) -> dict[str, Any]:
    model = copy.deepcopy(model).to(DT).eval()
    obj = ls.Objective(model, nn.CrossEntropyLoss(), (x, y), mode="eval")
    names = kronecker_params(obj)
    obj = obj.subset(names)
    p = obj.num_params
    dense = p <= dense_max
    t0 = time.perf_counter()
    ex = exact_ggn(model, names, x, dense)
    row: dict[str, Any] = {"num_params": p, "exact_trace": ex["trace"]}
    if dense:
        G = ex["G"]
        row["exact_lambda_max"] = float(torch.linalg.eigvalsh(G)[-1])
        row["lambda_max_method"] = "dense eigvalsh"
        row["lambda_max_error_bar"] = 0.0
        eigs, off = [], 0
        for s in block_sizes(model, names):
            eigs.append(float(torch.linalg.eigvalsh(G[off : off + s, off : off + s])[-1]))
            off += s
        row["block_diagonal_lambda_max"] = max(eigs)
    else:
        top = ls.eigenvalues(ls.ggn(obj), k=1, which="largest", tol=1e-8, seed=seed, return_vectors=False)
        row["exact_lambda_max"] = float(top.values[0])
        row["lambda_max_method"] = "lanczos"
        row["lambda_max_error_bar"] = float(top.residuals[0])
        row["lambda_max_converged"] = bool(top.converged[0])
    row["exact_seconds"] = time.perf_counter() - t0
    for m in ("kfac_trace", "kfac_lambda_max", "ekfac_trace", "ekfac_lambda_max"):
        r = ls.sharpness(obj, m)
        exact = row["exact_trace"] if m.endswith("trace") else row["exact_lambda_max"]
        row[m] = r.value
        row[f"{m}_seconds"] = r.seconds
        row[f"{m}_rel_error"] = (r.value - exact) / exact
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "kfac_error.json")
    ap.add_argument("--examples", type=int, default=256, help="training images the curvature is on")
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the short training")
    ap.add_argument("--dense-max", type=int, default=5000, help="largest p for the dense GGN")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="64 examples, 1 epoch (a smoke run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.examples, args.epochs = 64, 1
    torch.set_num_threads(1)  # one thread: the short float32 training rounds the same on every machine
    networks: dict[str, Any] = {}
    for name, (factory, kwargs, image) in NETWORKS.items():
        xtr, ytr = load_digits("train", seed=args.seed, image=image)
        model = model_factory(factory, seed=args.seed, **kwargs)
        x = xtr[: args.examples].to(DT)
        y = ytr[: args.examples]
        print(f"{name}: at initialisation", flush=True)
        entry = {
            "factory": factory,
            "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()},
        }
        entry["init"] = measure(model, x, y, args.dense_max, args.seed)
        print(f"{name}: training {args.epochs} epochs", flush=True)
        entry["train_loss"] = train(model, xtr, ytr, args.epochs, args.seed)
        entry["trained"] = measure(model, x, y, args.dense_max, args.seed)
        networks[name] = entry
        for when in ("init", "trained"):
            r = entry[when]
            print(
                f"  {when}: p={r['num_params']} Tr={r['exact_trace']:.4g} "
                f"kfac {r['kfac_trace_rel_error']:+.1%} "
                f"ekfac {r['ekfac_trace_rel_error']:+.1e}; lmax={r['exact_lambda_max']:.4g} "
                f"kfac {r['kfac_lambda_max_rel_error']:+.1%} ekfac {r['ekfac_lambda_max_rel_error']:+.1%}",
                flush=True,
            )
    rel = [abs(e[w]["kfac_trace_rel_error"]) for e in networks.values() for w in ("init", "trained")]
    lam = [abs(e[w]["kfac_lambda_max_rel_error"]) for e in networks.values() for w in ("init", "trained")]
    payload = {
        "settings": {
            "examples": args.examples,
            "epochs": args.epochs,
            "dense_max": args.dense_max,
            "seed": args.seed,
            "dtype": "float64",
            "loss": "mean cross-entropy",
            "fisher_type": "type-2",
            "kfac_approx": "expand",
        },
        "networks": networks,
        "summary": {
            "max_abs_kfac_trace_rel_error": max(rel),
            "min_abs_kfac_trace_rel_error": min(rel),
            "max_abs_kfac_lambda_max_rel_error": max(lam),
            "min_abs_kfac_lambda_max_rel_error": min(lam),
        },
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
