"""tests/ports.py: ports below the ephemeral range, never one twice, none that is held, and
the EADDRINUSE check the retrying tests rely on, against torch's own TCPStore message."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest

from tests.ports import DEFAULT_PORTS, FIRST_PORT, address_in_use, next_port


def ephemeral_low() -> int:
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    return int(path.read_text().split()[0]) if path.is_file() else 32768


def test_ports_are_distinct_and_outside_the_ephemeral_range():
    ports = [next_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(FIRST_PORT <= p < ephemeral_low() and p not in DEFAULT_PORTS for p in ports), ports


def test_a_port_something_listens_on_is_skipped():
    port = next_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with socket.socket() as probe:
            with pytest.raises(OSError):
                probe.bind(("127.0.0.1", port))
    # the next ports of this process never come back to it, held or not
    assert port not in [next_port() for _ in range(20)]


def test_address_in_use_recognises_the_messages():
    assert address_in_use("OSError: [Errno 98] Address already in use")
    assert address_in_use("RuntimeError: The server socket has failed to listen on any local network address. "
                          "port: 20001, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use")
    assert not address_in_use("RuntimeError: Connection refused")


def test_torch_tcpstore_on_a_taken_port_reports_what_address_in_use_detects():
    """The retrying tests restart their ranks when rank 0's TCPStore fails like this."""
    dist = pytest.importorskip("torch.distributed")
    port = next_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        with pytest.raises(Exception) as info:  # noqa: B017 (torch raises RuntimeError or its DistNetworkError subclass)
            dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5), wait_for_workers=False)
    assert address_in_use(str(info.value)), str(info.value)
