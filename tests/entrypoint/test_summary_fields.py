"""summary.json says what its fields are: the step checkpoint it names is the
newest one kept (retention keeps the newest ``keep_last_k`` by step), not a "best" one: no
validation loss decides it; the prediction file beside spec.json comes back as ``prediction``,
with what the run measured and measured / predicted."""

from __future__ import annotations

import json
from pathlib import Path

from jobgen.jobdir.summary import read_summary


def test_the_summary_names_the_newest_step_checkpoint_not_a_best_one(tmp_path: Path, write_spec, run_entrypoint) -> None:
    run_dir = tmp_path / "runs" / "tiny"
    spec = write_spec({"trainer": {"max_steps": 4, "val_check_interval": 2}, "checkpoint": {"every_n_steps": 2, "keep_last_k": 2}},
                      devices_per_node=1, world_size=1)
    band = {"value": 0.5, "low": 0.4, "high": 0.6}
    (spec.parent / ".jobgen-prediction.json").write_text(json.dumps({
        "version": 1, "inputs_sha256": json.loads(spec.read_text())["inputs_sha256"], "profile": "local", "made_at": None,
        "available": True, "message": "m", "layout": "single_device", "step_s": band, "tokens_per_s": band, "wall_s": band,
        "device_hours": None, "cost": None, "device_kind": "cpu", "devices": 1, "max_steps": 4, "price_per_device_hour": None,
        "tokens_per_step": None, "flops_per_token": None, "calibration": None, "calibration_file": None}))
    result = run_entrypoint("--spec", str(spec), "--run-dir", str(run_dir), timeout=300)
    assert result.code == 0, result.output
    text = (run_dir / "summary.json").read_text()
    summary = json.loads(text)
    assert read_summary(run_dir / "summary.json").dumps() == text  # every key a field of the contract, in its order
    assert f"done: tiny at step 4/4 (fresh start) in {summary['wall_time_s']:.1f} s" in result.stdout, result.output
    assert "best_checkpoint" not in summary, summary  # it named the newest, whatever its val_loss
    assert Path(summary["newest_step_checkpoint"]) == (run_dir / "checkpoints" / "step-00000004.ckpt").resolve(), summary
    assert Path(summary["last_checkpoint"]).name == "last.ckpt"
    pred = summary["prediction"]
    assert pred["predicted"]["step_s"] == band and pred["file"] == str(spec.parent / ".jobgen-prediction.json")
    step_s = summary["tokens_per_step"] / summary["tokens_per_s_steady"]
    assert pred["measured"]["step_s"] == round(step_s, 6)
    assert pred["measured_over_predicted"]["step_s"] == float(f"{step_s / 0.5:.4g}")
    assert pred["measured_over_predicted"]["wall_s"] == float(f"{summary['wall_time_s'] / 0.5:.4g}")
