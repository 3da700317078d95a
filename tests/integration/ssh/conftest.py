"""The ``ssh_lab`` fixture: two real OpenSSH servers on this machine, each in its own network
namespace with its own hostname and disk (see sshlab.py).

Skips, with the reason, where the machine can't host it: not Linux, not root, no
unshare/nsenter/ip, or openssh-server can't be installed; under CI (``$CI`` set, see
tests/conftest.py ``skip_or_fail``) each of those fails instead. ``JOBGEN_SKIP_SSH_LAB=1`` skips
it everywhere. Any other failure to come up is an error (with sshd's log tails).
``JOBGEN_SSH_LAB_ROOT`` puts the lab's files (keys, sshd logs, the hosts' disks) in a directory of
your choice, kept after the run.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also under --import-mode=importlib
sys.path.insert(1, str(Path(__file__).resolve().parent.parent / "slurm"))  # the SLURM lab's helpers (sshlab uses them)

from lab import LabInstallError  # noqa: E402
from sshlab import SshLab  # noqa: E402

from tests.conftest import skip_or_fail  # noqa: E402

MARKER = "ssh_lab"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: needs two sshd hosts in network namespaces on this machine (root, apt: openssh-server); "
        "skipped with a reason elsewhere, or with JOBGEN_SKIP_SSH_LAB=1",
    )


def lab_unavailable_reason() -> str | None:
    """Why this machine can't host the lab (None: it can try)."""
    if not sys.platform.startswith("linux"):
        return f"the ssh lab needs Linux network namespaces (platform: {sys.platform})"
    if os.geteuid() != 0:
        return f"the ssh lab needs root (network namespaces, a bridge, apt-get, sshd); running as uid {os.geteuid()}"
    missing = [tool for tool in ("unshare", "nsenter", "ip")
               if shutil.which(tool) is None and not any(os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin"))]
    if missing:
        return f"the ssh lab needs {', '.join(missing)} (util-linux, iproute2)"
    return None


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshLab]:
    """An up SshLab (host1, host2, reached as root with the lab's key) for the whole session."""
    if os.environ.get("JOBGEN_SKIP_SSH_LAB") == "1":
        pytest.skip("JOBGEN_SKIP_SSH_LAB=1")
    reason = lab_unavailable_reason()
    if reason:
        skip_or_fail(reason)
    configured = os.environ.get("JOBGEN_SSH_LAB_ROOT")
    root = Path(configured) if configured else tmp_path_factory.mktemp("ssh-lab")
    lab = SshLab(root)
    try:
        lab.up(owner_pid=os.getpid())
    except LabInstallError as exc:
        skip_or_fail(f"openssh-server could not be installed: {exc}")
    except BaseException:
        print(f"ssh lab failed to come up under {root}; sshd logs:\n{lab.log_tails(40)}", file=sys.stderr)
        lab.down()
        raise
    print(f"\nssh lab up in {lab.timings['total_s']:.1f} s under {root} ({lab.timings})", file=sys.stderr)
    try:
        yield lab
    finally:
        lab.down()
