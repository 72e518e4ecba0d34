"""Steps per second and epoch time of the experiment runner's training step, method by method.

Every method of the suite against a minimal PyTorch loop and a one-file SAM, in one run.

What is timed (the same model, data, batch size and augmentation everywhere, float32):

* the runner: one :class:`experiments.train.Trainer` per method, built from a config as
  ``python -m experiments run`` builds it, timed over whole epochs of ``Trainer._train_epoch`` (data
  order, batch indexing and augmentation, the method's closure, the optimizer step, the learning-rate
  schedule, the divergence monitor; no checkpoint, no test metrics, no log). Methods: SGD (momentum
  0.9, weight decay 5e-4), SAM with m = 1 and m = 8 (the batched sub-batches of
  :mod:`optimizers.m_sharpness`, the default, and the loop, ``batched_m = false``), ASAM,
  Fisher-SAM, bSAM with m = 1 and m = 8 (batched and loop), VOGN, IVON and SWAG (SGD collecting a
  rank-20 deviation matrix once per epoch from the first one). Hyperparameters are those of
  ``configs/digits_sam_vs_sgd.toml`` / ``configs/digits_bayesian_methods.toml`` (they do not change
  the cost, except VOGN's ``mc_samples``: its default, 5, per-example passes);
* the floor: a minimal loop (shuffle, index the on-device data, augment, SGD with momentum);
* the anchor of the SAM rows: :func:`one_file_sam_step`, a two-pass SAM (Foret et al. 2021, Alg. 1)
  in a few lines of plain PyTorch, in the minimal loop.

Batches of ``--batch-size`` (256) with ``drop_last`` (m = 8 gets equal sub-batches). Every method is
first warmed up, then ``--rounds`` interleaved rounds
(each times every method for ``--steps`` steps, rounded up to whole epochs, after ``--warmup``
untimed steps) give the median step time; steps per second, epoch time and the ratios are computed
from these medians: step time / the minimal SGD loop's and / the runner SGD's, SAM m = 8 / m = 1,
batched / loop, the SAM rows / the one-file SAM, runner SGD epoch / minimal loop epoch. The targets
of issue 25 are checked on these ratios (``summary``; each with the median of the per-round ratios
beside it): SAM m = 8 (batched) <= 2.0x SAM m = 1; SAM m = 1 <= 2.05x SGD and bSAM m = 1 <= 2.2x SGD
(both through the runner); runner SGD epoch <= 1.10x the minimal loop's.  The VOGN row also gives
its step per MC sample (``step_ms_per_mc_sample``, ``per_mc_sample_x_runner_sgd``) and the per-example
gradient method it ran (``per_example``: ``optimizers.per_example``, issue 41), checked against
:data:`VOGN_TARGETS` (<= 3x the runner SGD step on the MLP, <= 4x on LeNet-5).

Models (``--model``): ``mlp`` (default; the digits MLP 64-64-10, tanh, on scikit-learn's 8x8 digits
through the runner's data pipeline: a small, launch-bound step), ``lenet5-digits`` (a small CNN on
``digits-image`` with random crops (padding 1) and flips), ``resnet20`` / ``wrn16-4`` (BatchNorm; on
CIFAR-shaped random tensors, 3x32x32 and 10 classes, handed to the Trainer in memory, with random
crops (padding 4) and flips; VOGN refuses BatchNorm and is reported as an error row). On a CPU the
default is one thread (``--threads``).

    python benchmarks/bench_training.py [--quick] [--model mlp|lenet5-digits|resnet20|wrn16-4]
        [--device cpu|cuda] [--rounds 5] [--steps 50] [--warmup 10] [--batch-size 256]
        [--methods sgd,sam,sam-m8,...] [--train-size N] [--threads 1] [--out DIR] [--name NAME]
"""

from __future__ import annotations

import datetime as dt
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._plain_loops import PlainLoop, minimal_sgd_step, one_file_sam_step  # noqa: E402
from benchmarks._runner import base_argparser, format_table, machine_info, sync  # noqa: E402
from landscape.io import atomic_write_json  # noqa: E402

#: ``--model``: the registry name, its kwargs, the data (``random-cifar``: in-memory tensors) and
#: the augmentation with its crop padding.
MODELS: dict[str, dict[str, Any]] = {
    "mlp": dict(name="mlp", kwargs={"sizes": [64, 64, 10], "activation": "tanh"}, data="digits", aug="none"),
    "lenet5-digits": dict(name="lenet5-digits", kwargs={}, data="digits-image", aug="crop_flip", pad=1),
    "resnet20": dict(
        name="resnet20", kwargs={"num_classes": 10}, data="random-cifar", aug="crop_flip", pad=4
    ),
    "wrn16-4": dict(name="wrn16-4", kwargs={"num_classes": 10}, data="random-cifar", aug="crop_flip", pad=4),
}
LR, SGD_DEFAULTS, RHO = 0.05, {"momentum": 0.9, "weight_decay": 5e-4}, 0.05
_SAM = {"optimizer": "sam", "hyperparameters": {"rho": RHO}}
_BSAM = {"optimizer": "bsam", "hyperparameters": {"lr": 1.0, "rho": 0.01, "prior_precision": 1.0}}
_VOGN = {"optimizer": "vogn", "hyperparameters": {"lr": 1e-3, "prior_precision": 1.0}}


def _with(method: dict[str, Any], **hyper: Any) -> dict[str, Any]:
    return {**method, "hyperparameters": {**method["hyperparameters"], **hyper}}


#: key -> (method, variant, the ``[[methods]]`` entry of the runner's config)
RUNNER_METHODS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "sgd": ("SGD", "runner", {"optimizer": "sgd"}),
    "sam": ("SAM", "m=1", _SAM),
    "sam-m8": ("SAM", "m=8 batched", _with(_SAM, m=8)),
    "sam-m8-loop": ("SAM", "m=8 loop", _with(_SAM, m=8, batched_m=False)),
    "asam": ("ASAM", "m=1", {"optimizer": "asam", "hyperparameters": {"rho": 0.5, "eta": 0.01}}),
    "fsam": ("Fisher-SAM", "m=1", {"optimizer": "fsam", "hyperparameters": {"rho": 0.1, "eta": 1.0}}),
    "bsam": ("bSAM", "m=1", _BSAM),
    "bsam-m8": ("bSAM", "m=8 batched", _with(_BSAM, m=8)),
    "bsam-m8-loop": ("bSAM", "m=8 loop", _with(_BSAM, m=8, batched_m=False)),
    "vogn": ("VOGN", "mc_samples=5", _VOGN),
    "ivon": ("IVON", "", {"optimizer": "ivon", "hyperparameters": {"lr": 0.1}}),
    "swag": ("SWAG", "rank 20, every epoch", {"optimizer": "sgd", "swag": {"rank": 20, "start_epoch": 0}}),
    "sgd-compiled": ("SGD", "compiled", {"optimizer": "sgd"}),
    "sam-compiled": ("SAM", "m=1 compiled", _SAM),
    "bsam-compiled": ("bSAM", "m=1 compiled", _BSAM),
}
#: rows run with ``train.compile = "default"`` (torch.compile of the training forward/backward);
#: each is also compared with its eager row (``x_eager``)
COMPILED = {"sgd-compiled": "sgd", "sam-compiled": "sam", "bsam-compiled": "bsam"}
PLAIN = {"minimal-sgd": ("SGD", "minimal loop"), "one-file-sam": ("SAM", "one-file, m=1")}
#: rows compared with the one-file SAM (two-pass methods with one perturbation per step)
ONE_FILE_PEERS = ("sam", "asam", "fsam", "bsam")
#: (target, numerator key, denominator key, timed quantity, limit, device type): issue 25's "done
#: when", the CPU targets and the GPU ones (checked where the benchmark runs on that device)
TARGETS = (
    ("sam_m8_le_2.0x_sam_m1", "sam-m8", "sam", "step_ms", 2.0, "cpu"),
    ("sam_m1_le_2.05x_sgd", "sam", "sgd", "step_ms", 2.05, "cpu"),
    ("bsam_m1_le_2.2x_sgd", "bsam", "sgd", "step_ms", 2.2, "cpu"),
    ("runner_sgd_epoch_le_1.10x_minimal_loop", "sgd", "minimal-sgd", "epoch_ms", 1.10, "cpu"),
    ("sam_m8_le_2.5x_sgd", "sam-m8", "sgd", "step_ms", 2.5, "cuda"),
    ("bsam_m8_le_2.5x_sgd", "bsam-m8", "sgd", "step_ms", 2.5, "cuda"),
    (
        "compiled_sgd_step_ge_2.5x_faster_than_minimal_loop",
        "sgd-compiled",
        "minimal-sgd",
        "step_ms",
        0.4,
        "cuda",
    ),
)

#: issue 41: VOGN's step per MC sample against the runner's SGD step, by ``--model`` (CPU)
VOGN_TARGETS = {"mlp": 3.0, "lenet5-digits": 4.0}


# ------------------------------------------------------------------------------------ the runner
def runner_config(args, method: dict[str, Any], out_dir: Path, compile_mode: str = "off") -> dict[str, Any]:
    """The resolved config of one method's run (as the runner reads it from a TOML file)."""
    from experiments.config import resolve_config
    from experiments.runner import plan_runs

    spec = MODELS[args.model]
    data = {"name": "digits" if spec["data"] == "random-cifar" else spec["data"], "augmentation": spec["aug"]}
    if spec["aug"] != "none":
        data["crop_padding"] = spec["pad"]
    raw = {
        "name": "bench_training",
        "seeds": [args.seed],
        "device": str(args.device),
        "threads": torch.get_num_threads(),
        "progress": False,
        "precision": "float32",
        "out_dir": str(out_dir),
        "data": data,
        "model": {"name": spec["name"], "kwargs": spec["kwargs"]},
        "train": {
            "epochs": 1,
            "batch_size": args.batch_size,
            "lr": LR,
            "schedule": "constant",
            "drop_last": True,
            "divergence_factor": 1e30,  # a benchmark, not a training run: only non-finite losses stop it
            "compile": compile_mode,
            "optimizer_defaults": dict(SGD_DEFAULTS),
        },
        "methods": [{"name": "m", **method}],
        "evaluation": {"every": 0, "sharpness": []},
    }
    return plan_runs(resolve_config(raw))[0].cfg


def run_data(args, cfg: dict[str, Any]):
    """The training data every harness uses: the runner's pipeline, or CIFAR-shaped random tensors."""
    from experiments.data import RunData, prepare_data

    if MODELS[args.model]["data"] != "random-cifar":
        return prepare_data(cfg, args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    n = args.train_size or args.batch_size * (4 if args.quick else 10)
    x, y = torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    xt, yt = torch.randn(100, 3, 32, 32, generator=gen), torch.randint(0, 10, (100,), generator=gen)
    return RunData(x, y, y.clone(), xt, yt, 10)


def build_trainer(args, key: str, data, out_dir: Path):
    from experiments.parallel import DistContext
    from experiments.train import Trainer

    cfg = runner_config(args, RUNNER_METHODS[key][2], out_dir, "default" if key in COMPILED else "off")
    run_dir = out_dir / key
    dev = torch.device(args.device)
    return Trainer(
        cfg, run_dir, seed=args.seed, device=dev, ctx=DistContext(), fingerprint="bench", data=data
    )


def _jsonable(v: Any) -> Any:
    """Config values for the JSON: numbers, strings, lists and tables as they are, classes by name."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return getattr(v, "__name__", str(v))


# ------------------------------------------------------------------------------------ timing
@dataclass
class Bench:
    """One row: ``epoch_fn()`` runs one epoch of ``spe`` steps; the per-round times it recorded."""

    key: str
    harness: str
    epoch_fn: Callable[[], Any]
    spe: int
    info: dict[str, Any]
    step_ms: list[float] = field(default_factory=list)
    epoch_ms: list[float] = field(default_factory=list)
    error: str | None = None

    def run(self, epochs: int, device: str, timed: bool) -> None:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(epochs):
            self.epoch_fn()
        sync(device)
        if timed:
            seconds = time.perf_counter() - t0
            self.step_ms.append(1e3 * seconds / (epochs * self.spe))
            self.epoch_ms.append(1e3 * seconds / epochs)


def make_benches(args, out_dir: Path) -> tuple[list[Bench], dict[str, Any]]:
    from landscape.data import random_crop_flip
    from landscape.models import model_factory

    spec = MODELS[args.model]
    first = runner_config(args, RUNNER_METHODS["sgd"][2], out_dir)
    data = run_data(args, first)
    benches: list[Bench] = []
    trainers = {}
    for key in args.methods:
        method, variant, entry = RUNNER_METHODS[key]
        info = {"method": method, "variant": variant, "config": _jsonable(entry)}
        try:
            tr = build_trainer(args, key, data, out_dir)
        except Exception as exc:  # noqa: BLE001 - a method the runner refuses is a result
            benches.append(Bench(key, "runner", lambda: None, 1, info, error=f"{type(exc).__name__}: {exc}"))
            continue
        trainers[key] = tr
        counter = iter(range(10**9))
        info.update(
            optimizer=type(tr.opt).__name__, opt_args={k: _jsonable(v) for k, v in tr.opt_args.items()}
        )
        benches.append(
            Bench(key, "runner", lambda tr=tr, c=counter: tr._train_epoch(next(c)), tr.steps_per_epoch, info)
        )
    ref = trainers.get("sgd") or next(iter(trainers.values()))
    x, y = ref.x_train, ref.y_train  # on the device, float32
    gen = torch.Generator().manual_seed(args.seed)
    aug = None
    if spec["aug"] == "crop_flip":
        aug = lambda xb: random_crop_flip(xb, spec["pad"], 0.5, generator=gen)  # noqa: E731
    plain: list[Bench] = []
    for key, step in (("minimal-sgd", minimal_sgd_step), ("one-file-sam", one_file_sam_step)):
        model = model_factory(spec["name"], seed=args.seed, **spec["kwargs"]).to(x.device, torch.float32)
        opt = torch.optim.SGD(model.parameters(), lr=LR, **SGD_DEFAULTS)
        model.train()
        loop = PlainLoop(x, y, ref.batch_size, aug, lambda xb, yb, m=model, o=opt, s=step: s(m, o, xb, yb))
        method, variant = PLAIN[key]
        row_info = {"method": method, "variant": variant, "optimizer": "SGD"}
        plain.append(Bench(key, "plain", loop.epoch, loop.steps_per_epoch, row_info))
    benches = plain + benches
    info = {
        "train_size": len(y),
        "batch_size": ref.batch_size,
        "steps_per_epoch": ref.steps_per_epoch,
        "params": sum(p.numel() for p in ref.model.parameters()),
        "trainers": trainers,
    }
    return benches, info


def time_benches(benches: list[Bench], args, spe: int) -> None:
    warm = max(1, math.ceil(args.warmup / spe)) if args.warmup > 0 else 0
    timed = max(1, math.ceil(args.steps / spe))
    live = [b for b in benches if b.error is None]
    for b in live:  # first warm-up: allocations, lazy optimizer state, the batched path's tracing
        _guarded(b, lambda b=b: b.run(max(1, warm), args.device, timed=False))

    def one_round(b: Bench) -> None:
        if warm:
            b.run(warm, args.device, timed=False)
        b.run(timed, args.device, timed=True)

    for r in range(args.rounds):
        for b in [b for b in live if b.error is None]:
            _guarded(b, lambda b=b: one_round(b))
        print(f"  round {r + 1}/{args.rounds} done", flush=True)
    args.timed_epochs, args.warmup_epochs = timed, warm


def _guarded(b: Bench, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - e.g. a diverged run: reported, the others go on
        b.error = f"{type(exc).__name__}: {exc}"
        b.step_ms.clear()
        b.epoch_ms.clear()


# ------------------------------------------------------------------------------------ rows
def make_rows(benches: list[Bench], trainers: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for b in benches:
        row: dict[str, Any] = {"key": b.key, "harness": b.harness, **{k: v for k, v in b.info.items()}}
        tr = trainers.get(b.key)
        if tr is not None:
            cfg = getattr(tr.inner, "config", None)
            row["m"] = getattr(tr.inner, "m", 1)
            row["m_sharpness"] = cfg.get("m_sharpness") if isinstance(cfg, dict) else None
            engine = getattr(tr.inner, "per_example", None)
            if engine is not None:  # VOGN: its per-example gradient method and why (issue 41)
                row["mc_samples"] = tr.inner.mc_samples
                row["per_example"] = engine.config()
        if b.error is not None or not b.step_ms:
            row["error"] = b.error or "not timed"
        else:
            row.update(
                step_ms=statistics.median(b.step_ms),
                steps_per_s=1e3 / statistics.median(b.step_ms),
                epoch_ms=statistics.median(b.epoch_ms),
                min_step_ms=min(b.step_ms),
                step_ms_runs=list(b.step_ms),
                epoch_ms_runs=list(b.epoch_ms),
            )
        rows.append(row)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Every ratio from the recorded medians (``step_ms`` / ``epoch_ms``) of two rows of the run."""
    by = {r["key"]: r for r in rows if r.get("step_ms")}

    def ratio(a: str, b: str, key: str = "step_ms") -> float | None:
        return by[a][key] / by[b][key] if a in by and b in by else None

    for k, r in by.items():
        r["x_minimal_sgd"] = ratio(k, "minimal-sgd")
        r["x_runner_sgd"] = ratio(k, "sgd")
        r["epoch_x_minimal_sgd"] = ratio(k, "minimal-sgd", "epoch_ms")
        if k in ONE_FILE_PEERS:
            r["x_one_file_sam"] = ratio(k, "one-file-sam")
        if k.endswith("-m8") or k.endswith("-m8-loop"):
            r["x_m1"] = ratio(k, k.split("-m8")[0])
        if k.endswith("-m8"):
            r["batched_x_loop"] = ratio(k, f"{k}-loop")
        if k in COMPILED:
            r["x_eager"] = ratio(k, COMPILED[k])
        if r.get("mc_samples") and r["x_runner_sgd"] is not None:  # VOGN's step per weight sample
            r["step_ms_per_mc_sample"] = r["step_ms"] / r["mc_samples"]
            r["per_mc_sample_x_runner_sgd"] = r["x_runner_sgd"] / r["mc_samples"]


def summarize(rows: list[dict[str, Any]], device: str = "cpu", model: str | None = None) -> dict[str, Any]:
    """Issue 25's targets for this device type on the ratio of the medians (pass/fail), with the
    median over the rounds of the per-round ratio beside it (the two rows ran in the same round);
    issue 41's VOGN target for ``model`` (:data:`VOGN_TARGETS`) on the step per MC sample."""
    by = {r["key"]: r for r in rows if r.get("step_ms")}
    targets = []
    specs = list(TARGETS)
    if model in VOGN_TARGETS:
        limit = VOGN_TARGETS[model]
        specs.append(
            (f"vogn_per_mc_sample_le_{limit:g}x_sgd_{model}", "vogn", "sgd", "step_ms", limit, "cpu")
        )
    for name, a, b, key, limit, kind in specs:
        if kind != torch.device(device).type:
            continue
        entry: dict[str, Any] = {"target": name, "numerator": a, "denominator": b, "of": key, "limit": limit}
        if a in by and b in by:
            per = (by[a].get("mc_samples") or 1) if name.startswith("vogn_per_mc_sample") else 1
            runs = zip(by[a][f"{key}_runs"], by[b][f"{key}_runs"])
            value = by[a][key] / by[b][key] / per
            entry.update(
                ratio=value,
                ratio_paired=statistics.median(x / y / per for x, y in runs),
                **{"pass": value <= limit},
            )
            if per != 1:
                entry["per"] = f"{per} MC samples"
        else:
            entry.update(ratio=None, ratio_paired=None, **{"pass": None})
        targets.append(entry)
    decided = [t["pass"] for t in targets if t["pass"] is not None]
    return {"targets": targets, "all_pass": all(decided) if decided else None}


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    cols = ["method", "variant", "harness", "m_sharpness", "step_ms", "steps_per_s", "epoch_ms"]
    cols += ["x_minimal_sgd", "x_runner_sgd", "x_one_file_sam", "x_m1", "batched_x_loop", "x_eager", "error"]
    shown = [{**r, "error": r["error"][:80]} if r.get("error") else r for r in rows]  # full text in the JSON
    table = format_table(shown, [c for c in cols if any(r.get(c) is not None for r in rows)])
    lines = ["| " + ln + " |" for ln in table.splitlines()]
    lines += [
        "",
        "| target | ratio (of medians) | median per-round ratio | limit | result |",
        "|---|---|---|---|---|",
    ]

    def fmt(v: float | None) -> str:
        return "" if v is None else f"{v:.3g}"

    for t in summary["targets"]:
        res = {True: "pass", False: "FAIL", None: "not measured"}[t["pass"]]
        lines.append(
            f"| {t['target']} | {fmt(t['ratio'])} | {fmt(t['ratio_paired'])} | {t['limit']} | {res} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ main
def parse(argv: list[str] | None = None):
    ap = base_argparser(__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=list(MODELS))
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (5; quick 3)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per method and round (50; quick 10)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps before them (10; quick 5)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--train-size", type=int, default=0, help="random-data models: examples (10 batches)")
    ap.add_argument("--methods", default=None, help=f"comma-separated subset of {','.join(RUNNER_METHODS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="result file name (default training_<model>_<device>)")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.steps = args.steps or (10 if args.quick else 50)
    args.warmup = (5 if args.quick else 10) if args.warmup is None else args.warmup
    keys = [k.strip() for k in (args.methods or ",".join(RUNNER_METHODS)).split(",") if k.strip()]
    unknown = [k for k in keys if k not in RUNNER_METHODS]
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {','.join(RUNNER_METHODS)}")
    args.methods = list(dict.fromkeys(["sgd", *keys]))  # the runner's SGD is every ratio's reference
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0 or args.batch_size < 8:
        ap.error("--rounds and --steps must be >= 1, --warmup >= 0, --batch-size >= 8")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse(argv)
    threads = torch.get_num_threads()
    is_cpu = torch.device(args.device).type == "cpu"
    args.threads = args.threads or (1 if is_cpu else threads)  # recorded in the JSON's config
    torch.set_num_threads(args.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_training_") as tmp:
            return _run(args, Path(tmp))
    finally:
        torch.set_num_threads(threads)


def _run(args, tmp: Path) -> Path:
    t0 = time.perf_counter()
    benches, info = make_benches(args, tmp)
    trainers = info.pop("trainers")
    spe = info["steps_per_epoch"]
    print(f"{args.model} on {args.device}: {info}", flush=True)
    time_benches(benches, args, spe)
    rows = make_rows(benches, trainers)
    summary = summarize(rows, args.device, args.model)
    machine = machine_info()
    machine["loadavg_1_5_15"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    kind = torch.device(args.device).type
    name = args.name or f"training_{args.model}_{kind}{'_quick' if args.quick else ''}"
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config.update(info, model_spec=MODELS[args.model], dtype="float32", lr=LR, sgd=SGD_DEFAULTS)
    config["timed_steps_per_round"] = args.timed_epochs * spe
    config["warmup_steps_per_round"] = args.warmup_epochs * spe
    payload = {
        "benchmark": name,
        "when": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "config": config,
        "rows": rows,
        "summary": summary,
        "seconds": time.perf_counter() - t0,
    }
    print("\n" + markdown(rows, summary))
    path = atomic_write_json(Path(args.out) / f"{name}.json", payload)
    print(f"\nwrote {path}")
    return path


if __name__ == "__main__":
    main()
