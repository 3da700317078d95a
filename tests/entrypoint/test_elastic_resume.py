"""An elastic job restarted at another world size: real torchrun agents with a c10d rendezvous
(the flags the rendered elastic PyTorchJob gives, ``--nnodes=1:2``), gloo on CPU.

The job is planned for 1..2 nodes of 1 process with a global batch of 8 (micro batch 4): at 2
nodes the accumulation is 1, at 1 node 2. It trains at world size 2 (two agents, two "pods")
to max_steps with step checkpoints; then a copy of its step-5 checkpoint is resumed by one
agent (world size 1), as when a pod is lost and torchrun's rendezvous re-forms without it.

What is asserted, and why it is what it says:
- global batch kept: the resumed run takes 2 micro batches of 4 per optimizer step at world
  size 1 (its banner, its checkpoint's recorded layout), 8 samples per step as before;
- data position: the checkpoint records 5 x 8 = 40 samples consumed, and the resumed run ends
  at 12 x 8 = 96; each optimizer step reads the next 8 sample numbers in one block at either
  world size (tests/unit/test_position.py proves this of the data module and sampler), so no
  sample of the run is read twice or skipped, and step s of both runs reads the same samples;
- the learning rate after the restart is the schedule's at that optimizer step (the lr column
  of the uninterrupted run at the same step), and validation runs at the same optimizer steps;
- together: the resumed run's final weights equal the uninterrupted run's to float tolerance
  (the same samples per step, the same learning rate; only the reduction order differs). A
  position off by one micro batch, or one short accumulation window, moves them far more.
- a restart whose global batch differs from the checkpoint's stops with the clear message.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.entrypoint.conftest import TINY_SPEC, _merge, child_env, resolved_doc
from tests.ports import ATTEMPTS, address_in_use, next_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 240
MAX_STEPS = 12
#: 1..2 nodes x 1 process, micro batch 4, global batch 8: the spec.json the planner writes for such
#: a range (global_batch_size set, accumulation at the maximum, launch.min_nodes).
ELASTIC = {
    "trainer": {"max_steps": MAX_STEPS, "global_batch_size": 8, "gradient_accumulation_steps": 1, "log_every_n_steps": 1,
                "val_check_interval": 4},
    "checkpoint": {"every_n_steps": 5, "keep_last_k": 3},
}
LAUNCH = {"num_nodes": 2, "min_nodes": 1, "devices_per_node": 1, "world_size": 2}


def _agents(root: Path, spec: Path, run_dir: Path, count: int) -> tuple[int, str]:
    """Run ``count`` torchrun agents (one per "pod") to the end with the rendered elastic
    command's flags; returns the worst exit code and every agent's output. A rendezvous port
    another process took is retried on the next one (tests/ports.py)."""
    for _ in range(ATTEMPTS):
        port = next_port()
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=elastic-{port}", "--max-restarts=0",
                # the agent waits this long for more nodes once the minimum joined (torch's default is 30 s)
                "--rdzv-conf=last_call_timeout=1",
                "-m", "jobgen.train", "--spec", str(spec), "--run-dir", str(run_dir)]  # fmt: skip
        logs = [root / f"agent-{port}-{i}.log" for i in range(count)]
        procs = []
        for log in logs:
            with open(log, "w") as out:
                procs.append(subprocess.Popen(argv, cwd=root, env=child_env(), stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        deadline = time.monotonic() + TIMEOUT_S
        try:
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        output = "\n".join(f"--- {log.name} ---\n{log.read_text()}" for log in logs)
        if time.monotonic() >= deadline:
            pytest.fail(f"the agents did not finish in {TIMEOUT_S} s\n{output}")
        if not address_in_use(output):
            return max(p.returncode for p in procs), output
    pytest.fail(f"each of {ATTEMPTS} rendezvous ports was taken")


def _metrics(run_dir: Path) -> list[dict[str, str]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    with open(summary["metrics_csv"], newline="") as fh:
        return list(csv.DictReader(fh))


def _position(checkpoint: Path) -> dict[str, int]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["callbacks"]["TrainingPosition"]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted world-size-2 run and the world-size-1 restart from its step-5 checkpoint."""
    root = tmp_path_factory.mktemp("elastic")
    spec = root / "spec.json"
    spec.write_text(json.dumps(resolved_doc(_merge(TINY_SPEC, ELASTIC), **LAUNCH)))
    straight, restarted = root / "straight", root / "restarted"
    code, first = _agents(root, spec, straight, count=2)
    assert code == 0, first
    # a pod is lost: the rendezvous re-forms with one agent, which resumes from the step-5 checkpoint
    (restarted / "checkpoints").mkdir(parents=True)
    shutil.copy(straight / "checkpoints" / "step-00000005.ckpt", restarted / "checkpoints")
    shutil.copytree(straight / "data", restarted / "data")
    code, second = _agents(root, spec, restarted, count=1)
    assert code == 0, second
    return {"straight": straight, "restarted": restarted, "first": first, "second": second}


def test_a_restart_at_half_the_world_keeps_batch_data_position_and_learning_rate(runs: dict) -> None:
    straight, restarted, output = runs["straight"], runs["restarted"], runs["first"]
    assert output.count("elastic: global rank 0 runs on") == 2, output  # each node's local rank 0 says where
    assert "world size 2 = 2 node(s) x 1 cpu process(es)" in output and "accumulation 1 x world size 2" in output
    saved = _position(straight / "checkpoints" / "step-00000005.ckpt")
    assert saved | {"version": 0} == {"version": 0, "global_step": 5, "samples_consumed": 40, "micro_batch_size": 4,
                                      "gradient_accumulation_steps": 1, "world_size": 2, "global_batch_size": 8}

    output = runs["second"]
    assert "(step 5)" in output and "world size 1 = 1 node(s) x 1 cpu process(es)" in output, output
    assert "accumulation 2 x world size 1" in output, output  # global batch 8 kept: accumulation doubled
    assert "this world size 1 takes 2: same global batch 8, step 5, sample 40" in output, output
    final = _position(restarted / "checkpoints" / "last.ckpt")
    assert (final["global_step"], final["samples_consumed"], final["world_size"], final["gradient_accumulation_steps"],
            final["global_batch_size"]) == (MAX_STEPS, MAX_STEPS * 8, 1, 2, 8)

    before, after = _metrics(straight), _metrics(restarted)
    lr_before = {int(r["step"]): float(r["lr"]) for r in before if r.get("lr")}
    lr_after = {int(r["step"]): float(r["lr"]) for r in after if r.get("lr")}
    # one row per optimizer step 6..12 (a short first window would log step 5 twice, and step one sample block early)
    assert sorted(lr_after) == list(range(6, MAX_STEPS + 1)), lr_after
    # the uninterrupted run's lr at each step is the schedule's (warmup 2, cosine to step 12): it moves every step
    assert len({round(lr, 12) for lr in lr_after.values()}) == len(lr_after)
    for step, lr in lr_after.items():
        assert lr == pytest.approx(lr_before[step], rel=1e-9), (step, lr_before, lr_after)
    val_steps = [int(r["step"]) for r in after if r.get("val_loss")]
    assert val_steps == [int(r["step"]) for r in before if r.get("val_loss") and int(r["step"]) > 5], (before, after)

    a, b = _weights(straight / "checkpoints" / "last.ckpt"), _weights(restarted / "checkpoints" / "last.ckpt")
    start = _weights(straight / "checkpoints" / "step-00000005.ckpt")
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    apart = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"weights: moved {moved:.3g} in steps 5..12, apart {apart:.3g} between the runs")
    assert apart < moved / 100, (apart, moved)  # the same 7 steps, not merely 7 steps


def test_a_restart_at_another_global_batch_stops_with_the_sizes_and_the_fix(runs: dict, run_entrypoint, tmp_path: Path) -> None:
    # the job rendered again for one fixed process (global batch 4): the checkpoint's steps held 8 samples
    fixed = _merge(TINY_SPEC, {"trainer": {"max_steps": MAX_STEPS}})
    (tmp_path / "spec.json").write_text(json.dumps(resolved_doc(fixed, num_nodes=1, devices_per_node=1, world_size=1)))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copy(runs["straight"] / "checkpoints" / "step-00000005.ckpt", tmp_path / "run" / "checkpoints")
    result = run_entrypoint("--spec", "spec.json", "--run-dir", str(tmp_path / "run"), timeout=TIMEOUT_S)
    assert result.code == 2, result.output
    line = next(ln for ln in result.stderr.splitlines() if "error:" in ln)
    assert "step-00000005.ckpt: " in line, line
    assert "was written at step 5 with global batch 8 (micro batch 4 x accumulation 1 x world size 2)" in line, line
    assert "this run's global batch is 4 (micro batch 4 x accumulation 1 x world size 1)" in line, line
    assert "hint: keep the global batch: set trainer.global_batch_size: 8" in line and "Traceback" not in result.stderr
