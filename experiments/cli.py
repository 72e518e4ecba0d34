"""``python -m experiments run CONFIG [key=value ...]``, ``python -m experiments table RUN_DIRS...`` and
``python -m experiments figure NAME RUN_DIRS... --out DIR`` (:mod:`experiments.paper_figures`).

Every failure ends in one ``error: <what> — <how to fix>`` line on stderr (``--debug`` adds the
traceback) and an exit status: 2 for a bad command line or configuration (unknown key, method or
model, wrong type), 1 for a failure while running (missing data directory), 130 / 143
when interrupted (Ctrl-C / SIGTERM; the run is checkpointed at the step it stopped, or at its last
epoch, and the same command resumes).

A run that diverges (:mod:`experiments.divergence`: non-finite loss, weights or predictions, or a
training loss above ``train.divergence_factor`` times the initial one) does not stop the sweep: it
is recorded (``results.json`` with ``status = "diverged"``) and ``run`` goes on with the next runs,
prints the table of the finished ones, one ``diverged: <run dir>: <reason> ...`` line per diverged
run on stderr and ends with ``error: N of M runs diverged`` and exit status 3. Running the same
command again trains nothing anew for those runs (their result is kept) and exits with 3 again.
``table`` does not average them (see :mod:`experiments.table`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.cluster import Work, parse_shard, pending_work, shard, submit
from experiments.config import ConfigError, load_config
from experiments.divergence import DivergenceRecord
from experiments.estimate import device_name, estimate_runs, format_estimate
from experiments.paper_figures import FIGURES, make_figure
from experiments.parallel import from_environment
from experiments.runner import completed, plan_entries, plan_runs, resolve_device, run_one, run_task, validate
from experiments.status import format_status, missing_runs, run_states, write_plan
from experiments.sweep_plot import numbers_path
from experiments.table import aggregate, collect_runs, format_table, plot_table, write_text
from experiments.toml_writer import dumps
from landscape.cli_common import (
    CliError,
    Parser,
    TaskProgress,
    Terminated,
    UsageError,
    add_debug_option,
    check_figure,
    check_outputs,
    check_path,
    note,
    run_cli,
)
from sharpscape.resources import format_config_list, resolve_config, wrong_config

__all__ = ["FIGURE_NAMES", "main"]

#: the figures of ``figure NAME`` (:mod:`experiments.paper_figures`)
FIGURE_NAMES = tuple(FIGURES)


def _parser(prog: str = "python -m experiments") -> Parser:
    """The parser; ``prog`` names the program in usage and errors (``sharpscape`` passes its own)."""
    parser = Parser(
        prog=prog,
        description="Run the experiments of a TOML config and tabulate their results.",
    )
    add_debug_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="train and evaluate every run of a config (resumable)",
        epilog="exit status: 0 all runs finished, 1 a failure, 2 a bad config or command line, "
        "3 some runs diverged (recorded; the others finished), 130 / 143 interrupted",
    )
    run.add_argument(
        "config",
        nargs="?",
        help="TOML config file, or the name of an example config installed with the package "
        "(digits_sam_vs_sgd, miniatures/label_noise, ...: see --list-configs)",
    )
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. train.epochs=3 seeds=[0,1] budget=0.05 "
        "methods.sam.hyperparameters.rho=0.1",
    )
    run.add_argument(
        "--dry-run", action="store_true", help="print the resolved config and the run directories"
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.add_argument(
        "--list-configs",
        action="store_true",
        help="list the example configs installed with the package (their names work as CONFIG) and stop",
    )
    run.add_argument(
        "--estimate",
        action="store_true",
        help="time a few training steps and one evaluation of each method on this device and print the "
        "projected time of the full protocol (writes nothing)",
    )
    run.add_argument(
        "--estimate-steps",
        type=int,
        default=20,
        metavar="K",
        help="--estimate: timed steps per method, after 3 warm-up steps (default 20)",
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run only the I-th of N disjoint shares of the grid (0 <= I < N: runs I, I+N, I+2N, ... in the "
        "grid's order); N processes (a plain shell loop, another scheduler's array job) together run every "
        "run once, with the results of one process",
    )
    run.add_argument(
        "--slurm",
        action="store_true",
        help="submit every run without a result as one task of a Slurm job array (through submitit) and "
        "return; settings from the config's [slurm] table or slurm.KEY=VALUE overrides (partition, time in "
        "minutes per task, cpus_per_task, gpus_per_task, mem_gb, account, qos, max_requeues, "
        "sbatch = {...}); "
        "a task stopped by its time limit or a preemption checkpoints and is requeued; see `status`",
    )
    add_debug_option(run)
    run.intermixed = "overrides"  # options may stand among the overrides: a=1 --no-progress b=2
    table = sub.add_parser("table", help="mean ± std over seeds per method and metric")
    table.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories or directories above them")
    table.add_argument(
        "--format",
        choices=("markdown", "csv", "json"),
        default="markdown",
        help="output format (default: markdown)",
    )
    table.add_argument("--out", help="write the table to this file (atomically) instead of stdout")
    table.add_argument(
        "--plot",
        help="also write a figure (.png, .pdf, .svg, ...) and its numbers (NAME.plot.json beside it): the "
        "metric against the swept value, one line per method, for a 1-D sweep; a heat map of the mean "
        "per method for a 2-D sweep; otherwise a bar chart with error bars",
    )
    table.add_argument(
        "--stderr",
        action="store_true",
        help="show the standard error (std / sqrt(n)) beside the std in Markdown cells and draw it as "
        "the plot's error bars (CSV and JSON always have it)",
    )
    table.add_argument("--metrics", help="comma-separated metrics to show (default: all)")
    table.add_argument(
        "--strict",
        action="store_true",
        help="refuse runs of one method whose settings (config.toml, all but the seed) differ, instead of "
        "giving each setting its own row",
    )
    add_debug_option(table)
    table.intermixed = "runs"
    status = sub.add_parser(
        "status",
        help="where each run of a grid stands: done, diverged, failed (error, log), running (epoch, time "
        "left), queued, stopped, not started",
        description="Where each planned run under RUN_DIR stands (experiments.status): done, diverged, "
        "failed (its error line and log file), running (epoch and the time left at the mean epoch time), "
        "queued (a Slurm task waiting), stopped (a checkpoint and no runner: the same command resumes it) "
        "or not started, and what is left. Asks squeue where a Slurm scheduler answers.",
    )
    status.add_argument("runs", nargs="+", metavar="RUN_DIR", help="out_dir/NAME of a run, a study's --out")
    status.add_argument("--format", choices=("text", "json"), default="text", help="output (default: text)")
    add_debug_option(status)
    figure = sub.add_parser(
        "figure",
        help="a paper figure from run directories: fsam_fig4, flatbnn_fig1, flatbnn_fig2 (PNG + JSON)",
        description="Make one of the papers' figures that come from trained runs "
        "(experiments.paper_figures): fsam_fig4 (Fisher-SAM Fig. 4, needs the perturbation_robustness "
        "sharpness measure), flatbnn_fig1 (flat-BNN Fig. 1, needs runs with a swag table), flatbnn_fig2 "
        "(flat-BNN Fig. 2, reliability diagrams). Writes OUT/NAME.png and OUT/NAME.json.",
    )
    figure.add_argument("name", metavar="NAME", choices=FIGURE_NAMES, help=", ".join(FIGURE_NAMES))
    figure.add_argument(
        "runs", nargs="*", metavar="RUN_DIR", help="run directories or directories above them"
    )
    figure.add_argument(
        "--runs", dest="more_runs", action="append", metavar="DIR", help="more run directories (repeatable)"
    )
    figure.add_argument("--out", required=True, help="directory for NAME.png and NAME.json")
    figure.add_argument(
        "--predictive",
        choices=("auto", "bma", "point", "swa"),
        default="auto",
        help="flatbnn_fig2: which predictions (default auto: the model average when the runs have one)",
    )
    figure.add_argument(
        "--measure", help="fsam_fig4: the sharpness label (default: the perturbation_robustness row)"
    )
    figure.add_argument(
        "--samples", type=int, default=2, help="flatbnn_fig1: models sampled per run (default 2)"
    )
    figure.add_argument(
        "--grid", type=int, default=11, help="flatbnn_fig1: points per axis, odd (default 11)"
    )
    figure.add_argument(
        "--span", type=float, default=1.0, help="flatbnn_fig1: coordinates in [-span, span] (default 1)"
    )
    figure.add_argument(
        "--subset", type=int, default=256, help="flatbnn_fig1: training examples of the loss (default 256)"
    )
    figure.add_argument(
        "--seed", type=int, default=0, help="flatbnn_fig1: seed of the posterior samples (default 0)"
    )
    figure.add_argument(
        "--direction-seed",
        type=int,
        default=0,
        help="flatbnn_fig1: seed of the random directions (default 0)",
    )
    figure.add_argument("--device", default="cpu", help="flatbnn_fig1: cpu, cuda, auto (default cpu)")
    figure.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_debug_option(figure)
    figure.intermixed = "runs"
    return parser


def _run(args: Any) -> int:
    if args.list_configs:
        print(format_config_list(args.prog), end="")
        return 0
    if args.config is None:
        raise UsageError(
            "the following arguments are required: config",
            f"give a TOML file or an example config's name (`{args.prog} run --list-configs`)",
        )
    args.config = resolve_config(args.config)
    check_path(
        args.config,
        "config",
        read=True,
        missing_fix="give the path of a TOML config, e.g. configs/digits_sam_vs_sgd.toml, or the name of "
        f"an installed example config (`{args.prog} run --list-configs`)",
    )
    wrong = wrong_config(args.config, "run", args.prog)
    if wrong:
        raise UsageError(*wrong)
    if args.estimate and args.dry_run:
        raise UsageError("--estimate and --dry-run cannot be combined", "give one of them")
    if args.estimate_steps < 1:
        raise UsageError(
            f"--estimate-steps must be >= 1, got {args.estimate_steps}", "e.g. --estimate-steps 20"
        )
    try:
        cfg = load_config(args.config, args.overrides)
        runs = plan_runs(cfg)
        if not args.estimate:  # --estimate checks each (variant, method) and reports its error in its row
            validate(runs)
    except ConfigError as exc:
        raise UsageError(str(exc), "fix the config file or the key=value override") from None
    if args.shard is not None and args.slurm:
        raise UsageError(
            "--shard and --slurm cannot be combined", "--slurm submits every run as a task of its own"
        )
    if args.shard is not None:
        try:
            runs = shard(runs, *parse_shard(args.shard))
        except ValueError as exc:
            what, _, fix = str(exc).partition(" — ")
            raise UsageError(what, fix) from None
    if args.dry_run:
        print(dumps(cfg), end="")
        for r in runs:
            print(f"# run: {r.run_dir}")
        return 0
    if args.slurm:
        return _submit(args, cfg, runs)
    try:
        device = resolve_device(cfg["device"])
    except ValueError as exc:
        raise UsageError(str(exc), 'set device = "auto", "cpu" or "cuda"') from None
    if cfg["threads"]:
        import torch

        torch.set_num_threads(cfg["threads"])
    if args.estimate:
        return _estimate(runs, device, args.estimate_steps)
    _write_plan(cfg, plan_runs(cfg))
    ctx = from_environment(cfg["distributed"], device)
    mine = ctx.my_runs(runs)
    progress = cfg["progress"] and not args.no_progress
    rows, diverged = [], []
    try:
        overall = TaskProgress(len(mine), "run")
        for r in mine:
            if ctx.is_main:
                overall.begin(str(r.run_dir))
            metrics = run_one(r, device=device, ctx=ctx, progress=progress)
            if ctx.is_main:  # the other ranks of a data-parallel run note nothing
                overall.end()
            if metrics.get("status") == "diverged":
                diverged.append((r, metrics.get("divergence", {})))
                continue
            rows.append(
                {"method": r.method, "seed": r.seed, "variant": r.variant, "_dir": str(r.run_dir), **metrics}
            )
    except ConfigError as exc:
        raise UsageError(str(exc), "fix the config file or the key=value override") from None
    except Terminated:
        raise CliError(
            "terminated by SIGTERM",
            "the run is checkpointed at the step it stopped; run the same command again to resume",
            status=143,
        ) from None
    except KeyboardInterrupt:
        raise CliError(
            "interrupted (Ctrl-C)",
            "the epochs completed so far are checkpointed (and the step, if it stopped between two); run "
            "the same command again to resume",
            status=130,
        ) from None
    finally:
        ctx.close()
    if ctx.is_main and rows:
        shown = [
            k for k in rows[0] if k not in ("method", "seed", "variant", "_dir") and not k.startswith("c10c_")
        ]
        print(format_table(aggregate(rows, shown[:8])), end="")
    if diverged and ctx.is_main:
        _report_diverged(diverged, len(mine))
    return 0


def _write_plan(cfg: dict[str, Any], runs: list[Any]) -> Path:
    """Check the output paths and write ``plan.json`` of the whole grid (:mod:`experiments.status`)."""
    check_path(cfg["out_dir"], "out_dir", "directory")
    for r in runs:  # a file where one of its run directories (out_dir/NAME/...) would be
        check_path(r.run_dir, "run directory", "directory")
    root = Path(cfg["out_dir"]) / cfg["name"]
    write_plan(root, plan_entries(runs, root))
    return root


def _submit(args: Any, cfg: dict[str, Any], runs: list[Any]) -> int:
    """``run --slurm``: one job-array task per run without a result (:mod:`experiments.cluster`)."""
    root = _write_plan(cfg, runs)
    works = [
        Work(
            r.run_dir,
            run_task,
            (r,),
            label=str(r.run_dir.relative_to(root)),
            max_requeues=r.cfg["slurm"]["max_requeues"],
        )
        for r in runs
    ]
    by_dir = {r.run_dir: r for r in runs}
    todo, notes = pending_work(works, lambda w: completed(by_dir[w.run_dir]) is not None)
    for text in notes:
        note(text)
    if not todo:
        note(f"nothing to submit: every run of {root} has its result or a task in the queue")
        return 0
    try:
        ids = submit(todo, cfg["slurm"], root / "slurm", name=cfg["name"])
    except ValueError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise UsageError(what, fix) from None
    except RuntimeError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise CliError(what, fix, status=1) from None
    array = ids[0].split("_")[0]
    note(
        f"submitted {len(ids)} of {len(runs)} runs as Slurm job array {array} (logs in {root / 'slurm'}); "
        f"`{args.prog} status {root}` shows where they stand, `{args.prog} table {root}` collects them"
    )
    return 0


def _status(args: Any) -> int:
    for path in args.runs:
        check_path(path, "RUN_DIR", "any", read=True, missing_fix=f"give the out_dir of `{args.prog} run`")
    try:
        states = run_states(args.runs)
    except ValueError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise UsageError(what, fix) from None
    print(format_status(states, args.format), end="")
    return 0


def _estimate(runs: list[Any], device: Any, steps: int) -> int:
    """``--estimate``: the projected time of every run (:mod:`experiments.estimate`); writes nothing."""
    note(f"estimating {len(runs)} runs: {steps} timed steps per (variant, method) on {device}")
    estimates = estimate_runs(runs, device=device, steps=steps)
    print(format_estimate(estimates, device_name(device), steps=steps), end="")
    if estimates and all(e.error is not None for e in estimates):
        raise CliError("no method could be estimated", "see the error in each row of the table", status=1)
    return 0


def _report_diverged(diverged: list[tuple[Any, dict[str, Any]]], total: int) -> None:
    """One ``diverged:`` line per run on stderr, then exit status 3 (see the module docstring)."""
    sys.stdout.flush()
    for r, rec in diverged:
        known = {k: v for k, v in rec.items() if k in DivergenceRecord.__dataclass_fields__}
        text = DivergenceRecord(**{"reason": "diverged", **known}).describe()
        print(f"diverged: {r.run_dir}: {text}", file=sys.stderr, flush=True)
    raise CliError(
        f"{len(diverged)} of {total} runs diverged",
        "their results.json record where and why (the other runs finished); lower the learning rate "
        "or rho, or set train.divergence_factor (0 turns the growth check off) in a new out_dir",
        status=3,
    )


def _table(args: Any) -> int:
    for path in args.runs:
        wrong = wrong_config(path, "results", args.prog)
        if wrong:
            raise UsageError(*wrong)
        check_path(
            path,
            "RUN_DIR",
            "any",
            read=True,
            missing_fix=f"give run directories written by `{args.prog} run`",
        )
    check_path(args.out, "--out")
    check_figure(args.plot, "--plot")
    try:
        rows = collect_runs(args.runs)
    except (FileNotFoundError, ValueError) as exc:
        what, _, fix = str(exc).partition(" — ")
        raise UsageError(what, fix or f"give run directories written by `{args.prog} run`") from None
    dirs = dict.fromkeys(r["_dir"] for r in rows)
    _note_missing(args.runs, set(dirs), args.prog)
    numbers = str(numbers_path(args.plot)) if args.plot else None
    check_outputs(
        {"--out": args.out, "--plot": args.plot, "--plot's numbers": numbers},
        input_dirs=[("run directory", d) for d in dirs],
    )
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    if metrics:
        known = {k for r in rows for k in r if not k.startswith("_")}
        bad = [m for m in metrics if m not in known]
        if bad:
            raise UsageError(
                f"--metrics: unknown metric(s) {bad}",
                f"choose among {sorted(known - {'method', 'seed', 'variant'})}",
            )
    try:
        entries = aggregate(rows, metrics, strict=args.strict)
    except ValueError as exc:
        raise UsageError(str(exc), "drop --strict to give each setting its own row") from None
    text = format_table(entries, args.format, stderr=args.stderr)
    if args.out:
        write_text(args.out, text)
        note(f"table written to {args.out}")
    else:
        print(text, end="")
    if args.plot:
        plot_table(entries, args.plot, metrics, error="stderr" if args.stderr else "std")
        note(f"figure written to {args.plot}, its numbers to {numbers}")
    return 0


def _note_missing(paths: list[str], have: set[str], prog: str) -> None:
    """Say which planned runs (``plan.json``, :mod:`experiments.status`) the table still lacks."""
    missing = missing_runs(paths, have)
    if not missing:
        return
    counts: dict[str, int] = {}
    for m in missing:
        counts[m.state] = counts.get(m.state, 0) + 1
    how = ", ".join(f"{n} {state}" for state, n in counts.items())
    shown = ", ".join(m.label for m in missing[:8]) + (", ..." if len(missing) > 8 else "")
    note(
        f"the table lacks {len(missing)} planned run{'s' if len(missing) > 1 else ''} ({how}): {shown}; "
        f"`{prog} status "
        f"{' '.join(paths)}` says more"
    )


def _figure(args: Any) -> int:
    runs = list(args.runs) + list(args.more_runs or [])
    if not runs:
        raise UsageError("no run directories given", "give RUN_DIR ... or --runs DIR")
    for path in runs:
        check_path(
            path,
            "RUN_DIR",
            "any",
            read=True,
            missing_fix=f"give run directories written by `{args.prog} run`",
        )
    check_path(args.out, "--out", "directory")
    if args.name == "fsam_fig4":
        options: dict[str, Any] = {"measure": args.measure}
    elif args.name == "flatbnn_fig2":
        options = {"predictive": args.predictive}
    else:
        try:
            device = resolve_device(args.device)
        except ValueError as exc:
            raise UsageError(str(exc), "give --device cpu, cuda or auto") from None
        options = dict(
            samples=args.samples,
            grid=args.grid,
            span=args.span,
            subset=args.subset,
            seed=args.seed,
            direction_seed=args.direction_seed,
            device=device,
            progress=not args.no_progress,
        )
    try:
        png, js = make_figure(args.name, runs, args.out, **options)
    except ValueError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise UsageError(
            what, fix or "see the figure's requirements: python -m experiments figure --help"
        ) from None
    note(f"figure written to {png} (numbers and configuration in {js})")
    return 0


def _main(argv: list[str], prog: str = "python -m experiments") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    args.prog = prog
    if args.command == "run":
        return _run(args)
    if args.command == "table":
        return _table(args)
    if args.command == "figure":
        return _figure(args)
    if args.command == "status":
        return _status(args)
    parser.print_help()
    print("error: no command given — choose one of: run, table, status, figure", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None, prog: str = "python -m experiments") -> int:
    """Run a command; returns 0, or raises ``SystemExit`` with the status after one error line.
    ``prog`` names the program in usage and errors (``sharpscape`` passes its own)."""
    return run_cli(lambda args: _main(args, prog), argv)
