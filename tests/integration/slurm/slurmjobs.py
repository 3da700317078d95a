"""SLURM clients against the lab (lab.py): run one with the lab's environment, submit with sbatch,
read a job's state, wait for a state, release a requeued job. lab.py re-exports every name.
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from labtools import run, wait_for

if TYPE_CHECKING:
    from lab import SlurmLab


def run_slurm(lab: SlurmLab, *argv: str, timeout: float = 60, check: bool = True,
              env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client (``run_slurm(lab, "squeue", "-h")``) on the host against ``lab``.

    The environment is ``lab.client_env()`` plus ``env``. Raises LabCommandError on a non-zero
    exit (when check is true) or after ``timeout`` seconds.
    """
    return run(argv, env={**lab.client_env(), **(env or {})}, timeout=timeout, check=check)


#: squeue %T states after which a job never runs again (unless requeued by hand).
TERMINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                             "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"})


def sbatch(lab: SlurmLab, *argv: str, timeout: float = 30) -> str:
    """``sbatch --parsable ARGV`` on the host; returns the job id. Raises LabCommandError."""
    out = run_slurm(lab, "sbatch", "--parsable", *argv, timeout=timeout).stdout.strip()
    return out.split(";", 1)[0]


def job_state(lab: SlurmLab, job_id: str) -> str:
    """The job's state from ``squeue -h -t all -j ID -o %T`` ("PENDING", "RUNNING",
    "COMPLETED", ...), or "" when squeue does not know it. Without ``-t all`` squeue 22.05
    hides finished jobs; with it they stay listed for MinJobAge (300 s)."""
    proc = run_slurm(lab, "squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False,
                     timeout=20)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def wait_for_job(lab: SlurmLab, job_id: str, timeout: float = 60,
                 states: frozenset[str] | set[str] = TERMINAL_STATES) -> str:
    """Poll squeue every 0.2 s (``sbatch --wait`` polls every ~10 s: pitfall 12) until the job
    is in one of ``states``; returns that state. Raises TimeoutError after ``timeout`` s."""
    last = ""

    def reached() -> str:
        nonlocal last
        last = job_state(lab, job_id)
        return last if last in states else ""

    try:
        return wait_for(reached, timeout, 0.2)
    except TimeoutError:
        raise TimeoutError(f"job {job_id} is {last or 'unknown to squeue'} after {timeout:g} s; "
                           f"waited for one of {sorted(states)}") from None


def release_requeued(lab: SlurmLab, job_id: str, *updates: str, requeued_at: float) -> None:
    """Release a requeued job from its ~120 s hold (``scontrol update StartTime=now``, plus
    ``updates`` such as ``TimeLimit=30``), no sooner than the second after ``requeued_at``
    (``time.time()`` of the ``scontrol requeue`` or of the signal that requeued it).

    slurmctld revokes the job's credential at the requeue and slurmd refuses any credential made
    in the revocation's second ("Killing non-startable batch JobId=21: Job credential revoked",
    seen when the release came 0.2 s after the requeue, on the same node)."""
    time.sleep(max(0.0, math.floor(requeued_at) + 1.05 - time.time()))
    run_slurm(lab, "scontrol", "update", f"JobId={job_id}", "StartTime=now", *updates)
