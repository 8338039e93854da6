"""The suite-wide guard: a test that reaches outside the loopback fails, naming the address."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import network_guard
import pytest
from network_guard import OutboundRefused, is_local_host

DOCUMENTATION_V4 = "192.0.2.1"  # RFC 5737 TEST-NET-1: never routed
DOCUMENTATION_V6 = "2001:db8::1"  # RFC 3849


@pytest.mark.parametrize(("host", "local"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("0.0.0.0", True), ("localhost", True), (b"127.0.0.1", True), ("", True),
    (DOCUMENTATION_V4, False), (DOCUMENTATION_V6, False), ("::ffff:192.0.2.1", False),
    ("pypi.org", False), ("huggingface.co", False),
])
def test_which_hosts_are_local(host, local):
    assert is_local_host(host) is local


@pytest.mark.parametrize("family, address", [
    (socket.AF_INET, (DOCUMENTATION_V4, 9)), (socket.AF_INET6, (DOCUMENTATION_V6, 9, 0, 0))])
def test_a_real_connect_is_refused_before_it_leaves(family, address):
    # UDP connect only sets the peer: nothing is sent even if the guard were broken
    with socket.socket(family, socket.SOCK_DGRAM) as s, pytest.raises(OutboundRefused) as err:
        s.connect(address)
    assert address[0] in str(err.value)
    assert network_guard._refused == [f"socket.connect to {address[0]}:9"]
    network_guard._refused.clear()  # this test expected it


def test_a_name_lookup_outside_is_refused():
    with pytest.raises(OutboundRefused, match="pypi.org"):
        socket.getaddrinfo("pypi.org", 443)
    network_guard._refused.clear()


def test_loopback_is_allowed():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=2):
            pass
    assert network_guard._refused == []


def test_guard_fails_a_test_that_catches_the_refusal(pytester):
    """A test that connects outside and swallows the error still fails, naming itself and the
    address; a loopback test beside it passes."""
    shutil.copy(Path(network_guard.__file__), pytester.path / "network_guard.py")
    pytester.makeconftest("from network_guard import outbound_guard  # noqa: F401\n")
    pytester.makepyfile(test_inner=f'''
        import socket

        def test_sneaks_out():
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.connect(("{DOCUMENTATION_V4}", 53))
            except OSError:
                pass

        def test_stays_home():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(("127.0.0.1", 53))
    ''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    out = result.stdout.str()
    assert f"test_inner.py::test_sneaks_out reached outside the loopback: socket.connect to " \
           f"{DOCUMENTATION_V4}:53" in out
    assert "test_stays_home reached" not in out
