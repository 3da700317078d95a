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

A stopped rank: a 1-node job of one rank with a budget of 1 and ``watchdog.hang_timeout_s: 6``,
its rank stopped with SIGSTOP past its first checkpoint. A stopped process cannot watch itself
and a one-rank job has no other rank to see its heartbeat stop, so the rank's sentinel process
(jobgen/train/sentinel.py) prints the verdict naming the rank and its node, and ends the rank with
SIGKILL; srun reports it ``Killed`` (137), the batch script classes that as infrastructure,
excludes the node and requeues; the job resumes on the other node. (Two ranks on one node,
whose rank 0 would find its stopped peer and exit 201, do not fit the lab: slurmctld refuses
``--ntasks-per-node=2`` on a node of one CPU, ``--overcommit`` or not, and Lightning needs
``--ntasks-per-node``.)

A failed GPU: a fake ``nvidia-smi`` on node1 only (bind-mounted in node1's mount namespace over
a directory on the job's PATH, which on node2 stays empty) reports an uncorrectable ECC error.
The preflight's GPU check fails there naming node1 and exits 200; the job requeues itself without
node1 and completes on node2, whose check is skipped (no nvidia-smi). The lab's nodes have no
GPUs and its torch has no CUDA, so a GPU profile can neither be scheduled (no GRES) nor train
there: the job runs on the lab's CPU profile, and a ``sitecustomize`` on the job's PYTHONPATH has
the preflight check each node's GPUs as on a GPU profile of one GPU per node. That decision is
the only emulated part; nvidia-smi's output, the check, the exit code, srun, the batch script's
class and exclusion, SLURM's requeue and the run on the other node are real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


def _running(jobgen, lab, name: str, text: str, node: str | None = None) -> tuple[str, str, Path, str, int]:  # noqa: F811 - the fixture
    """Submit the spec ``text`` as ``name`` and wait for its first step checkpoint; returns
    ``(handle, job id, run dir, node, pid)``: the rank's process on ``node`` (default: the job's
    one node, as squeue names it)."""
    spec = jobgen.root / f"{name}.yaml"
    spec.write_text(text)
    handle = jobgen.submit(str(spec))
    jid = job_id(handle)
    run = run_dir(jobgen, name)
    wait_for(lambda: sorted((run / "checkpoints").glob("step-*")), 300, 0.5, what=f"a step checkpoint in {run}")
    if node is None:
        node = run_slurm(lab, "squeue", "-h", "-j", jid, "-o", "%N").stdout.strip()
        assert node in NODE_NAMES, node
    pid = wait_for(lambda: _rank_pid(lab, node), 30, 0.2, what=f"the rank's process on {node}")
    return handle, jid, run, node, pid


def test_a_killed_rank_requeues_the_job_onto_the_other_node_where_it_resumes(jobgen, slurm_lab):  # noqa: F811 - the fixture
    jobgen.profile()
    received = jobgen.root / "notified.jsonl"  # the notify command runs on the nodes, which share this filesystem
    recorder = jobgen.root / "recorder.py"
    recorder.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    notify = f"notify: {{command: [{json.dumps(sys.executable)}, {json.dumps(str(recorder))}, {json.dumps(str(received))}]}}\n"
    started = time.monotonic()
    handle, jid, run, first, pid = _running(jobgen, slurm_lab, "lab-restart", SPEC.format(name="lab-restart", max_steps=600, every=25)
                                            + notify)
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


def _requeued(lab, jid: str, node: str) -> float:
    """Wait until the job is requeued with ``node`` excluded and back in the queue (PENDING);
    returns ``time.time()`` then (for release_requeued: the requeue came before it)."""
    wait_for(lambda: f"ExcNodeList={node}" in _show_job(lab, jid), 60, 0.5,
             what=f"ExcNodeList={node} on job {jid} ({_show_job(lab, jid)[-400:]})")
    # the requeued job is COMPLETING until its steps are gone from the node (seconds on a loaded machine), then PENDING
    wait_for(lambda: "JobState=PENDING" in _show_job(lab, jid), 120, 0.5,
             what=f"job {jid} PENDING after its requeue ({_show_job(lab, jid)[-400:]})")
    shown = _show_job(lab, jid)
    assert "Restarts=1" in shown and f"ExcNodeList={node}" in shown, shown
    return time.time()


def _ran_on(lab, jid: str) -> str:
    """The node list SLURM shows for the job (the last run's)."""
    return run_slurm(lab, "squeue", "-h", "-t", "all", "-j", jid, "-o", "%N").stdout.strip()


def test_a_stopped_rank_is_found_hung_and_the_job_requeues_onto_the_other_node_where_it_resumes(jobgen, slurm_lab):  # noqa: F811 - the fixture
    jobgen.profile()
    started = time.monotonic()
    handle, jid, run, first, pid = _running(jobgen, slurm_lab, "lab-hang", SPEC.format(name="lab-hang", max_steps=300, every=25)
                                            + "watchdog: {hang_timeout_s: 6}\n")
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()

    requeued_at = _requeued(slurm_lab, jid, first)
    found_s = time.monotonic() - stopped
    # the limit (6 s, or 10 x the median step where that is longer), a tick, srun's end of the step, the requeue
    assert found_s < 6 + 30, found_s
    verdict = json.loads((run / "hang" / "verdict.json").read_text())
    assert (verdict["exit_code"], verdict["decided_by"]) == (137, "sentinel"), verdict
    assert [(r["rank"], r["host"], r["pid"]) for r in verdict["heartbeat_stopped_first"]] == [(0, first, pid)], verdict
    release_requeued(slurm_lab, jid, requeued_at=requeued_at)
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    log = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{log[-4000:]}"
    assert "error: hang: no rank advanced its optimizer step for " in log, log[-4000:]
    assert f"heartbeat stopped first: rank 0 on node {first} (pid {pid}) at step " in log, log[-4000:]
    other = next(node for node in NODE_NAMES if node != first)
    assert f"jobgen: restart 1/1 after infrastructure failure (exit 137 on {first}); excluding {first}" in log, log[-4000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 300 and summary["resumed_from_step"] and summary["resumed_from_step"] >= 25, summary
    assert _ran_on(slurm_lab, jid) == other
    print(f"\nhang job: rank stopped on {first}, requeued {found_s:.0f} s later onto {other}, COMPLETED "
          f"{time.monotonic() - started:.0f} s after submit (resumed from step {summary['resumed_from_step']}); states {seen}")


def test_a_hang_of_a_two_node_job_excludes_the_node_whose_heartbeat_stopped(jobgen, slurm_lab):  # noqa: F811 - the fixture
    """Rank 1 on the second node stopped: rank 0's watchdog decides (exit 201 on the first node) and
    srun then kills the stopped rank. The node to exclude is the one the verdict names, not the
    first task srun reports. The requeued job cannot run on one node: it stays PENDING and is
    cancelled."""
    jobgen.profile()
    first, second = NODE_NAMES
    text = SPEC.format(name="lab-hang2", max_steps=3000, every=25).replace("nodes: 1", "nodes: 2") + "watchdog: {hang_timeout_s: 6}\n"
    handle, jid, run, _, pid = _running(jobgen, slurm_lab, "lab-hang2", text, node=second)  # rank 1
    try:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: "Restarts=1" in _show_job(slurm_lab, jid), 90, 0.5,
                 what=f"job {jid} requeued ({_show_job(slurm_lab, jid)[-400:]})")
        log = (run / f"slurm-{jid}.out").read_text(errors="replace")
        verdict = json.loads((run / "hang" / "verdict.json").read_text())
        assert [(r["rank"], r["host"]) for r in verdict["heartbeat_stopped_first"]] == [(1, second)], verdict
        def excluded() -> str | None:
            shown = _show_job(slurm_lab, jid)
            return shown if "ExcNodeList=(null)" not in shown else None

        shown = wait_for(excluded, 30, 0.5, what=f"job {jid}'s ExcNodeList set ({log[-3000:]})")
        assert f"ExcNodeList={second}" in shown, (shown, log[-3000:])
        assert (f"jobgen: restart 1/1 after infrastructure failure (exit 201 on {first}); excluding {second}, "
                f"whose heartbeat stopped first (hang/verdict.json)") in log, log[-4000:]
    finally:
        run_slurm(slurm_lab, "scancel", jid, check=False)


#: What the fake nvidia-smi prints for the preflight's query (nvidia-smi --query-gpu ... --format=csv,noheader,nounits):
#: GPU 0 with 2 uncorrectable ECC errors since the driver loaded.
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$1" in
    --query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 2, No, No" ;;
    *) echo "fake nvidia-smi of the SLURM lab: only --query-gpu" >&2; exit 2 ;;
esac
"""

#: Has the preflight of the job's tasks (srun sets SLURM_STEP_ID; not the batch shell, not the
#: jobgen CLI) check the node's GPUs as on a GPU profile of one GPU per node (see the module doc).
GPU_PROFILE_SITECUSTOMIZE = """import os

if "SLURM_STEP_ID" in os.environ:
    import jobgen.train.preflight as preflight

    _check = preflight.check_node_gpus

    def check_node_gpus(accelerator, devices_per_node, environ, out):
        return _check("gpu", 1, environ, out)

    preflight.check_node_gpus = check_node_gpus
"""


def _in_mount_namespace(lab, node: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the mount namespace of the node's slurmd (which its jobs' processes share)."""
    pid = lab.daemon_pids()[f"slurmd@{node}"]
    return subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", *argv], capture_output=True, text=True,
                          timeout=30, check=False)


@pytest.fixture
def nvidia_smi_on_node1(slurm_lab, tmp_path) -> Iterator[Path]:
    """A fake nvidia-smi on node1 only; yields the directory to put on the job's PATH (empty on
    every other node). Bind-mounted in node1's mount namespace, unmounted at the end."""
    on_path, fake = tmp_path / "node-bin", tmp_path / "node1-bin"
    on_path.mkdir()
    fake.mkdir()
    (fake / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (fake / "nvidia-smi").chmod(0o755)
    node = NODES[0].name
    mounted = _in_mount_namespace(slurm_lab, node, "mount", "--bind", str(fake), str(on_path))
    assert mounted.returncode == 0, mounted.stderr
    try:
        yield on_path
    finally:
        gone = _in_mount_namespace(slurm_lab, node, "umount", str(on_path))
        (fake / "nvidia-smi").unlink()
        assert gone.returncode == 0, gone.stderr
        assert not list(on_path.iterdir()), f"{on_path} still shows files on the host"


def test_a_node_whose_gpu_fails_the_preflight_is_excluded_and_the_job_completes_on_the_other(
        jobgen, slurm_lab, nvidia_smi_on_node1, tmp_path):  # noqa: F811 - the fixture
    node1, node2 = NODE_NAMES
    assert _in_mount_namespace(slurm_lab, node1, "sh", "-c", f"test -x {nvidia_smi_on_node1}/nvidia-smi").returncode == 0
    assert _in_mount_namespace(slurm_lab, node2, "sh", "-c", f"test -e {nvidia_smi_on_node1}/nvidia-smi").returncode == 1
    site = tmp_path / "gpu-profile"
    site.mkdir()
    (site / "sitecustomize.py").write_text(GPU_PROFILE_SITECUSTOMIZE)
    jobgen.profile()
    spec = jobgen.root / "lab-gpu-check.yaml"
    spec.write_text(SPEC.format(name="lab-gpu-check", max_steps=20, every=20))
    # sbatch passes the submit's environment to the job
    jobgen.env.update(PATH=f"{nvidia_smi_on_node1}{os.pathsep}{jobgen.env['PATH']}",
                      PYTHONPATH=f"{site}{os.pathsep}{jobgen.env['PYTHONPATH']}")
    started = time.monotonic()
    handle = jobgen.submit(str(spec), "slurm-lab", "--preflight")
    jid = job_id(handle)
    # both nodes idle (the fixture drains the queue): slurmctld places the job on the first, node1
    requeued_at = _requeued(slurm_lab, jid, node1)
    release_requeued(slurm_lab, jid, requeued_at=requeued_at)
    final, seen = jobgen.wait_state(handle, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    log = jobgen("logs", "--rank", "all", handle).stdout
    assert final == "COMPLETED", f"{seen}\n{log[-4000:]}"
    assert (f"error: preflight: node {node1}: GPU 0 (NVIDIA H100 80GB HBM3): 2 uncorrectable ECC error(s) since the "
            "driver loaded") in log, log[-4000:]
    assert f"jobgen: restart 1/1 after infrastructure failure (exit 200 on {node1}); excluding {node1}" in log, log[-4000:]
    assert f"preflight: GPU check on node {node2} skipped: nvidia-smi is not on PATH" in log, log[-4000:]
    assert json.loads((run_dir(jobgen, "lab-gpu-check") / "summary.json").read_text())["global_step"] == 20
    assert _ran_on(slurm_lab, jid) == node2
    print(f"\nGPU check job: failed on {node1}, requeued onto {node2}, COMPLETED {time.monotonic() - started:.0f} s after "
          f"submit; states {seen}")
