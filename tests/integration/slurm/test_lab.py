"""The SLURM lab itself, on the real cluster: placement, names, torch across nodes, test-only
submission, requeue, cancel and the job completion log. Later SLURM tests build on these."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import pytest
from lab import (
    NODES,
    LabConflictError,
    SlurmLab,
    _process_identity,
    job_state,
    release_requeued,
    run_slurm,
    sbatch,
    wait_for,
    wait_for_job,
)

pytestmark = pytest.mark.slurm_lab

NODE_IPS = {n.name: n.ip for n in NODES}


def script(path: Path, body: str) -> Path:
    """Write an executable bash batch script (strict mode) and return its path."""
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    path.chmod(0o755)
    return path


def test_lab_runs_its_daemons_and_shows_two_idle_nodes(slurm_lab: SlurmLab):
    expected = {"munged", "slurmctld", "slurmd@node1", "slurmd@node2"}
    if slurm_lab.accounting:
        expected |= {"mariadbd", "slurmdbd"}
    assert set(slurm_lab.daemon_pids()) == expected
    assert slurm_lab.node_states() == {"node1": "idle", "node2": "idle"}
    assert slurm_lab.node_pids() == {"controller": [], "node1": [], "node2": []}


def test_srun_places_one_task_on_each_node(slurm_lab: SlurmLab, tmp_path: Path):
    out = run_slurm(slurm_lab, "srun", "-N2", "--ntasks-per-node=1", f"--chdir={tmp_path}",
                    "hostname").stdout.split()
    assert sorted(out) == ["node1", "node2"]


def test_batch_job_on_two_nodes_resolves_the_other_node_and_completes(slurm_lab: SlurmLab,
                                                                      tmp_path: Path):
    job = script(tmp_path / "names.sh", """\
srun --ntasks-per-node=1 bash -c '
  me=$(hostname); other=node1; [ "$me" = node1 ] && other=node2
  echo "$me $other $(getent hosts "$other" | cut -d" " -f1)"'
""")
    job_id = sbatch(slurm_lab, "-N2", f"--chdir={tmp_path}", f"--output={tmp_path}/out.txt",
                    str(job))
    assert wait_for_job(slurm_lab, job_id, timeout=60) == "COMPLETED"
    lines = sorted((tmp_path / "out.txt").read_text().splitlines())
    assert lines == [f"node1 node2 {NODE_IPS['node2']}", f"node2 node1 {NODE_IPS['node1']}"]


ALL_REDUCE = """\
import datetime, os, socket
import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank={rank} world={world} host={socket.gethostname()} "
      f"master={os.environ['MASTER_ADDR']} sum={value.item():g}", flush=True)
dist.destroy_process_group()
os._exit(0)  # no interpreter teardown beside gloo's worker threads (README, "Command mode")
"""


def test_torch_gloo_all_reduce_across_two_nodes(slurm_lab: SlurmLab, tmp_path: Path):
    program = tmp_path / "all_reduce.py"
    program.write_text(ALL_REDUCE)
    # The venv is at an absolute path on the shared filesystem, so jobs can run it.
    task = (f"RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec {shlex.quote(sys.executable)} "
            f"{shlex.quote(str(program))}")
    job = script(tmp_path / "all_reduce.sh", f"""\
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
export MASTER_ADDR="${{hosts[0]}}" MASTER_PORT=29517 OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c {shlex.quote(task)}
""")
    job_id = sbatch(slurm_lab, "-N2", "--time=3", f"--chdir={tmp_path}",
                    f"--output={tmp_path}/out.txt", str(job))
    state = wait_for_job(slurm_lab, job_id, timeout=120)
    out = (tmp_path / "out.txt").read_text()
    assert state == "COMPLETED", out
    lines = sorted(line for line in out.splitlines() if line.startswith("rank="))
    assert lines == ["rank=0 world=2 host=node1 master=node1 sum=3",
                     "rank=1 world=2 host=node2 master=node1 sum=3"], out


def test_sbatch_test_only_answers_without_queueing(slurm_lab: SlurmLab, tmp_path: Path):
    fits = run_slurm(slurm_lab, "sbatch", "--test-only", "-N2", f"--chdir={tmp_path}",
                     "--wrap", "true")
    assert "to start at" in fits.stderr and "node[1-2]" in fits.stderr, fits.stderr
    too_big = run_slurm(slurm_lab, "sbatch", "--test-only", "-N3", f"--chdir={tmp_path}",
                        "--wrap", "true", check=False)
    assert too_big.returncode != 0
    assert "Requested node configuration is not available" in too_big.stderr
    assert run_slurm(slurm_lab, "squeue", "-h").stdout.strip() == ""


def test_requeued_job_runs_again_with_restart_count_1(slurm_lab: SlurmLab, tmp_path: Path):
    runs = tmp_path / "runs.txt"
    job = script(tmp_path / "requeue.sh", f"""\
echo "restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname)" >> {shlex.quote(str(runs))}
if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then sleep 300; fi
""")
    job_id = sbatch(slurm_lab, "-N1", "--requeue", f"--chdir={tmp_path}",
                    f"--output={tmp_path}/out.txt", str(job))
    try:
        wait_for(lambda: runs.exists() and runs.read_text(), 60, what="the first run")
        requeued_at = time.time()
        run_slurm(slurm_lab, "scontrol", "requeue", job_id)
        wait_for_job(slurm_lab, job_id, timeout=30, states={"PENDING"})
        # Requeued jobs wait ~120 s (credential lifetime) before they may start: pitfall 9.
        release_requeued(slurm_lab, job_id, requeued_at=requeued_at)
        assert wait_for_job(slurm_lab, job_id, timeout=60) == "COMPLETED"
    finally:
        run_slurm(slurm_lab, "scancel", job_id, check=False)
    restarts = [line.split()[0] for line in runs.read_text().splitlines()]
    assert restarts == ["restart=0", "restart=1"]
    shown = run_slurm(slurm_lab, "scontrol", "show", "job", job_id).stdout
    assert "Restarts=1" in shown


def on_both_nodes(pids: dict[str, list[int]]) -> dict[str, list[int]] | None:
    return pids if pids["node1"] and pids["node2"] else None


def nothing_left(pids: dict[str, list[int]]) -> dict[str, list[int]] | None:
    return pids if not any(pids.values()) else None


def test_scancel_leaves_no_process_of_the_job_on_any_node(slurm_lab: SlurmLab, tmp_path: Path):
    job_id = sbatch(slurm_lab, "-N2", f"--chdir={tmp_path}", f"--output={tmp_path}/out.txt",
                    "--wrap", "srun --ntasks-per-node=1 sleep 300")
    try:
        wait_for_job(slurm_lab, job_id, timeout=30, states={"RUNNING"})
        # slurmstepd and sleep on both nodes: node_pids() sees job processes.
        busy = wait_for(lambda: on_both_nodes(slurm_lab.node_pids()), 30,
                        what="job processes on both nodes")
        assert busy["controller"] == []
    finally:
        run_slurm(slurm_lab, "scancel", job_id)
    assert wait_for_job(slurm_lab, job_id, timeout=30) == "CANCELLED"
    left = wait_for(lambda: nothing_left(slurm_lab.node_pids()), 30,
                    what="job processes gone from every node")
    assert left == {"controller": [], "node1": [], "node2": []}


def test_job_completion_log_records_final_states(slurm_lab: SlurmLab, tmp_path: Path):
    ok = sbatch(slurm_lab, "-N1", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "true")
    bad = sbatch(slurm_lab, "-N1", f"--chdir={tmp_path}", "--output=/dev/null", "--wrap", "exit 3")
    assert wait_for_job(slurm_lab, ok) == "COMPLETED"
    assert wait_for_job(slurm_lab, bad) == "FAILED"
    if not slurm_lab.accounting:
        # No slurmdbd: plain sacct refuses, `sacct -c` reads jobcomp/filetxt (pitfall 8).
        plain = run_slurm(slurm_lab, "sacct", "-j", ok, check=False)
        assert "accounting storage is disabled" in (plain.stdout + plain.stderr)

    def records() -> dict[str, str]:
        out = run_slurm(slurm_lab, "sacct", "-c", "-j", f"{ok},{bad}", "-n", "-P",
                        "-o", "JobID,State,ExitCode").stdout
        found = {line.split("|")[0]: line for line in out.splitlines() if line}
        return found if {ok, bad} <= found.keys() else {}

    found = wait_for(records, 15, what="jobcomp records")
    assert found[ok] == f"{ok}|COMPLETED|0:0"
    assert found[bad] == f"{bad}|FAILED|3:0"


def test_a_second_lab_is_refused_while_this_one_is_up(slurm_lab: SlurmLab, tmp_path: Path):
    with pytest.raises(LabConflictError, match=str(slurm_lab.root)):
        SlurmLab(tmp_path / "other").up()
    assert job_state(slurm_lab, "999999") == ""  # the running lab still answers
    assert slurm_lab.node_states() == {"node1": "idle", "node2": "idle"}


def test_a_lab_is_abandoned_once_its_root_or_its_owner_process_is_gone(tmp_path: Path):
    """What lets a test session take over a lab a killed session left (no daemons needed)."""
    import subprocess

    lab = SlurmLab(tmp_path / "left")
    assert "is gone" in lab.abandoned()  # no lab.json: its temporary root was deleted
    lab._write_state(owner=None)  # brought up by `lab.py up`: held until `down`
    assert lab.abandoned() is None
    me = _process_identity(os.getpid())
    lab._write_state(owner=me)
    assert lab.abandoned() is None
    dead = subprocess.Popen(["sleep", "30"])
    owner = _process_identity(dead.pid)
    dead.kill()
    dead.wait()
    lab._write_state(owner=owner)
    assert lab.abandoned() == f"its owner, pid {dead.pid}, has exited"
    lab._write_state(owner={**me, "start": me["start"] - 1})
    assert "has exited" in lab.abandoned()  # the PID was reused by a later process
