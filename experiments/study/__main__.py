"""``python -m experiments.study run CONFIG --out DIR`` and ``python -m experiments.study report DIR``.

Every failure ends in one ``error: <what> — <how to fix>`` line on stderr (``--debug`` adds the
traceback). ``run --jobs N`` trains and measures N members at a time in worker processes. Each
member is a run of the experiment runner under ``DIR/runs/`` (``config.toml`` there repeats it with
``python -m experiments run``). ``run`` is resumable: a member whose result file exists with the
same configuration is skipped, an interrupted member resumes from its last epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.cluster import parse_shard
from experiments.study.config import load_study_config
from experiments.study.population import member_runs, run_population, submit_population
from experiments.study.report import write_report
from landscape.cli_common import (
    CliError,
    Parser,
    Terminated,
    UsageError,
    add_debug_option,
    check_figure,
    check_outputs,
    check_path,
    note,
    run_cli,
)
from sharpscape.resources import resolve_config, wrong_config

__all__ = ["interrupted_error", "kept_files", "main"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def kept_files(out_dir: str | Path) -> tuple[int, int]:
    """``(finished members, checkpoints of unfinished members)`` in a study's output directory:
    ``models/<id>.json`` files, and ``runs/<id>/.../checkpoint.pt`` files of members without one."""
    out = Path(out_dir)
    done = {p.stem for p in (out / "models").glob("*.json")} if (out / "models").is_dir() else set()
    runs = out / "runs"
    ckpts = [p for p in runs.glob("*/**/checkpoint.pt") if p.relative_to(runs).parts[0] not in done]
    return len(done), len(ckpts)


def interrupted_error(out_dir: str | Path, sigterm: bool) -> CliError:
    """The one-line error of a study run stopped by SIGTERM (143) or Ctrl-C (130), saying what was
    kept in ``out_dir`` (finished members and checkpoints) and that the same command resumes."""
    finished, ckpts = kept_files(out_dir)
    how = "terminated by SIGTERM" if sigterm else "interrupted (Ctrl-C)"
    if finished or ckpts:
        whose = "an unfinished member" if ckpts == 1 else "unfinished members"
        kept = (
            f"kept in {out_dir}: {_plural(finished, 'finished model')} (models/*.json) and "
            f"{_plural(ckpts, 'checkpoint')} of {whose} (runs/<id>/.../checkpoint.pt)"
        )
        fix = (
            "run the same command again to resume: finished models are not trained again, an "
            "unfinished member resumes from its last epoch"
        )
    else:
        kept = f"nothing finished yet in {out_dir} (no model result, no checkpoint)"
        fix = "run the same command again"
    return CliError(f"{how}; {kept}", fix, status=143 if sigterm else 130)


def _parser(prog: str = "python -m experiments.study") -> Parser:
    parser = Parser(prog=prog, description="Does flatness predict generalisation?")
    add_debug_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="train and measure the population of a study config (resumable)")
    run.add_argument(
        "config",
        help="study TOML file, e.g. configs/study_digits.toml, or the name of an installed example "
        "config (study_digits; see `sharpscape run --list-configs`)",
    )
    run.add_argument(
        "--out", required=True, help="output directory (runs/, models/<id>.json, tables, figure)"
    )
    run.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="members trained and measured at a time, in worker processes of `threads` threads each "
        "(default 1: in this process); the results do not depend on it",
    )
    run.add_argument(
        "overrides",
        nargs="*",
        metavar="slurm.KEY=VALUE",
        help="settings of the [slurm] table for --slurm, e.g. slurm.time=120 slurm.partition=gpu",
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="train and measure only the I-th of N disjoint shares of the members (0 <= I < N); run "
        "`report` when every share is done",
    )
    run.add_argument(
        "--slurm",
        action="store_true",
        help="submit every member without a result as one task of a Slurm job array (through submitit) "
        "and return; `sharpscape status DIR` shows the queue, `report` tabulates the members when done",
    )
    run.add_argument("--dry-run", action="store_true", help="list the members' run directories and stop")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-report", action="store_true", help="skip the correlation report at the end")
    add_debug_option(run)
    run.intermixed = "overrides"
    rep = sub.add_parser("report", help="correlation tables and figure of a finished (or partial) study")
    rep.add_argument("dir", help="the --out directory of a run")
    rep.add_argument("--figure", help="also write the figure here (.png, .pdf, .svg, ...)")
    rep.add_argument("--json", help="also write the correlation JSON here")
    rep.add_argument("--csv", help="also write the per-model table (population.csv) here")
    rep.add_argument("--markdown", help="also write the correlation tables (correlation.md) here")
    rep.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    rep.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    add_debug_option(rep)
    return parser


def _submit(cfg: dict[str, Any], out: str, prog: str) -> int:
    """``run --slurm``: one job-array task per member without a result (:mod:`experiments.cluster`)."""
    try:
        ids, n = submit_population(cfg, out, log=note)
    except ValueError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise UsageError(what, fix or "fix the [slurm] settings") from None
    except RuntimeError as exc:
        what, _, fix = str(exc).partition(" — ")
        raise CliError(what, fix, status=1) from None
    if not ids:
        note(f"nothing to submit: every member in {out} has its result or a task in the queue")
        return 0
    status = prog.replace("study", "status") if prog.endswith(" study") else "python -m experiments status"
    note(
        f"submitted {len(ids)} of {n} members as Slurm job array {ids[0].split('_')[0]} (logs in "
        f"{Path(out) / 'slurm'}); `{status} {out}` shows where they stand, `{prog} report {out}` "
        "tabulates them when done"
    )
    return 0


def _main(argv: list[str], prog: str = "python -m experiments.study") -> int:
    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.command == "run":
        config = resolve_config(args.config)
        check_path(
            config,
            "config",
            read=True,
            missing_fix="give a study TOML file, e.g. configs/study_digits.toml, or the name of an "
            "installed example study config (study_digits)",
        )
        wrong = wrong_config(config, "study", prog)
        if wrong:
            raise UsageError(*wrong)
        check_path(args.out, "--out", "directory")
        if args.jobs < 1:
            raise UsageError(f"--jobs must be a positive integer, got {args.jobs}", "use --jobs 1 or more")
        if args.slurm and (args.shard is not None or args.jobs != 1):
            raise UsageError(
                "--slurm cannot be combined with --shard or --jobs", "--slurm submits every member as a task"
            )
        try:
            shares = parse_shard(args.shard) if args.shard is not None else None
            cfg = load_study_config(config, args.overrides)
        except ValueError as exc:
            what, _, fix = str(exc).partition(" — ")
            raise UsageError(what, fix or "fix the study config") from None
        members = member_runs(cfg, args.out)
        pops = cfg["populations"]
        of = f" in {pops} populations" if pops > 1 else ""
        note(f"{len(members)} models{of} ({cfg['sampling']} sampling) -> {args.out}")
        if args.dry_run:
            for _, run in members:
                print(run.run_dir)
            return 0
        if args.slurm:
            return _submit(cfg, args.out, prog)
        try:
            run_population(
                cfg, args.out, progress=not args.no_progress, log=note, jobs=args.jobs, shares=shares
            )
            if shares is not None:
                note(f"share {args.shard} done; `{prog} report {args.out}` once every share is done")
            elif not args.no_report:
                doc = write_report(args.out)
                print(doc["markdown"], end="")
                note(f"tables and figure written to {args.out}")
        except KeyboardInterrupt as exc:
            raise interrupted_error(args.out, isinstance(exc, Terminated)) from None
        return 0
    if args.command == "report":
        wrong = wrong_config(args.dir, "results", prog)
        if wrong:
            raise UsageError(*wrong)
        check_path(
            args.dir, "DIR", "directory", read=True, missing_fix=f"give the --out directory of `{prog} run`"
        )
        check_figure(args.figure, "--figure")
        for option in ("json", "csv", "markdown"):
            check_path(getattr(args, option), f"--{option}")
        if not (Path(args.dir) / "study_config.json").is_file():
            raise UsageError(
                f"DIR {args.dir} holds no study_config.json (not the --out directory of a study)",
                f"give the --out directory of `{prog} run CONFIG --out DIR`",
            )
        study = Path(args.dir)
        check_outputs(
            {f"--{option}": getattr(args, option) for option in ("figure", "json", "csv", "markdown")},
            [("study config", study / "study_config.json")],
            [("models directory", study / "models"), ("runs directory", study / "runs")],
        )  # fmt: skip
        doc = write_report(
            args.dir,
            figure=args.figure,
            json_path=args.json,
            csv_path=args.csv,
            markdown_path=args.markdown,
            samples=args.bootstrap,
            seed=args.seed,
        )
        print(doc["markdown"], end="")
        return 0
    parser.print_help()
    raise UsageError("no command given", "choose one of: run, report")


PROG = "python -m experiments.study"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run a command; returns 0, or raises ``SystemExit`` after one ``error:`` line. ``prog`` names
    the program in usage and errors (``sharpscape study`` passes its own)."""
    return run_cli(lambda args: _named(args, prog), argv)


def _named(argv: list[str], prog: str) -> int:
    """:func:`_main`, its library errors' advice in the program's own name (the report and member
    functions name ``python -m experiments.study``; ``sharpscape study`` is the same command)."""
    try:
        return _main(argv, prog)
    except ValueError as exc:
        if prog == PROG or PROG not in str(exc) or type(exc) is not ValueError:
            raise
        raise ValueError(str(exc).replace(PROG, prog)) from None


if __name__ == "__main__":
    raise SystemExit(main())
