"""Command mode and job triage/accounting on the real 2-node lab cluster.

- the shipped plain-torch DDP script and the shipped LightningCLI script, launched by ``jobgen
  submit`` through srun on 2 nodes x 1 rank: world size 2, ranks 0 and 1 on node ranks 0 and 1
  (read back with ``jobgen logs --rank all``); the finished job's CPU-hours in ``jobgen status -o
  json`` against the job-completion log (``sacct -c``: the lab has no slurmdbd);
- ``jobgen logs --first-error`` on a 2-node job in which only rank 1 raises, after a collective:
  it names rank 1, the node srun ran it on, and the exception line of its traceback.

The examples are copied out of the checkout first (``project``, as the local command-mode tests
do), into the test's directory, which is not a git repository: no snapshot, the ranks run the
copy where ``jobgen submit`` ran (the lab nodes share the host's filesystem).
"""

from __future__ import annotations

import json
import re

import pytest
from lab import run_slurm, wait_for

from tests.entrypoint.test_command_run import project
from tests.integration.slurm.test_jobgen_on_lab import job_id, jobgen  # noqa: F401 - jobgen: the fixture

pytestmark = pytest.mark.slurm_lab
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}


def _run(jg, spec: str, expect: str = "COMPLETED", timeout: float = 300) -> tuple[str, str]:
    """Submit ``spec`` to the lab profile, wait for the end; returns (handle, every rank's output)."""
    jg.profile()
    handle = jg.submit(spec)
    final, seen = jg.wait_state(handle, FINAL, timeout=timeout)
    everything = jg("logs", "--rank", "all", handle).stdout
    assert final == expect, f"{seen}\n{everything[-4000:]}"
    return handle, everything


def _ranked(everything: str, rank: int, pattern: str) -> re.Match[str]:
    """The first line of rank ``rank`` (srun's ``--label`` prefix) matching ``pattern``."""
    match = re.search(rf"^\s*{rank}: {pattern}", everything, re.M)
    assert match, f"no line of rank {rank} matches {pattern!r}:\n{everything[-4000:]}"
    return match


def test_plain_ddp_script_runs_with_world_size_two_and_its_cpu_hours_match_the_completion_log(jobgen, slurm_lab):  # noqa: F811
    project(jobgen.root)
    handle, everything = _run(jobgen, "examples/command-ddp.yaml")
    for rank in (0, 1):
        _ranked(everything, rank, rf"ddp: rank {rank} of world size 2, local rank 0, node rank {rank}, master node1:\d+, "
                                  rf"cwd {re.escape(str(jobgen.root))}$")
        _ranked(everything, rank, rf"ddp: rank {rank} all_reduce\(sum of rank\+1\) = 3 \(expected 3\)")
        _ranked(everything, rank, rf"ddp: rank {rank} 3 step\(s\), weights in sync across ranks: True")

    # GPU-hours (here CPU-hours) of the finished job: the allocation's CPUs x its elapsed time.
    jid = job_id(handle)

    def completion_record() -> list[str] | None:
        out = run_slurm(slurm_lab, "sacct", "-c", "--jobs", jid, "--noheader", "--parsable2",
                        "--format=JobID,State,ElapsedRaw,NCPUS", check=False).stdout
        rows = [line.split("|") for line in out.splitlines() if line.split("|")[0] == jid]
        return rows[-1] if rows else None

    _, state, elapsed_raw, ncpus = wait_for(completion_record, 30, 0.5, what=f"job {jid} in the job-completion log")
    status = jobgen.status(handle)
    usage = status["usage"]
    assert state == "COMPLETED" and usage is not None, status
    assert usage["device_kind"] == "cpu" and usage["devices"] == int(ncpus) >= 2, (usage, ncpus)
    assert abs(usage["elapsed_s"] - int(elapsed_raw)) <= 1, (usage, elapsed_raw)
    assert usage["cpu_hours"] == round(usage["devices"] * usage["elapsed_s"] / 3600, 6), usage
    assert usage["cost"] is None
    # Once the controller forgets the job (MinJobAge, 300 s here) status falls back to the job-completion
    # log. Rather than wait, one squeue that answers as it then does stands in; sacct -c is the real one.
    shim = jobgen.root / "forgotten"
    shim.mkdir()
    (shim / "squeue").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    (shim / "squeue").chmod(0o755)
    path = jobgen.env["PATH"]
    jobgen.env["PATH"] = f"{shim}:{path}"
    try:
        later = jobgen.status(handle)
    finally:
        jobgen.env["PATH"] = path
    assert (later["state"], later["source"]) == ("COMPLETED", "jobcomp"), later
    logged = later["usage"]
    assert (logged["device_kind"], logged["devices"], logged["elapsed_s"]) == ("cpu", int(ncpus), int(elapsed_raw)), logged
    assert logged["cpu_hours"] == round(int(ncpus) * int(elapsed_raw) / 3600, 6) and "jobcomp" in logged["source"], logged
    print(f"\nddp job {jid}: usage {usage} (source {status['source']}); sacct -c ElapsedRaw {elapsed_raw}, NCPUS {ncpus}; "
          f"from the completion log: {logged}")


def test_lightning_cli_script_sees_two_nodes_and_distinct_ranks(jobgen):  # noqa: F811
    project(jobgen.root)
    _, everything = _run(jobgen, "examples/command-lightning-cli.yaml")
    for rank in (0, 1):
        _ranked(everything, rank, rf"lightning: global rank {rank} of world size 2, num_nodes 2, devices 1, "
                                  r"strategy DDPStrategy, precision 32-true")
        _ranked(everything, rank, rf"lightning: global rank {rank} finished at step 4$")


FAILS_ON_RANK_1 = """\
import os, socket
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
value = torch.ones(1)
dist.all_reduce(value)
print(f"failing: rank {rank} on {socket.gethostname()} after all_reduce = {value.item():g}", flush=True)
if rank == 1:
    raise ValueError("rank 1 fails on purpose after the all-reduce")
dist.barrier()  # rank 0 waits for rank 1, which never comes
"""


def test_first_error_names_the_failing_rank_its_node_and_its_exception(jobgen):  # noqa: F811
    (jobgen.root / "fail_on_rank1.py").write_text(FAILS_ON_RANK_1)
    spec = jobgen.root / "lab-first-error.yaml"
    spec.write_text("name: lab-first-error\nentrypoint: {script: fail_on_rank1.py}\ntrainer: {strategy: ddp}\n"
                    "resources: {nodes: 2}\n")
    handle, everything = _run(jobgen, str(spec), expect="FAILED")
    host = _ranked(everything, 1, r"failing: rank 1 on (\S+) after all_reduce = 2$").group(1)
    srun_says = re.search(r"^srun: error: (\S+): task 1: ", everything, re.M)  # "Exited with exit code 1", "Aborted"
    assert srun_says and srun_says.group(1) == host, everything[-4000:]

    found = json.loads(jobgen("logs", "--first-error", "-o", "json", handle).stdout)
    first = found["first"]
    assert (first["rank"], first["node"], first["kind"]) == (1, host, "traceback"), found
    assert first["headline"] == "ValueError: rank 1 fails on purpose after the all-reduce", found
    assert first["lines"][0] == "Traceback (most recent call last):", first["lines"]
    text = jobgen("logs", "--first-error", handle).stdout
    assert text.startswith(f"first failure: rank 1 on {host} (traceback;"), text
    assert "  ValueError: rank 1 fails on purpose after the all-reduce" in text.splitlines()
    print(f"\n{text}")


def test_a_script_that_exits_3_is_failed_with_exit_code_3_in_status_and_ls(jobgen):  # noqa: F811
    """A one-node command-mode job whose script exits 3 is FAILED in `jobgen status`
    with SLURM's exit code ``3:0`` (code:signal), and `jobgen ls --state FAILED` lists it."""
    (jobgen.root / "exit3.py").write_text('import sys\nprint("exit3: giving up", flush=True)\nsys.exit(3)\n')
    spec = jobgen.root / "lab-exit3.yaml"
    spec.write_text("name: lab-exit3\nentrypoint: {script: exit3.py}\nresources: {nodes: 1}\n")
    handle, everything = _run(jobgen, str(spec), expect="FAILED", timeout=120)
    assert "exit3: giving up" in everything, everything[-3000:]
    status = jobgen.status(handle)
    assert (status["state"], status["details"].get("exit_code")) == ("FAILED", "3:0"), status
    listed = {row["handle"]: row["state"] for row in json.loads(jobgen("ls", "--state", "FAILED", "-o", "json").stdout)}
    assert listed == {handle: "FAILED"}, listed
