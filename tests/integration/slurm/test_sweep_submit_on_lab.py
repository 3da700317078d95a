"""`jobgen submit SPEC --sweep ...` on the real lab cluster: with a profile
that extends the shipped ``slurm-cpu-array`` (sweeps as ONE job array) for the lab, one command
renders and submits a 2-point sweep as one array (one sbatch, one job in squeue with two tasks),
each task trains its own point, and ``jobgen ls`` lists the array with its tasks together under
the sweep's id. The lab is the session's ``slurm_lab`` fixture (conftest.py); a few steps only.
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from lab import run_slurm

from tests.integration.slurm.test_array_on_lab import FINAL
from tests.integration.slurm.test_jobgen_on_lab import job_id, jobgen, run_dir  # noqa: F401 - jobgen: the fixture

pytestmark = pytest.mark.slurm_lab

#: The shipped slurm-cpu-array (sweep_as_array: true, array_parallelism: 2) on the lab's partition.
PROFILE = """\
extends: slurm-cpu-array
description: jobgen SLURM lab, sweeps as one job array
cpus_per_node: 1
slurm:
  cluster: jobgenlab
  partition: lab
  python: {python}
  time_limit_min: 10
"""

SPEC = """\
name: lab-sweep
model: {preset: null, n_layer: 1, n_head: 2, d_model: 32, block_size: 32}
data: {max_bytes: 200000}
trainer: {precision: 32-true, micro_batch_size: 4, learning_rate: 0.003, max_steps: 6, warmup_steps: 1,
          val_check_interval: 3, limit_val_batches: 1, log_every_n_steps: 2}
checkpoint: {every_n_steps: 3}
resources: {nodes: 1}
"""


def test_submit_sweep_makes_one_array_and_ls_lists_its_tasks_together(jobgen):  # noqa: F811
    (jobgen.root / "profiles").mkdir()
    (jobgen.root / "profiles" / "lab-array.yaml").write_text(PROFILE.format(python=json.dumps(sys.executable)))
    spec = jobgen.root / "lab-sweep.yaml"
    spec.write_text(SPEC)
    started = time.monotonic()
    out = jobgen("submit", str(spec), "--profile", "lab-array", "--profiles-dir", str(jobgen.root / "profiles"),
                 "--sweep", "trainer.learning_rate=1e-3,3e-3", "-o", "json").stdout
    doc = json.loads(out)
    (job,) = doc["jobs"]
    handle = job["handle"]
    assert doc["sweep"]["array"] is True and doc["sweep"]["points"] == 2 and handle.startswith("slurm://jobgenlab/"), doc
    names = [t["name"] for t in job["tasks"]]
    assert [t["handle"] for t in job["tasks"]] == [f"{handle}_0", f"{handle}_1"] and names == ["lab-sweep-lr1e-3", "lab-sweep-lr3e-3"]
    # one job in SLURM's queue: the array (its tasks are <jobid>_<task>)
    queued = {line.split("_")[0] for line in run_slurm(jobgen.lab, "squeue", "-h", "-o", "%i").stdout.split()}
    assert queued <= {job_id(handle)}, queued

    final, seen = jobgen.wait_state(handle, FINAL, timeout=300)
    assert final == "COMPLETED", (seen, [jobgen("logs", "--rank", "all", f"{handle}_{i}", check=False).stdout[-2000:] for i in range(2)])
    for name, lr in zip(names, ("1e-3", "3e-3"), strict=True):
        summary = json.loads((run_dir(jobgen, name) / "summary.json").read_text())
        assert summary["name"] == name and summary["global_step"] == 6, summary
        assert f"learning_rate: {float(lr)}" in "".join(p.read_text() for p in run_dir(jobgen, name).glob("logs/version_*/hparams.yaml"))

    (row,) = json.loads(jobgen("ls", "-o", "json").stdout)
    assert (row["handle"], row["name"], row["state"], row["sweep"]["id"]) == (handle, "lab-sweep", "COMPLETED", doc["sweep"]["id"])
    assert [(t["handle"], t["name"], t["state"]) for t in row["tasks"]] == [(f"{handle}_{i}", n, "COMPLETED") for i, n in enumerate(names)]
    table = jobgen("ls").stdout.splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith(handle + " "))
    assert [table[at + 1 + i].split()[:3] for i in range(2)] == [[f"{handle}_{i}", n, "COMPLETED"] for i, n in enumerate(names)], table
    assert all(line.split()[-1] == doc["sweep"]["id"] for line in table[at:at + 3]), table
    print(f"\nlab submit --sweep: 2-task array COMPLETED {time.monotonic() - started:.0f} s after submit; states {seen}\n" + "\n".join(table))
