"""``python -m landscape <command> ...``.

Each feature module that offers a command defines ``add_cli(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed namespace, returning an exit code).
Every failure ends in one ``error: <what> — <how to fix>`` line on stderr and a non-zero exit
status (2 usage, 1 runtime, 130 Ctrl-C, 143 SIGTERM); ``--debug`` also prints the traceback
(:func:`landscape.cli_common.run_cli`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from landscape.cli_common import Parser, add_debug_option, run_cli

# modules that may register sub-commands, in the order they appear in --help
_COMMAND_MODULES = ("landscape.sharpness.cli", "landscape.surface.cli")


def build_parser(prog: str = "python -m landscape") -> argparse.ArgumentParser:
    """The parser; ``prog`` names the program in usage and errors (``sharpscape`` passes its own)."""
    parser: argparse.ArgumentParser = Parser(
        prog=prog,
        description="Sharpness measures and loss surfaces of a saved PyTorch model (see COMMAND --help).",
    )
    add_debug_option(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # feature not installed in this build
            if exc.name != name:
                raise
            continue
        if hasattr(module, "add_cli"):
            module.add_cli(sub)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m landscape") -> int:
    """Run a command; returns 0, or raises ``SystemExit`` with the status after one error line."""
    return run_cli(lambda args: _main(args, prog), argv)


def _main(argv: list[str], prog: str = "python -m landscape") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        names = ", ".join(name.split(".")[-2] for name in _COMMAND_MODULES)
        print(f"error: no command given — choose one of: {names}", file=sys.stderr)
        return 2
    return int(args.func(args) or 0)
