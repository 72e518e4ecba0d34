"""``sharpscape COMMAND ...``: one command line for the toolkit (the ``sharpscape`` console script).

Each command is one of the packages' own command lines, which keep working as ``python -m ...``:

| command | the same as |
|---|---|
| `run` | `python -m experiments run CONFIG [key=value ...]` |
| `table` | `python -m experiments table RUN_DIR ...` |
| `status` | `python -m experiments status RUN_DIR ...` |
| `study` | `python -m experiments.study run ...`, `... report ...` |
| `figures` | `python -m toy_problems figures --out DIR` |
| `sharpness` | `python -m landscape sharpness ...` |
| `surface` | `python -m landscape surface ...` |
| `dashboard` | `streamlit run app/Home.py` on 127.0.0.1 (:mod:`sharpscape.dashboard`) |

``sharpscape figures NAME --runs DIR --out OUT`` with a NAME of :data:`RUN_FIGURES` (a figure from
trained runs) is ``python -m experiments figure NAME --runs DIR --out OUT``.

Each package's parser is built with ``prog="sharpscape"`` (``"sharpscape study"``), so usage and
error messages name ``sharpscape run``, ``sharpscape study report``, ... . The command's module is
imported only when the command runs: ``sharpscape --help`` and ``sharpscape dashboard`` do not
import torch. Errors end in one ``error: <what> — <how to fix>`` line on stderr (exit status 2 for
a bad command line; the commands' own statuses otherwise); ``--debug`` adds the traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "PROG", "RUN_FIGURES", "help_text", "main"]

PROG = "sharpscape"

#: command -> (module with ``main(argv, prog)``, arguments put before the user's, one-line help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "run": ("experiments.cli", ("run",), "train and evaluate every run of a TOML config (resumable)"),
    "table": (
        "experiments.cli",
        ("table",),
        "mean ± std over seeds per method and metric of run directories",
    ),
    "status": (
        "experiments.cli",
        ("status",),
        "where each run stands: done / running (epoch, time left) / queued / failed (error, log)",
    ),
    "study": ("experiments.study.__main__", (), "does flatness predict generalisation? (study run / report)"),
    "figures": ("toy_problems.__main__", ("figures",), "regenerate the papers' 2-D toy figures (PNG + JSON)"),
    "sharpness": ("landscape.cli", ("sharpness",), "sharpness measures of a saved model on a data set"),
    "surface": (
        "landscape.cli",
        ("surface",),
        "loss surface of a saved model along random directions (.npz)",
    ),
    "dashboard": ("sharpscape.dashboard", (), "start the Streamlit dashboard on this machine (127.0.0.1)"),
}


#: the figures made from run directories (``experiments.paper_figures``), which ``figures NAME``
#: hands to ``python -m experiments figure`` (listed here so that dispatching imports nothing)
RUN_FIGURES = ("fsam_fig4", "flatbnn_fig1", "flatbnn_fig2")


def help_text(prog: str = PROG) -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, _, text) in COMMANDS.items())
    return (
        f"usage: {prog} COMMAND [ARGS ...]\n\n"
        "Loss landscapes, sharpness and flat-minima optimizers.\n"
        f"`{prog} COMMAND --help` describes a command.\n\n"
        f"commands:\n{rows}\n\n"
        "options:\n"
        "  -h, --help  show this help and exit\n"
        "  --version   print the version and exit\n"
        "  --debug     on error, print the full traceback before the error line\n\n"
        f"Example configs ship with the package: `{prog} run --list-configs`, then `{prog} run NAME`.\n"
    )


def _fail(what: str, fix: str, status: int = 2) -> int:
    print(f"error: {what} — {fix}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sharpscape")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run ``sharpscape COMMAND ...``; returns the exit status, or raises ``SystemExit`` after one
    ``error:`` line (as ``argparse`` does)."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = []
    while args and args[0] == "--debug":  # `sharpscape --debug run ...`: the command takes it
        debug = [args.pop(0)]
    if not args or args[0] in ("-h", "--help"):
        print(help_text(prog), end="")
        return 0 if args else _fail("no command given", f"choose one of: {', '.join(COMMANDS)}")
    if args[0] == "--version":
        print(f"{prog} {_version()}")
        return 0
    name, rest = args[0], args[1:] + debug
    if name not in COMMANDS:
        kind = "option" if name.startswith("-") else "command"
        return _fail(
            f"unknown {kind} {name!r}", f"choose one of: {', '.join(COMMANDS)} (see `{prog} --help`)"
        )
    module_name, before, _ = COMMANDS[name]
    if name == "figures" and rest[:1] and rest[0] in RUN_FIGURES:  # a figure from trained runs
        module_name, before = "experiments.cli", ("figure",)
    try:  # imported only now, on purpose: --help and the dashboard import no torch (module docstring)
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if "--debug" in rest:
            import traceback

            traceback.print_exc()
        return _fail(
            f"`{prog} {name}` cannot start: {exc}",
            f"install {exc.name or 'the missing package'} (see the README: torch first, then sharpscape)",
            status=1,
        )
    # A parser whose commands are sub-parsers names them itself (prog + " run"); the others get
    # the full name of the command.
    return int(module.main([*before, *rest], prog=prog if before else f"{prog} {name}") or 0)
