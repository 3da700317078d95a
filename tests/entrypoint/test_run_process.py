"""``run_process`` (tests/entrypoint/conftest.py), the runner of every training subprocess: a
timeout must end the run and fail the test, whatever the launcher's workers do.

torchrun starts each worker in a session of its own, so killing torchrun's process group left
the workers running, holding the output pipes, and the runner waited for their end of file for
ever: a suite run on a loaded machine hung in test_hf_sharded after ZeRO-2's 240 s timeout
(the workers sat in a collective whose peer was gone). No training here: a launcher that starts
a sleeping child in a new session stands in for torchrun.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.entrypoint.conftest import run_process

LAUNCHER = """\
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
open("child.pid", "w").write(str(child.pid))
print("launched", flush=True)
time.sleep(300)
"""


def test_a_timeout_kills_workers_in_sessions_of_their_own_and_fails_the_test(tmp_path: Path) -> None:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            run_process([sys.executable, "launcher.py"], cwd=tmp_path, timeout=3)
        except BaseException as exc:  # noqa: BLE001 - pytest.fail's exception is what is expected
            outcome["raised"] = exc

    runner = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    runner.start()
    runner.join(60)
    pid_file = tmp_path / "child.pid"
    child = int(pid_file.read_text()) if pid_file.exists() else None
    try:
        assert not runner.is_alive(), "run_process still waits 60 s after its 3 s timeout"
        assert isinstance(outcome.get("raised"), pytest.fail.Exception), outcome
        message = str(outcome["raised"])
        assert "timed out after 3 s" in message and "launched" in message, message
        # SIGKILL takes effect once the process leaves an uninterruptible sleep (D: e.g. reading its
        # imports on a loaded 2-core machine, where one full run of 2026-11-27 saw it still there)
        deadline = time.monotonic() + 5
        while child is not None and _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert child is not None and not _alive(child), f"the launcher's child {child} survived the timeout"
        assert time.monotonic() - started < 30
    finally:
        if child is not None and _alive(child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """``pid`` exists and is not a zombie (a killed child of an exited launcher is reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
