"""The ``slurm_lab`` fixture: a real 2-node SLURM cluster on this machine (see lab.py).

Skips, with the reason, where the machine can't host it: not Linux, not root, no
unshare/nsenter/ip, or the SLURM packages can't be installed; under CI (``$CI`` set, see
tests/conftest.py ``skip_or_fail``) each of those fails instead. ``JOBGEN_SKIP_SLURM_LAB=1``
skips it everywhere. Any other failure to come up is an error (with the daemons' log tails). ``JOBGEN_SLURM_LAB_ACCOUNTING=1`` adds
slurmdbd + MariaDB (plain ``sacct``, ``sacct --json``). ``JOBGEN_SLURM_LAB_ROOT`` puts the lab's
files in a directory of your choice (kept after the run, for reading logs); the fixture owns
the lab there: it restarts one left running under that root and stops it at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also under --import-mode=importlib

from lab import LabInstallError, SlurmLab  # noqa: E402

from tests.conftest import skip_or_fail  # noqa: E402

MARKER = "slurm_lab"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: needs a real SLURM cluster in network namespaces on this machine (root, "
        "apt); skipped with a reason elsewhere, or with JOBGEN_SKIP_SLURM_LAB=1",
    )


def lab_unavailable_reason() -> str | None:
    """Why this machine can't host the lab (None: it can try)."""
    if not sys.platform.startswith("linux"):
        return f"the SLURM lab needs Linux network namespaces (platform: {sys.platform})"
    if os.geteuid() != 0:
        return (f"the SLURM lab needs root (network namespaces, a bridge, apt-get); "
                f"running as uid {os.geteuid()}")
    missing = [tool for tool in ("unshare", "nsenter", "ip")
               if shutil.which(tool) is None and not any(
                   os.access(os.path.join(d, tool), os.X_OK) for d in ("/usr/sbin", "/sbin"))]
    if missing:
        return f"the SLURM lab needs {', '.join(missing)} (util-linux, iproute2)"
    return None


@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmLab]:
    """An up SlurmLab (controller, node1, node2; partition ``lab``) for the whole session."""
    if os.environ.get("JOBGEN_SKIP_SLURM_LAB") == "1":
        pytest.skip("JOBGEN_SKIP_SLURM_LAB=1")
    reason = lab_unavailable_reason()
    if reason:
        skip_or_fail(reason)
    configured = os.environ.get("JOBGEN_SLURM_LAB_ROOT")
    root = Path(configured) if configured else tmp_path_factory.mktemp("slurm-lab")
    lab = SlurmLab(root, accounting=os.environ.get("JOBGEN_SLURM_LAB_ACCOUNTING") == "1")
    try:
        lab.up(owner_pid=os.getpid())
    except LabInstallError as exc:
        skip_or_fail(f"SLURM packages could not be installed: {exc}")
    except BaseException:
        print(f"SLURM lab failed to come up under {root}; daemon logs:\n{lab.log_tails(40)}",
              file=sys.stderr)
        lab.down(drain_timeout=5)
        raise
    print(f"\nSLURM lab up in {lab.timings.get('total_s', 0):.1f} s under {root}",
          file=sys.stderr)
    try:
        yield lab
    finally:
        lab.down()
