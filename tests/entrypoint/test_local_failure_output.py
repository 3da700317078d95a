"""What a failed local run prints: jobgen's line, the first failing rank's error (the
triage of ``jobgen logs --first-error``) and where the full output is, not every rank's
traceback and torchrun's ChildFailedError report; the full output stays in the run directory's
output.log. A real run: ``jobgen submit --profile local`` on 2 CPU ranks of a user module whose
training_step raises on rank 1 only (rank 0 then fails too, waiting for its peer). The spec's
restart budget of 3 is not spent on it: an exception in user code runs once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobgen import api
from tests.entrypoint.conftest import Result, child_env

pytestmark = pytest.mark.slow

TIMEOUT_S = 300
MODULE = '''\
from lightning.pytorch.demos.boring_classes import BoringModel


class BreaksOnRankOne(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and batch_idx == 1:
            raise ValueError("rank one broke at batch 1")
        return super().training_step(batch, batch_idx)
'''
SPEC = {
    "name": "breaks",
    "model": {"class_path": "breaks_mod.BreaksOnRankOne"},
    "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"},
    "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 1, "max_steps": 4,
                "val_check_interval": 4, "limit_val_batches": 1, "num_sanity_val_steps": 0},
    "checkpoint": {"every_n_steps": 4, "resume": "never"},
    "resources": {"devices_per_node": 2},
    "restart": {"max_restarts": 3},  # an exception in user code is not restarted
}


def _submit(tmp_path: Path) -> tuple[Result, Path]:
    (tmp_path / "breaks_mod.py").write_text(MODULE)
    spec = tmp_path / "breaks.yaml"
    spec.write_text(json.dumps(SPEC))
    env = child_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"  # the spec is in no git repository: no snapshot
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "jobgen.cli", "submit", str(spec), "--profile", "local", "--runs-dir", str(runs)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Result(proc.returncode, proc.stdout, proc.stderr), runs / "breaks"


def test_a_failed_local_run_prints_the_first_failing_ranks_error_and_the_log(tmp_path: Path) -> None:
    result, run_dir = _submit(tmp_path)
    terminal = result.stdout + result.stderr
    log = run_dir / "output.log"
    assert result.code == 1, result.output
    assert "ValueError: rank one broke at batch 1" in terminal, result.output
    assert "first failure: rank 1" in terminal, result.output
    assert str(log) in terminal, result.output
    assert json.loads((run_dir / ".jobgen-submission.json").read_text())["log_file"] == str(log)
    assert "training exited with code 1" in result.stderr, result.output  # jobgen's line
    # not torchrun's report, nor the other ranks' tracebacks
    assert "ChildFailedError" not in terminal and "Root Cause" not in terminal, result.output
    assert terminal.count("Traceback (most recent call last)") <= 1, result.output
    # the whole output is kept: every rank's lines (labelled) and torchrun's report
    text = log.read_text()
    assert "[default1]:" in text and "[default0]:" in text and "ChildFailedError" in text
    assert "rank one broke at batch 1" in text
    # and `jobgen logs --first-error` reads the same file
    first = api.first_error(str(run_dir)).first
    assert first is not None and first.rank == 1 and "rank one broke at batch 1" in first.headline
    # a budget of 3, one start: an exception in the user's code is a user failure, never restarted
    assert text.count("==== jobgen submit") == 1 and "jobgen: restart " not in terminal, result.output
    assert "jobgen: restarts used: 0 of 3 (restart.max_restarts); a user failure is not restarted" in terminal, result.output
    status = api.status(str(run_dir))
    # the entrypoint reports the exception in one line (python -m jobgen.train: error: ValueError: ...)
    assert status.state == "FAILED" and (status.failure.cls, status.failure.rule) == ("user", "entrypoint-error"), status
    assert status.details["restarts_used"] == "0 of 3"
