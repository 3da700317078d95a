"""Processes the labs start and stop by PID (the SLURM, ssh and Kubernetes labs under
tests/integration/): whether one is alive, stopping one the way each lab's ``down`` does, and
running one for a ``with`` block (the Kubernetes lab's emulated controllers).
Standard library only, like tests/ports.py, so each lab module can import it as a script too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def proc_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (``R``, ``S``, ``Z``...), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[0] if fields else None


def pid_alive(pid: int) -> bool:
    """True when PID exists and is not a zombie (a dead child nobody reaped yet) or dead (``X``)."""
    return proc_state(pid) not in (None, "Z", "X")


def cmdline(pid: int) -> list[str]:
    """The argv of process PID from /proc/PID/cmdline; empty when there is no such process, and
    while its exec is still completing (see :func:`wait_exec`)."""
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def wait_exec(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    """Wait until ``proc``'s exec has completed: its /proc/PID/cmdline shows the new program's
    argv. True then; False when the process exited first. Raises TimeoutError after ``timeout`` s.

    ``subprocess.Popen`` returns once the child's exec has passed its point of no return (the
    kernel closes the close-on-exec pipe Popen waits on), before the new argv is in place; until
    then /proc/PID/cmdline reads empty, and a loaded machine can keep the child from completing
    its exec for longer than any fixed grace. A check by argv (a PID file's daemon, a stop)
    must come after this."""
    deadline = time.monotonic() + timeout
    while not cmdline(proc.pid):
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"pid {proc.pid} ({proc.args!r}) did not complete its exec in {timeout:.0f} s")
        time.sleep(0.01)
    return proc.poll() is None


def stop_pid(pid: int, what: str, grace: float = 10.0, *, label: str = "lab") -> None:
    """SIGTERM ``pid``, SIGKILL it after ``grace`` s, reap it if it is our child; a process that
    survives SIGKILL (5 s more) is reported on stderr as ``<label>: <what> (pid N) survived
    SIGKILL``. Returns at once when there is no such process."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                with contextlib.suppress(ChildProcessError, OSError):  # our child: collect it, leave no zombie
                    os.waitpid(pid, os.WNOHANG)
                return
            time.sleep(0.05)
    print(f"{label}: {what} (pid {pid}) survived SIGKILL", file=sys.stderr)


@contextlib.contextmanager
def process_running(argv: list[str], log_path: Path, what: str) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` as a process for the ``with`` block, its output in ``log_path``; stopped (TERM,
    then KILL after 15 s) on the way out, its log's tail printed to stderr. Raises AssertionError
    when it exits at start, or, once stopped, when it exited non-zero or its log shows a traceback
    (the lab's emulated controllers: a reconcile pass that failed)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.5)
        assert proc.poll() is None, log_path.read_text()
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"\n--- {what} log (tail)\n{log_path.read_text()[-3000:]}", file=sys.stderr)
    text = log_path.read_text()
    assert proc.returncode == 0 and "Traceback" not in text, text[-6000:]
