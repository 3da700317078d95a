"""The progress watchdog on real 2-rank CPU trainings (torchrun, gloo), as the local profile runs them.

- a rank stopped with SIGSTOP mid-run: the other rank finds the job hung within the spec's
  ``watchdog.hang_timeout_s`` (a few seconds here), writes its stacks under ``<run>/hang/``, names
  the stopped rank and its step, and the job ends with exit code 201 (torchrun then takes its
  30 s grace before it SIGKILLs the stopped worker);
- a rank that is slow but advances, with validation and checkpoint saves longer than the hang
  timeout on one rank: the job completes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.entrypoint.conftest import child_env, descendants

#: hang_timeout_s of these tests: a few seconds.
HANG_TIMEOUT_S = 3
#: torchrun's grace between its SIGTERM and its SIGKILL of a worker (PContext.close's timeout).
TORCHRUN_GRACE_S = 30
TIMEOUT_S = 300


class Launched:
    """``torchrun --standalone --nproc-per-node 2 -m jobgen.train ...`` in its own session, its
    stdout and stderr read line by line as they come."""

    def __init__(self, argv: list[str], cwd: Path):
        self.proc = subprocess.Popen(argv, cwd=cwd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    @property
    def output(self) -> str:
        return f"--- stdout ---\n{''.join(self.out)}\n--- stderr ---\n{''.join(self.err)}"

    def wait_for_step(self, step: int, timeout: float) -> None:
        """Until rank zero's progress line reports optimizer step >= ``step``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.out):
                found = re.search(r"step (\d+)/\d+ \|", line)
                if found and int(found.group(1)) >= step:
                    return
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended before step {step}\n{self.output}")
            time.sleep(0.05)
        raise AssertionError(f"no step {step} within {timeout} s\n{self.output}")

    def rank_pid(self, rank: int) -> int:
        """The pid of the worker whose environment says RANK=<rank> (torchrun sets it)."""
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if f"RANK={rank}".encode() in environ and b"jobgen.train" in cmdline:
                    return pid
        raise AssertionError(f"no worker with RANK={rank} under {self.proc.pid}")

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        for reader in self._readers:
            reader.join(10)
        if code is None:
            raise AssertionError(f"still running after {timeout} s\n{self.output}")
        return code

    def kill(self) -> None:
        """SIGKILL the launcher and every worker (a stopped worker dies on SIGKILL too)."""
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def torchrun(spec: Path, run_dir: Path, cwd: Path) -> Launched:
    return Launched([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)], cwd)


def test_a_stopped_rank_is_found_hung_its_peers_stacks_written_and_the_job_exits_201(write_spec, tmp_path: Path) -> None:
    spec = write_spec({"trainer": {"max_steps": 5000, "val_check_interval": 5000, "log_every_n_steps": 1},
                       "checkpoint": {"every_n_steps": 10}, "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}})
    run_dir = tmp_path / "run"
    launched = torchrun(spec, run_dir, tmp_path)
    stopped = None
    try:
        launched.wait_for_step(12, TIMEOUT_S)
        stopped = launched.rank_pid(1)
        os.kill(stopped, signal.SIGSTOP)
        began = time.monotonic()
        code = launched.wait(HANG_TIMEOUT_S + TORCHRUN_GRACE_S + 60)
        took = time.monotonic() - began
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        if launched.proc.poll() is None:
            launched.kill()
    output = launched.output
    assert code != 0, output
    assert "exitcode  : 201" in output or "exitcode: 201" in output.replace("  ", " ").replace(" :", ":"), output
    # found within the hang timeout plus a few ticks; then torchrun's grace for the stopped worker
    assert took < HANG_TIMEOUT_S + TORCHRUN_GRACE_S + 20, (took, output)
    verdict = json.loads((run_dir / "hang" / "verdict.json").read_text())
    assert verdict["verdict"] == "hang" and verdict["exit_code"] == 201 and verdict["decided_by_rank"] == 0, verdict
    first = verdict["heartbeat_stopped_first"]
    assert [r["rank"] for r in first] == [1] and first[0]["pid"] == stopped and first[0]["step"] >= 12, verdict
    assert HANG_TIMEOUT_S <= verdict["idle_s"] < HANG_TIMEOUT_S + 5, verdict
    line = next(x for x in launched.err if "error: hang: no rank advanced its optimizer step" in x)
    assert f"heartbeat stopped first: rank 1 on node {first[0]['host']} (pid {stopped}) at step {first[0]['step']}" in line
    assert f"stacks of every live rank are in {run_dir / 'hang'} (exit 201)" in line
    stacks = (run_dir / "hang" / "stacks-rank0.txt").read_text()
    assert stacks.startswith("rank 0 on node ") and "Thread 0x" in stacks and "jobgen-watchdog" not in stacks.split("\n")[0]
    assert "(most recent call first)" in stacks and "watchdog.py" in stacks, stacks
    assert not (run_dir / "hang" / "stacks-rank1.txt").exists()  # the stopped rank wrote nothing


def test_a_slow_rank_that_advances_and_long_validation_and_saves_are_not_a_hang(resolved_doc, tmp_path: Path) -> None:
    """Rank 1 sleeps 0.5 s after every batch (slow, still advancing), and 3 s in every validation
    and checkpoint save (longer than hang_timeout_s 2: those phases pause the clock)."""
    pieces = "tests.entrypoint.watchdog_pieces"
    spec = {
        "name": "slow",
        "model": {"class_path": f"{pieces}.SlowRankModel",
                  "init_args": {"rank": 1, "step_sleep_s": 0.5, "validation_sleep_s": 3.0, "checkpoint_sleep_s": 3.0}},
        "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"},
        "trainer": {"precision": "32-true", "micro_batch_size": 1, "max_steps": 6, "val_check_interval": 3,
                    "limit_val_batches": 1, "log_every_n_steps": 1},
        "checkpoint": {"every_n_steps": 3},
        "watchdog": {"hang_timeout_s": 2},
    }
    (tmp_path / "spec.json").write_text(json.dumps(resolved_doc(spec)))
    launched = torchrun(tmp_path / "spec.json", tmp_path / "run", tmp_path)
    try:
        code = launched.wait(TIMEOUT_S)
    finally:
        if launched.proc.poll() is None:
            launched.kill()
    assert code == 0, launched.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["global_step"] == 6
    assert not (tmp_path / "run" / "hang").exists(), launched.output
    assert "watchdog: hung after max(2 s, 10 x median step)" in launched.output
