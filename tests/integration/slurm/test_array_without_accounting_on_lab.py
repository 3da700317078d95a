"""Job-array task states on the real lab cluster WITHOUT accounting (no slurmdbd), after squeue
has forgotten the tasks: the route single jobs take (squeue, then the job-completion log).

The lab runs ``JobCompType=jobcomp/filetxt`` and, unless ``JOBGEN_SLURM_LAB_ACCOUNTING=1``, no
slurmdbd. This module's fixture lowers MinJobAge to 2 s for its own tests (``scontrol
reconfigure``; restored after), so slurmctld purges each ended task within seconds instead of
300 s. A 2-point sweep is submitted as one array; task 1 is cancelled as soon as it runs, task 0
trains a few steps. Then, with squeue knowing nothing of the array, ``jobgen status`` must still give
each task's own state (COMPLETED, CANCELLED), its exit code and the array's state by the array
rule. Helpers come from test_jobgen_on_lab.py and test_array_on_lab.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from lab import MIN_JOB_AGE_S, SlurmLab, run_slurm, wait_for
from test_array_on_lab import SPEC
from test_jobgen_on_lab import Jobgen, job_id

pytestmark = pytest.mark.slurm_lab

ARRAY_PROFILE = """\
extends: slurm-lab
description: jobgen SLURM lab, sweeps as one job array
slurm:
  sweep_as_array: true
"""
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.fixture(scope="module")
def forgetful_lab(slurm_lab: SlurmLab) -> Iterator[SlurmLab]:
    """The session's lab, without accounting, forgetting ended jobs 2 s after their end (this module only)."""
    if slurm_lab.accounting:
        pytest.skip("the lab runs slurmdbd (JOBGEN_SLURM_LAB_ACCOUNTING=1); this module tests the route without it")
    slurm_lab.set_min_job_age(2)
    try:
        yield slurm_lab
    finally:
        slurm_lab.set_min_job_age(MIN_JOB_AGE_S)


@pytest.fixture
def jobgen(forgetful_lab, tmp_path) -> Iterator[Jobgen]:
    """The CLI against the lab; a failed test leaves no job queued."""
    yield Jobgen(forgetful_lab, tmp_path)
    jobs = run_slurm(forgetful_lab, "squeue", "-h", "-o", "%i").stdout.split()
    if jobs:
        run_slurm(forgetful_lab, "scancel", *jobs)
        wait_for(lambda: not run_slurm(forgetful_lab, "squeue", "-h", "-o", "%i").stdout.split(), 60, 0.5, what="the queue to drain")


def test_array_task_states_come_from_the_job_completion_log_once_squeue_forgot_them(jobgen, forgetful_lab):
    started = time.monotonic()
    assert run_slurm(forgetful_lab, "sacct", "--noheader", check=False).returncode != 0, "the lab has accounting"
    jobgen.profile()
    (jobgen.root / "profiles" / "slurm-lab-array.yaml").write_text(ARRAY_PROFILE)
    spec = jobgen.root / "lab-nodbd.yaml"
    spec.write_text(SPEC.format(name="lab-nodbd", max_steps=4, every=2))
    jobgen("render", str(spec), "--profile", "slurm-lab-array", "--profiles-dir", str(jobgen.root / "profiles"),
           "--out", "manifests", "--sweep", "trainer.learning_rate=1e-3,3e-3")
    job_dir = jobgen.root / "manifests" / "slurm-lab-array" / "lab-nodbd"
    out = jobgen("submit", str(job_dir)).stdout
    handle = next(line.split()[1] for line in out.splitlines() if line.startswith("submitted "))
    names = [p["name"] for p in json.loads((job_dir / "array.json").read_text())["points"]]
    jid = job_id(handle)

    # Task 1 is cancelled once it runs: a task cancelled while still pending is only dropped from
    # the array's task list (SLURM 22.05 logs no line for it and squeue shows no record of it).
    jobgen.wait_state(f"{handle}_1", {"RUNNING", *FINAL}, timeout=120)
    cancelled = json.loads(jobgen("cancel", f"{handle}_1", "-o", "json", check=False).stdout or "{}")
    final, seen = jobgen.wait_state(handle, FINAL, timeout=300)
    wait_for(lambda: not run_slurm(forgetful_lab, "squeue", "-h", "-t", "all", "-j", jid, check=False).stdout.strip(), 90, 1.0,
             what=f"squeue to forget array {jid}")

    status = jobgen.status(handle)
    tasks = [(t["handle"], t["state"], t["source"], t["details"].get("name"), t["details"].get("exit_code")) for t in status["tasks"]]
    assert (final, status["state"], status["source"]) == ("CANCELLED", "CANCELLED", "jobcomp"), (seen, cancelled, status)
    assert tasks[0] == (f"{handle}_0", "COMPLETED", "jobcomp", names[0], "0:0"), (tasks, jobgen("logs", f"{handle}_0", check=False).stdout[-2000:])
    assert tasks[1][:4] == (f"{handle}_1", "CANCELLED", "jobcomp", names[1]), tasks
    one = jobgen.status(f"{handle}_0")
    assert (one["state"], one["source"]) == ("COMPLETED", "jobcomp") and one["usage"]["elapsed_s"] > 0, one
    assert run_slurm(forgetful_lab, "squeue", "-h", "-t", "all", "-j", jid, check=False).stdout.strip() == ""
    print(f"\nlab array without accounting: read from the job-completion log {time.monotonic() - started:.0f} s after submit; "
          f"states seen {seen}")
