"""Stragglers on real 2-rank CPU trainings (torchrun, gloo; Lightning's BoringModel as user code,
tests/entrypoint/watchdog_pieces.py): rank 1 sleeps in every training step, so its compute per
batch is far above rank 0's and rank 0 names it once, in the log and in summary.json; when both
ranks sleep the same, no rank is named. The decision rule's edges are in tests/unit/test_watchdog.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.entrypoint.test_watchdog import TIMEOUT_S, torchrun

pytestmark = pytest.mark.slow

PIECES = "tests.entrypoint.watchdog_pieces"


def train(resolved_doc, tmp_path: Path, rank: int, forward_sleep_s: float) -> tuple[dict, str]:
    """A 25-step 2-rank run where ``rank`` (-1: every rank) sleeps ``forward_sleep_s`` per training
    step; hang_timeout_s 2 makes the watchdog tick every 0.1 s. Its summary.json and output."""
    spec = {
        "name": "forward-sleep",
        "model": {"class_path": f"{PIECES}.SlowRankModel", "init_args": {"rank": rank, "forward_sleep_s": forward_sleep_s}},
        "data": {"class_path": "lightning.pytorch.demos.boring_classes.BoringDataModule"},
        "trainer": {"precision": "32-true", "micro_batch_size": 1, "max_steps": 25, "val_check_interval": 1000,
                    "limit_val_batches": 1, "log_every_n_steps": 5},
        "checkpoint": {"every_n_steps": 1000},
        "watchdog": {"hang_timeout_s": 2, "straggler_factor": 1.5},
    }
    (tmp_path / "spec.json").write_text(json.dumps(resolved_doc(spec)))
    launched = torchrun(tmp_path / "spec.json", tmp_path / "run", tmp_path)
    try:
        code = launched.wait(TIMEOUT_S)
    finally:
        if launched.proc.poll() is None:
            launched.kill()
    assert code == 0, launched.output
    return json.loads((tmp_path / "run" / "summary.json").read_text()), launched.output


def test_a_rank_slowed_on_purpose_is_reported_once_as_the_straggler(resolved_doc, tmp_path: Path) -> None:
    summary, output = train(resolved_doc, tmp_path, rank=1, forward_sleep_s=0.15)
    found = summary["straggler"]
    assert found is not None and found["rank"] == 1 and found["node"], summary
    assert found["step_time_s"] >= 0.15 and found["ratio"] > 1.5 and found["median_step_time_s"] < 0.15, found
    assert output.count("is a straggler") == 1, output
    assert (f"jobgen: rank 1 on {found['node']} is a straggler: {found['ratio']:.1f}x the median step time "
            f"({found['step_time_s']:.2f} s vs {found['median_step_time_s']:.2f} s)") in output, output


def test_an_even_run_reports_no_straggler(resolved_doc, tmp_path: Path) -> None:
    summary, output = train(resolved_doc, tmp_path, rank=-1, forward_sleep_s=0.15)
    assert summary["straggler"] is None and "is a straggler" not in output, (summary, output)
