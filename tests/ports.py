"""TCP ports for tests whose processes must all be told a port before the one that listens on
it has bound it (rank 0's TCPStore under srun-style launches, the master's torchrun agent).

Why not "bind port 0, read the number, close the socket, hand the number on": between the
close and the child's bind any other process may take the port, and that is likely rather than
rare, because the kernel hands out exactly those ports (the ephemeral range,
/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default) to every bind(0) and every
outgoing connection on the machine, and several test sessions share this machine. Letting the
listener pick and report does not fit here: the other ranks are started with MASTER_PORT in
their environment and cannot be told later.

The scheme:
- ports below the ephemeral range, which the kernel never hands out on its own: only a process
  that names a port explicitly can hold it;
- each test process starts at its own offset in that range (keyed by the pytest-xdist worker
  and the pid) and never hands out a port twice, so concurrent runs walk disjoint stretches and
  a port of an earlier test in TIME_WAIT is not reused;
- a port that something holds right now is skipped (a bind probe: a hint, not a reservation);
- the caller starts its processes again on :func:`next_port` when the listener still reports
  the port taken (:func:`address_in_use`), which covers the race the probe cannot close.
"""

from __future__ import annotations

import itertools
import os
import socket
import zlib
from pathlib import Path

FIRST_PORT = 20000
#: Ports other tools pick by default (torchrun's c10d 29400, torch/Lightning/jobgen 29500).
DEFAULT_PORTS = frozenset({29400, 29500})
#: How many times a test starts its processes before it gives up on finding a free port.
ATTEMPTS = 3


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_LAST_PORT = max(FIRST_PORT + 1000, min(_ephemeral_low(), 32768)) - 1
_SPAN = _LAST_PORT - FIRST_PORT + 1
_KEY = f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}:{os.getpid()}"
_OFFSETS = itertools.count(zlib.crc32(_KEY.encode()) % _SPAN)


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken too
        except OSError:
            return False
    return True


def next_port(host: str = "127.0.0.1") -> int:
    """The next port of this process's stretch that nothing holds right now (see the module doc)."""
    for _ in range(_SPAN):
        port = FIRST_PORT + next(_OFFSETS) % _SPAN
        if port not in DEFAULT_PORTS and _bindable(port, host):
            return port
    raise RuntimeError(f"no bindable port in {FIRST_PORT}-{_LAST_PORT}")


def address_in_use(output: str) -> bool:
    """True when a process's output says its listening port was taken (torch's TCPStore:
    "... name: EADDRINUSE, message: address already in use"; Python: "[Errno 98] Address already in use")."""
    return "EADDRINUSE" in output or "address already in use" in output.lower()
