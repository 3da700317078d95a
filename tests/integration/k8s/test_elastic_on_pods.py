"""An elastic PyTorchJob really running in pods, scaled down while it trains, keeps
its global batch: ``jobgen submit examples/quickstart.yaml`` with ``resources.nodes=1:2`` (Worker
pods only, ``elasticPolicy`` 1..2, torchrun ``--nnodes=1:2`` with a c10d rendezvous hosted by
worker 0's agent) in the node lab, driven through the CLI only (submit, status, logs). In the lab
tier like the other node tests (``JOBGEN_SKIP_K8S_NODES=1`` skips them).

The job is planned for 1..2 pods x 1 gloo process, micro batch 4 and global batch 8: at 2 pods
the accumulation is 1, at 1 pod 2 (the pod-level twin of tests/entrypoint/test_elastic_resume.py,
which proves it with local torchrun agents).

How the job goes from 2 pods to 1, and why this way: through the PyTorchJob's scale subresource
(:func:`podlab.scale_workers`: Worker replicas 2 -> 1), which is what ``kubectl scale`` and the
HPA that v1.9 builds from ``elasticPolicy.metrics`` do. training-operator v1.9 then deletes the
pod and Service whose replica index is out of range, worker-1 (pkg/controller.v1/common/pod.go
``ReconcilePods``, service.go ``ReconcileServices``), and nothing else: worker-0 keeps running
with the environment it started with. The emulation does the same
(test_operator_emulation.py ``test_elastic_job_scaled_down_loses_its_highest_workers_and_keeps_running``).
Deleting or evicting a pod instead would not shrink the job: with Worker replicas still 2 the
operator recreates the pod (``ReconcilePods`` creates every missing index below the count), and
the job goes on at world size 2.

What follows is torch's, in the pods: the kubelet SIGTERMs worker-1's torchrun, which stops its
trainer and leaves the rendezvous open (torch's launcher does not close it on a signal: "prevents
any additional scaling events"); worker-0's trainer loses its gloo peer and fails; worker-0's
agent restarts its worker group (``--max-restarts``, the profile's backoff_limit) in the same
container (its restartCount stays 0), and the c10d rendezvous re-forms with the one agent left
(as read in torch 2.13's dynamic_rendezvous.py: worker-1's heartbeats expire, the minimum of 1 is
met, the last call passes; not traced in the pods); the entrypoint then runs at world size 1
with accumulation 2 and resumes from the newest checkpoint in the shared run directory.

What the test asserts, each from what the run itself wrote (its log through ``jobgen logs``, its
checkpoints' recorded layout, its metrics CSV), against an uninterrupted run of the same job
(1:2, world size 2 throughout) in the same lab session:

- world size 2 before: both pods Running on the two nodes, the resumed checkpoint written by
  world size 2 with accumulation 1;
- world size 1 with accumulation 2 after the restart, global batch 8 unchanged: worker-0's log
  (the entrypoint's banner and its "resume: ... this world size 1 takes 2" line) and every later
  checkpoint's layout;
- the data position continues: samples consumed = steps x 8 in every checkpoint, before and
  after, and the metrics of the resumed start begin at the step after the checkpoint;
- the learning rate at each step after the restart is the uninterrupted run's;
- the losses after the restart match the uninterrupted run's at the same steps: each step
  checkpoint's model evaluated on the run's fixed validation windows (the same 16 windows for
  both runs, in this process). Tolerance: relative 1e-4. The two runs see the same samples and
  learning rate at every step; only the reduction order differs (DDP averages two ranks'
  gradients, (g0 + g1) / 2 over the network; accumulation adds g0 / 2 + g1 / 2 in one process),
  which moves float32 results by ~1e-7 relative per step, and AdamW amplifies that only a little
  over 24 steps; a step read one micro batch off, or a short accumulation window, moves the loss
  by 1e-3 or more. The weights are compared as the entrypoint test does: apart by less than
  1/100 of what they moved since the checkpoint.

Not compared: the ``train_loss`` column. It is global rank 0's last micro batch's loss (Lightning's
on_step log, no sync), whose samples depend on the world size: at 2 ranks rank 0 reads samples
0, 2, 4, 6 of a step's block of 8, at 1 rank with accumulation 2 the last micro batch is 4..7
(tests/unit/test_position.py). Nor ``val_loss``: ``limit_val_batches`` counts micro batches per
rank, so the two world sizes validate on 16 and 8 windows.
"""

from __future__ import annotations

import csv
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # one kubelab module, as conftest.py imports it
from kubelab import wait_for  # noqa: E402
from podlab import (  # noqa: E402
    EVERY,
    PodLab,
    cli,
    container_status,
    job_pods,
    scale_workers,
    submit,
    wait_state,
)

pytestmark = pytest.mark.k8s_lab

#: 1..2 pods, micro batch 4, global batch 8 (accumulation 1 at 2 pods, 2 at 1), every step checkpoint kept.
STEPS, MICRO, GLOBAL = 32, 4, 8
ELASTIC = ("resources.nodes=1:2", f"trainer.max_steps={STEPS}", f"trainer.micro_batch_size={MICRO}",
           f"trainer.global_batch_size={GLOBAL}", f"checkpoint.keep_last_k={STEPS // EVERY + 1}")
#: Relative tolerance of the evaluated losses (module docstring).
LOSS_RTOL = 1e-4
#: Validation windows each checkpoint's model is evaluated on (the same for both runs).
EVAL_WINDOWS = 16


def position(checkpoint: Path) -> dict[str, int]:
    """The ``TrainingPosition`` a checkpoint recorded (jobgen.train.position)."""
    import torch

    return torch.load(checkpoint, map_location="cpu", weights_only=False)["callbacks"]["TrainingPosition"]


def step_checkpoints(run_dir: Path) -> dict[int, Path]:
    return {int(path.stem.split("-")[1]): path for path in (run_dir / "checkpoints").glob("step-*.ckpt")}


def metrics(run_dir: Path) -> list[list[dict[str, str]]]:
    """The rows of each start's ``logs/version_<n>/metrics.csv``, in start order."""
    starts = []
    for path in sorted(run_dir.glob("logs/version_*/metrics.csv"), key=lambda q: int(q.parent.name.split("_")[1])):
        with open(path, newline="") as f:
            starts.append(list(csv.DictReader(f)))
    return starts


def column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    return {int(float(r["step"])): float(r[name]) for r in rows if r.get(name)}


def evaluate(spec_json: Path, run_dir: Path, checkpoints: dict[int, Path]) -> dict[int, float]:
    """step -> mean loss (nats/token) of that checkpoint's model on the run's first
    ``EVAL_WINDOWS`` validation windows (``val.bin`` of the shared run directory), in this process."""
    import numpy as np
    import torch

    from jobgen.jobdir.spec import load_resolved_spec
    from jobgen.train.data import ValWindows
    from jobgen.train.model import LitGPT

    spec = load_resolved_spec(spec_json).spec
    val = np.memmap(run_dir / "data" / "val.bin", dtype=np.uint8, mode="r")
    windows = ValWindows(val, spec.model.block_size, EVAL_WINDOWS)
    x = torch.stack([windows[i][0] for i in range(len(windows))])
    y = torch.stack([windows[i][1] for i in range(len(windows))])
    losses = {}
    for step, path in sorted(checkpoints.items()):
        model = LitGPT.from_spec(spec)
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["state_dict"])
        model.eval()
        with torch.no_grad():
            losses[step] = float(model.loss(model(x), y))
    return losses


def weights(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def spec_file(p: PodLab, name: str) -> Path:
    found = sorted((p.work / "runs" / name / "job").rglob("spec.json"))
    assert found, list((p.work / "runs" / name).rglob("*"))
    return found[0]


def test_elastic_job_scaled_to_one_pod_resumes_with_its_global_batch(pods: PodLab) -> None:
    # The uninterrupted reference: the same job, world size 2 from start to end.
    started = time.monotonic()
    ref_handle = submit(pods, "el-ref", *ELASTIC)
    ref = wait_state(pods, ref_handle, {"COMPLETED", "FAILED"}, 900)
    print(f"\nel-ref: {ref['state']} {time.monotonic() - started:.0f} s after submit; {ref['details']}")
    assert ref["state"] == "COMPLETED", (ref, cli(pods, "logs", "--replica", "worker-0", ref_handle).stdout[-3000:])
    ref_dir = pods.runs / "el-ref"
    ref_ckpts = step_checkpoints(ref_dir)
    assert sorted(ref_ckpts) == list(range(EVERY, STEPS + 1, EVERY)), ref_ckpts
    for step, path in ref_ckpts.items():
        layout = position(path)
        assert (layout["world_size"], layout["gradient_accumulation_steps"], layout["samples_consumed"]) == (2, 1, step * GLOBAL), layout

    # The job scaled down: 2 pods until a step checkpoint exists, then Worker replicas 1.
    run_dir = pods.runs / "el-scale"
    handle = submit(pods, "el-scale", *ELASTIC)
    first = run_dir / "checkpoints" / f"step-{EVERY:08d}.ckpt"
    wait_for(first.is_file, 600, 0.2, what=f"the step {EVERY} checkpoint in the shared run directory")
    before = job_pods(pods, "el-scale")
    placed = {pod["metadata"]["name"]: (pod["status"]["phase"], pod["spec"]["nodeName"]) for pod in before}
    print(f"pods at the step {EVERY} checkpoint: {placed}")
    assert sorted(placed) == ["el-scale-worker-0", "el-scale-worker-1"] and {ph for ph, _ in placed.values()} == {"Running"}, placed
    assert len({node for _, node in placed.values()}) == 2, placed
    scaled_at = time.monotonic()
    scale = scale_workers(pods.lab, "el-scale", 1)
    assert scale["spec"]["replicas"] == 1, scale
    wait_for(lambda: [pod["metadata"]["name"] for pod in job_pods(pods, "el-scale")] == ["el-scale-worker-0"], 180, 1.0,
             what="worker-1 deleted by the operator")
    print(f"worker-1 gone {time.monotonic() - scaled_at:.0f} s after the scale-down")
    final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 900)
    print(f"el-scale: {final['state']} {time.monotonic() - scaled_at:.0f} s after the scale-down; {final['details']}")
    log = cli(pods, "logs", "--replica", "worker-0", handle)
    assert log.returncode == 0, log.stdout + log.stderr
    out = log.stdout
    assert final["state"] == "COMPLETED", (final, out[-4000:])
    (pod,) = job_pods(pods, "el-scale")
    print(f"worker-0: {pod['status']['phase']}, container restarts {container_status(pod).get('restartCount')}")
    assert pod["status"]["phase"] == "Succeeded"

    # The restart: the checkpoint it resumed from, written at world size 2 with accumulation 1.
    resumed = re.findall(r"resume: auto - resuming from \S+\.ckpt \(step (\d+)\)", out)  # last.ckpt or step-N.ckpt
    assert resumed, out[-4000:]
    n = int(resumed[-1])
    assert EVERY <= n < STEPS and n % EVERY == 0, n
    # World size 1, accumulation 2, global batch 8: worker-0's log after the restart (the files: check_resumed_run).
    after_restart = out[out.rindex("resume: auto - resuming from"):]
    assert "world size 1 = 1 node(s) x 1 cpu process(es)" in after_restart, after_restart[:3000]
    assert f"accumulation {GLOBAL // MICRO} x world size 1" in after_restart, after_restart[:3000]
    assert (f"this world size 1 takes {GLOBAL // MICRO}: same global batch {GLOBAL}, step {n}, sample {n * GLOBAL}"
            in after_restart), after_restart[:3000]
    assert re.search(r"elastic: global rank 0 runs on \S+; this node is \S+, node rank 0 of 1\b", after_restart), after_restart[:3000]
    assert f"done: el-scale at step {STEPS}/{STEPS}" in after_restart, after_restart[-3000:]
    check_resumed_run(run_dir, ref_dir, n, spec_file(pods, "el-scale"), spec_file(pods, "el-ref"))


def check_resumed_run(run_dir: Path, ref_dir: Path, n: int, spec_json: Path, ref_spec_json: Path) -> None:
    """What the scaled-down run wrote, against the uninterrupted run's files: it resumed from
    step ``n``'s checkpoint (world size 2, accumulation 1), every later checkpoint is world size 1
    with accumulation 2 and the same global batch, samples = steps x global batch throughout, the
    resumed start's metrics begin at step n + 1 with the reference's learning rate, and the losses
    and weights after the restart are the reference's to tolerance (module docstring)."""
    ref_ckpts = step_checkpoints(ref_dir)
    ckpts = step_checkpoints(run_dir)
    saved = position(ckpts[n])
    assert (saved["global_step"], saved["world_size"], saved["gradient_accumulation_steps"], saved["global_batch_size"],
            saved["samples_consumed"]) == (n, 2, 1, GLOBAL, n * GLOBAL), saved
    later = {step: path for step, path in ckpts.items() if step > n}
    assert sorted(later) == list(range(n + EVERY, STEPS + 1, EVERY)), sorted(ckpts)
    for step, path in [*later.items(), (STEPS, run_dir / "checkpoints" / "last.ckpt")]:
        layout = position(path)
        assert (layout["global_step"], layout["world_size"], layout["gradient_accumulation_steps"], layout["global_batch_size"],
                layout["samples_consumed"]) == (step, 1, GLOBAL // MICRO, GLOBAL, step * GLOBAL), (path.name, layout)

    # The data position continues: the resumed start logs from step n + 1, once per optimizer step, with the reference's lr.
    starts = metrics(run_dir)
    assert len(starts) >= 2, run_dir
    lr_after, lr_ref = column(starts[-1], "lr"), column(metrics(ref_dir)[-1], "lr")
    assert sorted(lr_after) == list(range(n + 1, STEPS + 1)), sorted(lr_after)
    for step, lr in lr_after.items():
        assert lr == pytest.approx(lr_ref[step], rel=1e-9), (step, lr, lr_ref[step])

    # The losses after the restart: each step checkpoint's model on the same validation windows.
    from jobgen.jobdir.spec import load_resolved_spec

    ours, theirs = load_resolved_spec(spec_json).spec, load_resolved_spec(ref_spec_json).spec
    assert (ours.model, ours.trainer, ours.data) == (theirs.model, theirs.trainer, theirs.data)  # only the names differ
    ref_losses = evaluate(ref_spec_json, ref_dir, {s: ref_ckpts[s] for s in later})
    losses = evaluate(spec_json, run_dir, later)
    print(f"losses after the restart (step: scaled run, uninterrupted run): "
          f"{ {s: (losses[s], ref_losses[s]) for s in later} }")
    for step in later:
        assert losses[step] == pytest.approx(ref_losses[step], rel=LOSS_RTOL), (step, losses[step], ref_losses[step])
    start = weights(ckpts[n])
    a, b = weights(ref_ckpts[STEPS]), weights(run_dir / "checkpoints" / "last.ckpt")
    moved = max((a[k] - start[k]).abs().max().item() for k in a)
    apart = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"weights: moved {moved:.3g} in steps {n}..{STEPS}, apart {apart:.3g} between the runs")
    assert apart < moved / 100, (apart, moved)
