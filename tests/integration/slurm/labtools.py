"""The labs' generic helpers (the SLURM lab, lab.py, and the ssh lab, ../ssh/sshlab.py): their
errors, running a command, waiting for a condition, finding and apt-installing binaries, and
reading a process's name, parent and start time from /proc. lab.py re-exports the names tests use.

Standard library only.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

#: Places searched for daemons besides $PATH (pytest may run with a PATH without sbin).
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


# --------------------------------------------------------------------------- errors


class LabError(RuntimeError):
    """Anything that stops the lab from coming up or going down."""


class LabCommandError(LabError):
    """A command failed: carries argv, the return code (None: timed out), stdout and stderr."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str,
                 note: str = ""):
        self.argv = [str(a) for a in argv]
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        status = "timed out" if returncode is None else f"exit {returncode}"
        detail = (stderr.strip() or stdout.strip())[-3000:]
        super().__init__(f"{shlex.join(self.argv)}: {status}{note}" + (f"\n{detail}" if detail else ""))


class LabInstallError(LabError):
    """The SLURM/munge (or slurmdbd/MariaDB) packages could not be installed."""


class LabConflictError(LabError):
    """The lab's interface/namespace names or subnet are already in use by something else."""


class LabStartError(LabError):
    """A daemon did not start or the nodes did not become idle; the message has the log tails."""


# --------------------------------------------------------------------------- helpers


def run(argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
        timeout: float = 60, check: bool = True, input: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run argv (no shell) and return the completed process (text stdout/stderr).

    Raises LabCommandError (argv, return code, stderr) when it exits non-zero and check is
    true, when it runs longer than ``timeout`` seconds, or when the program is missing.
    """
    argv = [os.fspath(a) for a in argv]
    try:
        proc = subprocess.run(argv, env=None if env is None else dict(env), input=input,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise LabCommandError(argv, None, out, err, f" after {timeout:g} s") from None
    except FileNotFoundError as exc:
        raise LabCommandError(argv, 127, "", str(exc)) from None
    if check and proc.returncode != 0:
        raise LabCommandError(argv, proc.returncode, proc.stdout, proc.stderr)
    return proc


T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.2,
             what: str = "") -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns something truthy.

    Returns that value. Raises TimeoutError after ``timeout`` seconds, naming ``what`` (or the
    predicate) and the last value seen.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(predicate, "__name__", repr(predicate))
            raise TimeoutError(f"gave up waiting for {name} after {timeout:g} s "
                               f"(last value: {value!r})")
        time.sleep(interval)


def find_binary(name: str) -> str | None:
    """Absolute path of ``name`` on $PATH or in the sbin/bin directories, or None."""
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def apt_install(packages: Sequence[str], binaries: Sequence[str]) -> None:
    """apt-get install ``packages`` when any of ``binaries`` is missing (pitfall 6: with a
    policy-rc.d so postinsts start no service; created only if missing, removed after).
    Runs `apt-get update` only when the install fails without it. Raises LabInstallError."""
    missing = [b for b in binaries if find_binary(b) is None]
    if not missing:
        return
    if find_binary("apt-get") is None:
        raise LabInstallError(f"missing {', '.join(missing)} and no apt-get to install "
                              f"{' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# jobgen SLURM lab: no service starts during install\n"
                          "exit 101\n")
        policy.chmod(0o755)
        created_policy = True
    # Wait for dpkg's lock (the Kubernetes lab's build may install in the background meanwhile).
    argv = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y", "--no-install-recommends", *packages]
    try:
        try:
            run(argv, env=env, timeout=900)
        except LabCommandError as first:
            try:
                run(["apt-get", "-o", "DPkg::Lock::Timeout=600", "update"], env=env, timeout=600)
                run(argv, env=env, timeout=900)
            except LabCommandError as second:
                raise LabInstallError(f"could not install {' '.join(packages)}: {second}\n"
                                      f"(before apt-get update: {first})") from None
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)
    still = [b for b in binaries if find_binary(b) is None]
    if still:
        raise LabInstallError(f"installed {' '.join(packages)} but {', '.join(still)} "
                              f"still missing")


def _require(name: str) -> str:
    path = find_binary(name)
    if path is None:
        raise LabError(f"{name} not found on PATH or in {', '.join(SBIN)}")
    return path


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(missing)"
    return "\n".join(text[-lines:]) or "(empty)"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _process_identity(pid: int) -> dict[str, int] | None:
    """``{"pid", "start"}`` (start: clock ticks after boot, /proc/<pid>/stat field 22), which
    tells a live process from a later one given the same PID; None when ``pid`` is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is field 3 (state); field 22 (starttime) is fields[19].
    return None if fields[0] == "Z" else {"pid": pid, "start": int(fields[19])}
