"""Tests reach no address outside this machine.

The machines this suite runs on allow the loopback range only, so a test that connects or sends
anywhere else is a fault of the suite, whatever answer comes back. An audit hook refuses every
``socket.connect``, ``sendto`` and ``sendmsg`` to an address outside 127.0.0.0/8 and ::1, and
every name lookup other than the loopback names, before any packet leaves; the autouse fixture
then fails the test, naming it and the address, even when the code under test caught the error.

The hook sees the pytest process only. Children the tests start (the sandboxed predictor child
among them) are outside it; the seal gives those children no network of their own.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

import pytest

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                            "ip6-loopback", socket.gethostname()})
_refused: list[str] = []


class OutboundRefused(ConnectionRefusedError):
    """Raised where a test would have reached outside the loopback."""


def is_local_host(host) -> bool:
    """True for loopback and unspecified addresses (what a connect to them reaches is this
    machine); a name is local only if it is one of the loopback names."""
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in (None, ""):
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return str(host).lower() in LOOPBACK_NAMES
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    return address.is_loopback or address.is_unspecified


def _describe(address) -> str | None:
    """The address as printed in the failure, or None where it stays on this machine."""
    if address is None or isinstance(address, (str, bytes)):  # unix sockets, connected sends
        return None
    if isinstance(address, tuple) and address and not is_local_host(address[0]):
        return f"{address[0]}:{address[1]}" if len(address) > 1 else str(address[0])
    return None


def _audit(event: str, args: tuple) -> None:
    if event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
        where = _describe(args[1])
    elif event == "socket.getaddrinfo":
        host = args[0]
        numeric = True
        try:
            ipaddress.ip_address(str(host.decode() if isinstance(host, bytes) else host)
                                 .split("%")[0])
        except ValueError:
            numeric = host in (None, "", b"")
        where = None if numeric or is_local_host(host) else f"name lookup of {host!r}"
    else:
        return
    if where is not None:
        _refused.append(f"{event} to {where}")
        raise OutboundRefused(f"tests may reach the loopback only; refused {event} to {where}")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def outbound_guard(request):
    if _refused:
        found = ", ".join(dict.fromkeys(_refused))
        _refused.clear()
        pytest.fail(f"outside any test (collection or a fixture), the suite reached outside the "
                    f"loopback: {found}", pytrace=False)
    yield
    if _refused:
        found = ", ".join(dict.fromkeys(_refused))
        _refused.clear()
        pytest.fail(f"{request.node.nodeid} reached outside the loopback: {found}. Tests may "
                    f"connect to 127.0.0.0/8 and ::1 only; serve what the test needs locally "
                    f"(see the http_root fixture in test_sources.py)", pytrace=False)
