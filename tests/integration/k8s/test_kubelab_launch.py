"""A daemon the Kubernetes labs launch is known by its PID file as soon as ``_launch`` returns,
however late its exec completes. Needs no lab (Linux only).

``subprocess.Popen`` returns once the child's exec has passed its point of no return (the kernel
closes the close-on-exec pipe Popen waits on), before the new program's argv is in place: for that
moment /proc/PID/cmdline reads empty. On this project's 2-core machine it read empty in most
launches right after Popen returned; on a loaded machine the moment lasted past a fixed 50 ms
grace, and the API-server lab's first check took a starting etcd for a dead one. The kernel's
moment cannot be stretched on demand, so these tests emulate it: /proc/PID/cmdline of the
launched process reads empty for its first ``EXEC_S`` seconds, as it would while its exec is
descheduled."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kubelab
import kubenodes
import pytest

from tests import processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")

EXEC_S = 0.4  # longer than any fixed grace a launch might sleep
DAEMON = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def slow_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/PID/cmdline of any process started during the test reads empty for ``EXEC_S`` s."""
    started: dict[int, float] = {}
    real_popen = kubelab.subprocess.Popen
    real_read = Path.read_bytes

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started[proc.pid] = time.monotonic()
        return proc

    def read_bytes(path: Path) -> bytes:
        parts = path.parts
        if len(parts) == 4 and parts[:2] == ("/", "proc") and parts[3] == "cmdline" and parts[2].isdigit():
            launched = started.get(int(parts[2]))
            if launched is not None and time.monotonic() - launched < EXEC_S:
                return b""
        return real_read(path)

    monkeypatch.setattr(kubelab.subprocess, "Popen", popen)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)


def test_the_api_server_lab_finds_a_daemon_whose_exec_completes_late(tmp_path: Path, slow_exec: None) -> None:
    lab = kubelab.K8sLab(tmp_path, {})
    for sub in ("run", "log"):
        (tmp_path / sub).mkdir()
    try:
        pid = lab._launch("etcd", DAEMON)
        assert lab.daemon_pids().get("etcd") == pid, "a running etcd taken for a dead one"
    finally:
        lab.down()
    assert not processes.pid_alive(pid), "down() left the daemon running"


def test_the_node_lab_finds_a_daemon_whose_exec_completes_late(tmp_path: Path, slow_exec: None) -> None:
    nodes = kubenodes.NodeLab(tmp_path)
    for sub in ("run", "log"):
        (nodes.base / sub).mkdir(parents=True)
    try:
        pid = nodes._launch("kube-scheduler", DAEMON)
        assert nodes.daemon_pids().get("kube-scheduler") == pid, "a running daemon taken for a dead one"
    finally:
        nodes._stop_daemon("kube-scheduler", grace=5)
    assert not processes.pid_alive(pid), "the daemon was not stopped"


def test_a_daemon_that_exits_at_once_is_reported_with_its_log(tmp_path: Path) -> None:
    lab = kubelab.K8sLab(tmp_path, {})
    for sub in ("run", "log"):
        (tmp_path / sub).mkdir()
    with pytest.raises(kubelab.LabStartError, match=r"etcd exited with 3 at once[\s\S]*no such flag"):
        lab._launch("etcd", [sys.executable, "-c", "import sys; print('no such flag'); sys.exit(3)"])
