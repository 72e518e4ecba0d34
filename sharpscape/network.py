"""Whether an address a server is told to listen on keeps it to this machine.

:func:`is_loopback` is the one test every server and launcher of the toolkit uses (``sharpscape
dashboard``): an address on which only this machine can connect is accepted silently, any other one
is announced (anyone who can reach it may upload files and start training runs). It accepts every
spelling of a loopback address:

* ``localhost``;
* IPv4 ``127.0.0.0/8`` in every form ``inet_aton`` reads, which is how the server's
  ``getaddrinfo`` reads a numeric host: ``127.0.0.1``, ``127.1``, ``127.0.1``, ``2130706433``,
  ``0x7f.1``, ``0177.0.0.1``;
* IPv6 ``::1`` in any spelling (``0:0:0:0:0:0:0:1``), in brackets (``[::1]``), with a zone
  (``::1%lo``), and IPv4-mapped loopback (``::ffff:127.0.0.1``).

:func:`plain_address` removes the brackets of ``[::1]``, which URLs need and sockets refuse.
Importing this module imports neither torch nor the library packages.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["is_loopback", "plain_address"]


def plain_address(address: str) -> str:
    """``address`` without surrounding white space and the brackets of an IPv6 literal (``[::1]``)."""
    text = address.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return text


def _ipv4(text: str) -> ipaddress.IPv4Address | None:
    """``text`` read as ``inet_aton`` reads it (1 to 4 parts, decimal, octal ``0..`` or hex ``0x..``),
    or ``None``. Text with white space is refused (``inet_aton`` would ignore what follows it)."""
    if not text or any(c.isspace() for c in text) or not text.isascii():
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def is_loopback(address: str) -> bool:
    """Whether a server listening on ``address`` is reachable from this machine only (see the
    module docstring for the spellings); ``False`` for a wildcard (``0.0.0.0``, ``::``), another
    address or a host name other than ``localhost``."""
    text = plain_address(address)
    if text.lower().rstrip(".") == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0] if ":" in text else text)
    except ValueError:
        v4 = _ipv4(text)
        return v4 is not None and v4.is_loopback
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
