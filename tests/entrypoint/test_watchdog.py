"""The progress watchdog and the local restart budget on real 2-rank CPU trainings (torchrun,
gloo): the quick start's tiny GPT through ``jobgen submit --profile local``, and a user module
through torchrun directly.

- a rank stopped with SIGSTOP mid-run, no restart budget: rank 0 finds the job hung within the
  spec's ``watchdog.hang_timeout_s`` (a few seconds here), writes its stacks under
  ``<run>/hang/``, names the stopped rank and its step, and exits 201; torchrun takes its 30 s
  grace before it SIGKILLs the stopped worker; jobgen ends FAILED, class infrastructure, rule hang;
- the same with ``restart.max_restarts: 1``: jobgen starts the ranks again, they resume from the
  newest checkpoint and complete, with the losses of an uninterrupted run from that checkpoint;
- a rank that is slow but advances, with validation and checkpoint saves longer than the hang
  timeout on one rank: the job completes;
- a job whose every process is stopped and continued (a SLURM suspend and resume) completes;
- a job of one rank stopped with SIGSTOP: no peer watches it, so its sentinel process
  (jobgen/train/sentinel.py) prints the verdict naming it, writes ``hang/verdict.json`` and ends
  it with SIGKILL.

An exception in user code with a budget runs once: tests/entrypoint/test_local_failure_output.py.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.entrypoint.conftest import TINY_SPEC, _merge, child_env, descendants, run_process

pytestmark = pytest.mark.slow

#: hang_timeout_s of these tests: a few seconds.
HANG_TIMEOUT_S = 3
#: torchrun's grace between its SIGTERM and its SIGKILL of a worker (PContext.close's timeout).
TORCHRUN_GRACE_S = 30
TIMEOUT_S = 300


class Launched:
    """A command (``jobgen submit``, ``torchrun``) in its own session, its stdout and stderr read
    line by line as they come."""

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


def submit(spec: dict, tmp_path: Path) -> tuple[Launched, Path]:
    """``jobgen submit <spec> --profile local`` of TINY_SPEC merged with ``spec``; its run directory."""
    path = tmp_path / "quick.json"
    path.write_text(json.dumps(_merge(TINY_SPEC, spec)))
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(path), "--profile", "local", "--runs-dir", str(runs)]
    return Launched(argv, tmp_path), runs / TINY_SPEC["name"]


def stop_rank_one(launched: Launched, at_step: int, timeout: float) -> tuple[int, float]:
    """SIGSTOP rank 1 once rank zero reports ``at_step``; its pid and when (monotonic)."""
    launched.wait_for_step(at_step, TIMEOUT_S)
    pid = launched.rank_pid(1)
    os.kill(pid, signal.SIGSTOP)
    return pid, time.monotonic()


def status(run_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "jobgen.cli", "status", f"local://{run_dir}", "-o", "json"], env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def metrics(path: Path) -> dict[int, float]:
    with open(path, newline="") as f:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]}


def test_a_stopped_rank_is_found_hung_its_peers_stacks_written_and_the_job_fails_as_a_hang(tmp_path: Path) -> None:
    launched, run_dir = submit({"trainer": {"max_steps": 5000, "val_check_interval": 5000, "log_every_n_steps": 1},
                                "checkpoint": {"every_n_steps": 10}, "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}}, tmp_path)
    stopped = None
    try:
        stopped, began = stop_rank_one(launched, 12, TIMEOUT_S)
        code = launched.wait(HANG_TIMEOUT_S + TORCHRUN_GRACE_S + 60)
        took = time.monotonic() - began
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        if launched.proc.poll() is None:
            launched.kill()
    output = launched.output
    assert code == 1, output
    # found within the hang timeout plus a few ticks; then torchrun's grace for the stopped worker
    assert took < HANG_TIMEOUT_S + TORCHRUN_GRACE_S + 20, (took, output)
    log = (run_dir / "output.log").read_text()
    assert re.search(r"exitcode\s*: 201 ", log), log[-3000:]
    verdict = json.loads((run_dir / "hang" / "verdict.json").read_text())
    assert verdict["verdict"] == "hang" and verdict["exit_code"] == 201 and verdict["decided_by_rank"] == 0, verdict
    first = verdict["heartbeat_stopped_first"]
    # the heartbeat carries the step of its last tick (tick_seconds), which can lag the step rank zero
    # printed when rank 1 was stopped by a few steps on a loaded machine
    assert [r["rank"] for r in first] == [1] and first[0]["pid"] == stopped and first[0]["step"] >= 1, verdict
    assert HANG_TIMEOUT_S <= verdict["idle_s"] < HANG_TIMEOUT_S + 5, verdict
    line = next(x for x in log.splitlines() if "error: hang: no rank advanced its optimizer step" in x)
    assert f"heartbeat stopped first: rank 1 on node {first[0]['host']} (pid {stopped}) at step {first[0]['step']}" in line
    assert f"stacks of every live rank are in {run_dir / 'hang'} (exit 201)" in line
    stacks = (run_dir / "hang" / "stacks-rank0.txt").read_text()
    assert stacks.startswith("rank 0 on node ") and "Thread 0x" in stacks and "(most recent call first)" in stacks, stacks
    assert "watchdog.py" in stacks and "jobgen/train/run.py" in stacks, stacks  # the watchdog's thread and the training's
    assert not (run_dir / "hang" / "stacks-rank1.txt").exists()  # the stopped rank wrote nothing
    # jobgen: FAILED, infrastructure, hang; no restart without a budget
    assert "jobgen: failure: infrastructure (retried): no rank made progress" in output and "jobgen: restart " not in output
    st = status(run_dir)
    assert st["state"] == "FAILED" and (st["failure"]["class"], st["failure"]["rule"]) == ("infrastructure", "hang"), st
    assert log.count("==== jobgen submit") == 1


def test_with_a_budget_a_stopped_rank_is_restarted_and_continues_like_an_uninterrupted_run(tmp_path: Path) -> None:
    """Also the notifications of a restarted run (the spec's notify command): started (restart 0),
    restart (jobgen's decision: class, reason, 1 of 1), started (restart 1), finished."""
    received = tmp_path / "notified.jsonl"
    recorder = tmp_path / "recorder.py"
    recorder.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    launched, run_dir = submit({"trainer": {"max_steps": 120, "val_check_interval": 1000, "log_every_n_steps": 5},
                                "checkpoint": {"every_n_steps": 10, "keep_last_k": 20},
                                "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}, "restart": {"max_restarts": 1},
                                "notify": {"command": [sys.executable, str(recorder), str(received)]}}, tmp_path)
    stopped = None
    try:
        stopped, _ = stop_rank_one(launched, 12, TIMEOUT_S)
        code = launched.wait(TIMEOUT_S)
    finally:
        if stopped is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGKILL)
        if launched.proc.poll() is None:
            launched.kill()
    assert code == 0, launched.output
    assert "jobgen: restart 1 of 1 (restart.max_restarts) after a failure classed infrastructure (retried): no rank made " \
           "progress" in launched.output, launched.output
    summary = json.loads((run_dir / "summary.json").read_text())
    restarts = summary["restarts"]
    assert (restarts["max_restarts"], restarts["used"]) == (1, 1), restarts
    assert [(h["class"], h["rule"]) for h in restarts["history"]] == [("infrastructure", "hang")], restarts
    resumed = summary["resumed_from_step"]
    assert summary["global_step"] == 120 and resumed is not None and resumed >= 10, summary
    st = status(run_dir)
    assert st["state"] == "COMPLETED" and st["details"]["restarts_used"] == "1 of 1", st
    assert st["details"]["restart_1"].startswith("infrastructure (hang): "), st
    bodies = [json.loads(line) for line in received.read_text().splitlines()]
    assert [(b["event"], b["restart"]) for b in bodies] == [("started", 0), ("restart", 1), ("started", 1), ("finished", 1)], bodies
    restart = bodies[1]
    assert (restart["class"], restart["restarts_used"], restart["max_restarts"]) == ("infrastructure", 1, 1), restart
    assert restart["reason"] == restarts["history"][0]["reason"] and restart["handle"] == f"local://{run_dir.resolve()}"

    # an uninterrupted run from the checkpoint the restart resumed
    reference = tmp_path / "reference"
    (reference / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "checkpoints" / f"step-{resumed:08d}.ckpt", reference / "checkpoints")  # last.ckpt moved on
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "jobgen.train",
            "--spec", str(run_dir / "spec.json"), "--run-dir", str(reference)]
    result = run_process(argv, cwd=tmp_path, timeout=TIMEOUT_S)
    assert result.code == 0, result.output
    straight = json.loads((reference / "summary.json").read_text())
    assert straight["resumed_from_step"] == resumed and straight["global_step"] == 120
    after, expected = metrics(Path(summary["metrics_csv"])), metrics(Path(straight["metrics_csv"]))
    assert set(after) == set(expected) and min(after) > resumed and max(after) == 120, (after, expected)
    for step in expected:  # same samples in the same order after the restart: the same losses
        assert math.isclose(after[step], expected[step], rel_tol=1e-5), (step, after, expected)
    assert math.isclose(summary["val_loss"], straight["val_loss"], rel_tol=1e-5), (summary["val_loss"], straight["val_loss"])


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


def test_a_stopped_single_rank_is_ended_by_its_sentinel_naming_it(write_spec, tmp_path: Path) -> None:
    spec = write_spec({"trainer": {"max_steps": 5000, "val_check_interval": 5000, "log_every_n_steps": 1},
                       "checkpoint": {"every_n_steps": 10}, "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}},
                      devices_per_node=1, world_size=1)
    run_dir = tmp_path / "run"
    launched = Launched([sys.executable, "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)], tmp_path)
    try:
        launched.wait_for_step(12, TIMEOUT_S)
        rank = launched.proc.pid
        sentinels = [pid for pid in descendants(rank) if b"jobgen.train.sentinel" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        os.kill(rank, signal.SIGSTOP)
        began = time.monotonic()
        code = launched.wait(HANG_TIMEOUT_S + 60)
        took = time.monotonic() - began
    finally:
        if launched.proc.poll() is None:
            launched.kill()
    output = launched.output
    assert code == -signal.SIGKILL, output
    assert took < HANG_TIMEOUT_S + 10, (took, output)
    verdict = json.loads((run_dir / "hang" / "verdict.json").read_text())
    first = verdict["heartbeat_stopped_first"]
    assert (verdict["verdict"], verdict["exit_code"], verdict["decided_by"]) == ("hang", 137, "sentinel"), verdict
    assert [(r["rank"], r["pid"]) for r in first] == [(0, rank)] and first[0]["step"] >= 1, verdict
    line = next(x for x in launched.err if "error: hang: no rank advanced its optimizer step" in x)
    assert f"heartbeat stopped first: rank 0 on node {first[0]['host']} (pid {rank}) at step {first[0]['step']}" in line, line
    assert "its sentinel ended it with SIGKILL and no stacks were written (exit 137)" in line, line
    assert len(sentinels) == 1, sentinels
    deadline = time.monotonic() + 10
    while running(sentinels[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(sentinels[0]), sentinels  # it ended after ending the rank


def test_a_job_suspended_and_resumed_is_not_hung(write_spec, tmp_path: Path) -> None:
    """SLURM suspends a job (``scontrol suspend``, gang scheduling, PreemptMode=SUSPEND) by stopping
    every process of it, and resumes it with SIGCONT: here torchrun and both ranks stop for three
    hang timeouts, and rank 0 (with torchrun's agent, which holds the store) runs again a second
    before rank 1 (nodes are continued one by one). The ranks' watchdogs skip the time their process did not run, and the job completes."""
    spec = write_spec({"trainer": {"max_steps": 40, "val_check_interval": 5000, "log_every_n_steps": 1},
                       "checkpoint": {"every_n_steps": 1000}, "watchdog": {"hang_timeout_s": HANG_TIMEOUT_S}},
                      devices_per_node=2, world_size=2)
    run_dir = tmp_path / "run"
    launched = torchrun(spec, run_dir, tmp_path)
    try:
        launched.wait_for_step(12, TIMEOUT_S)
        first = launched.rank_pid(0)
        group = [launched.proc.pid, *descendants(launched.proc.pid)]
        for pid in group:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(3 * HANG_TIMEOUT_S)
        # slurmd on each node continues its processes: one node's ranks may run again first and wait
        # in a collective for the others (a third of the timeout here)
        for pid in (launched.proc.pid, first):  # torchrun's agent holds the rendezvous store (rank 0's node)
            os.kill(pid, signal.SIGCONT)
        time.sleep(HANG_TIMEOUT_S / 3)
        for pid in group:
            os.kill(pid, signal.SIGCONT)
        code = launched.wait(TIMEOUT_S)
    finally:
        if launched.proc.poll() is None:
            launched.kill()
    output = launched.output
    assert code == 0, output
    assert not (run_dir / "hang").exists() and "error: hang" not in output, output
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == 40


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
