"""The restart budget (``restart.max_restarts``) on the real 2-node lab cluster.

A 1-node job with a budget of 1 whose rank is killed with SIGKILL past its first checkpoint (as
the kernel's OOM killer or a failing node ends a process) requeues itself: the batch script
classes srun's ``task 0: Killed`` as an infrastructure failure, adds the node to the job's
ExcNodeList and runs ``scontrol requeue``. The requeued job runs on the other node, resumes
from its checkpoint and completes. The test releases it from SLURM's requeue hold (~120 s,
BeginTime; lab.release_requeued) so that it does not wait; nothing else is done for it.

A user failure with a budget of 3 is never requeued: tests/integration/slurm/test_jobgen_on_lab.py
``test_an_input_error_fails_the_job_naming_the_users_spec_file`` submits its bad-data job with a
budget and checks that the job ends FAILED after one run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from lab import NODES, release_requeued, run_slurm, wait_for

from tests.integration.slurm.test_jobgen_on_lab import job_id, jobgen, run_dir  # noqa: F401 - the fixture

pytestmark = pytest.mark.slurm_lab

NODE_NAMES = tuple(node.name for node in NODES)

SPEC = """\
name: {name}
model: {{preset: null, n_layer: 2, n_head: 2, d_model: 64, block_size: 64}}
data: {{max_bytes: 1000000}}
trainer: {{precision: 32-true, micro_batch_size: 8, learning_rate: 0.003, max_steps: {max_steps}, warmup_steps: 5,
          val_check_interval: 1000, limit_val_batches: 2, log_every_n_steps: 25}}
checkpoint: {{every_n_steps: {every}}}
resources: {{nodes: 1}}
restart: {{max_restarts: 1}}
"""


def _rank_pid(lab, node: str) -> int | None:
    """The pid of the job's rank on ``node`` (``python -m jobgen.train``, not srun, whose command
    line names it too, nor a data-loader worker, a child of the rank with the same command line)."""
    def is_rank(pid: int) -> bool:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return argv[1:3] == [b"-m", b"jobgen.train"] and not os.path.basename(argv[0]).startswith(b"srun")

    ranks = [pid for pid in lab.node_pids()[node] if is_rank(pid)]
    parents = {pid: int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in ranks
               if Path(f"/proc/{pid}/stat").exists()}
    top = [pid for pid in ranks if parents.get(pid) not in ranks]
    return top[0] if len(top) == 1 else None


def _show_job(lab, jid: str) -> str:
    return run_slurm(lab, "scontrol", "show", "job", "-o", jid, check=False).stdout


def test_a_killed_rank_requeues_the_job_onto_the_other_node_where_it_resumes(jobgen, slurm_lab):  # noqa: F811 - the fixture
    jobgen.profile()
    spec = jobgen.root / "lab-restart.yaml"
    received = jobgen.root / "notified.jsonl"  # the notify command runs on the nodes, which share this filesystem
    recorder = jobgen.root / "recorder.py"
    recorder.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    notify = f"notify: {{command: [{json.dumps(sys.executable)}, {json.dumps(str(recorder))}, {json.dumps(str(received))}]}}\n"
    spec.write_text(SPEC.format(name="lab-restart", max_steps=600, every=25) + notify)
    started = time.monotonic()
    handle = jobgen.submit(str(spec))
    jid = job_id(handle)
    run = run_dir(jobgen, "lab-restart")
    wait_for(lambda: sorted((run / "checkpoints").glob("step-*")), 300, 0.5, what=f"a step checkpoint in {run}")
    first = run_slurm(slurm_lab, "squeue", "-h", "-j", jid, "-o", "%N").stdout.strip()
    assert first in NODE_NAMES, first
    pid = wait_for(lambda: _rank_pid(slurm_lab, first), 30, 0.2, what=f"the rank's process on {first}")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    # the batch script requeues the job and excludes the node: both visible while it waits
    wait_for(lambda: f"ExcNodeList={first}" in _show_job(slurm_lab, jid), 60, 0.5,
             what=f"ExcNodeList={first} on job {jid} ({_show_job(slurm_lab, jid)[-400:]})")
    # the requeued job is COMPLETING until its steps are gone from the node (seconds on a loaded machine), then PENDING
    wait_for(lambda: "JobState=PENDING" in _show_job(slurm_lab, jid), 120, 0.5,
             what=f"job {jid} PENDING after its requeue ({_show_job(slurm_lab, jid)[-400:]})")
    shown = _show_job(slurm_lab, jid)
    assert "Restarts=1" in shown and f"ExcNodeList={first}" in shown, shown
    release_requeued(slurm_lab, jid, requeued_at=killed_at)
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    log = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{log[-4000:]}"
    other = next(node for node in NODE_NAMES if node != first)
    assert f"jobgen: restart 1/1 after infrastructure failure (exit 137 on {first}); excluding {first}" in log, log[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 600 and summary["resumed_from_step"] and summary["resumed_from_step"] >= 25, summary
    # the second run was on the other node: SLURM's NodeList of the finished job
    assert f"NodeList={other}" in _show_job(slurm_lab, jid) or other in run_slurm(
        slurm_lab, "squeue", "-h", "-t", "all", "-j", jid, "-o", "%N").stdout
    text = jobgen("status", handle).stdout
    assert "restarts 1" in text and "  restart budget: max_restarts 1, 1 used (spec.json)" in text, text
    # the batch script's record of the restart: in summary.json, and sent by the requeued run's rank zero before started
    restarts = summary["restarts"]
    assert (restarts["max_restarts"], restarts["used"]) == (1, 1), restarts
    (entry,) = restarts["history"]
    assert (entry["restart"], entry["class"], entry["reason"], entry["exit_code"]) == (1, "infrastructure", f"exit 137 on {first}", 137)
    bodies = [json.loads(line) for line in received.read_text().splitlines()]
    assert [(b["event"], b["restart"]) for b in bodies] == [("started", 0), ("restart", 1), ("started", 1), ("finished", 1)], bodies
    assert (bodies[1]["class"], bodies[1]["reason"], bodies[1]["restarts_used"], bodies[1]["max_restarts"]) == \
           ("infrastructure", f"exit 137 on {first}", 1, 1), bodies[1]
    assert bodies[1]["handle"].endswith(f"/{jid}"), (bodies[1], handle)
    print(f"\nrestart job: killed on {first}, requeued onto {other}, COMPLETED {time.monotonic() - started:.0f} s after "
          f"submit (resumed from step {summary['resumed_from_step']}); states {seen}")
