"""Tables, figure and verdicts of the CPU miniatures (docs/miniatures.md) from finished runs.

    python -m experiments run configs/miniatures/label_noise.toml
    python -m experiments run configs/miniatures/flat_posteriors.toml
    python docs/make_miniatures.py [--runs runs/miniatures] [--out docs/figures] [--samples 8]

Reads every ``<runs>/<config>/[<variant>/]<method>/seed<k>/`` directory of the two configs and adds
what the results table of the runner does not hold:

* label noise: the best test accuracy over the epochs and the epoch it was reached (``log.jsonl``),
  and from the final weights (``checkpoint.pt``) the memorisation of the flipped training examples:
  the fraction predicted as their *noisy* label and as their *clean* label;
* flat posteriors: the sharpness of the *sampled* models of SWAG and F-SWAG (``lambda_max`` by
  Lanczos and ``Tr H`` by Hutch++, ``landscape.sharpness``; Nguyen et al. 2023, Sec. 4 and Fig. 1,
  claim F-SWAG's samples are flatter), of ``--samples`` draws per run and of the SWA mean, on the
  same 256 training examples as the runner's sharpness of the final iterate.

Writes ``miniature_label_noise.png`` (test accuracy and training loss per epoch, mean and standard
deviation over seeds), ``miniature_tables.md`` (the tables of docs/miniatures.md) and
``miniature_results.json`` (every per-seed number) to ``--out``. The tables are rendered from the
JSON's rows alone (:func:`tables_page`), so ``--from-json`` rewrites ``miniature_tables.md`` from a
committed ``miniature_results.json`` without the runs (``tests/test_make_miniatures.py`` checks that
the committed page is that rendering)::

    python docs/make_miniatures.py --from-json docs/figures/miniature_results.json

Verdict rule of the tables: a difference counts as resolved when the intervals mean +- one sample
standard deviation (ddof 1, over seeds) of method and baseline do not overlap; then "reproduced" if
it goes the paper's way, "not reproduced" if the other way, else "not resolved (within 1 std)".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.config import load_config  # noqa: E402
from experiments.data import _subset  # noqa: E402
from experiments.ensembles import predict_probs  # noqa: E402
from experiments.parallel import DistContext  # noqa: E402
from experiments.train import OPT_SEED_OFFSET, Trainer  # noqa: E402
from landscape.io import atomic_write, atomic_write_json, atomic_write_text, read_json  # noqa: E402

LABEL_NOISE_METHODS = {
    "sgd": "SGD",
    "sam": "SAM ρ=0.1",
    "sam_rho0.2": "SAM ρ=0.2",
    "sam_rho0.5": "SAM ρ=0.5",
    "asam": "ASAM ρ=0.5",
    "fsam": "Fisher-SAM γ=0.1, η=0.001",
    "sgd_tracer": "G-TRACER (SGD)",
    "bsam": "bSAM",
}
POSTERIOR_METHODS = {"swag": "SWAG", "f_swag": "F-SWAG", "sgld": "SGLD", "f_sgld": "F-SGLD"}
DIVERGED_LOSS = 10.0
#: the per-epoch curves the JSON keeps (rounded to 5 digits: a small file)
PER_EPOCH = ("train_loss", "test_accuracy", "test_nll")
SAMPLE_MEASURES = [
    ("lambda_max", {"tol": 1e-3, "smallest": False, "max_matvecs": 100}),
    ("hessian_trace", {"method": "hutchpp", "max_matvecs": 60}),
]


# ------------------------------------------------------------------------------------ loading
def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("results.json"))


def restore(run_dir: Path) -> Trainer:
    """The trainer of a finished run with its final weights and optimizer state (no training)."""
    cfg = load_config(run_dir / "config.toml")
    seed = int(cfg["seeds"][0])
    # the checkpoint's own fingerprint: a key added to the runner's defaults since the run was made
    # changes the fingerprint of the same configuration
    fp = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)["fingerprint"]
    tr = Trainer(cfg, run_dir, seed=seed, device=torch.device("cpu"), ctx=DistContext(), fingerprint=fp)
    tr.restore()
    return tr


# ------------------------------------------------------------------------------------ analyses
def memorisation(tr: Trainer) -> dict[str, float]:
    """Predictions of the final weights on the training set: on the flipped examples the fraction
    given the noisy label and the clean one; the accuracy on the clean and on the noisy labels."""
    probs = predict_probs(tr.model, tr.data.x_train, 1000, torch.device("cpu"))
    pred = probs.argmax(1)
    noisy, clean = tr.data.y_train, tr.data.y_train_clean
    flipped = noisy != clean
    return {
        "flipped_fraction": float(flipped.double().mean()),
        "memorised": float((pred[flipped] == noisy[flipped]).double().mean()),
        "flipped_predicted_clean": float((pred[flipped] == clean[flipped]).double().mean()),
        "train_accuracy_noisy_labels": float((pred == noisy).double().mean()),
        "train_accuracy_clean_labels": float((pred == clean).double().mean()),
    }


def _sharpness_here(tr: Trainer) -> dict[str, float]:
    import landscape as ls

    k = min(tr.cfg["evaluation"]["sharpness_subset"], len(tr.data.y_train))
    idx = _subset(len(tr.data.y_train), k)
    obj = ls.Objective(tr.model, torch.nn.CrossEntropyLoss(), (tr.x_train[idx], tr.y_train[idx]), mode="eval")
    return {name: float(ls.sharpness(obj, name, **opts).value) for name, opts in SAMPLE_MEASURES}


def swag_sample_sharpness(tr: Trainer, samples: int) -> dict[str, Any]:
    """``lambda_max`` and ``Tr H`` of ``samples`` SWAG draws (scale of the run's config) and of the
    SWA mean; the draws use a generator seeded with the run's seed + ``OPT_SEED_OFFSET`` + 1."""
    gen = torch.Generator().manual_seed(tr.seed + OPT_SEED_OFFSET + 1)
    scale = tr.method["swag"]["scale"]
    per_sample = []
    for _ in range(samples):
        with tr.opt.sample(gen, scale, model=tr.model):
            per_sample.append(_sharpness_here(tr))
    with tr.opt.swa(model=tr.model):
        mean = _sharpness_here(tr)
    out: dict[str, Any] = {"swa": mean, "per_sample": per_sample}
    for name, _ in SAMPLE_MEASURES:
        out[f"samples_{name}"] = float(np.mean([s[name] for s in per_sample]))
    return out


# ------------------------------------------------------------------------------------ tables
def mean_std(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else float("nan")


def fmt(values: list[float], digits: int = 3) -> str:
    m, s = mean_std(values)
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def verdict(method: list[float], base: list[float], better: str) -> str:
    """See the module docstring; ``better`` is ``"higher"`` or ``"lower"``."""
    (m1, s1), (m0, s0) = mean_std(method), mean_std(base)
    if not (np.isfinite(s1) and np.isfinite(s0)):
        return "not resolved (one seed)"
    if abs(m1 - m0) <= s1 + s0:
        return "not resolved (within 1 std)"
    return "reproduced" if (m1 > m0) == (better == "higher") else "not reproduced"


def shown(v: str) -> str:
    """A verdict as the tables print it: a resolved one (reproduced or not) in bold."""
    return v if v.startswith("not resolved") else f"**{v}**"


def stopped(row: dict[str, Any]) -> bool:
    """A run the runner stopped at a divergence: no final metrics (counted, not averaged)."""
    return row.get("status") == "diverged"


def group(rows: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def label_noise_tables(rows: list[dict[str, Any]]) -> str:
    g = group(rows, "variant", "method")
    lines = []
    for variant in sorted({r["variant"] for r in rows}):
        rate = variant.split("=")[-1]
        lines += [
            f"**{float(rate):.0%} of the training labels flipped** "
            "(final epoch; verdict on test accuracy vs SGD)",
            "",
            "| method | test accuracy | best epoch's test acc. | NLL | ECE | flipped examples memorised"
            " | λ_max | BMA NLL / ECE | more robust than SGD |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        base = [r["accuracy"] for r in g[(variant, "sgd")] if not stopped(r)]
        for key, label in LABEL_NOISE_METHODS.items():
            runs = g.get((variant, key))
            if not runs:
                continue
            rs = [r for r in runs if not stopped(r)]  # the runner's diverged runs have no metrics
            acc = [r["accuracy"] for r in rs]
            bma = (
                f"{fmt([r['bma_nll'] for r in rs])} / {fmt([r['bma_ece'] for r in rs])}"
                if "bma_nll" in rs[0]
                else ""
            )
            v = "" if key == "sgd" else shown(verdict(acc, base, "higher"))
            n_bad = sum(diverged(r) for r in runs)
            if n_bad:
                kept = "" if n_bad == len(runs) - len(rs) else ", kept in the means"
                v += f" ({n_bad} of {len(runs)} seeds diverged{kept})"
            mem, lam = [r["memorised"] for r in rs], [r["sharpness_lambda_max"] for r in rs]
            lines.append(
                f"| {label} | {fmt(acc)} | {fmt([r['best_accuracy'] for r in rs])} | "
                f"{fmt([r['nll'] for r in rs])} | {fmt([r['ece'] for r in rs])} | "
                f"{fmt(mem, 2)} | {fmt(lam, 2)} | "
                f"{bma} | {v} |"
            )
        lines.append("")
    return "\n".join(lines)


def bsam_calibration_table(rows: list[dict[str, Any]]) -> str:
    """bSAM's model average against SGD and SAM (rho 0.1) on NLL and ECE, per noise level."""
    g = group(rows, "variant", "method")
    lines = [
        "| noise | metric | bSAM (model average) | SGD | SAM ρ=0.1 | vs SGD | vs SAM ρ=0.1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in sorted({r["variant"] for r in rows}):
        if not all((variant, k) in g for k in ("bsam", "sgd", "sam")):
            continue
        for metric in ("nll", "ece"):
            b = [r[f"bma_{metric}"] for r in g[(variant, "bsam")] if not stopped(r)]
            s0 = [r[metric] for r in g[(variant, "sgd")] if not stopped(r)]
            s1 = [r[metric] for r in g[(variant, "sam")] if not stopped(r)]
            rate = float(variant.split("=")[-1])
            lines.append(
                f"| {rate:.0%} | {metric.upper()} | {fmt(b)} | {fmt(s0)} | {fmt(s1)} | "
                f"{shown(verdict(b, s0, 'lower'))} | {shown(verdict(b, s1, 'lower'))} |"
            )
    return "\n".join(lines) + "\n"


def timing_table(rows: list[dict[str, Any]]) -> str:
    """Seconds per run (training and evaluation, ``results.json``), mean over the runs of a method."""
    g = group(rows, "method")
    lines = ["| method | runs | seconds per run (mean) |", "|---|---|---|"]
    for (method,), rs in g.items():
        lines.append(f"| {method} | {len(rs)} | {np.mean([r['seconds'] for r in rs]):.1f} |")
    return "\n".join(lines) + "\n"


def posterior_tables(rows: list[dict[str, Any]]) -> str:
    g = group(rows, "method")
    lines = [
        "| method | BMA accuracy | BMA NLL | BMA ECE | final iterate λ_max | final iterate Tr H"
        " | sampled models' mean λ_max | sampled models' mean Tr H | SWA mean λ_max |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in POSTERIOR_METHODS.items():
        rs = g.get((key,))
        if not rs:
            continue
        samp = (
            [
                fmt([r["swag_sharpness"]["samples_lambda_max"] for r in rs]),
                fmt([r["swag_sharpness"]["samples_hessian_trace"] for r in rs], 2),
                fmt([r["swag_sharpness"]["swa"]["lambda_max"] for r in rs]),
            ]
            if "swag_sharpness" in rs[0]
            else ["", "", ""]
        )
        lines.append(
            f"| {label} | {fmt([r['bma_accuracy'] for r in rs])} | {fmt([r['bma_nll'] for r in rs])} | "
            f"{fmt([r['bma_ece'] for r in rs])} | {fmt([r['sharpness_lambda_max'] for r in rs])} | "
            f"{fmt([r['sharpness_hessian_trace'] for r in rs], 2)} | " + " | ".join(samp) + " |"
        )
    lines += ["", "| claim | F-version | baseline | verdict |", "|---|---|---|---|"]
    claims = [
        ("f_swag", "swag", "swag_sharpness.samples_lambda_max", "lower", "sampled models flatter (λ_max)"),
        ("f_swag", "swag", "swag_sharpness.samples_hessian_trace", "lower", "sampled models flatter (Tr H)"),
        ("f_swag", "swag", "bma_nll", "lower", "lower NLL"),
        ("f_swag", "swag", "bma_ece", "lower", "lower ECE"),
        ("f_sgld", "sgld", "bma_nll", "lower", "lower NLL"),
        ("f_sgld", "sgld", "bma_ece", "lower", "lower ECE"),
    ]

    def get(r: dict[str, Any], path: str) -> float:
        for part in path.split("."):
            r = r[part]
        return float(r)

    for new, old, path, better, text in claims:
        if (new,) not in g or (old,) not in g:
            continue
        a, b = [get(r, path) for r in g[(new,)]], [get(r, path) for r in g[(old,)]]
        lines.append(
            f"| {POSTERIOR_METHODS[new]} vs {POSTERIOR_METHODS[old]}: {text} | {fmt(a)} | {fmt(b)} | "
            f"{shown(verdict(a, b, better))} |"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ figure
def diverged(row: dict[str, Any]) -> bool:
    """A run the runner stopped as diverged (``status``, :mod:`experiments.divergence`), or whose
    training loss exceeded ``DIVERGED_LOSS`` in some epoch (chance is ln 10 = 2.3)."""
    return stopped(row) or any(loss > DIVERGED_LOSS for loss in row["per_epoch"]["train_loss"])


def label_noise_figure(rows: list[dict[str, Any]], path: Path) -> None:
    """Test accuracy (mean +- std over seeds) and training loss (mean, range over seeds) per epoch;
    a diverged run is drawn alone (thin dotted line) and left out of its method's mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({r["variant"] for r in rows})
    fig, axes = plt.subplots(2, len(variants), figsize=(6 * len(variants), 7.5), sharex=True, squeeze=False)
    g = group(rows, "variant", "method")
    colours = plt.get_cmap("tab10")
    styles = {"sgd": ("--", 2.0), "fsam": (":", 2.5)}
    for j, variant in enumerate(variants):
        for i, (key, label) in enumerate(LABEL_NOISE_METHODS.items()):
            rs = g.get((variant, key))
            if not rs:
                continue
            ok = [r for r in rs if not diverged(r)]
            bad = [r for r in rs if diverged(r)]
            if key == "fsam":
                label += " (= SAM ρ=0.1)"
            if bad:
                label += f" ({len(bad)} of {len(rs)} seeds diverged: dotted)"
            ls, lw = styles.get(key, ("-", 1.5))
            for row, metric in ((0, "test_accuracy"), (1, "train_loss")):
                ax = axes[row, j]
                for r in bad:
                    curve = r["per_epoch"][metric]
                    ax.plot(range(1, len(curve) + 1), curve, color=colours(i), ls=":", lw=0.8)
                if not ok:
                    continue
                curves = np.array([r["per_epoch"][metric] for r in ok])
                ep = np.arange(1, curves.shape[1] + 1)
                m = curves.mean(0)
                if row == 0:  # accuracy: mean +- std; loss (log axis): the range over seeds
                    sd = curves.std(0, ddof=1) if len(ok) > 1 else np.zeros_like(m)
                    lo, hi = m - sd, m + sd
                else:
                    lo, hi = curves.min(0), curves.max(0)
                ax.plot(ep, m, color=colours(i), label=label, lw=lw, ls=ls)
                ax.fill_between(ep, lo, hi, color=colours(i), alpha=0.15, lw=0)
        rate = float(variant.split("=")[-1])
        axes[0, j].set_title(f"digits, {rate:.0%} of training labels flipped")
        axes[0, j].set_ylabel("test accuracy (clean labels)")
        axes[1, j].set_ylabel("training loss (noisy labels)")
        axes[1, j].set_yscale("log")
        axes[1, j].set_xlabel("epoch")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        "MLP 64-128-128-10, 60 epochs, cosine lr, 3 seeds: accuracy mean ± std, loss mean and range "
        "(bSAM: its mean weights)"
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    atomic_write(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)


def tables_page(results: dict[str, list[dict[str, Any]]]) -> str:
    """``miniature_tables.md`` from the rows of ``miniature_results.json`` (``label_noise``,
    ``flat_posteriors``; either may be absent)."""
    tables = ["# Miniature tables (written by docs/make_miniatures.py)", ""]
    if "label_noise" in results:
        rows = results["label_noise"]
        tables += ["## Label noise", "", label_noise_tables(rows)]
        tables += ["### bSAM's calibration", "", bsam_calibration_table(rows)]
        tables += ["### Seconds per run", "", timing_table(rows)]
    if "flat_posteriors" in results:
        rows = results["flat_posteriors"]
        tables += ["## F-versions vs baselines", "", posterior_tables(rows)]
        tables += ["### Seconds per run", "", timing_table(rows)]
    return "\n".join(tables)


# ------------------------------------------------------------------------------------ main
def _row(run_dir: Path) -> dict[str, Any]:
    """A run's metrics, seconds, divergence record and per-epoch curves (``PER_EPOCH``, rounded);
    ``history`` is the runner's full per-epoch record, dropped before the JSON is written."""
    res = read_json(run_dir / "results.json", what="results file")
    row = read_json(run_dir / "metrics.json", what="metrics file")
    row["history"], row["seconds"] = res["history"], res["seconds"]
    if res.get("divergence"):
        row["divergence"] = res["divergence"]
    row["per_epoch"] = {k: [round(float(h[k]), 5) for h in res["history"]] for k in PER_EPOCH}
    return row


def rewrite_tables(results_json: Path, out: Path) -> str:
    """Write ``out/miniature_tables.md`` from a ``miniature_results.json`` (no runs needed)."""
    results = read_json(results_json, what="miniature results")
    if not isinstance(results, dict) or not {"label_noise", "flat_posteriors"} & set(results):
        raise ValueError(
            f"{results_json} holds no 'label_noise' or 'flat_posteriors' rows: pass the "
            "miniature_results.json that docs/make_miniatures.py wrote"
        )
    text = tables_page(results)
    atomic_write_text(out / "miniature_tables.md", text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="runs/miniatures", help="out_dir of the two configs")
    ap.add_argument("--out", default="docs/figures", help="where the figure, tables and JSON go")
    ap.add_argument("--samples", type=int, default=8, help="SWAG draws per run for the sample sharpness")
    ap.add_argument(
        "--from-json",
        default=None,
        help="only rewrite miniature_tables.md in --out from this miniature_results.json (no runs)",
    )
    args = ap.parse_args(argv)
    if args.from_json is not None:
        print(rewrite_tables(Path(args.from_json), Path(args.out)))
        return 0
    torch.set_num_threads(1)
    root, out = Path(args.runs), Path(args.out)
    results: dict[str, Any] = {}
    noise_root = root / "label_noise"
    if noise_root.is_dir():
        rows = []
        for d in run_dirs(noise_root):
            row = _row(d)
            if stopped(row):
                rows.append(row)
                continue
            accs = [h["test_accuracy"] for h in row["history"]]
            row["best_accuracy"], row["best_epoch"] = max(accs), int(np.argmax(accs)) + 1
            row.update(memorisation(restore(d)))
            rows.append(row)
        label_noise_figure(rows, out / "miniature_label_noise.png")
        results["label_noise"] = rows
    post_root = root / "flat_posteriors"
    if post_root.is_dir():
        rows = []
        for d in run_dirs(post_root):
            row = _row(d)
            tr = restore(d)
            if tr.method["swag"]:
                row["swag_sharpness"] = swag_sample_sharpness(tr, args.samples)
            rows.append(row)
        results["flat_posteriors"] = rows
    for rows in results.values():  # the JSON keeps the per-epoch curves of PER_EPOCH only
        for row in rows:
            del row["history"]
    text = tables_page(results)  # from the rows as the JSON holds them: --from-json gives the same
    atomic_write_text(out / "miniature_tables.md", text)
    atomic_write_json(out / "miniature_results.json", results)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
