"""jobgen's TrainJobs (Trainer v2, ``kubernetes.job_api: trainjob``) really running in pods:
the ``jobgen`` CLI against the node lab (kubenodes.py: kube-apiserver 1.20, two
kubelet nodes with containerd and runc, CNI, kube-scheduler, cluster DNS), the emulated Trainer
v2.3.0 + JobSet v0.12.0 + Indexed Job controllers (trainer_controller.py: the emulated part; the
Trainer CRDs installed with the parts 1.20 cannot parse removed, :func:`trainer_controller.crd_for_120`)
and the training image built from this repository. In the lab tier like the other node tests
(``JOBGEN_SKIP_K8S_NODES=1`` skips them).

What the module's tests prove, each through the CLI only (submit, status, logs, cancel):

1. ``jobgen submit examples/quickstart.yaml`` rendered as a TrainJob (2 nodes, the small
   overrides of test_jobgen_on_pods.py) trains to completion with one pod on each node: plain
   ``torchrun`` configured only by the PET_* variables the Trainer's torch plugin injects, the
   rendezvous at ``<job>-node-0-0.<job>:29500`` (the index-0 pod's hostname under the JobSet's
   headless Service, resolved by cluster DNS); ``jobgen status`` says RUNNING while it runs, with
   the progress read from the log of the pod of completion index 0 (global rank zero), and
   COMPLETED after; ``jobgen logs`` (``-f`` while it runs, default node-0, ``--replica node-1``,
   ``--first-error``) reads both pods' output through the API server;
2. ``jobgen cancel`` deletes the TrainJob, its pods and Service go with it, and no container,
   task or pod sandbox is left on either node;
3. node-1's training process SIGKILLed from the host is restarted in place (the JobSet's
   restartPolicy OnFailure: same pods, the kubelet restarts the containers), the restarts stay
   within the Job's backoffLimit (6), and the job resumes from the last checkpoint in the shared
   run directory and ends with the losses of the uninterrupted run at every step after it.

The uninterrupted run of 1. is the module's ``quickstart`` fixture, made by whichever of 1. and 3.
runs first (3. compares its losses with it), so each test also runs alone.

The pod lab (image, controllers, namespace, Secret, shared run directory, profiles) and the CLI
helpers: podlab.py, the ``pods`` fixture.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # one kubelab module, as conftest.py imports it
import trainer_controller as tc  # noqa: E402
from kubelab import wait_for  # noqa: E402
from podlab import (  # noqa: E402
    EVERY,
    NS,
    STEPS,
    PodLab,
    children,
    cli,
    container_status,
    job_containers,
    read_logs_while_running,
    request,
    state,
    submit,
    task_pid,
    train_losses,
    wait_state,
    without_exit_barrier_race,
)

pytestmark = pytest.mark.k8s_lab


def trainjob_pods(p: PodLab, name: str) -> list[dict[str, Any]]:
    """The TrainJob's pods (JobSet's label), by completion index."""
    answer = request(p.lab, "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={tc.JOBSET_NAME_LABEL}%3D{name}")
    return sorted(answer["items"], key=lambda pod: int(pod["metadata"]["annotations"][tc.COMPLETION_INDEX]))


def node_status(pod: dict[str, Any]) -> dict[str, Any]:
    return container_status(pod, tc.NODE)


@dataclass
class Quickstart:
    """What :func:`quickstart` saw of the uninterrupted ``tj-quickstart`` run."""

    handle: str
    final: dict[str, Any]  # `jobgen status -o json` once COMPLETED or FAILED
    seen_running: bool  # `jobgen status` said RUNNING at least once before the end
    followed: str  # `jobgen logs -f --replica node-0`, read while the pods ran
    stepping: dict[str, Any]  # `jobgen status -o json` once node-0's output showed a training step
    elapsed_s: float  # from submit to the end state


@pytest.fixture(scope="module")
def quickstart(pods: PodLab) -> Quickstart:
    """The uninterrupted TrainJob run both the quickstart test (its checks) and the kill test
    (its reference losses) need, submitted once per module by whichever of them runs first, so
    either runs alone; it asserts nothing itself (the tests do, with the run's output)."""
    started = time.monotonic()
    handle = submit(pods, "tj-quickstart", profile=pods.trainjob_profile)
    seen_running = False

    def running_or_done() -> bool:
        nonlocal seen_running
        now = state(pods, handle)
        seen_running |= now["state"] == "RUNNING"
        return now["state"] in ("RUNNING", "COMPLETED", "FAILED")
    wait_for(running_or_done, 300, 2.0, what="jobgen status RUNNING")
    follower = read_logs_while_running(pods, handle, "node-0")  # then `jobgen logs -f --replica node-0`
    try:
        stepping = state(pods, handle)
        final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 900)
    finally:
        try:
            followed = follower.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            follower.kill()
            followed = follower.communicate()[0]
    return Quickstart(handle, final, seen_running, followed, stepping, time.monotonic() - started)


def test_quickstart_trainjob_trains_on_two_nodes_with_status_and_logs(pods: PodLab, quickstart: Quickstart) -> None:
    handle, final, seen_running, followed, elapsed = (quickstart.handle, quickstart.final, quickstart.seen_running,
                                                      quickstart.followed, quickstart.elapsed_s)
    rendered = (pods.work / "runs" / "tj-quickstart" / "job" / "trainjob.yaml").read_text()
    assert "PET_" not in rendered and "MASTER_ADDR" not in rendered  # all of that is the Trainer's, injected in the pods
    pod_list = trainjob_pods(pods, "tj-quickstart")
    print(f"\ntj-quickstart: {final['state']} {elapsed:.0f} s after submit; {final['details']}")
    out0, out1 = cli(pods, "logs", handle), cli(pods, "logs", "--replica", "node-1", handle)
    assert final["state"] == "COMPLETED", (final, out0.stdout[-3000:], out1.stdout[-3000:])
    assert seen_running, "jobgen status never said RUNNING while the pods ran"
    assert final["details"]["reason"] == "AllJobsCompleted" and final["details"][tc.NODE].startswith("jobs active 0 ready 0 succeeded 1")
    assert final["usage"]["devices"] == 2 and final["usage"]["device_kind"] == "cpu", final["usage"]
    placed = {pod["metadata"]["name"]: (pod["status"]["phase"], pod["spec"]["nodeName"], pod["spec"]["hostname"]) for pod in pod_list}
    print(f"pods: {placed}")
    assert [phase for phase, _, _ in placed.values()] == ["Succeeded", "Succeeded"]
    assert len({node for _, node, _ in placed.values()}) == 2, placed  # one pod per node, placed by kube-scheduler
    assert [host for _, _, host in placed.values()] == ["tj-quickstart-node-0-0", "tj-quickstart-node-0-1"]
    assert all(node_status(pod)["state"]["terminated"]["exitCode"] == 0 and node_status(pod)["restartCount"] == 0 for pod in pod_list)
    # The containers' output through the API server: rank 0 on node-0 (PET_NODE_RANK 0), rank 1 on node-1.
    assert out0.returncode == 0 and out1.returncode == 0, out0.stderr + out1.stderr
    assert out0.stdout.startswith("resume: auto - no checkpoint"), out0.stdout[:500]
    assert f"done: tj-quickstart at step {STEPS}/{STEPS} (fresh start)" in out0.stdout, out0.stdout[-3000:]
    assert f"step {STEPS}/{STEPS} | train_loss" in out0.stdout and "over 2 rank(s)" in out0.stdout
    assert f"done: tj-quickstart at step {STEPS}/{STEPS}" in followed, followed[-3000:]  # read live, to the end
    # torchrun's agents meet at an exit barrier held by node 0's agent, which may leave first (podlab.without_exit_barrier_race)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out1.stdout and "Traceback" not in without_exit_barrier_race(out1.stdout), \
        out1.stdout[-3000:]
    triage = cli(pods, "logs", "--first-error", handle)
    assert triage.returncode == 0 and "no rank's output shows a traceback" in triage.stdout, triage.stdout + triage.stderr
    run_dir = pods.runs / "tj-quickstart"  # /workspace/runs/tj-quickstart on the shared volume
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and json.loads((run_dir / "summary.json").read_text())
    assert sorted(train_losses(run_dir)) == list(range(1, STEPS + 1))
    # `jobgen status` once a step showed: the progress line of global rank zero's pod, the one of completion index 0
    progress = quickstart.stepping["progress"]
    assert progress is not None, quickstart.stepping
    assert 1 <= progress["step"] <= STEPS and progress["max_steps"] == STEPS, progress
    assert progress["source"] == f"pod {pod_list[0]['metadata']['name']} log", (progress, [pod["metadata"]["name"] for pod in pod_list])


def test_cancel_of_a_trainjob_leaves_no_pod_service_or_container(pods: PodLab) -> None:
    handle = submit(pods, "tj-cancel", "trainer.max_steps=5000", profile=pods.trainjob_profile)
    wait_for(lambda: [node_status(pod).get("state", {}).get("running") is not None for pod in trainjob_pods(pods, "tj-cancel")] == [True, True],
             300, 2.0, what="both training containers running")
    assert len(job_containers(pods, "tj-cancel")) >= 6  # per pod: its sandbox and training container, both with a running task
    assert request(pods.lab, "GET", f"/api/v1/namespaces/{NS}/services/tj-cancel")["spec"]["clusterIP"] == "None"
    started = time.monotonic()
    gone = cli(pods, "cancel", handle, "--wait-s", "180")
    assert gone.returncode == 0 and f"{handle}  DELETED" in gone.stdout, gone.stdout + gone.stderr
    print(f"\ncancel returned in {time.monotonic() - started:.1f} s")
    assert trainjob_pods(pods, "tj-cancel") == []
    assert pods.lab.request("GET", f"/api/v1/namespaces/{NS}/services/tj-cancel")[0] == 404
    wait_for(lambda: not job_containers(pods, "tj-cancel"), 150, 1.0, what="no container, task or sandbox of the job on either node")
    print(f"containers (pause sandboxes included) and tasks gone from both nodes {time.monotonic() - started:.1f} s after the cancel")
    assert state(pods, handle)["state"] == "CANCELLED"


def test_killed_node_restarts_in_place_and_resumes_with_the_uninterrupted_losses(pods: PodLab, quickstart: Quickstart) -> None:
    reference = train_losses(pods.runs / "tj-quickstart")
    assert sorted(reference) == list(range(1, STEPS + 1)), (
        f"the uninterrupted run (the quickstart fixture) logged steps {sorted(reference)}, not 1-{STEPS}: {quickstart.final}")
    run_dir = pods.runs / "tj-kill"
    handle = submit(pods, "tj-kill", profile=pods.trainjob_profile)
    wait_for((run_dir / "checkpoints" / f"step-{EVERY:08d}.ckpt").is_file, 600, 0.2, what=f"the step {EVERY} checkpoint")
    before = trainjob_pods(pods, "tj-kill")
    node1 = before[1]
    torchrun = task_pid(pods, node1, tc.NODE)
    trainers = children(torchrun)
    assert len(trainers) == 1, (torchrun, trainers)
    cmdline = Path(f"/proc/{trainers[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "jobgen.train" in cmdline, cmdline
    os.kill(trainers[0], signal.SIGKILL)
    killed_at = time.monotonic()
    print(f"\nSIGKILLed pid {trainers[0]} ({cmdline.strip()}) in {node1['metadata']['name']} on {node1['spec']['nodeName']}")
    final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 900)
    after = trainjob_pods(pods, "tj-kill")
    restarts = {pod["metadata"]["name"]: node_status(pod).get("restartCount") for pod in after}
    print(f"tj-kill: {final['state']} {time.monotonic() - killed_at:.0f} s after the kill; {final['details']}; restart counts {restarts}")
    assert final["state"] == "COMPLETED", final
    assert [p["metadata"]["name"] for p in after] == [p["metadata"]["name"] for p in before]  # restarted in place, not replaced
    assert restarts[node1["metadata"]["name"]] >= 1 and sum(restarts.values()) <= tc.DEFAULT_BACKOFF_LIMIT, restarts
    versions = sorted(run_dir.glob("logs/version_*"), key=lambda q: int(q.name.split("_")[1]))
    assert len(versions) >= 2, versions  # a second start logged: it resumed, it did not run once
    with open(versions[-1] / "metrics.csv", newline="") as f:
        first_step = min(int(float(row["step"])) for row in csv.DictReader(f) if row.get("train_loss"))
    assert first_step == EVERY + 1, first_step  # the last start began after the step-EVERY checkpoint
    losses = train_losses(run_dir)
    steps = list(range(EVERY + 1, STEPS + 1))
    assert [losses.get(s) for s in steps] == [reference[s] for s in steps], {s: (losses.get(s), reference[s]) for s in steps}
