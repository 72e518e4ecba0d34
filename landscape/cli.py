"""``python -m landscape <command> ...``.

Each feature module that offers a command defines ``add_cli(subparsers)``, which adds its
sub-parser and sets ``func`` (called with the parsed namespace, returning an exit code).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

# modules that may register sub-commands, in the order they appear in --help
_COMMAND_MODULES = ("landscape.sharpness.cli", "landscape.surface.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m landscape",
        description="Sharpness measures and loss surfaces of a saved PyTorch model (see COMMAND --help).",
    )
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
