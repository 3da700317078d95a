"""tests/processes.py, which every lab's ``down`` stops its daemons with: TERM first, KILL for a
process that ignores it, the exit collected (no zombie counted alive), and /proc's state read
right for a command name with spaces and parentheses."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

from tests.processes import pid_alive, proc_state, stop_pid

IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def test_stop_pid_terms_then_kills_one_that_ignores_term_and_reaps_it(capsys) -> None:
    proc = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    started = time.monotonic()
    stop_pid(proc.pid, "a TERM-proof sleeper", grace=0.5, label="test")
    assert 0.5 <= time.monotonic() - started < 5.0  # waited the grace, then SIGKILL took it at once
    assert proc_state(proc.pid) is None and not pid_alive(proc.pid)  # gone and reaped: no zombie left
    assert "survived" not in capsys.readouterr().err


def test_stop_pid_of_a_cooperating_process_and_of_no_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    stop_pid(proc.pid, "sleeper", grace=10.0)
    assert time.monotonic() - started < 5.0 and proc_state(proc.pid) is None  # SIGTERM was enough, and it was reaped
    stop_pid(proc.pid, "sleeper", grace=10.0)  # no such process any more: returns at once


def test_a_zombie_is_not_alive_and_a_strange_command_name_parses(tmp_path) -> None:
    strange = tmp_path / "x) (y z"  # the kernel's comm field is the program's file name
    strange.symlink_to(shutil.which("sleep"))
    proc = subprocess.Popen([str(strange), "60"])
    try:
        time.sleep(0.2)
        assert proc_state(proc.pid) in ("S", "R") and pid_alive(proc.pid)
    finally:
        proc.kill()
    deadline = time.monotonic() + 5
    while proc_state(proc.pid) != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(proc.pid) == "Z" and not pid_alive(proc.pid)  # exited, not yet reaped
    proc.wait()
    assert proc_state(proc.pid) is None
