"""``python -m toy_problems figures --out DIR [--only NAME ...] [--resolution N]``.

Errors end in one ``error: <what> — <how to fix>`` line on stderr (exit status 2 for usage, 1 for
runtime failures, 130 on Ctrl-C); ``--debug`` also prints the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import toy_problems as tp
from landscape.cli_common import CliError, Parser, TaskProgress, add_debug_option, check_path, run_cli
from toy_problems.figures import FIGURES, make_figures


def _resolution(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 10:
        raise argparse.ArgumentTypeError(
            f"got {text!r} — give a whole number >= 10 (< 100 is the reduced mode)"
        )
    return value


def _parser(prog: str = "python -m toy_problems") -> Parser:
    parser = Parser(prog=prog)
    add_debug_option(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fig = sub.add_parser("figures", help="regenerate the papers' toy figures (PNG + JSON)")
    fig.add_argument("--out", required=True, help="output directory")
    fig.add_argument("--only", action="append", choices=list(FIGURES), help="one figure (repeatable)")
    fig.add_argument(
        "--resolution",
        type=_resolution,
        default=200,
        help="grid size (>= 10; default: 200); < 100 = reduced mode",
    )
    add_debug_option(fig)
    listing = sub.add_parser("list", help="list the registered toy problems")
    add_debug_option(listing)
    return parser


def _main(argv: list[str], prog: str = "python -m toy_problems") -> int:
    args = _parser(prog).parse_args(argv)
    if args.command == "list":
        print("\n".join(tp.names()))
        return 0
    check_path(args.out, "--out", "directory")
    names = args.only or list(FIGURES)
    overall = TaskProgress(len(names), "figure")
    try:
        for name in names:
            overall.begin(name)
            make_figures(args.out, [name], args.resolution)
            overall.end()
    except ValueError as exc:
        raise CliError(str(exc), f"see `{prog} figures --help`") from None
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "python -m toy_problems") -> int:
    """Run a command; returns 0, or raises ``SystemExit`` with the status after one error line.
    ``prog`` names the program in usage and errors (``sharpscape`` passes its own)."""
    return run_cli(lambda args: _main(args, prog), argv)


if __name__ == "__main__":
    sys.exit(main())
