"""`jobgen.api.executor` on the real lab: a Python callable through submitit.

A function's result comes back through ``job.result()`` and the job is listed by ``jobgen ls``; a
``submitit.helpers.Checkpointable`` callable, signalled with the profile's requeue signal (USR1
here, not submitit's default USR2, so the test fails if the profile's signal does not reach
submitit), checkpoints, requeues itself and resumes where it stopped, as submitit documents.
Runs in-process (``api.executor`` is a Python API) with the lab's SLURM_CONF and a state index of
its own; ``jobgen ls`` / ``status`` through the CLI. Wall times are printed (``-s``).
"""

from __future__ import annotations

import json
import time

import pytest
from lab import run_slurm, wait_for

from jobgen import api
from tests.conftest import REPO
from tests.integration.slurm import submitit_callables
from tests.integration.slurm.test_jobgen_on_lab import _requeue_now, jobgen  # noqa: F401 - jobgen: the fixture

pytestmark = pytest.mark.slurm_lab

USR1_PROFILE = """\
extends: slurm-lab
slurm:
  requeue_signal: USR1
"""


@pytest.fixture
def lab_env(jobgen, monkeypatch):  # noqa: F811
    """This process as a user's notebook on the lab's login node: sbatch finds the lab (SLURM_CONF),
    records go to the test's state index, and the nodes import the test callables (PYTHONPATH)."""
    jobgen.profile()
    (jobgen.root / "profiles" / "slurm-lab-usr1.yaml").write_text(USR1_PROFILE)
    for key in ("SLURM_CONF", "JOBGEN_STATE_DIR"):
        monkeypatch.setenv(key, jobgen.env[key])
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return jobgen


def test_a_callables_result_comes_back_and_jobgen_ls_lists_it(lab_env, slurm_lab):
    started = time.monotonic()
    ex = api.executor("slurm-lab", folder=lab_env.root / "submitit" / "%j", profiles_dir=lab_env.root / "profiles")
    job = ex.submit(submitit_callables.where_am_i, 6, 7)
    result = job.result()
    took = time.monotonic() - started
    assert result["product"] == 42 and result["job_id"] == job.job_id and result["host"] in slurm_lab.nodes, result
    assert (result["preempt_signal"], result["omp_threads"]) == ("USR2", "1"), result  # the profile's signal; the lab's 1 CPU per node
    [row] = json.loads(lab_env("ls", "-o", "json").stdout)
    assert (row["handle"], row["name"], row["state"], row["num_nodes"], row["accelerator"], row["stale"]) == \
        (f"slurm://jobgenlab/{job.job_id}", "where_am_i", "COMPLETED", 1, "cpu", None), row
    assert lab_env.status(row["handle"])["state"] == "COMPLETED"
    assert f"where_am_i: 6 x 7 on {result['host']}" in lab_env("logs", row["handle"]).stdout.splitlines()
    print(f"\nsubmitit callable on the lab: submit -> result {took:.1f} s")


def test_a_checkpointable_callable_requeued_on_the_profiles_signal_resumes(lab_env, slurm_lab):
    started = time.monotonic()
    ex = api.executor("slurm-lab-usr1", folder=lab_env.root / "submitit" / "%j", profiles_dir=lab_env.root / "profiles",
                      time_limit_min=15)
    ready = lab_env.root / "ready"
    job = ex.submit(submitit_callables.Countdown(4, str(ready)))
    wait_for(ready.exists, 120, 0.2, what="the first run to reach its half-way point")
    run_slurm(slurm_lab, "scancel", "--signal=USR1", job.job_id)  # to the job's steps, as --signal=USR1@T does
    _requeue_now(slurm_lab, job.job_id)
    result = job.result()
    took = time.monotonic() - started
    assert result == {"resumed_at": 2, "done": 4, "restart": 1}, (result, job.stderr())
    assert "Caught signal SIGUSR1" in (job.stderr() or ""), job.stderr()
    assert lab_env.status(f"slurm://jobgenlab/{job.job_id}")["state"] == "COMPLETED"
    print(f"\nsubmitit requeue on the lab: submit -> signal -> requeue -> result {took:.1f} s")
