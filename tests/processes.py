"""Processes the labs start and stop by PID (the SLURM, ssh and Kubernetes labs under
tests/integration/): whether one is alive, and stopping one the way each lab's ``down`` does.
Standard library only, like tests/ports.py, so each lab module can import it as a script too."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
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
