"""The emulated training-operator (tests/integration/k8s/training_operator.py, v1.9's PyTorchJob
controller) run as a process against the API-server lab (real etcd, kube-apiserver 1.20 and
garbage collector), on PyTorchJobs jobgen rendered: the pods and Services it creates, the
environment it injects, restart policies and backoffLimit, the status it writes, and what
`jobgen status` makes of that and of the pods' own phases.

The lab has no kubelet, so no pod ever runs: here the kubelet is emulated by writing each pod's
status through the real API server's /status subresource (:func:`kubelet`: phase, and the
``pytorch`` container's restartCount, or its terminated exitCode), as a kubelet reports it. Only
that report and the operator are emulated; the objects, ownership and cascading deletion are
the real server's and garbage collector's."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from jobgen.backends import plan
from jobgen.backends.kubernetes import manifest as k8s_manifest
from jobgen.specs.load import load_profile, load_spec
from tests.conftest import REPO, TEMPLATES
from tests.integration.k8s import training_operator as op
from tests.integration.k8s.emulation import NS, cli, jobgen_state, wait_for
from tests.integration.k8s.podlab import scale_workers

pytestmark = pytest.mark.k8s_lab
ELASTIC_SPEC = REPO / "tests" / "golden" / "specs" / "elastic-fsdp.yaml"


@pytest.fixture(scope="module")
def operator(k8s_lab, tmp_path_factory) -> Iterator[Path]:
    """``python tests/integration/k8s/training_operator.py`` watching the lab for this module's tests
    (not the session's: the other lab tests expect no controller); yields its log."""
    log_path = tmp_path_factory.mktemp("operator") / "operator.log"
    with op.operator_process(k8s_lab.kubeconfig, log_path):
        yield log_path


def _cpu_profile(tmp_path: Path) -> Path:
    """The shipped k8s-a100 profile with CPU pods of 2 processes each (what test_rank_semantics runs)."""
    path = tmp_path / "k8s-cpu-sim.yaml"
    path.write_text(yaml.safe_dump({
        "extends": str(REPO / "cluster_profiles" / "k8s-a100.yaml"),
        "gpus_per_node": 0, "gpu_type": None, "cpu_processes_per_node": 2, "cpus_per_node": 2, "mem_gib_per_node": 8,
        "network_fabric": "tcp", "kubernetes": {"shm_size_gib": 1, "python": sys.executable, "rdma_resource": None},
    }))
    return path


def render(tmp_path: Path, name: str, **resources: Any) -> tuple[Path, dict[str, Any]]:
    """A 2-pod (Master + 1 Worker) x 2-process job ``name`` rendered by jobgen (further
    ``resources`` fields: ``resources``): its job directory and its PyTorchJob."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
        "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 4, "max_steps": 6, "warmup_steps": 1},
        "resources": {"nodes": 2, "devices_per_node": 2, **resources},
    }))
    job_plan = plan(load_spec(spec), load_profile(str(_cpu_profile(tmp_path))), TEMPLATES)
    job_dir = tmp_path / name
    job_plan.write(job_dir)
    return job_dir, k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")[1]


def create(lab, job: dict[str, Any]) -> dict[str, Any]:
    status, answer = lab.request("POST", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs", job)
    assert status == 201, answer
    return answer


def get_job(lab, name: str) -> dict[str, Any]:
    status, job = lab.request("GET", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/{name}")
    assert status == 200, job
    return job


def get(lab, kind: str, name: str) -> dict[str, Any] | None:
    status, obj = lab.request("GET", f"/api/v1/namespaces/{NS}/{kind}/{name}")
    return obj if status == 200 else None


def conditions(job: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c["reason"]) for c in (job.get("status") or {}).get("conditions") or []]


def condition(lab, name: str, ctype: str) -> dict[str, Any] | None:
    return next((c for c in (get_job(lab, name).get("status") or {}).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


def kubelet(lab, pod_name: str, phase: str, *, exit_code: int | None = None, restarts: int = 0) -> str:
    """Report pod ``pod_name`` as its kubelet would: ``phase``, and the ``pytorch`` container
    running (``exit_code`` None) or terminated with ``exit_code``, after ``restarts`` restarts.
    Written through the /status subresource; returns the pod's uid."""
    pod = wait_for(lambda: get(lab, "pods", pod_name), f"pod {pod_name}")
    at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if exit_code is None:
        state = {"running": {"startedAt": at}}
    else:
        state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt": at, "finishedAt": at}}
    container = pod["spec"]["containers"][0]
    pod["status"] = {"phase": phase, "startTime": at, "containerStatuses": [{
        "name": container["name"], "ready": phase == "Running" and exit_code is None, "restartCount": restarts,
        "image": container["image"], "imageID": "", "state": state}]}
    status, answer = lab.request("PUT", f"/api/v1/namespaces/{NS}/pods/{pod_name}/status", pod)
    assert status == 200, answer
    return pod["metadata"]["uid"]


def pods_of(lab, name: str) -> dict[str, dict[str, Any]]:
    _, listed = lab.request("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={op.JOB_NAME_LABEL}%3D{name}")
    return {p["metadata"]["name"]: p for p in listed.get("items") or []}


def services_of(lab, name: str) -> dict[str, dict[str, Any]]:
    _, listed = lab.request("GET", f"/api/v1/namespaces/{NS}/services?labelSelector={op.JOB_NAME_LABEL}%3D{name}")
    return {s["metadata"]["name"]: s for s in listed.get("items") or []}


class History:
    """Every version of job ``name``'s conditions the API server's watch delivers, as the list of
    ``(type, status)`` of each version, consecutive duplicates dropped (a transient condition,
    e.g. Restarting while the Master runs, lasts one operator pass: polling would miss it)."""

    def __init__(self, lab, name: str):
        from kubernetes import client, config, watch

        self.versions: list[tuple[tuple[str, str], ...]] = []
        self.error: Exception | None = None
        self._watch = watch.Watch()
        custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(lab.kubeconfig), context="jobgen-lab"))
        stream = self._watch.stream(custom.list_namespaced_custom_object, "kubeflow.org", "v1", NS, "pytorchjobs",
                                    field_selector=f"metadata.name={name}", timeout_seconds=300)
        self._thread = threading.Thread(target=self._record, args=(stream,), daemon=True)
        self._thread.start()

    def _record(self, stream: Iterator[dict[str, Any]]) -> None:
        try:
            for event in stream:
                version = tuple((c["type"], c["status"]) for c in (event["object"].get("status") or {}).get("conditions") or [])
                if not self.versions or self.versions[-1] != version:
                    self.versions.append(version)
        except Exception as exc:  # the connection closed under stop(): kept, for a message
            self.error = exc

    def entered(self, ctype: str) -> int:
        """How many times condition ``ctype`` turned True."""
        states = [(ctype, "True") in v for v in self.versions]
        return sum(1 for before, after in zip([False, *states[:-1]], states, strict=True) if after and not before)

    def stop(self) -> None:
        self._watch.stop()


def delete_job(lab, name: str) -> None:
    lab.request("DELETE", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/{name}")
    wait_for(lambda: not pods_of(lab, name) and not services_of(lab, name), f"the garbage collector to remove {name}'s pods and services")


def test_pods_services_and_env_of_a_two_pod_two_process_job(k8s_lab, operator, tmp_path):
    """`jobgen submit` of a Master + 1 Worker x 2-process job: the operator creates
    ``<job>-master-0`` and ``<job>-worker-0`` from the templates, with v1.9's labels, controller
    owner reference, restart policy, the Worker's init-pytorch container, and the environment
    v1.9 appends after the template's; a headless Service of the same name per pod; Created."""
    job_dir, rendered = render(tmp_path, "op-env")
    out = cli(k8s_lab, tmp_path, "submit", str(job_dir))
    assert out.returncode == 0 and f"created k8s://jobgen-lab/{NS}/op-env" in out.stdout, out.stdout + out.stderr
    try:
        job = get_job(k8s_lab, "op-env")
        pods = wait_for(lambda: (p := pods_of(k8s_lab, "op-env")) and len(p) == 2 and p, "two pods")
        assert sorted(pods) == ["op-env-master-0", "op-env-worker-0"]
        expected_env = {
            "master": {"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "op-env-master-0",
                       "PET_MASTER_ADDR": "op-env-master-0", "WORLD_SIZE": "4", "RANK": "0", "PET_NODE_RANK": "0",
                       "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2"},
            "worker": {"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "op-env-master-0",
                       "PET_MASTER_ADDR": "op-env-master-0", "WORLD_SIZE": "4", "RANK": "1", "PET_NODE_RANK": "1",
                       "PET_NPROC_PER_NODE": "2", "PET_NNODES": "2"},
        }
        for role in ("master", "worker"):
            pod = pods[f"op-env-{role}-0"]
            template = rendered["spec"]["pytorchReplicaSpecs"][role.capitalize()]["template"]
            labels = pod["metadata"]["labels"]
            assert labels == {**template["metadata"]["labels"], op.JOB_NAME_LABEL: "op-env", op.OPERATOR_NAME_LABEL: "pytorchjob-controller",
                              op.REPLICA_TYPE_LABEL: role, op.REPLICA_INDEX_LABEL: "0",
                              **({op.JOB_ROLE_LABEL: "master"} if role == "master" else {})}
            assert pod["metadata"]["ownerReferences"] == [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "op-env",
                                                           "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
            assert pod["spec"]["restartPolicy"] == "Never"  # jobgen's replicas restart ExitCode: v1.9 gives their pods Never
            container = pod["spec"]["containers"][0]
            template_env = template["spec"]["containers"][0]["env"]
            assert container["env"][:len(template_env)] == template_env  # the template's first, the operator's appended
            injected = container["env"][len(template_env):]
            assert [e["name"] for e in injected] == list(expected_env[role])
            assert {e["name"]: e["value"] for e in injected} == expected_env[role]
            assert op.operator_env(rendered, role, 0) == expected_env[role]  # what test_rank_semantics runs with
            # the rendered command reads the operator's variables the kubelet expands
            assert "--master-addr=$(MASTER_ADDR)" in container["command"] and "--master-port=$(MASTER_PORT)" in container["command"]
            init = [c["name"] for c in pod["spec"].get("initContainers") or []]
            assert init == (["init-pytorch"] if role == "worker" else [])
        init_script = pods["op-env-worker-0"]["spec"]["initContainers"][0]["command"][2]
        assert "nslookup op-env-master-0" in init_script and "seq 100" in init_script

        services = wait_for(lambda: (s := services_of(k8s_lab, "op-env")) and len(s) == 2 and s, "two services")
        for role in ("master", "worker"):
            svc = services[f"op-env-{role}-0"]
            assert svc["spec"]["clusterIP"] == "None"
            assert svc["spec"]["selector"] == {op.JOB_NAME_LABEL: "op-env", op.OPERATOR_NAME_LABEL: "pytorchjob-controller",
                                               op.REPLICA_TYPE_LABEL: role, op.REPLICA_INDEX_LABEL: "0"}
            assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [("pytorchjob-port", 23456)]
            assert svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        # MASTER_ADDR names the Master's Service, which selects exactly the Master pod
        master_labels = pods["op-env-master-0"]["metadata"]["labels"]
        assert all(master_labels.get(k) == v for k, v in services["op-env-master-0"]["spec"]["selector"].items())

        job = wait_for(lambda: (j := get_job(k8s_lab, "op-env")).get("status", {}).get("startTime") and j, "the job's status")
        assert conditions(job) == [("Created", "True", "PyTorchJobCreated")]
        assert job["status"]["conditions"][0]["message"] == "PyTorchJob op-env is created."
        assert job["status"]["replicaStatuses"]["Master"]["selector"] == (
            "training.kubeflow.org/job-name=op-env,training.kubeflow.org/operator-name=pytorchjob-controller,"
            "training.kubeflow.org/replica-type=master")
        assert jobgen_state(k8s_lab, tmp_path, "op-env")["state"] == "CREATED"
    finally:
        delete_job(k8s_lab, "op-env")


def test_master_success_completes_the_job_and_deletion_cascades(k8s_lab, operator, tmp_path):
    """Created -> Running (the Master runs) -> Succeeded when the Master exits 0 (v1.9's success
    policy with a Master: the Worker's state does not matter); `jobgen status` says RUNNING, then
    COMPLETED; cleanPodPolicy None (jobgen's) keeps the pods; `jobgen cancel` deletes the job and
    the garbage collector its pods and Services."""
    job_dir, _ = render(tmp_path, "op-ok")
    assert cli(k8s_lab, tmp_path, "submit", str(job_dir)).returncode == 0
    for role in ("master", "worker"):
        kubelet(k8s_lab, f"op-ok-{role}-0", "Running")
    wait_for(lambda: condition(k8s_lab, "op-ok", "Running"), "Running")
    wait_for(lambda: all(c.get("active") == 1 for c in get_job(k8s_lab, "op-ok")["status"]["replicaStatuses"].values()),
             "Master and Worker active")
    running = jobgen_state(k8s_lab, tmp_path, "op-ok")
    assert running["state"] == "RUNNING" and running["details"]["master"] == "active 1 succeeded 0 failed 0", running
    assert running["details"]["pods"] == "master-0 Running; worker-0 Running", running  # the pods' own phases
    # jobgen finds the operator's pods by its labels and their pytorch containers: 2 pods x 2 requested CPUs
    assert (running["usage"]["device_kind"], running["usage"]["devices"], running["usage"]["end"]) == ("cpu", 4, None), running

    kubelet(k8s_lab, "op-ok-master-0", "Succeeded", exit_code=0)
    wait_for(lambda: condition(k8s_lab, "op-ok", "Succeeded"), "Succeeded")
    job = wait_for(lambda: (j := get_job(k8s_lab, "op-ok"))["status"]["replicaStatuses"]["Worker"].get("succeeded") and j,
                   "the finished job's active Worker counted as succeeded")
    assert conditions(job) == [("Created", "True", "PyTorchJobCreated"), ("Running", "False", "PyTorchJobRunning"),
                               ("Succeeded", "True", "PyTorchJobSucceeded")]
    assert job["status"]["conditions"][-1]["message"] == "PyTorchJob op-ok is successfully completed."
    assert job["status"]["completionTime"] and job["status"]["startTime"]
    assert {k: v for k, v in job["status"]["replicaStatuses"]["Master"].items() if k != "selector"} == {"succeeded": 1}
    done = jobgen_state(k8s_lab, tmp_path, "op-ok")
    assert done["state"] == "COMPLETED" and done["details"]["condition"] == "Succeeded", done
    assert done["details"]["pods"] == "master-0 Succeeded (exit 0); worker-0 Running", done
    assert sorted(pods_of(k8s_lab, "op-ok")) == ["op-ok-master-0", "op-ok-worker-0"]  # cleanPodPolicy None

    gone = cli(k8s_lab, tmp_path, "cancel", f"k8s://jobgen-lab/{NS}/op-ok", "--wait-s", "60")
    assert gone.returncode == 0 and "DELETED" in gone.stdout, gone.stdout + gone.stderr
    wait_for(lambda: not pods_of(k8s_lab, "op-ok") and not services_of(k8s_lab, "op-ok"), "pods and services gone")
    assert jobgen_state(k8s_lab, tmp_path, "op-ok")["state"] == "CANCELLED"


def test_on_failure_recreates_a_failed_pod_and_restarts_count_against_backoff_limit(k8s_lab, operator, tmp_path):
    """Replicas that restart OnFailure with runPolicy.backoffLimit 3 (set here: jobgen renders
    ExitCode, tested below). A pod that fails as a
    whole (phase Failed, e.g. evicted) is deleted and created again (a new uid) and the job is
    Restarting (`jobgen status` RESTARTING); the kubelet's in-place restarts (restartCount of
    Running pods) count against backoffLimit: at 3 the job is Failed, its pods and Services
    deleted (`jobgen status` FAILED)."""
    _, job = render(tmp_path, "op-backoff")
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"ExitCode"}
    create(k8s_lab, _with_policy(job, "OnFailure", backoff_limit=3))
    try:
        # the Master still Pending: nothing turns Restarting back into Running, so jobgen sees it
        first = kubelet(k8s_lab, "op-backoff-worker-0", "Failed", exit_code=1)
        restarting = wait_for(lambda: condition(k8s_lab, "op-backoff", "Restarting"), "Restarting")
        assert (restarting["reason"], restarting["message"]) == ("PyTorchJobRestarting",
                                                                 "job op-backoff is restarting because Worker replica(s) failed.")
        wait_for(lambda: (p := get(k8s_lab, "pods", "op-backoff-worker-0")) and p["metadata"]["uid"] != first, "worker-0 created again")
        state = jobgen_state(k8s_lab, tmp_path, "op-backoff")
        assert state["state"] == "RESTARTING", state
        assert state["details"]["pods"] == "master-0 Pending; worker-0 Pending", state  # the recreated pod: no kubelet report yet

        kubelet(k8s_lab, "op-backoff-worker-0", "Running")
        kubelet(k8s_lab, "op-backoff-master-0", "Running", restarts=2)
        running = wait_for(lambda: condition(k8s_lab, "op-backoff", "Running"), "Running")
        assert "Restarting" not in [c[0] for c in conditions(get_job(k8s_lab, "op-backoff"))]  # Running replaced it
        assert running["message"] == "PyTorchJob op-backoff is running."
        assert jobgen_state(k8s_lab, tmp_path, "op-backoff")["details"]["pods"] == "master-0 Running (restarts 2); worker-0 Running"
        kubelet(k8s_lab, "op-backoff-worker-0", "Running", restarts=1)  # 3 restarts in all
        failed = wait_for(lambda: condition(k8s_lab, "op-backoff", "Failed"), "Failed")
        assert failed["reason"] == "PyTorchJobFailed"
        assert failed["message"] == "Job op-backoff has failed because it has reached the specified backoff limit"
        wait_for(lambda: not pods_of(k8s_lab, "op-backoff") and not services_of(k8s_lab, "op-backoff"), "pods and services deleted")
        job = get_job(k8s_lab, "op-backoff")
        assert ("Running", "False", "PyTorchJobRunning") in conditions(job) and job["status"]["completionTime"]
        state = jobgen_state(k8s_lab, tmp_path, "op-backoff")
        assert state["state"] == "FAILED" and "backoff limit" in state["details"]["message"], state
    finally:
        delete_job(k8s_lab, "op-backoff")


def _with_policy(job: dict[str, Any], policy: str, backoff_limit: int | None = None) -> dict[str, Any]:
    """jobgen's job with every replica's restartPolicy set to ``policy`` (jobgen renders ExitCode only)."""
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["restartPolicy"] = policy
    if backoff_limit is not None:
        job["spec"]["runPolicy"]["backoffLimit"] = backoff_limit
    return job


def test_exit_code_policy_retries_128_and_up_and_fails_on_1_to_127(k8s_lab, operator, tmp_path):
    """restartPolicy ExitCode: the pods get restartPolicy Never; exit code 137 (>= 128, e.g.
    SIGKILL) deletes and recreates the pod (Restarting), twice, although backoffLimit is 1 (v1.9
    counts no recreations: its work queue never counts requeues); exit code 1 fails the job with
    v1.9's ExitCode message and, as in v1.9, no completionTime; the finished job keeps its pods."""
    _, job = render(tmp_path, "op-exit")
    create(k8s_lab, _with_policy(job, "ExitCode", backoff_limit=1))
    history = History(k8s_lab, "op-exit")
    try:
        pods = wait_for(lambda: (p := pods_of(k8s_lab, "op-exit")) and len(p) == 2 and p, "two pods")
        assert {p["spec"]["restartPolicy"] for p in pods.values()} == {"Never"}
        kubelet(k8s_lab, "op-exit-master-0", "Running")
        wait_for(lambda: condition(k8s_lab, "op-exit", "Running"), "Running")
        for attempt in range(2):
            uid = kubelet(k8s_lab, "op-exit-worker-0", "Failed", exit_code=137)
            wait_for(lambda u=uid: (p := get(k8s_lab, "pods", "op-exit-worker-0")) and p["metadata"]["uid"] != u,
                     f"worker-0 recreated (retryable exit {attempt + 1})")
        # each time: Restarting for one pass (ReconcilePods' message), then Running again (the Master runs)
        wait_for(lambda: history.entered("Restarting") == 2 and history.versions[-1] == (("Created", "True"), ("Running", "True")),
                 "Restarting twice, Running after each", timeout=10)
        kubelet(k8s_lab, "op-exit-worker-0", "Running")
        wait_for(lambda: condition(k8s_lab, "op-exit", "Running"), "Running")
        kubelet(k8s_lab, "op-exit-master-0", "Failed", exit_code=1)
        failed = wait_for(lambda: condition(k8s_lab, "op-exit", "Failed"), "Failed")
        assert (failed["reason"], failed["message"]) == ("PyTorchJobFailed", 'job "op-exit" is failing because "Master" replica(s) failed.')
        job = get_job(k8s_lab, "op-exit")
        assert "completionTime" not in job["status"]
        assert sorted(pods_of(k8s_lab, "op-exit")) == ["op-exit-master-0", "op-exit-worker-0"]
        assert jobgen_state(k8s_lab, tmp_path, "op-exit")["state"] == "FAILED"
        assert history.versions[-1] == (("Created", "True"), ("Running", "False"), ("Failed", "True")), history.versions
    finally:
        history.stop()
        delete_job(k8s_lab, "op-exit")


def test_exit_code_retry_with_backoff_limit_0_fails_the_job(k8s_lab, operator, tmp_path):
    """backoffLimit 0: the first retryable failure (a new failed pod while not all are active)
    fails the job at once, and its pods and Services are deleted."""
    _, job = render(tmp_path, "op-exit0")
    create(k8s_lab, _with_policy(job, "ExitCode", backoff_limit=0))
    try:
        kubelet(k8s_lab, "op-exit0-master-0", "Running")
        kubelet(k8s_lab, "op-exit0-worker-0", "Failed", exit_code=143)
        failed = wait_for(lambda: condition(k8s_lab, "op-exit0", "Failed"), "Failed")
        assert failed["message"] == "Job op-exit0 has failed because it has reached the specified backoff limit"
        wait_for(lambda: not pods_of(k8s_lab, "op-exit0") and not services_of(k8s_lab, "op-exit0"), "pods and services deleted")
    finally:
        delete_job(k8s_lab, "op-exit0")


def test_never_policy_fails_the_job_on_the_first_failure(k8s_lab, operator, tmp_path):
    """restartPolicy Never: a Worker that fails fails the job (v1.9's UpdateJobStatus message,
    completionTime set), `jobgen status` FAILED with that message; nothing is recreated."""
    _, job = render(tmp_path, "op-never")
    create(k8s_lab, _with_policy(job, "Never", backoff_limit=3))  # a backoffLimit of 0 would fail it by the limit first
    try:
        kubelet(k8s_lab, "op-never-master-0", "Running")
        uid = kubelet(k8s_lab, "op-never-worker-0", "Failed", exit_code=1)
        failed = wait_for(lambda: condition(k8s_lab, "op-never", "Failed"), "Failed")
        assert failed["message"] == "PyTorchJob op-never is failed because 1 Worker replica(s) failed."
        job = get_job(k8s_lab, "op-never")
        assert job["status"]["completionTime"] and job["status"]["replicaStatuses"]["Worker"]["failed"] == 1
        assert conditions(job) == [("Created", "True", "PyTorchJobCreated"), ("Running", "False", "PyTorchJobRunning"),
                                   ("Failed", "True", "PyTorchJobFailed")]
        assert get(k8s_lab, "pods", "op-never-worker-0")["metadata"]["uid"] == uid
        state = jobgen_state(k8s_lab, tmp_path, "op-never")
        assert state["state"] == "FAILED" and "1 Worker replica(s) failed" in state["details"]["message"], state
    finally:
        delete_job(k8s_lab, "op-never")


def test_elastic_job_env_and_success_when_one_worker_succeeds(k8s_lab, operator, tmp_path):
    """jobgen's elastic job (Worker replicas 4, elasticPolicy 2:4, c10d, maxRestarts 3, no
    Master): no MASTER_* / WORLD_SIZE / RANK and no init container; the rendezvous variables
    (endpoint on worker-0's Service and the Worker's port); worker-0 carries job-role=master; the
    job succeeds as soon as one Worker succeeds (v1.9's elastic success policy)."""
    job_plan = plan(load_spec(ELASTIC_SPEC, ["name=op-elastic"]), load_profile("k8s-h100", REPO / "cluster_profiles"), TEMPLATES)
    job = k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")[1]
    create(k8s_lab, job)
    try:
        pods = wait_for(lambda: (p := pods_of(k8s_lab, "op-elastic")) and len(p) == 4 and p, "four pods")
        template_env = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].get("env") or []
        for index in range(4):
            pod = pods[f"op-elastic-worker-{index}"]
            injected = pod["spec"]["containers"][0]["env"][len(template_env):]
            assert [(e["name"], e["value"]) for e in injected] == [
                ("PYTHONUNBUFFERED", "1"), ("PET_NPROC_PER_NODE", "8"), ("PET_RDZV_ENDPOINT", "op-elastic-worker-0:23456"),
                ("PET_RDZV_BACKEND", "c10d"), ("PET_NNODES", "2:4"), ("PET_MAX_RESTARTS", "3")]
            assert not pod["spec"].get("initContainers")
            assert (pod["metadata"]["labels"].get(op.JOB_ROLE_LABEL) == "master") == (index == 0)
        command = pods["op-elastic-worker-1"]["spec"]["containers"][0]["command"]
        assert "--rdzv-endpoint=$(PET_RDZV_ENDPOINT)" in command and "--nnodes=2:4" in command
        assert len(services_of(k8s_lab, "op-elastic")) == 4 or wait_for(lambda: len(services_of(k8s_lab, "op-elastic")) == 4, "services")
        for index in range(4):
            kubelet(k8s_lab, f"op-elastic-worker-{index}", "Running")
        running = wait_for(lambda: condition(k8s_lab, "op-elastic", "Running"), "Running")
        assert running["message"] == f"PyTorchJob {NS}/op-elastic is running."
        kubelet(k8s_lab, "op-elastic-worker-2", "Succeeded", exit_code=0)
        done = wait_for(lambda: condition(k8s_lab, "op-elastic", "Succeeded"), "Succeeded")
        assert done["message"] == f"PyTorchJob {NS}/op-elastic successfully completed."
    finally:
        delete_job(k8s_lab, "op-elastic")


def test_elastic_job_scaled_down_loses_its_highest_workers_and_keeps_running(k8s_lab, operator, tmp_path):
    """A replica decrease through the PyTorchJob's scale subresource (what ``kubectl scale`` and
    the HPA of elasticPolicy.metrics do: the CRD maps it to spec.pytorchReplicaSpecs.Worker.replicas)
    makes v1.9 delete the pods and Services whose index is out of range and nothing else
    (common/pod.go ``ReconcilePods``, service.go ``ReconcileServices``: "index >= numReplicas,
    kill the pod"): jobgen's elastic job 2:4 scaled from 4 to 2 keeps worker-0 (the rendezvous
    host) and worker-1 untouched, environment included (PET_NNODES stays ``2:4``: torchrun re-forms
    its rendezvous within the range), and stays Running, neither Restarting nor Failed."""
    job_plan = plan(load_spec(ELASTIC_SPEC, ["name=op-scale"]), load_profile("k8s-h100", REPO / "cluster_profiles"), TEMPLATES)
    create(k8s_lab, k8s_manifest.parse_manifest(job_plan.file("pytorchjob.yaml"), "pytorchjob.yaml")[1])
    try:
        before = wait_for(lambda: (p := pods_of(k8s_lab, "op-scale")) and len(p) == 4 and p, "four pods")
        wait_for(lambda: len(services_of(k8s_lab, "op-scale")) == 4, "four services")
        for index in range(4):
            kubelet(k8s_lab, f"op-scale-worker-{index}", "Running")
        wait_for(lambda: condition(k8s_lab, "op-scale", "Running"), "Running")
        scale = scale_workers(k8s_lab, "op-scale", 2)  # the HPA's update of the scale subresource
        assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 2, scale
        assert get_job(k8s_lab, "op-scale")["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        wait_for(lambda: sorted(pods_of(k8s_lab, "op-scale")) == ["op-scale-worker-0", "op-scale-worker-1"], "workers 2 and 3 deleted")
        wait_for(lambda: sorted(services_of(k8s_lab, "op-scale")) == ["op-scale-worker-0", "op-scale-worker-1"], "their services deleted")
        after = pods_of(k8s_lab, "op-scale")
        for name in after:  # the same pods (not recreated), with the environment they started with
            assert after[name]["metadata"]["uid"] == before[name]["metadata"]["uid"], name
            env = {e["name"]: e.get("value") for e in after[name]["spec"]["containers"][0]["env"]}
            assert env["PET_NNODES"] == "2:4" and env["PET_RDZV_ENDPOINT"] == "op-scale-worker-0:23456", env
        time.sleep(1.0)  # a few operator passes
        job = get_job(k8s_lab, "op-scale")
        assert [c[:2] for c in conditions(job)] == [("Created", "True"), ("Running", "True")], conditions(job)
        assert job["status"]["replicaStatuses"]["Worker"]["active"] == 2, job["status"]
        kubelet(k8s_lab, "op-scale-worker-0", "Succeeded", exit_code=0)
        wait_for(lambda: condition(k8s_lab, "op-scale", "Succeeded"), "Succeeded")
    finally:
        delete_job(k8s_lab, "op-scale")


def test_active_deadline_fails_the_job_and_ttl_deletes_it(k8s_lab, operator, tmp_path):
    """jobgen renders resources.time_limit_min as runPolicy.activeDeadlineSeconds (and the
    profile's ttl_seconds_after_finished as ttlSecondsAfterFinished); here shortened to 2 s and
    1 s: the running job fails "active longer than specified deadline" (its pods and Services
    deleted), and 1 s after its completionTime the operator deletes the job itself."""
    _, job = render(tmp_path, "op-deadline", time_limit_min=1)
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 60
    job["spec"]["runPolicy"].update(activeDeadlineSeconds=2, ttlSecondsAfterFinished=1)
    history = History(k8s_lab, "op-deadline")  # before create: it sees every version (the job is deleted at the end)
    create(k8s_lab, job)
    try:
        kubelet(k8s_lab, "op-deadline-master-0", "Running")
        wait_for(lambda: k8s_lab.request("GET", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/op-deadline")[0] == 404,
                 "the job failed and deleted after its TTL", timeout=20)
        wait_for(lambda: not pods_of(k8s_lab, "op-deadline") and not services_of(k8s_lab, "op-deadline"), "pods and services gone")
        assert history.versions[-1] == (("Created", "True"), ("Running", "False"), ("Failed", "True")), history.versions
        assert history.entered("Running") == 1
    finally:
        history.stop()
        delete_job(k8s_lab, "op-deadline")


def test_suspended_job_has_no_pods_until_resumed(k8s_lab, operator, tmp_path):
    """runPolicy.suspend: no pods, Suspended (`jobgen status` SUSPENDED); resumed: the pods are
    created and Suspended turns False with reason PyTorchJobResumed."""
    _, job = render(tmp_path, "op-suspend")
    job["spec"]["runPolicy"]["suspend"] = True
    create(k8s_lab, job)
    try:
        suspended = wait_for(lambda: condition(k8s_lab, "op-suspend", "Suspended"), "Suspended")
        assert (suspended["reason"], suspended["message"]) == ("PyTorchJobSuspended", "PyTorchJob op-suspend is suspended.")
        assert not pods_of(k8s_lab, "op-suspend")
        assert jobgen_state(k8s_lab, tmp_path, "op-suspend")["state"] == "SUSPENDED"
        stored = get_job(k8s_lab, "op-suspend")
        stored["spec"]["runPolicy"]["suspend"] = False
        status, answer = k8s_lab.request("PUT", f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs/op-suspend", stored)
        assert status == 200, answer
        wait_for(lambda: len(pods_of(k8s_lab, "op-suspend")) == 2, "pods after resuming")
        resumed = wait_for(lambda: next((c for c in get_job(k8s_lab, "op-suspend")["status"]["conditions"]
                                         if c["type"] == "Suspended" and c["status"] == "False"), None), "Suspended False")
        assert (resumed["reason"], resumed["message"]) == ("PyTorchJobResumed", "PyTorchJob op-suspend is resumed.")
        assert jobgen_state(k8s_lab, tmp_path, "op-suspend")["state"] == "CREATED"
    finally:
        delete_job(k8s_lab, "op-suspend")


def test_elastic_env_of_every_policy_field_and_the_init_container_template():
    """The parts of elastic.go a jobgen job leaves out (no server needed): rdzvHost/rdzvPort
    replace the endpoint, rdzvId, rdzvConf as ``k=v,k=v``, standalone as an empty value, and the
    policy's nProcPerNode appended after spec.nprocPerNode (the later one is what a process sees);
    minReplicas alone sets maxReplicas too (the defaults). And v1.9's
    --pytorch-init-container-template-file: ``[]`` adds no init container."""
    worker = {"replicas": 2, "template": {"spec": {"containers": [{"name": "pytorch", "image": "i"}]}}}
    job = {"metadata": {"name": "el", "namespace": NS}, "spec": {
        "nprocPerNode": "4", "pytorchReplicaSpecs": {"Worker": worker},
        "elasticPolicy": {"minReplicas": 2, "rdzvHost": "rdzv.example", "rdzvPort": 29400, "rdzvId": "abc", "nProcPerNode": 2,
                          "rdzvConf": [{"key": "timeout", "value": "60"}, {"key": "join_timeout", "value": "5"}], "standalone": True}}}
    injected = op.injected_env(op.defaulted(job), "Worker", 1)
    assert [(e["name"], e["value"]) for e in injected] == [
        ("PYTHONUNBUFFERED", "1"), ("PET_NPROC_PER_NODE", "4"), ("PET_RDZV_ENDPOINT", "rdzv.example:29400"), ("PET_RDZV_BACKEND", "c10d"),
        ("PET_NNODES", "2:2"), ("PET_NPROC_PER_NODE", "2"), ("PET_RDZV_ID", "abc"), ("PET_RDZV_CONF", "timeout=60,join_timeout=5"),
        ("PET_STANDALONE", "")]
    assert op.operator_env(job, "Worker", 1)["PET_NPROC_PER_NODE"] == "2"
    with_master = op.defaulted({"metadata": {"name": "m", "namespace": NS, "uid": "u"}, "spec": {"pytorchReplicaSpecs": {
        "Master": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i"}]}}}, "Worker": worker}}})
    assert op.desired_pod(with_master, "Worker", 0)["spec"]["initContainers"][0]["name"] == "init-pytorch"
    assert "initContainers" not in op.desired_pod(with_master, "Worker", 0, init_template="[]")["spec"]
    custom = "- name: wait\n  image: {{.InitContainerImage}}\n  command: [getent, hosts, {{.MasterAddr}}]\n"
    assert op.init_containers(with_master, "Worker", image="busybox", template=custom) == [
        {"name": "wait", "image": "busybox", "command": ["getent", "hosts", "m-master-0"]}]
    # the defaults v1.9 fills in: replicas 1, OnFailure, port 23456 on the pytorch container, nprocPerNode auto
    master = with_master["spec"]["pytorchReplicaSpecs"]["Master"]
    assert (master["replicas"], master["restartPolicy"]) == (1, "OnFailure")
    assert master["template"]["spec"]["containers"][0]["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert op.operator_env(with_master, "Worker", 1) == {
        "PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "m-master-0", "PET_MASTER_ADDR": "m-master-0",
        "WORLD_SIZE": "3", "RANK": "2", "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "3"}
