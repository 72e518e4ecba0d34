"""``sharpscape dashboard``: the Streamlit dashboard, on this machine only unless asked otherwise.

Runs ``python -m streamlit run <the installed app/Home.py>`` (the same interpreter) with

* ``--server.address 127.0.0.1`` (``--address``): only this machine can open the dashboard. Anyone
  who can reach the address may upload files and start training runs, so opening it to a network
  (``--address 0.0.0.0``) is a deliberate choice, announced by a warning; every spelling of a
  loopback address (``127.1``, ``localhost``, ``[::1]``, ... : :func:`sharpscape.network.is_loopback`)
  is this machine only, without one;
* ``--server.port 8501`` (``--port``), checked free before Streamlit starts;
* ``--server.headless true``: no browser is opened, no e-mail prompt on the first run;
* ``--server.maxUploadSize 32`` (``--max-upload-mb``, in MB). The dashboard takes two kinds of
  upload: surface files (``Surface.save`` / ``sharpscape surface`` ``.npz``: the grid plus the two
  model-sized directions, i.e. 2 x parameters x 4 bytes in float32, x 8 in float64) and the state
  dicts of the digits MLPs of the paths page (well under 1 MB). 32 MB is the smallest round limit
  that fits the surface file of every CIFAR network of ``configs/`` up to ResNet-110 and
  PreResNet-164 (1.7 M parameters: 13 MiB in float32, 26 MiB in float64), WRN-28-2, and any
  surface saved without directions (a 1001 x 1001 grid of loss and accuracy is about 17 MB). Surfaces of
  ResNet-18 (85 MiB in float32) or WRN-28-10 (278 MiB in float32, 557 MiB in float64) need
  ``--max-upload-mb 300`` (or 600), or ``Surface.save(path, include_directions=False)``.

The repository's ``.streamlit/config.toml`` sets the same address and limit for the README's
``streamlit run app/Home.py`` (Streamlit reads it from the working directory); the command-line
flags given here take precedence over any config file. ``--dry-run`` prints the command instead of
running it. Errors end in one ``error: <what> — <how to fix>`` line (exit status 2 for a bad
command line, 1 when the dashboard cannot start).
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence

from sharpscape.network import is_loopback, plain_address
from sharpscape.resources import app_home

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_MAX_UPLOAD_MB",
    "DEFAULT_PORT",
    "DashboardError",
    "build_parser",
    "listening_note",
    "main",
    "streamlit_command",
    "url",
]

DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 8501
DEFAULT_MAX_UPLOAD_MB = 32
#: Streamlit's settings for the dashboard, the same from every entry point: ``sharpscape dashboard``
#: passes them on the command line (address and upload limit from its options), and the
#: repository's ``.streamlit/config.toml`` (read by ``streamlit run app/Home.py`` in the checkout)
#: holds exactly these (``tests/test_wheel_dashboard.py`` compares the two).
STREAMLIT_SETTINGS: dict[str, object] = {
    "server.address": DEFAULT_ADDRESS,
    "server.maxUploadSize": DEFAULT_MAX_UPLOAD_MB,
    "browser.gatherUsageStats": False,  # no usage statistics sent to Streamlit's servers
}
DASH = " — "


class DashboardError(Exception):
    """A failure reported as one ``error: <what> — <fix>`` line with exit status ``status``."""

    def __init__(self, what: str, fix: str, status: int = 1):
        super().__init__(f"{what}{DASH}{fix}")
        self.status = status


class _Parser(argparse.ArgumentParser):
    """Usage errors become :class:`DashboardError` (status 2) instead of usage + message."""

    def error(self, message: str) -> None:  # type: ignore[override]
        fix = f"see `{self.prog} --help`"
        if DASH in message:
            message, _, fix = message.partition(DASH)
        raise DashboardError(message, fix, status=2)


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a port number from 1 to 65535, e.g. 8502")
    return int(text)


def _address(text: str) -> str:
    """``--address``: :func:`plain_address`; an empty one is refused (Streamlit would listen on every
    interface, as for an unset shell variable in ``--address "$HOST"``)."""
    address = plain_address(text)
    if not address:
        raise argparse.ArgumentTypeError(
            f"got {text!r}{DASH}give an address: {DEFAULT_ADDRESS} (this machine only) or 0.0.0.0 (every "
            "machine that can reach this one)"
        )
    return address


def _megabytes(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}{DASH}give a whole number of megabytes >= 1")
    return int(text)


def build_parser(prog: str = "sharpscape dashboard") -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Start the Streamlit dashboard. It listens on 127.0.0.1 (this machine only) unless "
        "--address says otherwise; open the printed URL in a browser, Ctrl-C stops it.",
    )
    parser.add_argument(
        "--address",
        type=_address,
        default=DEFAULT_ADDRESS,
        help=f"address to listen on (default {DEFAULT_ADDRESS}: this machine only; 0.0.0.0 opens the "
        "dashboard, its uploads and training runs, to every machine that can reach this one)",
    )
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}")
    parser.add_argument(
        "--max-upload-mb",
        type=_megabytes,
        default=DEFAULT_MAX_UPLOAD_MB,
        metavar="N",
        help=f"largest file the dashboard accepts, in MB (default {DEFAULT_MAX_UPLOAD_MB}: the surface "
        "files of networks up to ~1.7 M parameters with their directions; WRN-28-10 needs 300)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the streamlit command and stop")
    parser.add_argument("--debug", action="store_true", help="on error, also print the traceback")
    return parser


def streamlit_command(home: str, address: str, port: int, max_upload_mb: int) -> list[str]:
    """The command that starts the dashboard ``home`` (its ``Home.py``) with this interpreter:
    :data:`STREAMLIT_SETTINGS` (address and upload limit as given), the port, headless."""
    settings = {
        **STREAMLIT_SETTINGS,
        "server.address": address,
        "server.maxUploadSize": max_upload_mb,
        "server.port": port,
        "server.headless": True,
    }
    flags = [
        item
        for key, value in settings.items()
        for item in (f"--{key}", str(value).lower() if isinstance(value, bool) else str(value))
    ]
    return [sys.executable, "-m", "streamlit", "run", str(home), *flags]


def url(address: str, port: int) -> str:
    """The URL to open (IPv6 addresses in brackets; a wildcard address shown as this machine)."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(address, address)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def listening_note(address: str, port: int) -> str:
    """The line printed when the dashboard starts: its URL and who can reach it, a warning for an
    address that is not a loopback one (:func:`sharpscape.network.is_loopback`)."""
    if is_loopback(address):
        where = "this machine only; --address 0.0.0.0 opens it to the network"
    else:
        where = (
            f"WARNING: listening on {address}, so anyone who can reach this machine can upload files "
            "and start training runs; the default --address 127.0.0.1 keeps it to this machine"
        )
    return f"note: dashboard at {url(address, port)} ({where}); Ctrl-C stops it"


def _check_free(address: str, port: int) -> None:
    """Refuse an address this machine does not have, or a port another program listens on."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise DashboardError(
            f"--address {address}: not an address or host name this machine can resolve ({exc.strerror})",
            "give an IP address such as 127.0.0.1",
            status=2,
        ) from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        if os.name == "posix":  # as Streamlit's server does: a port in TIME_WAIT is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DashboardError(
                    f"port {port} on {address} is in use (another dashboard?)",
                    f"stop that program or pass another port, e.g. --port {port % 65535 + 1}",
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise DashboardError(
                    f"--address {address} is not an address of this machine",
                    "give 127.0.0.1 (this machine only) or one of this machine's addresses",
                    status=2,
                ) from None
            raise DashboardError(
                f"cannot listen on {address} port {port}: {exc.strerror or exc}",
                "choose another --port (ports below 1024 need root)",
            ) from None


def _main(argv: list[str], prog: str) -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        home = app_home()
    except FileNotFoundError as exc:
        what, _, fix = str(exc).partition(DASH)
        raise DashboardError(what, fix) from None
    cmd = streamlit_command(str(home), args.address, args.port, args.max_upload_mb)
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    if importlib.util.find_spec("streamlit") is None:
        raise DashboardError(
            "streamlit is not installed in this environment",
            "install the app extra: pip install 'sharpscape[app]'",
        )
    _check_free(args.address, args.port)
    print(listening_note(args.address, args.port), flush=True)
    sys.stderr.flush()
    if os.name == "posix":  # Streamlit takes over this process: Ctrl-C and SIGTERM reach it directly
        os.execv(sys.executable, cmd)
    return subprocess.call(cmd)  # pragma: no cover - Windows


def main(argv: Sequence[str] | None = None, prog: str = "sharpscape dashboard") -> int:
    """Run ``sharpscape dashboard``; returns 0 (``--dry-run``), or does not return (Streamlit runs
    in this process); a failure prints one ``error:`` line and raises ``SystemExit``."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args, prog)
    except DashboardError as exc:
        if "--debug" in args:
            import traceback

            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.status) from None
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C) — nothing was started", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
