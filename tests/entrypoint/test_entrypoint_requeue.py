"""SLURM pre-emption in the entrypoint: the requeue signal reaching the ranks at different times.

Real training processes launched the way ``srun`` launches them (SLURM_PROCID etc. set per
task, one task per "node"), gloo on CPU; only ``scontrol`` is a stand-in that records its
arguments (the real cluster test is tests/integration/slurm/test_jobgen_on_lab.py). SLURM
signals each task on its own, so the hardest case is a signal that reaches one rank only: with
Lightning's own auto-requeue handler that rank enters a collective checkpoint save alone and
the job hangs until its time limit.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.entrypoint.conftest import REPO, child_env
from tests.ports import ATTEMPTS, address_in_use, next_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 240

SCONTROL = """#!/bin/sh
# Records what the entrypoint asked SLURM for; exits with $FAKE_SCONTROL_RC.
echo "$@" >> "$FAKE_SCONTROL_LOG"
exit "${FAKE_SCONTROL_RC:-0}"
"""


def _srun_env(tmp_path: Path, rank: int, ntasks: int, port: int, scontrol_rc: int) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(SCONTROL)
    scontrol.chmod(0o755)
    env = child_env()
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "FAKE_SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "FAKE_SCONTROL_RC": str(scontrol_rc),
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "tiny", "SLURM_NODELIST": "localhost",
        "SLURM_NTASKS": str(ntasks), "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": str(ntasks),
        "SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank), "SLURM_LOCALID": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })  # fmt: skip
    return env


def _launch(tmp_path: Path, spec: Path, ntasks: int, scontrol_rc: int = 0) -> list[tuple[subprocess.Popen, Path]]:
    """Start ``ntasks`` ranks as srun would (one per node); rank i writes to out-<i>.txt.

    Every rank must get MASTER_PORT before rank 0's TCPStore binds it, so the port cannot be
    picked by the listener; it comes from tests/ports.py (below the ephemeral range, a stretch
    of its own per test process), and when rank 0 still finds it taken (EADDRINUSE) every rank
    is stopped and started again on the next port. Returns once training has begun (a
    ``step N/`` line from rank 0) or a rank has exited for another reason.
    """
    for _ in range(ATTEMPTS):
        port = next_port()
        procs = []
        for rank in range(ntasks):
            out = tmp_path / f"out-{rank}.txt"
            with open(out, "w") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(tmp_path / "run")],
                    cwd=REPO, env=_srun_env(tmp_path, rank, ntasks, port, scontrol_rc),
                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
            procs.append((proc, out))
        if not _lost_the_port(procs):
            return procs
        _kill(procs)
    pytest.fail(f"rank 0 found each of {ATTEMPTS} ports taken (EADDRINUSE)")


def _lost_the_port(procs: list[tuple[subprocess.Popen, Path]]) -> bool:
    """Wait until rank 0 trains or a rank exits; True when a rank exited because the port was taken."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if re.search(r"(?m)^step \d+/", procs[0][1].read_text()):
            return False
        if any(p.poll() is not None for p, _ in procs):
            return any(p.poll() not in (None, 0) and address_in_use(out.read_text()) for p, out in procs)
        time.sleep(0.1)
    return False  # the caller's own waits report the hang


def _kill(procs: list[tuple[subprocess.Popen, Path]]) -> None:
    for proc, _ in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait(procs: list[tuple[subprocess.Popen, Path]], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    codes = []
    for proc, _ in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            _kill(procs)
            logs = "\n".join(f"--- {o.name} ---\n{o.read_text()[-3000:]}" for _, o in procs)
            pytest.fail(f"ranks still running after {timeout} s (deadlock?)\n{logs}")
    return codes


def _wait_for_step(out: Path, step: int, procs: list[tuple[subprocess.Popen, Path]]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while f"step {step}/" not in out.read_text():
        if any(p.poll() is not None for p, _ in procs) or time.monotonic() > deadline:
            _wait(procs, 5)
            pytest.fail(f"no 'step {step}/' in {out}:\n{out.read_text()[-3000:]}")
        time.sleep(0.1)


def _step_of(checkpoint: Path) -> int:
    from jobgen.train.checkpoints import read_global_step

    step = read_global_step(checkpoint)
    assert step is not None, checkpoint
    return step


@pytest.mark.parametrize("signalled_ranks", [(1,), (0, 1)], ids=["one-rank", "both-ranks"])
def test_requeue_signal_checkpoints_on_all_ranks_requeues_once_and_resumes(
    write_spec, tmp_path: Path, signalled_ranks: tuple[int, ...]
) -> None:
    spec = write_spec(
        {"trainer": {"max_steps": 400, "log_every_n_steps": 5, "val_check_interval": 1000}},
        scheduler="slurm", requeue_signal="USR2", num_nodes=2, devices_per_node=1, world_size=2,
    )  # fmt: skip
    procs = _launch(tmp_path, spec, ntasks=2)
    _wait_for_step(procs[0][1], 20, procs)
    for rank in signalled_ranks:
        os.kill(procs[rank][0].pid, signal.SIGUSR2)
    codes = _wait(procs, TIMEOUT_S)
    rank0 = procs[0][1].read_text()
    assert codes == [0, 0], "\n".join(o.read_text()[-3000:] for _, o in procs)
    assert "requeue: SIGUSR2 received; saving a checkpoint at step" in rank0, rank0[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    hpc = tmp_path / "run" / "checkpoints" / "hpc_ckpt_1.ckpt"
    step = _step_of(hpc)
    assert 20 <= step < 400, step
    assert f"requeued at step {step}; SLURM will run the job again" in rank0
    assert not (tmp_path / "run" / "summary.json").exists()  # the run is not finished

    # SLURM starts the job again: it resumes from the HPC checkpoint and finishes.
    again = _launch(tmp_path, spec, ntasks=2)
    assert _wait(again, TIMEOUT_S) == [0, 0], again[0][1].read_text()[-3000:]
    assert f"resume: auto - resuming from {hpc} (step {step})" in again[0][1].read_text()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 400 and summary["resumed_from_step"] == step, summary


def test_failed_requeue_keeps_training_and_the_checkpoint(write_spec, tmp_path: Path) -> None:
    spec = write_spec(
        {"trainer": {"max_steps": 200, "log_every_n_steps": 5, "val_check_interval": 1000}},
        scheduler="slurm", requeue_signal="USR2", num_nodes=1, devices_per_node=1, world_size=1,
    )  # fmt: skip
    procs = _launch(tmp_path, spec, ntasks=1, scontrol_rc=1)
    _wait_for_step(procs[0][1], 20, procs)
    os.kill(procs[0][0].pid, signal.SIGUSR2)
    assert _wait(procs, TIMEOUT_S) == [0]
    out = procs[0][1].read_text()
    assert "requeue: scontrol requeue 4242 failed" in out, out[-3000:]
    assert (tmp_path / "scontrol.log").read_text() == "requeue 4242\n"
    assert 20 <= _step_of(tmp_path / "run" / "checkpoints" / "hpc_ckpt_1.ckpt") < 200
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["global_step"] == 200
