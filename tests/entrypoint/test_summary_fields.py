"""summary.json says what its fields are: the step checkpoint it names is the
newest one kept (retention keeps the newest ``keep_last_k`` by step), not a "best" one: no
validation loss decides it."""

from __future__ import annotations

import json
from pathlib import Path


def test_the_summary_names_the_newest_step_checkpoint_not_a_best_one(tmp_path: Path, write_spec, run_entrypoint) -> None:
    run_dir = tmp_path / "runs" / "tiny"
    spec = write_spec({"trainer": {"max_steps": 4, "val_check_interval": 2}, "checkpoint": {"every_n_steps": 2, "keep_last_k": 2}},
                      devices_per_node=1, world_size=1)
    result = run_entrypoint("--spec", str(spec), "--run-dir", str(run_dir), timeout=300)
    assert result.code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "best_checkpoint" not in summary, summary  # it named the newest, whatever its val_loss
    assert Path(summary["newest_step_checkpoint"]) == (run_dir / "checkpoints" / "step-00000004.ckpt").resolve(), summary
    assert Path(summary["last_checkpoint"]).name == "last.ckpt"
