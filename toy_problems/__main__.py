"""``python -m toy_problems figures --out DIR [--only NAME ...] [--resolution N]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from toy_problems.figures import FIGURES, make_figures

    parser = argparse.ArgumentParser(prog="python -m toy_problems")
    sub = parser.add_subparsers(dest="command", required=True)
    fig = sub.add_parser("figures", help="regenerate the papers' toy figures (PNG + JSON)")
    fig.add_argument("--out", required=True, help="output directory")
    fig.add_argument("--only", action="append", choices=list(FIGURES), help="one figure (repeatable)")
    fig.add_argument("--resolution", type=int, default=200, help="grid size; < 100 = reduced mode")
    sub.add_parser("list", help="list the registered toy problems")
    args = parser.parse_args(argv)
    if args.command == "list":
        import toy_problems as tp

        print("\n".join(tp.names()))
        return 0
    try:
        make_figures(args.out, args.only, args.resolution)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
