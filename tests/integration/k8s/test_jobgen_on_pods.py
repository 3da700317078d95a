"""jobgen's PyTorchJobs really running in pods (issue 31): the ``jobgen`` CLI against the node
lab (kubenodes.py: kube-apiserver 1.20, two kubelet nodes with containerd and runc, CNI,
kube-scheduler, cluster DNS), the emulated training-operator v1.9 (training_operator.py, the one
emulated part) and the training image built from this repository (kubeimage.py). Opt-in like the
other node tests: ``JOBGEN_K8S_NODES=1``.

What the module's tests prove, each through the CLI only (submit, status, logs, cancel):

1. ``jobgen submit examples/quickstart.yaml`` (2 pods, small overrides) trains to completion with
   one pod on each node (gloo over the lab's pod network, MASTER_ADDR resolved by cluster DNS);
   ``jobgen status`` says COMPLETED with the replica counts the operator took from the pods' real
   phases; ``jobgen logs`` (``-f``, ``--replica worker-0``, ``--first-error``) read the
   containers' real output through the API server;
2. ``jobgen cancel`` deletes the job, and no container, task or pod sandbox is left in either
   node's containerd;
3. a worker's training process SIGKILLed from the host (found through its pod's container) is
   restarted by the replica's restart policy (OnFailure: the kubelet restarts the container in
   place), the job resumes from the last checkpoint in the shared run directory and ends with the
   losses of an uninterrupted run at every step after the restart;
4. a Secret referenced by the profile's ``kubernetes.secret_env`` reaches the container's
   environment, and no rendered file, ConfigMap or job object holds its value.

The shared run directory: jobgen mounts ``kubernetes.runs_volume_claim`` (a PersistentVolumeClaim,
ReadWriteMany for multi-pod jobs) at /workspace/runs, else an emptyDir per pod. Both lab nodes
are network namespaces of this one machine and share its filesystem, so a ``hostPath``
PersistentVolume on one host directory stands for a ReadWriteMany volume (NFS, CephFS, a CSI
driver) here: both pods see the same files, as they would on shared storage. The claim is bound
to it by kube-controller-manager's real persistentvolume-binder.

The operator's ``init-pytorch`` container (v1.9 adds it to Worker pods: wait until the Master's
Service resolves) runs the lab's busybox image, with v1.9's own flags
(``--pytorch-init-container-image``, ``--pytorch-init-container-template-file``): there is no
registry to pull alpine:3.10 from, and busybox 1.35's ``nslookup`` exits 1 when any name of the
search list is NXDOMAIN even though the first one answered, so the template's loop tests for an
answer (``grep '^Name:'``) instead of the exit status.

Logs: the test reads them while the pods run (``jobgen logs`` polled until a step line shows,
then ``jobgen logs -f``, as a user would) and again after the end. Both need each node's own
/var/log/pods (kubenodes.py ``_make_mount_ns``): with the machine's one directory each kubelet's
container GC removed the other node's pod logs within a minute (docs/labs-k8s-nodes-notes.md).
"""

from __future__ import annotations

import csv
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # one kubelab module, as conftest.py imports it
import kubeimage  # noqa: E402
import kubenodes  # noqa: E402
from kubelab import K8sLab, wait_for  # noqa: E402

from tests.conftest import EXAMPLES, REPO  # noqa: E402

pytestmark = pytest.mark.k8s_lab
NS = "training"
CONTEXT = "jobgen-lab"
OPERATOR = Path(__file__).resolve().parent / "training_operator.py"
#: v1.9's default init container, with the lab's busybox and a loop that tests for an answer (module docstring).
INIT_TEMPLATE = """\
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: Never
  resources: {limits: {cpu: 100m, memory: 20Mi}, requests: {cpu: 50m, memory: 10Mi}}
  command: ["sh", "-c", "err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}} | grep -q '^Name:'; then err=0 && break; fi;\\
    echo waiting for master; sleep 2; done; exit $err"]
"""
#: The quickstart made small: 2 pods x 1 gloo process, a 300 kB corpus, checkpoints every 8 steps.
STEPS, EVERY = 24, 8
OVERRIDES = ("resources.nodes=2", f"trainer.max_steps={STEPS}", "data.max_bytes=300000", f"trainer.val_check_interval={EVERY}",
             "trainer.limit_val_batches=2", "trainer.log_every_n_steps=1", f"checkpoint.every_n_steps={EVERY}", "trainer.warmup_steps=2")
SECRET_NAME, SECRET_KEY, SECRET_ENV = "lab-token", "token", "JOBGEN_LAB_TOKEN"


@dataclass
class PodLab:
    """What the module fixture brought up: the lab, its nodes, where jobgen runs, the profile."""

    lab: K8sLab
    nodes: kubenodes.NodeLab
    work: Path  #: the CLI's working directory (its state dir and rendered jobs are under it)
    runs: Path  #: the host directory behind /workspace/runs in every pod
    profile: Path
    secret_value: str
    timings: dict[str, float] = field(default_factory=dict)


def _request(lab: K8sLab, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
    status, answer = lab.request(method, path, body)
    assert status in ok, (method, path, status, answer)
    return answer


@pytest.fixture(scope="module")
def pods(k8s_nodes, tmp_path_factory) -> Iterator[PodLab]:
    """The node lab with the training image imported on both nodes, namespace ``training``, a
    Secret, the shared run directory (hostPath PV + claim), the emulated operator as a process and
    the ``k8s-lab`` profile (CPU, gloo, 1 process per pod, the local image, Never pull)."""
    lab, nodes = k8s_nodes
    timings: dict[str, float] = {}
    started = time.monotonic()
    image = kubeimage.build(tmp_path_factory.mktemp("image"), log=lambda m: print(m, file=sys.stderr))
    timings["image_build_or_cache_s"] = round(time.monotonic() - started, 1)
    ref, archive = image["ref"], Path(image["archive"])

    def import_image(node: kubenodes.Node) -> None:
        if ref not in nodes.ctr(node, "images", "ls", "-q").split():
            t0 = time.monotonic()
            nodes.ctr(node, "images", "import", str(archive), timeout=900)
            timings[f"import_{node.name}_s"] = round(time.monotonic() - t0, 1)
    with ThreadPoolExecutor(len(kubenodes.NODES)) as pool:  # both nodes at once: mostly disk-bound
        list(pool.map(import_image, kubenodes.NODES))
    timings["imports_s"] = round(time.monotonic() - started - timings["image_build_or_cache_s"], 1)
    print(f"\ntraining image {ref}: {timings}", file=sys.stderr)

    if lab.request("GET", f"/api/v1/namespaces/{NS}")[0] == 404:
        _request(lab, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    secret_value = secrets.token_hex(16)
    _request(lab, "POST", f"/api/v1/namespaces/{NS}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET_NAME},
                                                              "stringData": {SECRET_KEY: secret_value}})
    runs = tmp_path_factory.mktemp("shared-runs")
    _request(lab, "POST", "/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "jobgen-lab-runs"},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                 "storageClassName": "", "hostPath": {"path": str(runs), "type": "Directory"}}})
    _request(lab, "POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "jobgen-runs"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "jobgen-lab-runs",
                 "resources": {"requests": {"storage": "10Gi"}}}})
    wait_for(lambda: (lab.request("GET", f"/api/v1/namespaces/{NS}/persistentvolumeclaims/jobgen-runs")[1].get("status") or {})
             .get("phase") == "Bound", 60, 0.5, what="the run directory's claim Bound")

    work = tmp_path_factory.mktemp("jobgen-work")
    profile = work / "k8s-lab.yaml"
    settings = kubeimage.cpu_profile(ref, processes=1)
    settings.update({"max_nodes": 2, "cpus_per_node": 1, "mem_gib_per_node": 4})
    settings["kubernetes"].update({"context": CONTEXT, "namespace": NS, "shm_size_gib": 0.5, "runs_volume_claim": "jobgen-runs",
                                   "backoff_limit": 8, "secret_env": {SECRET_ENV: {"secret": SECRET_NAME, "key": SECRET_KEY}}})
    profile.write_text(yaml.safe_dump(settings))
    template = work / "init-container.yaml"
    template.write_text(INIT_TEMPLATE)
    log_path = work / "operator.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(OPERATOR), "--kubeconfig", str(lab.kubeconfig), "--context", CONTEXT, "--resync-s", "10",
                                 "--pytorch-init-container-image", kubenodes.BUSYBOX_IMAGE,
                                 "--pytorch-init-container-template-file", str(template)],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        time.sleep(0.5)
        assert proc.poll() is None, log_path.read_text()
        yield PodLab(lab, nodes, work, runs, profile, secret_value, timings)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(f"\n--- operator log (tail)\n{log_path.read_text()[-3000:]}", file=sys.stderr)
        # Leave the session's lab as found (the node tests after this module expect no pods): the
        # jobs deleted with their pods, no container of this namespace on either node.
        jobs = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
        for job in _request(lab, "GET", jobs)["items"]:
            _request(lab, "DELETE", f"{jobs}/{job['metadata']['name']}", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                                          "propagationPolicy": "Foreground"})
        wait_for(lambda: not _request(lab, "GET", f"/api/v1/namespaces/{NS}/pods")["items"], 180, 1.0, what="this module's pods deleted")
        wait_for(lambda: not any(nodes.ctr(node, "containers", "ls", "-q", f'labels."io.kubernetes.pod.namespace"=={NS}').split()
                                 for node in kubenodes.NODES), 150, 1.0, what="this module's containers gone from both nodes")
    assert "Traceback" not in log_path.read_text(), log_path.read_text()[-6000:]


def cli(p: PodLab, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m jobgen.cli ARGS`` against the node lab (its kubeconfig, a private state dir)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(p.lab.kubeconfig), "JOBGEN_STATE_DIR": str(p.work / "state")}
    for key in ("JOBGEN_K8S_CONTEXT", "JOBGEN_K8S_NAMESPACE", "JOBGEN_DEBUG"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "jobgen.cli", *args], cwd=p.work, env=env, capture_output=True, text=True, timeout=timeout)


def follow_logs(p: PodLab, handle: str, *args: str) -> subprocess.Popen[str]:
    """``jobgen logs -f HANDLE ARGS`` in the background (unbuffered: its lines come as they are read)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(p.lab.kubeconfig), "JOBGEN_STATE_DIR": str(p.work / "state"),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "jobgen.cli", "logs", "-f", *args, handle], cwd=p.work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def submit(p: PodLab, name: str, *overrides: str) -> str:
    out = cli(p, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", str(p.profile), "--set", f"name={name}",
              *(a for o in (*OVERRIDES, *overrides) for a in ("--set", o)))
    handle = f"k8s://{CONTEXT}/{NS}/{name}"
    assert out.returncode == 0 and f"created {handle}" in out.stdout, out.stdout + out.stderr
    return handle


def state(p: PodLab, handle: str) -> dict[str, Any]:
    out = cli(p, "status", "-o", "json", handle)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def wait_state(p: PodLab, handle: str, wanted: set[str], timeout: float) -> dict[str, Any]:
    """Poll ``jobgen status`` until the job's state is in ``wanted`` (print the pods on timeout)."""
    seen: dict[str, Any] = {}

    def reached() -> bool:
        seen.update(state(p, handle))
        return seen["state"] in wanted
    try:
        wait_for(reached, timeout, 3.0, what=f"{handle} in {sorted(wanted)}")
    except TimeoutError:
        print(json.dumps(seen, indent=1), json.dumps(job_pods(p, handle.rsplit("/", 1)[1]), indent=1)[-6000:], p.nodes.log_tails(20))
        raise
    return seen


def job_pods(p: PodLab, name: str) -> list[dict[str, Any]]:
    answer = _request(p.lab, "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=training.kubeflow.org/job-name%3D{name}")
    return sorted(answer["items"], key=lambda pod: pod["metadata"]["name"])


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c["name"] == "pytorch"), {})


def node_of(name: str) -> kubenodes.Node:
    return next(n for n in kubenodes.NODES if n.name == name)


def task_pid(p: PodLab, pod: dict[str, Any]) -> int:
    """The host PID of the pod's ``pytorch`` container's first process (torchrun), from its node's
    containerd (``ctr tasks ls``) by the container ID the kubelet reported."""
    container_id = container_status(pod)["containerID"].split("://", 1)[1]
    for line in p.nodes.ctr(node_of(pod["spec"]["nodeName"]), "tasks", "ls").splitlines()[1:]:
        task, pid, status = line.split()
        if task == container_id and status == "RUNNING":
            return int(pid)
    raise AssertionError(f"no running task {container_id} on {pod['spec']['nodeName']}")


def children(pid: int) -> list[int]:
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        found += [int(c) for c in path.read_text().split()]
    return found


def train_losses(run_dir: Path) -> dict[int, float]:
    """step -> train_loss over every ``logs/version_<n>/metrics.csv`` of the run, a later version
    (a resumed start) replacing the steps an earlier one logged."""
    losses: dict[int, float] = {}
    for path in sorted(run_dir.glob("logs/version_*/metrics.csv"), key=lambda q: int(q.parent.name.split("_")[1])):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("train_loss"):
                    losses[int(float(row["step"]))] = float(row["train_loss"])
    return losses


def job_containers(p: PodLab, name: str) -> list[str]:
    """``node/container`` (pod sandboxes included) of job ``name``'s pods in either node's containerd
    (the kubelet's ``io.kubernetes.pod.name`` label), and ``node/task`` for any of them still running."""
    found = []
    for node in kubenodes.NODES:
        ids = p.nodes.ctr(node, "containers", "ls", "-q", f'labels."io.kubernetes.pod.name"~=^{name}-').split()
        tasks = set(p.nodes.ctr(node, "tasks", "ls", "-q").split())
        found += [f"{node.name}/container {i}" for i in ids] + [f"{node.name}/task {i}" for i in ids if i in tasks]
    return found


def _read_logs_while_running(p: PodLab, handle: str, replica: str, timeout: float = 300) -> subprocess.Popen[str]:
    """Poll ``jobgen logs [--replica R]`` until the container's output shows a training step,
    then open ``jobgen logs -f`` on it (returned): what a user does, and it keeps the kubelet's
    open log file through the lab's /var/log/pods quirk (module docstring)."""
    args = ("--replica", replica)

    def stepping() -> bool:
        out = cli(p, "logs", *args, handle)
        assert out.returncode == 0, out.stdout + out.stderr
        return "| train_loss" in out.stdout or "jobgen.train:" in out.stdout
    wait_for(stepping, timeout, 2.0, what=f"{replica}'s output through `jobgen logs`")
    return follow_logs(p, handle, *args)


def test_quickstart_trains_on_two_nodes_with_status_and_logs(pods: PodLab) -> None:
    started = time.monotonic()
    handle = submit(pods, "quickstart")
    followers = [_read_logs_while_running(pods, handle, "master-0")]
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
    print(f"pods: {phases}")
    # The containers' real output, read through the API server while the pods ran.
    assert f"done: quickstart at step {STEPS}/{STEPS} (fresh start)" in master_out, master_out[-3000:]
    assert f"step {STEPS}/{STEPS} | train_loss" in master_out and "over 2 rank(s)" in master_out
    # (Not checked: "restarted; attaching again". `jobgen logs -f --replica worker-0` says it when
    # the worker's container has exited 0 while the job is still RUNNING (the Master not done
    # yet): it takes any ended stream of an unfinished job for a restart. Seen in this test.)
    assert "Traceback" not in worker_out, worker_out[-3000:]
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
    assert _request(pods.lab, "GET", f"/api/v1/namespaces/{NS}/services?labelSelector=training.kubeflow.org/job-name%3Dqs-cancel")["items"] == []
    wait_for(lambda: not job_containers(pods, "qs-cancel"), 150, 1.0, what="no container, task or sandbox of the job on either node")
    print(f"containers (pause sandboxes included) and tasks gone from both nodes {time.monotonic() - started:.1f} s after the cancel")
    assert state(pods, handle)["state"] == "CANCELLED"


def test_killed_worker_restarts_and_resumes_with_the_uninterrupted_losses(pods: PodLab) -> None:
    reference = train_losses(pods.runs / "quickstart")
    if sorted(reference) != list(range(1, STEPS + 1)):
        pytest.skip("needs the uninterrupted run of test_quickstart_trains_on_two_nodes_with_status_and_logs")
    run_dir = pods.runs / "qs-kill"
    handle = submit(pods, "qs-kill")
    first_ckpt = run_dir / "checkpoints" / f"step-{EVERY:08d}.ckpt"
    wait_for(first_ckpt.is_file, 600, 0.2, what=f"the step {EVERY} checkpoint in the shared run directory")
    worker = next(pod for pod in job_pods(pods, "qs-kill") if pod["metadata"]["name"].endswith("-worker-0"))
    torchrun = task_pid(pods, worker)
    trainers = children(torchrun)
    assert len(trainers) == 1, (torchrun, trainers)
    cmdline = Path(f"/proc/{trainers[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "jobgen.train" in cmdline, cmdline
    os.kill(trainers[0], signal.SIGKILL)
    killed_at = time.monotonic()
    print(f"\nSIGKILLed pid {trainers[0]} ({cmdline.strip()}) in {worker['metadata']['name']} on {worker['spec']['nodeName']}")
    final = wait_state(pods, handle, {"COMPLETED", "FAILED"}, 900)
    print(f"qs-kill: {final['state']} {time.monotonic() - killed_at:.0f} s after the kill; {final['details']}")
    restarts = {pod["metadata"]["name"]: container_status(pod).get("restartCount") for pod in job_pods(pods, "qs-kill")}
    print(f"restart counts: {restarts}")
    assert final["state"] == "COMPLETED", final
    assert restarts["qs-kill-worker-0"] >= 1, restarts  # restarted in place by the kubelet (OnFailure), not a new pod
    losses = train_losses(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"summary: {json.dumps(summary)[:600]}")
    versions = sorted(run_dir.glob("logs/version_*"), key=lambda q: int(q.name.split("_")[1]))
    assert len(versions) >= 2, versions  # a second start logged: it resumed, it did not run once
    with open(versions[-1] / "metrics.csv", newline="") as f:
        first_step = min(int(float(row["step"])) for row in csv.DictReader(f) if row.get("train_loss"))
    assert first_step == EVERY + 1, first_step  # the last start began after the step-EVERY checkpoint, not at step 1
    after = [step for step in range(EVERY + 1, STEPS + 1)]
    assert [losses.get(s) for s in after] == [reference[s] for s in after], {s: (losses.get(s), reference[s]) for s in after}


def test_secret_env_reaches_the_container_and_no_rendered_file(pods: PodLab) -> None:
    handle = submit(pods, "qs-secret", "trainer.max_steps=5000")
    try:
        wait_for(lambda: [container_status(pod).get("state", {}).get("running") is not None
                          for pod in job_pods(pods, "qs-secret")] == [True, True], 300, 2.0, what="both training containers running")
        for pod in job_pods(pods, "qs-secret"):
            environ = Path(f"/proc/{task_pid(pods, pod)}/environ").read_bytes().split(b"\0")
            assert f"{SECRET_ENV}={pods.secret_value}".encode() in environ, pod["metadata"]["name"]
        job_dir = pods.work / "runs" / "qs-secret" / "job"
        rendered = [path for path in job_dir.rglob("*") if path.is_file()]
        assert rendered and not [path for path in rendered if pods.secret_value.encode() in path.read_bytes()]
        assert SECRET_NAME in (job_dir / "pytorchjob.yaml").read_text()  # by reference only
        for path in (f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/qs-secret", f"/api/v1/namespaces/{NS}/configmaps/qs-secret-config"):
            assert pods.secret_value not in json.dumps(_request(pods.lab, "GET", path)), path
    finally:
        gone = cli(pods, "cancel", handle, "--wait-s", "180")
        assert gone.returncode == 0, gone.stdout + gone.stderr
