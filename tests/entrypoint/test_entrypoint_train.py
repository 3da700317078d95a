"""Real 2-process DDP training on CPU (gloo) under torchrun: train, resume, exact continuation.

No mocks: each test launches ``python -m torch.distributed.run --standalone --nproc-per-node 2
-m jobgen.train`` on a tiny GPT and 1 MB of the interpreter's stdlib source, as the local
backend does. Each run takes ~5-10 s on 2 cores (mostly imports); the hard timeout kills the
whole process group.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from tests.entrypoint.conftest import _merge

pytestmark = pytest.mark.slow

TIMEOUT_S = 300
LN_256 = math.log(256)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _train_losses(metrics_csv: Path) -> dict[int, float]:
    with open(metrics_csv, newline="") as f:
        return {int(row["step"]): float(row["train_loss"]) for row in csv.DictReader(f) if row["train_loss"]}


def test_two_process_training_checkpoints_and_resumes(run_entrypoint, write_spec, tmp_path: Path) -> None:
    write_spec(filename="spec20.json")
    write_spec({"trainer": {"max_steps": 30}}, filename="spec30.json")
    run_dir = tmp_path / "run"

    first = run_entrypoint("--spec", "spec20.json", "--run-dir", str(run_dir), nproc=2, timeout=TIMEOUT_S)
    assert first.code == 0, first.output
    assert "resume: auto - no checkpoint" in first.stdout
    summary = _summary(run_dir)
    assert summary["global_step"] == 20
    assert summary["world_size"] == 2
    assert summary["resumed_from"] is None
    assert summary["val_loss"] < LN_256 - 1.0, summary  # it learned something (init: ln 256 = 5.55)
    assert summary["tokens_per_step"] == 4 * 64 * 1 * 2
    assert summary["tokens_per_s_mean"] > 0
    usage = summary["usage"]  # this run's CPU-hours: 2 ranks x its wall time
    assert (usage["device_kind"], usage["devices"]) == ("cpu", 2) and 0 < usage["elapsed_s"] <= summary["wall_time_s"] + 1
    assert abs(usage["cpu_hours"] - 2 * usage["elapsed_s"] / 3600) < 1e-5 and usage["cost"] is None
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["last.ckpt", "step-00000010.ckpt", "step-00000020.ckpt"]
    assert Path(summary["last_checkpoint"]) == run_dir / "checkpoints" / "last.ckpt"
    assert sorted(p.name for p in (run_dir / "data").iterdir()) == ["manifest.json", "train.bin", "val.bin"]
    assert _train_losses(Path(summary["metrics_csv"]))  # metrics were logged
    # Progress lines (stdout is not a TTY here) come from rank zero only.
    assert first.stdout.count("step 20/20 |") == 1, first.output
    bins_mtime = (run_dir / "data" / "train.bin").stat().st_mtime_ns

    resumed = run_entrypoint("--spec", "spec30.json", "--run-dir", str(run_dir), nproc=2, timeout=TIMEOUT_S)
    assert resumed.code == 0, resumed.output
    assert "resume: auto - resuming from" in resumed.stdout and "(step 20)" in resumed.stdout
    summary = _summary(run_dir)
    assert summary["global_step"] == 30
    assert summary["resumed_from_step"] == 20
    assert Path(summary["resumed_from"]).parent == run_dir / "checkpoints"
    assert summary["val_loss"] < LN_256 - 1.0
    # keep_last_k=2 step checkpoints, plus last.ckpt
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "last.ckpt", "step-00000020.ckpt", "step-00000030.ckpt",
    ]  # fmt: skip
    assert (run_dir / "data" / "train.bin").stat().st_mtime_ns == bins_mtime  # bins reused, not rebuilt
    # Training longer keeps the 20-step cosine: the steps past 20 train at its
    # end, min_lr_ratio x learning_rate = 0.1 x 3e-3, said in the log; the lr never jumps back up.
    assert resumed.stdout.count("resume: max_steps 20 -> 30; the learning-rate schedule keeps the 2-step warmup "
                                "and its cosine end at step 20") == 1, resumed.output
    with open(summary["metrics_csv"], newline="") as f:
        lrs = {int(row["step"]): float(row["lr"]) for row in csv.DictReader(f) if row["lr"]}
    assert lrs and all(lr == pytest.approx(3e-4) for step, lr in lrs.items() if step >= 20), lrs

    again = run_entrypoint("--spec", "spec30.json", "--run-dir", str(run_dir), nproc=2, timeout=TIMEOUT_S)
    assert again.code == 0, again.output
    assert again.stdout.count("run already complete at step 30") == 1, again.output
    assert _summary(run_dir) == summary  # nothing rewritten


def test_resumed_run_continues_exactly_like_an_uninterrupted_one(
    run_entrypoint, write_spec, tmp_path: Path
) -> None:
    # max_steps not a multiple of the checkpoint interval: the final step is checkpointed too.
    write_spec({"trainer": {"max_steps": 26}, "checkpoint": {"keep_last_k": 3}})
    straight, restarted = tmp_path / "straight", tmp_path / "restarted"

    result = run_entrypoint("--spec", "spec.json", "--run-dir", str(straight), nproc=2, timeout=TIMEOUT_S)
    assert result.code == 0, result.output
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == [
        "last.ckpt", "step-00000010.ckpt", "step-00000020.ckpt", "step-00000026.ckpt",
    ]  # fmt: skip

    # A job that was stopped right after its step-20 checkpoint, then restarted (resume: auto).
    (restarted / "checkpoints").mkdir(parents=True)
    shutil.copy(straight / "checkpoints" / "step-00000020.ckpt", restarted / "checkpoints")
    result = run_entrypoint("--spec", "spec.json", "--run-dir", str(restarted), nproc=2, timeout=TIMEOUT_S)
    assert result.code == 0, result.output

    a, b = _summary(straight), _summary(restarted)
    assert b["resumed_from_step"] == 20 and b["global_step"] == a["global_step"] == 26
    # Same samples in the same order after the restart, so the same losses (gloo on CPU is
    # deterministic for a fixed world size).
    losses_a, losses_b = _train_losses(Path(a["metrics_csv"])), _train_losses(Path(b["metrics_csv"]))
    # logged every 5 steps (step 25) and at the last step (26); metrics.csv's step is the optimizer step
    assert set(losses_b) == {25, 26}
    for index in (25, 26):
        assert math.isclose(losses_b[index], losses_a[index], rel_tol=1e-5), (losses_a, losses_b)
    assert math.isclose(b["val_loss"], a["val_loss"], rel_tol=1e-5), (a["val_loss"], b["val_loss"])


def test_compiled_run_resumes_an_eager_checkpoint_and_matches_the_eager_run(run_entrypoint, write_spec,
                                                                             tmp_path: Path) -> None:
    """trainer.compile compiles the network in place: checkpoints keep their keys (an eager
    checkpoint resumes compiled), and the numbers are those of the eager run. The eager run goes
    straight to step 8 and leaves a step-6 checkpoint; the compiled run resumes a copy of it from
    step 6 (a resumed run continues exactly like an uninterrupted one:
    test_resumed_run_continues_exactly_like_an_uninterrupted_one), two runs where three were."""
    one = {"devices_per_node": 1, "world_size": 1}
    base = {"trainer": {"max_steps": 8, "val_check_interval": 4}, "checkpoint": {"every_n_steps": 6}}
    write_spec(base, filename="eager8.json", **one)
    write_spec(_merge(base, {"trainer": {"compile": True}}), filename="compiled8.json", **one)
    eager_run = run_entrypoint("--spec", "eager8.json", "--run-dir", str(tmp_path / "eager"), timeout=TIMEOUT_S)
    assert eager_run.code == 0, eager_run.output
    assert "torch.compile" not in eager_run.stdout
    shutil.copytree(tmp_path / "eager", tmp_path / "compiled")
    (tmp_path / "compiled" / "summary.json").unlink()
    for ckpt in (tmp_path / "compiled" / "checkpoints").iterdir():  # the step-6 checkpoint is the one left
        if ckpt.name != "step-00000006.ckpt":
            ckpt.unlink()
    compiled_run = run_entrypoint("--spec", "compiled8.json", "--run-dir", str(tmp_path / "compiled"), timeout=TIMEOUT_S)
    assert compiled_run.code == 0, compiled_run.output
    assert "torch.compile: on" in compiled_run.stdout
    compiled, eager = _summary(tmp_path / "compiled"), _summary(tmp_path / "eager")
    assert (compiled["global_step"], compiled["resumed_from_step"]) == (8, 6)
    assert (eager["global_step"], eager["resumed_from_step"]) == (8, None)
    assert compiled["val_loss"] == pytest.approx(eager["val_loss"], rel=1e-4)
