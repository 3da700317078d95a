"""The pod lab the tests of jobgen on real pods share: the node lab (kubenodes.py) with
the training image built from this repository (kubeimage.py) imported on both nodes, the
emulated training-operator v1.9 (training_operator.py) running, and what jobgen needs there
(namespace, Secret, shared run directory, the ``k8s-lab`` profile), and the emulated Trainer v2
stack (trainer_controller.py, with the Trainer CRDs made for 1.20) for TrainJobs; plus the small
helpers the tests drive jobgen's CLI and read the pods with. conftest.py's ``pod_lab`` fixture
(the session's) is :func:`pod_lab`; its ``pods`` fixture hands it to a module and
:func:`delete_jobs` after it.

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
"""

from __future__ import annotations

import csv
import json
import os
import secrets
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
import trainer_controller  # noqa: E402
import training_operator  # noqa: E402
from kubelab import K8sLab, wait_for  # noqa: E402

from tests import phases  # noqa: E402
from tests.conftest import EXAMPLES, REPO  # noqa: E402

NS = "training"
CONTEXT = "jobgen-lab"
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
    trainjob_profile: Path  #: the same profile rendering TrainJobs (``kubernetes.job_api: trainjob``)
    timings: dict[str, float] = field(default_factory=dict)


def request(lab: K8sLab, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
    status, answer = lab.request(method, path, body)
    assert status in ok, (method, path, status, answer)
    return answer


def pod_lab(k8s_nodes: tuple[K8sLab, kubenodes.NodeLab], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodLab]:
    """The node lab with the training image imported on both nodes, namespace ``training``, a
    Secret, the shared run directory (hostPath PV + claim), the emulated operator as a process,
    the Trainer CRDs made for 1.20 with the emulated Trainer stack as a second process, and the
    ``k8s-lab`` profile (CPU, gloo, 1 process per pod, the local image, Never pull) with its
    TrainJob variant (a TrainJob cannot carry imagePullPolicy: its pods get IfNotPresent, which
    finds the imported image)."""
    lab, nodes = k8s_nodes
    timings: dict[str, float] = {}
    started = time.monotonic()
    with phases.waited("wait: training image"):
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
        request(lab, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    secret_value = secrets.token_hex(16)
    request(lab, "POST", f"/api/v1/namespaces/{NS}/secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET_NAME},
                                                              "stringData": {SECRET_KEY: secret_value}})
    runs = tmp_path_factory.mktemp("shared-runs")
    request(lab, "POST", "/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "jobgen-lab-runs"},
        "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                 "storageClassName": "", "hostPath": {"path": str(runs), "type": "Directory"}}})
    request(lab, "POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", {
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
    trainjob_profile = work / "k8s-lab-trainjob.yaml"
    trainjob_profile.write_text(yaml.safe_dump({"extends": str(profile), "kubernetes": {"job_api": "trainjob"}}))
    template = work / "init-container.yaml"
    template.write_text(INIT_TEMPLATE)
    with training_operator.operator_process(lab.kubeconfig, work / "operator.log", "--pytorch-init-container-image", kubenodes.BUSYBOX_IMAGE,
                                            "--pytorch-init-container-template-file", str(template), context=CONTEXT), \
            trainer_controller.lab_crds(lab, REPO / "jobgen" / "_crds"), \
            trainer_controller.controller_process(lab.kubeconfig, work / "trainer.log", context=CONTEXT):
        lab_state = PodLab(lab, nodes, work, runs, profile, secret_value, trainjob_profile, timings)
        try:
            yield lab_state
        finally:
            delete_jobs(lab_state)


def delete_jobs(p: PodLab) -> None:
    """Leave the lab as the node tests expect it (no pods): every job (PyTorchJob, TrainJob) of the
    namespace deleted with its pods, and no container of the namespace left on either node. The
    ``pods`` fixture calls it after each module."""
    for jobs in (f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs",
                 f"/apis/{trainer_controller.GROUP}/{trainer_controller.VERSION}/namespaces/{NS}/{trainer_controller.PLURAL}"):
        for job in request(p.lab, "GET", jobs)["items"]:
            request(p.lab, "DELETE", f"{jobs}/{job['metadata']['name']}", {"kind": "DeleteOptions", "apiVersion": "v1",
                                                                            "propagationPolicy": "Foreground"})
    wait_for(lambda: not request(p.lab, "GET", f"/api/v1/namespaces/{NS}/pods")["items"], 180, 1.0, what="the pods of the jobs deleted")
    wait_for(lambda: not any(p.nodes.ctr(node, "containers", "ls", "-q", f'labels."io.kubernetes.pod.namespace"=={NS}').split()
                             for node in kubenodes.NODES), 150, 1.0, what="their containers gone from both nodes")


def scale_workers(lab: K8sLab, name: str, replicas: int, namespace: str = NS) -> dict[str, Any]:
    """Set PyTorchJob ``name``'s Worker replicas through its scale subresource (the CRD maps
    ``spec.replicas`` to ``spec.pytorchReplicaSpecs.Worker.replicas``), as ``kubectl scale`` and
    an HPA do: read the Scale, write it back changed, again on a conflict (the operator writes the
    job's status in between). Returns the Scale the server stored."""
    path = f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}/scale"
    for _ in range(20):
        scale = request(lab, "GET", path)
        scale["spec"]["replicas"] = replicas
        status, answer = lab.request("PUT", path, scale)
        if status != 409:
            assert status == 200, (path, status, answer)
            return answer
        time.sleep(0.1)
    raise AssertionError(f"{path}: a conflict on each of 20 updates")


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


#: A mutation check of the pod tests (each test is seen failing when the rendered
#: container command or env is broken on purpose): ``JOBGEN_POD_MUTATION`` holds a JSON object
#: ``{job name: [[old, new], ...]}``, text replacements that :func:`submit` makes in that job's
#: rendered manifest (pytorchjob.yaml or trainjob.yaml; each must match), which it then submits
#: as a rendered job directory.
MUTATION_ENV = "JOBGEN_POD_MUTATION"


def submit(p: PodLab, name: str, *overrides: str, profile: Path | None = None) -> str:
    """``jobgen submit examples/quickstart.yaml`` with :data:`OVERRIDES`, ``overrides`` and
    ``name`` for ``profile`` (default: the PyTorchJob one); returns the handle. Under
    :data:`MUTATION_ENV`: render, break, submit the directory."""
    settings = [a for o in (f"name={name}", *OVERRIDES, *overrides) for a in ("--set", o)]
    profile = profile or p.profile
    mutation = json.loads(os.environ.get(MUTATION_ENV) or "{}").get(name)
    if mutation:
        out = cli(p, "render", str(EXAMPLES / "quickstart.yaml"), "-p", str(profile), "--out", str(p.work / "mutated"), "-o", "json", *settings)
        assert out.returncode == 0, out.stdout + out.stderr
        job_dir = p.work / json.loads(out.stdout)["jobs"][0]["job_dir"]  # relative to the CLI's cwd, or absolute
        manifest = next(job_dir / f for f in ("pytorchjob.yaml", "trainjob.yaml") if (job_dir / f).is_file())
        text = manifest.read_text()
        for old, new in mutation:
            assert old in text, f"{MUTATION_ENV}: {old!r} is not in {manifest}"
            text = text.replace(old, new)
        manifest.write_text(text)
        print(f"\nmutated {manifest}: {mutation}", file=sys.stderr)
        out = cli(p, "submit", str(manifest.parent))
    else:
        out = cli(p, "submit", str(EXAMPLES / "quickstart.yaml"), "-p", str(profile), *settings)
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
    answer = request(p.lab, "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=training.kubeflow.org/job-name%3D{name}")
    return sorted(answer["items"], key=lambda pod: pod["metadata"]["name"])


def container_status(pod: dict[str, Any], container: str = "pytorch") -> dict[str, Any]:
    """The status of the pod's training container: ``pytorch`` (PyTorchJob), ``node`` (TrainJob)."""
    return next((c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c["name"] == container), {})


def node_of(name: str) -> kubenodes.Node:
    return next(n for n in kubenodes.NODES if n.name == name)


def task_pid(p: PodLab, pod: dict[str, Any], container: str = "pytorch") -> int:
    """The host PID of the pod's training container's first process (torchrun), from its node's
    containerd (``ctr tasks ls``) by the container ID the kubelet reported."""
    container_id = container_status(pod, container)["containerID"].split("://", 1)[1]
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


#: Where torchrun's elastic agent logs its own records from (``E1129 08:14:26.635000 1 <path>:<line>] ...``).
AGENT_RECORD = "torch/distributed/elastic/agent/server/api.py:"


def without_exit_barrier_race(output: str) -> str:
    """``output`` of a node's container without torchrun's agent's records after "Error waiting
    on exit barrier". After every worker of every node succeeded, the agents meet at an exit
    barrier held in the store of node 0's agent; that agent may leave as soon as the barrier
    opens, and an agent still reading the barrier's key then logs a traceback
    (DistNetworkError). The job and the container still succeed (exit 0). Every other line, the
    ranks' own tracebacks included, is kept."""
    kept, in_race = [], False
    for line in output.splitlines(keepends=True):
        if AGENT_RECORD in line:
            in_race = in_race or "Error waiting on exit barrier" in line
            if in_race:
                continue
        else:
            in_race = False
        kept.append(line)
    return "".join(kept)


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


def read_logs_while_running(p: PodLab, handle: str, replica: str, timeout: float = 300) -> subprocess.Popen[str]:
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
