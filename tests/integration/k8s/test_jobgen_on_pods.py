"""jobgen's PyTorchJobs really running in pods: the ``jobgen`` CLI against the node
lab (kubenodes.py: kube-apiserver 1.20, two kubelet nodes with containerd and runc, CNI,
kube-scheduler, cluster DNS), the emulated training-operator v1.9 (training_operator.py, the one
emulated part) and the training image built from this repository (kubeimage.py). In the lab tier
like the other node tests (``JOBGEN_SKIP_K8S_NODES=1`` skips them).

What the module's tests prove, each through the CLI only (submit, status, logs, cancel):

1. ``jobgen submit examples/quickstart.yaml`` (2 pods, small overrides) trains to completion with
   one pod on each node (gloo over the lab's pod network, MASTER_ADDR resolved by cluster DNS);
   ``jobgen status`` says COMPLETED with the replica counts the operator took from the pods' real
   phases, and each pod's phase, node and exit code (a restarted one: its restarts); ``jobgen
   logs`` (``-f``, ``--replica worker-0``, ``--first-error``) read the containers' real output
   through the API server;
2. ``jobgen cancel`` deletes the job, and no container, task or pod sandbox is left in either
   node's containerd;
3. restartPolicy ExitCode (jobgen.train.launch gives the pod the failure's class as exit code):
   a worker's training process SIGKILLed from the host (found through its pod's container) exits
   the pod 137, the other pod's rank exits 200 (its lost peer), the operator recreates both pods
   within the spec's restart budget, and the job resumes from the last checkpoint in the shared
   run directory; an input error (exit 2) fails the job with no
   restart, and ``jobgen status`` says class user;
4. a Secret referenced by the profile's ``kubernetes.secret_env`` reaches the container's
   environment, and no rendered file, ConfigMap or job object holds its value.

The pod lab these tests share (image, operator, namespace, Secret, shared run directory, profile)
and the helpers they drive the CLI with: podlab.py, the ``pods`` fixture.

Logs: the test reads them while the pods run (``jobgen logs`` polled until a step line shows,
then ``jobgen logs -f``, as a user would) and again after the end. Both need each node's own
/var/log/pods (kubenodes.py ``_make_mount_ns``): with the machine's one directory each kubelet's
container GC removed the other node's pod logs within a minute (docs/labs-k8s-nodes-notes.md).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # one kubelab module, as conftest.py imports it
from kubelab import wait_for  # noqa: E402
from podlab import (  # noqa: E402
    EVERY,
    NS,
    SECRET_ENV,
    SECRET_NAME,
    STEPS,
    PodLab,
    children,
    cli,
    container_status,
    follow_logs,
    job_containers,
    job_pods,
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


def node_of_pod(p: PodLab, pod_name: str) -> str:
    return next(pod["spec"]["nodeName"] for pod in job_pods(p, pod_name.rsplit("-", 2)[0]) if pod["metadata"]["name"] == pod_name)


def test_quickstart_trains_on_two_nodes_with_status_and_logs(pods: PodLab) -> None:
    started = time.monotonic()
    handle = submit(pods, "quickstart")
    followers = [read_logs_while_running(pods, handle, "master-0")]
    followers.append(follow_logs(pods, handle, "--replica", "worker-0"))
    try:
        final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 600)
    finally:
        outputs = []
        for proc in followers:
            try:
                outputs.append(proc.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                proc.kill()
                outputs.append(proc.communicate()[0])
    print(f"\nquickstart: {final['state']} {time.monotonic() - started:.0f} s after submit; {final['details']}")
    master_out, worker_out = outputs
    assert final["state"] == "COMPLETED", (final, master_out[-3000:], worker_out[-3000:])
    assert final["details"]["master"] == "active 0 succeeded 1 failed 0" and final["details"]["worker"] == "active 0 succeeded 1 failed 0"
    assert final["usage"]["devices"] == 2 and final["usage"]["device_kind"] == "cpu"
    pod_list = job_pods(pods, "quickstart")
    phases = {pod["metadata"]["name"]: (pod["status"]["phase"], pod["spec"]["nodeName"]) for pod in pod_list}
    assert {name: phase for name, (phase, _) in phases.items()} == {"quickstart-master-0": "Succeeded", "quickstart-worker-0": "Succeeded"}
    assert len({node for _, node in phases.values()}) == 2, phases  # one pod per node, placed by kube-scheduler
    # jobgen status reads the same pods: their phase, node and the training container's exit code
    assert final["details"]["pods"] == "; ".join(f"{name.removeprefix('quickstart-')} Succeeded (on {node}, exit 0)"
                                                 for name, (_, node) in sorted(phases.items())), final["details"]
    print(f"pods: {phases}")
    # The containers' real output, read through the API server while the pods ran.
    assert f"done: quickstart at step {STEPS}/{STEPS} (fresh start)" in master_out, master_out[-3000:]
    assert f"step {STEPS}/{STEPS} | train_loss" in master_out and "over 2 rank(s)" in master_out
    # (Not checked: "restarted; attaching again". `jobgen logs -f --replica worker-0` says it when
    # the worker's container has exited 0 while the job is still RUNNING (the Master not done
    # yet): it takes any ended stream of an unfinished job for a restart. Seen in this test.)
    assert "Traceback" not in without_exit_barrier_race(worker_out), worker_out[-3000:]
    # And after the end, from the pods that stay (cleanPodPolicy None): the whole output.
    master_after = cli(pods, "logs", handle)
    assert master_after.returncode == 0 and f"done: quickstart at step {STEPS}/{STEPS}" in master_after.stdout, master_after.stdout[-3000:]
    assert master_after.stdout.startswith("resume: auto - no checkpoint"), master_after.stdout[:500]
    worker_after = cli(pods, "logs", "--replica", "worker-0", handle)
    assert worker_after.returncode == 0 and "failed to try resolving" not in worker_after.stdout, worker_after.stdout[-3000:]
    for out in (worker_out, worker_after.stdout):  # rank 1 (Lightning's line), read live and after the end
        assert "GLOBAL_RANK: 1, MEMBER: 2/2" in out, out[-2000:]
    assert container_status(pod_list[1])["state"]["terminated"]["exitCode"] == 0
    triage = cli(pods, "logs", "--first-error", handle)
    assert triage.returncode == 0 and "no rank's output shows a traceback" in triage.stdout, triage.stdout + triage.stderr
    run_dir = pods.runs / "quickstart"  # the pods' /workspace/runs/quickstart, on the shared volume
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and json.loads((run_dir / "summary.json").read_text())
    assert sorted(train_losses(run_dir)) == list(range(1, STEPS + 1))


def test_cancel_leaves_no_pod_or_container_on_either_node(pods: PodLab) -> None:
    handle = submit(pods, "qs-cancel", "trainer.max_steps=5000")
    wait_for(lambda: [container_status(pod).get("state", {}).get("running") is not None for pod in job_pods(pods, "qs-cancel")] == [True, True],
             300, 2.0, what="both training containers running")
    assert len(job_containers(pods, "qs-cancel")) >= 6  # per pod: its sandbox and training container, both with a running task
    started = time.monotonic()
    gone = cli(pods, "cancel", handle, "--wait-s", "180")
    assert gone.returncode == 0 and f"{handle}  DELETED" in gone.stdout, gone.stdout + gone.stderr
    print(f"\ncancel returned in {time.monotonic() - started:.1f} s")
    assert job_pods(pods, "qs-cancel") == []
    assert request(pods.lab, "GET", f"/api/v1/namespaces/{NS}/services?labelSelector=training.kubeflow.org/job-name%3Dqs-cancel")["items"] == []
    wait_for(lambda: not job_containers(pods, "qs-cancel"), 150, 1.0, what="no container, task or sandbox of the job on either node")
    print(f"containers (pause sandboxes included) and tasks gone from both nodes {time.monotonic() - started:.1f} s after the cancel")
    assert state(pods, handle)["state"] == "CANCELLED"


def test_a_killed_worker_recreates_the_pods_within_the_budget_and_the_job_resumes(pods: PodLab) -> None:
    """restartPolicy ExitCode with a budget of 1: worker-0's training process SIGKILLed from the
    host past the first checkpoint. jobgen.train.launch exits worker-0's pod 137 (128 + SIGKILL),
    and the Master's rank, having lost its gloo peer, exits 200 (the entrypoint's class code): both
    retryable, so the operator deletes both pods and creates them again (new pods, restartCount 0;
    the pods' own policy is Never), and the job resumes from the step checkpoint in the shared run
    directory and completes."""
    started = time.monotonic()
    run_dir = pods.runs / "qs-kill"
    handle = submit(pods, "qs-kill", "restart.max_restarts=1")
    manifest = yaml.safe_load_all((pods.work / "runs" / "qs-kill" / "job" / "pytorchjob.yaml").read_text())
    job = [doc for doc in manifest if doc and doc.get("kind") == "PyTorchJob"][0]
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    assert job["spec"]["runPolicy"]["backoffLimit"] == 1
    first_ckpt = run_dir / "checkpoints" / f"step-{EVERY:08d}.ckpt"
    wait_for(lambda: first_ckpt.is_file() or any(pod["status"].get("phase") == "Failed" for pod in job_pods(pods, "qs-kill")),
             600, 0.5, what=f"the step {EVERY} checkpoint in the shared run directory")
    before = {pod["metadata"]["name"]: pod for pod in job_pods(pods, "qs-kill")}
    assert {pod["status"].get("phase") for pod in before.values()} == {"Running"}, [p["status"] for p in before.values()]
    worker = before["qs-kill-worker-0"]
    launcher = task_pid(pods, worker)
    assert "jobgen.train.launch" in Path(f"/proc/{launcher}/cmdline").read_bytes().decode(errors="replace")
    trainers = children(launcher)
    assert len(trainers) == 1, (launcher, trainers)
    cmdline = Path(f"/proc/{trainers[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "jobgen.train" in cmdline, cmdline
    os.kill(trainers[0], signal.SIGKILL)
    killed_at = time.monotonic()
    print(f"\nSIGKILLed pid {trainers[0]} in {worker['metadata']['name']} on {worker['spec']['nodeName']}")
    final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 900)
    print(f"qs-kill: {final['state']} {time.monotonic() - killed_at:.0f} s after the kill; {final['details']}")
    assert final["state"] == "COMPLETED", final
    after = {pod["metadata"]["name"]: pod for pod in job_pods(pods, "qs-kill")}
    assert sorted(after) == sorted(before)
    assert after["qs-kill-worker-0"]["metadata"]["uid"] != worker["metadata"]["uid"]  # recreated, not restarted in place
    for pod in after.values():
        assert pod["spec"]["restartPolicy"] == "Never" and not container_status(pod).get("restartCount"), pod["metadata"]["name"]
    starts = {path.name: path.read_text().count("\n") for path in (run_dir / "restarts").glob("*/*")}
    print(f"starts per pod (the launcher's count): {starts}")
    assert starts["qs-kill-worker-0"] == 2, starts
    versions = sorted(run_dir.glob("logs/version_*"), key=lambda q: int(q.name.split("_")[1]))
    assert len(versions) >= 2, versions  # a second start logged: it resumed, it did not run once
    with open(versions[-1] / "metrics.csv", newline="") as f:
        steps = [int(float(row["step"])) for row in csv.DictReader(f) if row.get("train_loss")]
    assert min(steps) == EVERY + 1 and max(steps) == STEPS, steps  # the new pods began after the step-EVERY checkpoint
    print(f"test duration {time.monotonic() - started:.0f} s")


#: ``jobgen status``'s progress line of a Kubernetes job (jobgen/cli/jobs.py) with the ETA.
PROGRESS_TEXT = re.compile(r"  progress: step ([0-9]+)/([0-9]+), ([0-9,]+) tokens/s \(last log interval\), ETA ((?:[0-9]+d )?[0-9]+:[0-9]{2}:[0-9]{2}) "
                           r"\(pod ([a-z0-9-]+) log line written ([0-9:]+) ago\)")
#: The line's ETA field as LineProgress prints it (str() of a timedelta: "1:32:19", "2 days, 0:00:09").
LINE_ETA = re.compile(r"\| eta (?:([0-9]+) days?, )?([0-9]+):([0-9]{2}):([0-9]{2})$")


def check_running_progress(p: PodLab, handle: str, name: str, max_steps: int) -> None:
    """``jobgen status`` of the RUNNING job ``handle``: polled until its progress has a rate and an
    ETA (the first lines come before the throughput window is full), then checked against the
    Master's own progress line of that step (``jobgen logs``): the ETA is the line's less the time
    since it was written. The usage is the pods' CPU-hours so far, with no cost."""
    started = time.monotonic()
    seen: dict = {}

    def shown() -> bool:
        seen.update(state(p, handle))
        progress = seen.get("progress") or {}
        return progress.get("eta_s") is not None and progress.get("tokens_per_s") is not None
    wait_for(shown, 180, 1.0, what=f"{handle}'s progress with a rate and an ETA in jobgen status -o json")
    waited = time.monotonic() - started
    progress, usage = seen["progress"], seen["usage"]
    assert seen["state"] == "RUNNING", seen
    assert 0 < progress["step"] < max_steps and progress["max_steps"] == max_steps, progress
    assert progress["tokens_per_step"] is None and progress["tokens_per_s"] > 0 and progress["eta_s"] > 0, progress
    assert progress["source"] == f"pod {name}-master-0 log" and 0 <= progress["updated_s_ago"] < 60, progress
    # the figures are the Master's line of that step, its ETA less the seconds since the kubelet stamped it
    logged = cli(p, "logs", handle)
    assert logged.returncode == 0, logged.stdout + logged.stderr
    line = next((x for x in logged.stdout.splitlines() if x.startswith(f"step {progress['step']}/{max_steps} | ")), None)
    assert line is not None, logged.stdout[-3000:]
    eta = LINE_ETA.search(line)
    assert eta is not None, line
    line_eta = int(eta.group(1) or 0) * 86400 + int(eta.group(2)) * 3600 + int(eta.group(3)) * 60 + int(eta.group(4))
    assert line_eta - progress["updated_s_ago"] - 1 <= progress["eta_s"] <= line_eta, (line, progress)
    assert f"| {progress['tokens_per_s'] / 1000:.1f}k tok/s |" in line, (line, progress)
    assert (usage["device_kind"], usage["devices"], usage["end"]) == ("cpu", 2, None), usage  # 2 pods x 1 CPU, still running
    assert usage["cpu_hours"] > 0 and usage["cost"] is None, usage
    text = cli(p, "status", handle)
    assert text.returncode == 0, text.stdout + text.stderr
    match = PROGRESS_TEXT.search(text.stdout)
    assert match is not None, text.stdout
    assert int(match.group(1)) >= progress["step"] and int(match.group(2)) == max_steps and match.group(5) == f"{name}-master-0", text.stdout
    assert re.search(r"  usage: 2 CPUs = [0-9]+\.[0-9]{3} CPU-hours \(pods' container times x requested CPUs\)", text.stdout), text.stdout
    print(f"\n{name}: progress with a rate and an ETA {waited:.1f} s after both containers ran; checks {time.monotonic() - started:.1f} s\n"
          f"{text.stdout}")


def test_secret_env_reaches_the_container_and_no_rendered_file(pods: PodLab) -> None:
    """A Secret of the profile's ``kubernetes.secret_env`` reaches the container's environment by
    reference only; and, on the same running job (5000 steps: it runs until cancelled),
    ``jobgen status`` (text and ``-o json``) shows its progress from the last progress line of the
    Master's log (the step of max_steps, tokens/s, the ETA) and its CPU-hours so far (a CPU job
    has no price: ``gpu_hour_price`` prices GPU-hours only) (:func:`check_running_progress`)."""
    handle = submit(pods, "qs-secret", "trainer.max_steps=5000")
    try:
        wait_for(lambda: [container_status(pod).get("state", {}).get("running") is not None
                          for pod in job_pods(pods, "qs-secret")] == [True, True], 300, 2.0, what="both training containers running")
        check_running_progress(pods, handle, "qs-secret", 5000)
        for pod in job_pods(pods, "qs-secret"):
            environ = Path(f"/proc/{task_pid(pods, pod)}/environ").read_bytes().split(b"\0")
            assert f"{SECRET_ENV}={pods.secret_value}".encode() in environ, pod["metadata"]["name"]
        job_dir = pods.work / "runs" / "qs-secret" / "job"
        rendered = [path for path in job_dir.rglob("*") if path.is_file()]
        assert rendered and not [path for path in rendered if pods.secret_value.encode() in path.read_bytes()]
        assert SECRET_NAME in (job_dir / "pytorchjob.yaml").read_text()  # by reference only
        for path in (f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/qs-secret", f"/api/v1/namespaces/{NS}/configmaps/qs-secret-config"):
            assert pods.secret_value not in json.dumps(request(pods.lab, "GET", path)), path
    finally:
        gone = cli(pods, "cancel", handle, "--wait-s", "180")
        assert gone.returncode == 0, gone.stdout + gone.stderr


def test_an_input_error_fails_the_job_without_a_restart_and_status_says_user(pods: PodLab) -> None:
    """A spec whose data matches no file inside the container, with a restart budget of 2: the
    entrypoint refuses it in both pods (exit 2, passed on by jobgen.train.launch: permanent under
    restartPolicy ExitCode), so the operator fails the job at once: no pod is recreated and no
    container restarted. `jobgen status` says FAILED with class user and the pods' exit codes, and
    `jobgen logs --first-error` finds the entrypoint's error, naming the field, in the containers'
    logs through the API server."""
    started = time.monotonic()
    handle = submit(pods, "qs-bad-input", "data.paths=[no-such-dir/*.txt]", "restart.max_restarts=2")
    try:
        created = wait_for(lambda: [pod for pod in job_pods(pods, "qs-bad-input") if len(job_pods(pods, "qs-bad-input")) == 2],
                           300, 1.0, what="both pods created")
        first = {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in created}
        final = wait_state(pods, handle, {"FAILED", "COMPLETED"}, 300)
        assert final["state"] == "FAILED", final
        # the operator fails the job at the first pod's permanent exit; the other pod ends by itself (cleanPodPolicy None)
        wait_for(lambda: all(pod["status"].get("phase") == "Failed" for pod in job_pods(pods, "qs-bad-input")), 300, 1.0,
                 what="both pods Failed")
        final = state(pods, handle)
        assert final["failure"]["class"] == "user" and final["failure"]["retried"] is False, final["failure"]
        pods_now = job_pods(pods, "qs-bad-input")
        assert {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods_now} == first  # no pod recreated
        assert all(not container_status(pod).get("restartCount") for pod in pods_now), [container_status(p) for p in pods_now]
        for replica in ("master-0", "worker-0"):
            summary = next(part for part in final["details"]["pods"].split("; ") if part.startswith(f"{replica} "))
            assert "exit 2" in summary, final["details"]
        triage = cli(pods, "logs", "--first-error", handle)
        assert triage.returncode == 0, triage.stdout + triage.stderr
        assert "data.paths[0]: 'no-such-dir/*.txt' matches no files" in triage.stdout, triage.stdout[-3000:]
        text = cli(pods, "status", handle)
        assert "FAILED" in text.stdout and "failure: user (not retried)" in text.stdout, text.stdout
        print(f"\n{text.stdout}\n{triage.stdout[-1500:]}\ntest duration {time.monotonic() - started:.0f} s")
    finally:
        gone = cli(pods, "cancel", handle, "--wait-s", "180")
        assert gone.returncode == 0, gone.stdout + gone.stderr
