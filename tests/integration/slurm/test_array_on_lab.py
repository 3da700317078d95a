"""A sweep as ONE SLURM job array on the real lab cluster (profile ``slurm.sweep_as_array``).

A 2x2 sweep (trainer.learning_rate x trainer.micro_batch_size) of a tiny 1-node, 1-rank job is
rendered into one job directory and submitted with one sbatch; the lab's 2 nodes run 2 tasks at
a time. Proven from what each task left: its own run directory (``<runs dir>/<point name>``),
its summary.json (the point's name; tokens per step = its micro batch x block size) and the
hyper-parameters Lightning saved (its learning rate). In the same array, ``scontrol requeue
<jobid>_2`` puts task 2 alone back in the queue: it resumes from its checkpoint, the other tasks
are untouched.
Helpers come from test_jobgen_on_lab.py; the lab is the ``slurm_lab`` fixture (conftest.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import run_slurm, wait_for
from test_jobgen_on_lab import Jobgen, job_id, run_dir

pytestmark = pytest.mark.slurm_lab

ARRAY_PROFILE = """\
extends: slurm-lab
description: jobgen SLURM lab, sweeps as one job array
slurm:
  sweep_as_array: true
"""

SPEC = """\
name: {name}
model: {{preset: null, n_layer: 2, n_head: 2, d_model: 64, block_size: 64}}
data: {{max_bytes: 1000000}}
trainer: {{precision: 32-true, micro_batch_size: 8, learning_rate: 0.003, max_steps: {max_steps}, warmup_steps: 2,
          val_check_interval: {every}, limit_val_batches: 2, log_every_n_steps: 10}}
checkpoint: {{every_n_steps: {every}}}
resources: {{nodes: 1}}
"""

SWEEPS = ("--sweep", "trainer.learning_rate=1e-3,3e-3", "--sweep", "trainer.micro_batch_size=4,8")
POINTS = [("1e-3", 4), ("1e-3", 8), ("3e-3", 4), ("3e-3", 8)]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@pytest.fixture
def jobgen(slurm_lab, tmp_path) -> Iterator[Jobgen]:
    """As test_jobgen_on_lab's fixture: the CLI against the lab; a failed test leaves no job queued."""
    yield Jobgen(slurm_lab, tmp_path)
    jobs = run_slurm(slurm_lab, "squeue", "-h", "-o", "%i").stdout.split()
    if jobs:
        run_slurm(slurm_lab, "scancel", *jobs)
        wait_for(lambda: not run_slurm(slurm_lab, "squeue", "-h", "-o", "%i").stdout.split(), 60, 0.5, what="the queue to drain")


def submit_array(jg: Jobgen, name: str, *, max_steps: int, every: int) -> tuple[str, Path, list[dict]]:
    """Render the 2x2 sweep as one array and submit the directory; returns (handle, job dir, array.json points)."""
    jg.profile()
    (jg.root / "profiles" / "slurm-lab-array.yaml").write_text(ARRAY_PROFILE)
    spec = jg.root / f"{name}.yaml"
    spec.write_text(SPEC.format(name=name, max_steps=max_steps, every=every))
    jg("render", str(spec), "--profile", "slurm-lab-array", "--profiles-dir", str(jg.root / "profiles"), "--out", "manifests", *SWEEPS)
    job_dir = jg.root / "manifests" / "slurm-lab-array" / name
    assert "#SBATCH --array=0-3\n" in (job_dir / "job.sbatch").read_text()
    out = jg("submit", str(job_dir)).stdout
    handle = next(line.split()[1] for line in out.splitlines() if line.startswith("submitted "))
    points = json.loads((job_dir / "array.json").read_text())["points"]
    return handle, job_dir, points


def hparams(run: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(run.glob("logs/version_*/hparams.yaml")))


def test_a_sweep_runs_as_one_array_and_a_requeued_task_resumes_alone(jobgen, slurm_lab):
    """One array run proves both: each task ran its own point into its own run directory, with
    its own status and log, and ``ls`` shows the array once; and a ``scontrol requeue`` of task 2
    resumes that task from its checkpoint, the other tasks untouched. (Two tests before, each
    with its own array; one array does for both: same assertions, one array's wall time less.)"""
    # The requeue comes within a second of task 2's first step checkpoint (step 25); the task would
    # need 125 more steps (~4 s at ~30 steps/s) to finish on its own, so the requeued run is the one
    # that completes.
    started = time.monotonic()
    handle, _, points = submit_array(jobgen, "lab-array", max_steps=150, every=25)
    assert handle.startswith("slurm://jobgenlab/") and "_" not in job_id(handle)
    jid = job_id(handle)
    task2 = run_dir(jobgen, points[2]["name"])
    # tasks 0 and 1 take both nodes; task 2 starts when one of them ends
    wait_for(lambda: sorted((task2 / "checkpoints").glob("step-*")), 480, 0.5, what=f"a step checkpoint of task 2 in {task2}")
    run_slurm(slurm_lab, "scontrol", "requeue", f"{jid}_2")

    def pending() -> bool:
        return run_slurm(slurm_lab, "squeue", "-h", "-j", f"{jid}_2", "-o", "%T", check=False).stdout.strip() == "PENDING"

    wait_for(pending, 60, 0.5, what=f"task {jid}_2 back in the queue")
    run_slurm(slurm_lab, "scontrol", "update", f"JobId={jid}_2", "StartTime=now")  # docs/labs.md, pitfall 9
    final, seen = jobgen.wait_state(handle, FINAL, timeout=600)
    status = jobgen.status(handle)
    assert final == "COMPLETED", (seen, status, [jobgen("logs", "--rank", "all", f"{handle}_{i}", check=False).stdout[-2000:]
                                                 for i in range(4)])
    assert [(t["handle"], t["state"]) for t in status["tasks"]] == [(f"{handle}_{i}", "COMPLETED") for i in range(4)]
    # each task: its point, its run directory, its status and its log
    for i, (lr, mbs) in enumerate(POINTS):
        name = points[i]["name"]
        assert points[i]["overrides"] == {"trainer.learning_rate": lr, "trainer.micro_batch_size": str(mbs)}
        run = run_dir(jobgen, name)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["name"] == name and summary["global_step"] == 150 and summary["world_size"] == 1, summary
        assert summary["tokens_per_step"] == mbs * 64, summary
        assert f"learning_rate: {float(lr)}" in hparams(run), hparams(run)
        assert jobgen.status(f"{handle}_{i}")["state"] == "COMPLETED"
        log = jobgen("logs", f"{handle}_{i}").stdout
        assert f"jobgen: job {jid}_{i} ({name})" in log, log[-2000:]
        if i == 2:  # the requeued task resumed from its checkpoint
            assert "restart 1" in log and "resuming from" in log, log[-3000:]
            assert summary["resumed_from_step"] and 25 <= summary["resumed_from_step"] < 150, summary
        else:  # the others ran once, from the start
            assert "restart 1" not in log and "resuming from" not in log, log[-2000:]
            assert not summary.get("resumed_from_step"), summary
    restarts = {i: jobgen.status(f"{handle}_{i}")["details"].get("restarts") for i in range(4)}
    assert restarts[2] not in (None, "", "0") and all(restarts[i] == "0" for i in (0, 1, 3)), restarts
    logs = sorted(p.name for p in (jobgen.root / "runs" / "lab-array").glob("slurm-*.out"))
    assert logs == [f"slurm-{jid}_{i}.out" for i in range(4)]
    listed = json.loads(jobgen("ls", "-o", "json").stdout)
    assert [(r["handle"], r["name"], len(r["tasks"])) for r in listed] == [(handle, "lab-array", 4)]
    print(f"\nlab array: 4 tasks COMPLETED (task 2 requeued) {time.monotonic() - started:.0f} s after submit; states {seen}")
