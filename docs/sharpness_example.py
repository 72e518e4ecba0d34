"""The user guide's worked example (Sharpness measures): the same small MLP trained on digits with
SGD and with SAM, then the sharpness table for both.

    python docs/sharpness_example.py [--epochs 40] [--out DIR] [--json FILE]

``--json docs/figures/sharpness_example.json`` writes the numbers the guide's table quotes (each
measure's value and standard error, the train / test accuracy) for the claims registry
(``docs/claims.py``, claim ``guide.sharpness_example``); about 30 s on one CPU core.

Both runs start from the same initial weights and see the same mini-batches in the same order;
SAM (Foret et al. 2021) uses rho = 0.05 on top of the same SGD. The measures are taken on the whole
training set in float64, in eval mode.
"""

from __future__ import annotations

import argparse
import copy
import platform
import time
from pathlib import Path

import torch
from torch import nn
from tqdm.auto import tqdm

import landscape as ls
from landscape.data import load_digits
from landscape.io import atomic_write_json, atomic_write_text
from landscape.sharpness import SharpnessReport
from optimizers import SAM

#: the training settings, shared by :func:`train` and the JSON of :func:`summary`
SETTINGS = {"batch_size": 64, "lr": 0.05, "momentum": 0.9, "sam_rho": 0.05}

MEASURES = [
    ("lambda_max", {}),
    ("hessian_trace", {}),
    ("gradient_norm", {}),
    ("worst_case", {"rho": 0.05}),  # SAM neighbourhood, Auto-PGD
    ("worst_case", {"rho": 0.5, "adaptive": True, "eta": 0.01}),  # ASAM neighbourhood
    ("average_case", {"rho": 0.01}),
    ("keskar", {"epsilon": 1e-3}),
    ("pacbayes_flatness", {}),
    ("fisher_trace", {}),
]


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def train(model: nn.Module, x, y, *, sam: bool, epochs: int, seed: int = 0) -> nn.Module:
    loss_fn = nn.CrossEntropyLoss()
    lr, momentum, batch = SETTINGS["lr"], SETTINGS["momentum"], SETTINGS["batch_size"]
    if sam:
        opt = SAM(model.parameters(), torch.optim.SGD, rho=SETTINGS["sam_rho"], lr=lr, momentum=momentum)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(epochs), desc="train SAM" if sam else "train SGD", unit="epoch"):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            xb, yb = x[perm[i : i + batch]], y[perm[i : i + batch]]

            def closure(xb=xb, yb=yb):
                opt.zero_grad()
                loss = loss_fn(model(xb), yb)
                loss.backward()
                return loss

            if sam:
                opt.step(closure)
            else:
                closure()
                opt.step()
    return model


def main(argv: list[str] | None = None) -> dict[str, SharpnessReport]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None, help="write sgd.json/sam.json and the table here")
    parser.add_argument("--json", type=Path, default=None, help="write the table's numbers to this JSON file")
    args = parser.parse_args(argv)

    x, y = load_digits("train")
    xt, yt = load_digits("test")
    init = make_model()
    reports = {}
    for name, sam in (("SGD", False), ("SAM", True)):
        t0 = time.perf_counter()
        model = train(copy.deepcopy(init), x, y, sam=sam, epochs=args.epochs)
        obj = ls.Objective(model, nn.CrossEntropyLoss(), [(x, y)], dtype=torch.float64)
        test = ls.Objective(model, nn.CrossEntropyLoss(), [(xt, yt)], dtype=torch.float64).evaluate()
        train_eval = obj.evaluate()
        print(f"{name}: {len(MEASURES)} measures (a bar over them, with an estimate)", flush=True)
        reports[name] = ls.sharpness_report(obj, MEASURES, progress=True)
        reports[name].config["accuracy"] = {"train": train_eval["accuracy"], "test": test["accuracy"]}
        print(
            f"{name}: train loss {train_eval['loss']:.4f} acc {train_eval['accuracy']:.4f} | "
            f"test loss {test['loss']:.4f} acc {test['accuracy']:.4f} | {time.perf_counter() - t0:.1f}s"
        )

    lines = ["| measure | options | SGD | SAM |", "|---|---|---|---|"]
    for i, (measure, options) in enumerate(MEASURES):
        opts = ", ".join(f"{k}={v}" for k, v in options.items())
        lines.append(
            f"| {measure} | {opts} | {_fmt(reports['SGD'].rows[i])} | {_fmt(reports['SAM'].rows[i])} |"
        )
    for split in ("train", "test"):
        accs = [reports[n].config["accuracy"][split] for n in ("SGD", "SAM")]
        lines.append(f"| {split} accuracy | | {accs[0]:.4f} | {accs[1]:.4f} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, rep in reports.items():
            rep.to_json(args.out / f"{name.lower()}.json")
        atomic_write_text(args.out / "table.md", table + "\n")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.json, summary(reports, args.epochs))
        print(f"wrote {args.json}")
    return reports


def summary(reports: dict[str, SharpnessReport], epochs: int) -> dict:
    """The table's numbers: per optimizer, each measure's value and standard error (``None`` for a
    deterministic measure) in the order of ``MEASURES``, and the train / test accuracy."""
    return {
        "settings": {
            "model": "MLP 64-32-10 (ReLU)",
            "data": "digits, measures on the training split",
            "epochs": epochs,
            **SETTINGS,
            "dtype": "float64",
        },
        "methods": {
            name: {
                "rows": [
                    {"measure": measure, "options": options, "value": row.value, "stderr": row.stderr}
                    for (measure, options), row in zip(MEASURES, rep.rows, strict=True)
                ],
                "accuracy": rep.config["accuracy"],
            }
            for name, rep in reports.items()
        },
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }


def _fmt(r) -> str:
    return f"{r.value:.4g}" if r.stderr is None else f"{r.value:.4g} ± {r.stderr:.2g}"


if __name__ == "__main__":
    main()
