"""kubelab's check that a daemon itself listens on the port it was told (not some other process
holding it): ``listening_ports`` reads a process's own listening sockets from /proc. Needs no
lab (Linux only)."""

from __future__ import annotations

import os
import socket
import sys

import pytest
from kubelab import listening_ports

from tests.ports import next_port

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


def test_a_port_is_listed_while_this_process_listens_on_it_and_not_after():
    port = next_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        assert port not in listening_ports(os.getpid()), "bound but not listening yet"
        s.listen()
        assert port in listening_ports(os.getpid())
    assert port not in listening_ports(os.getpid())


def test_a_port_another_process_listens_on_is_not_this_process_port():
    import subprocess

    port = next_port()
    code = f"import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); print('up', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert port in listening_ports(child.pid)
        assert port not in listening_ports(os.getpid())
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    assert listening_ports(child.pid) == set(), "a process that is gone listens on nothing"
