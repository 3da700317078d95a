"""The emulated Trainer v2 stack (tests/integration/k8s/trainer_controller.py: Trainer v2.3.0 +
torch-distributed runtime + JobSet v0.12.0 + Indexed Job) run as a process against the
API-server lab (real etcd, kube-apiserver 1.20, garbage collector), on TrainJobs jobgen rendered
and submitted with its CLI: the Trainer CRDs made acceptable to 1.20 (what is removed, and that
the shipped ones are refused), the pods, hostnames, Service and torchrun environment a TrainJob
becomes, completion, the backoffLimit failure, suspend/resume, activeDeadlineSeconds, and what
``jobgen status`` and ``jobgen cancel`` make of them.

No kubelet here: pod status is written through the /status subresource as a kubelet reports it
(:func:`kubelet`). Only that report and the controllers are emulated."""

from __future__ import annotations

import re
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
from tests.integration.k8s import trainer_controller as tc
from tests.integration.k8s.emulation import NS, cli, jobgen_state, wait_for

pytestmark = pytest.mark.k8s_lab
CRDS = REPO / "jobgen" / "_crds"
TRAINJOBS = f"/apis/{tc.GROUP}/{tc.VERSION}/namespaces/{NS}/{tc.PLURAL}"


@pytest.fixture(scope="module")
def trainer(k8s_lab, tmp_path_factory) -> Iterator[dict[str, dict[str, int]]]:
    """The Trainer CRDs (made for 1.20) and the torch-distributed runtime installed, and the
    emulated controllers running, for this module only; yields what was removed from each CRD."""
    log_path = tmp_path_factory.mktemp("trainer") / "trainer.log"
    with tc.lab_crds(k8s_lab, CRDS) as removed, tc.controller_process(k8s_lab.kubeconfig, log_path):
        yield removed


def submit(lab, tmp_path: Path, name: str, nodes: int = 2, processes: int = 2, *, create: bool = True, **resources: Any) -> dict[str, Any]:
    """Render ``name`` (``nodes`` CPU pods x ``processes`` gloo processes, a Secret variable,
    further ``resources``) as a TrainJob and ``jobgen submit`` it (``create``); returns the
    TrainJob as rendered."""
    profile = tmp_path / "k8s-cpu-trainjob.yaml"
    profile.write_text(yaml.safe_dump({
        "extends": str(REPO / "cluster_profiles" / "k8s-a100.yaml"),
        "gpus_per_node": 0, "gpu_type": None, "cpu_processes_per_node": processes, "cpus_per_node": 2, "mem_gib_per_node": 8,
        "network_fabric": "tcp", "kubernetes": {"job_api": "trainjob", "priority_class": None, "shm_size_gib": 1, "rdma_resource": None,
                                                "secret_env": {"LAB_TOKEN": {"secret": "lab-token", "key": "token"}}}}))
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "model": {"preset": None, "n_layer": 2, "n_head": 2, "d_model": 64, "block_size": 64},
        "trainer": {"strategy": "ddp", "precision": "32-true", "micro_batch_size": 4, "max_steps": 6, "warmup_steps": 1},
        "resources": {"nodes": nodes, "devices_per_node": processes, **resources}}))
    job_plan = plan(load_spec(spec), load_profile(str(profile)), TEMPLATES)
    job_dir = tmp_path / name
    job_plan.write(job_dir)
    if create:
        out = cli(lab, tmp_path, "submit", str(job_dir))
        assert out.returncode == 0 and f"created k8s://jobgen-lab/{NS}/{name}" in out.stdout, out.stdout + out.stderr
    return k8s_manifest.parse_manifest(job_plan.file("trainjob.yaml"), "trainjob.yaml")[1]


def pods_of(lab, name: str) -> list[dict[str, Any]]:
    status, answer = lab.request("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={tc.JOBSET_NAME_LABEL}%3D{name}")
    assert status == 200, answer
    return sorted(answer["items"], key=lambda p: int(p["metadata"]["annotations"][tc.COMPLETION_INDEX]))


def get_job(lab, name: str) -> dict[str, Any] | None:
    status, job = lab.request("GET", f"{TRAINJOBS}/{name}")
    return job if status == 200 else None


def condition(lab, name: str, ctype: str) -> dict[str, Any] | None:
    return next((c for c in ((get_job(lab, name) or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


def kubelet(lab, pod: dict[str, Any], phase: str, *, exit_code: int | None = None, restarts: int = 0) -> None:
    """Report ``pod`` (read again: its latest version) as its kubelet would: ``phase``, its ``node``
    container running or terminated after ``restarts`` restarts."""
    status, pod = lab.request("GET", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
    assert status == 200, pod
    at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    state = ({"running": {"startedAt": at}} if exit_code is None else
             {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error", "startedAt": at, "finishedAt": at}})
    ready = "True" if phase == "Running" and exit_code is None else "False"
    body = {**pod, "status": {"phase": phase, "startTime": at, "conditions": [{"type": "Ready", "status": ready}], "containerStatuses": [{
        "name": tc.NODE, "ready": ready == "True", "restartCount": restarts, "image": pod["spec"]["containers"][0]["image"],
        "imageID": "", "state": state}]}}
    status, answer = lab.request("PUT", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status", body)
    assert status == 200, answer


def suspend(lab, name: str, value: bool) -> None:
    """Set the TrainJob's ``spec.suspend`` (GET, then PUT; again on a conflict with a status write)."""
    for _ in range(5):
        job = get_job(lab, name)
        job["spec"]["suspend"] = value
        status, answer = lab.request("PUT", f"{TRAINJOBS}/{name}", job)
        if status != 409:
            break
    assert status == 200, answer


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in pod["spec"]["containers"][0].get("env") or []}


# --------------------------------------------------------------------------- the CRDs


def test_shipped_trainer_crds_are_refused_and_the_ones_made_for_120_served(k8s_lab, trainer):
    for rel, removed in trainer.items():
        text = (CRDS / rel).read_text()
        # Every `default: ""` went (the server counted one error per such default), and every CEL rule list.
        assert removed["empty_string_defaults"] == text.count('default: ""') > 0, (rel, removed)
        assert removed["cel_rule_lists"] == text.count("x-kubernetes-validations:"), (rel, removed)
        refusal = k8s_lab.crd_rejections[rel]
        errors = re.search(r"\((\d+) errors in all\)", refusal)
        assert errors and int(errors.group(1)) == removed["empty_string_defaults"], refusal[-300:]
        assert 'must be of type string: "null"' in refusal
    for plural in (tc.PLURAL, tc.RUNTIME_PLURAL):
        status, crd = k8s_lab.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.{tc.GROUP}")
        assert status == 200 and any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    status, runtime = k8s_lab.request("GET", f"/apis/{tc.GROUP}/{tc.VERSION}/{tc.RUNTIME_PLURAL}/{tc.RUNTIME_NAME}")
    assert status == 200 and runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}, runtime


# --------------------------------------------------------------------------- pods, Service, environment


def test_trainjob_becomes_indexed_pods_a_headless_service_and_the_torchrun_environment(k8s_lab, trainer, tmp_path):
    k8s_lab.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lab-token", "namespace": NS}, "stringData": {"token": "x"}})
    rendered = submit(k8s_lab, tmp_path, "tj-pods", nodes=3, processes=2)
    trainer_spec = rendered["spec"]["trainer"]
    nodes = trainer_spec["numNodes"]
    pods = wait_for(lambda: len(pods_of(k8s_lab, "tj-pods")) == nodes and pods_of(k8s_lab, "tj-pods"), f"{nodes} pods")
    job = get_job(k8s_lab, "tj-pods")
    master = f"tj-pods-{tc.NODE}-0-0.tj-pods"  # the index-0 pod's hostname . the Service (subdomain)
    patch_pod = rendered["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    for index, pod in enumerate(pods):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["name"].startswith(f"tj-pods-{tc.NODE}-0-{index}-") and len(meta["name"]) == len(f"tj-pods-node-0-{index}-") + 5
        assert (spec["hostname"], spec["subdomain"]) == (f"tj-pods-{tc.NODE}-0-{index}", "tj-pods")
        assert meta["annotations"][tc.COMPLETION_INDEX] == meta["labels"][tc.COMPLETION_INDEX] == str(index)
        assert meta["labels"][tc.REPLICATED_JOB_LABEL] == tc.NODE and meta["labels"]["batch.kubernetes.io/job-name"] == "tj-pods-node-0"
        assert meta["ownerReferences"] == [{"apiVersion": f"{tc.GROUP}/{tc.VERSION}", "kind": "TrainJob", "name": "tj-pods",
                                            "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        for key, value in patch_pod["metadata"]["labels"].items():  # runtimePatches' pod labels reach the pods
            assert meta["labels"][key] == value
        assert spec["restartPolicy"] == "OnFailure"  # JobSet's default
        container = spec["containers"][0]
        assert (container["name"], container["image"], container["command"]) == (tc.NODE, trainer_spec["image"], trainer_spec["command"])
        env = env_of(pod)
        index_ref = {"fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{tc.COMPLETION_INDEX}']"}}
        assert env["PET_NNODES"] == str(nodes) and env["PET_NPROC_PER_NODE"] == str(trainer_spec["numProcPerNode"])
        assert env["PET_NODE_RANK"] == env["JOB_COMPLETION_INDEX"] == index_ref
        assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == (master, str(tc.TRAINER_PORT))
        for var in trainer_spec["env"]:  # spec.trainer.env, values and Secret references alike
            assert env[var["name"]] == var.get("value", var.get("valueFrom")), var
        assert {"containerPort": tc.TRAINER_PORT, "protocol": "TCP"} in container["ports"]
        assert {m["mountPath"] for m in container["volumeMounts"]} == {m["mountPath"] for m in patch_pod["spec"]["containers"][0]["volumeMounts"]}
        assert {v["name"] for v in spec["volumes"]} == {v["name"] for v in patch_pod["spec"]["volumes"]}
        requests = trainer_spec["resourcesPerNode"]["requests"]
        assert container["resources"]["requests"]["cpu"] == requests["cpu"]
    status, service = k8s_lab.request("GET", f"/api/v1/namespaces/{NS}/services/tj-pods")
    assert status == 200 and service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {tc.JOBSET_NAME_LABEL: "tj-pods"}
    # (That the master address resolves through this Service is proven on real pods: test_trainjob_on_pods.py.)
    for pod in pods:
        kubelet(k8s_lab, pod, "Running")
    wait_for(lambda: jobgen_state(k8s_lab, tmp_path, "tj-pods")["state"] == "RUNNING", "jobgen status RUNNING")
    seen = jobgen_state(k8s_lab, tmp_path, "tj-pods")
    assert seen["details"][tc.NODE] == "jobs active 1 ready 1 succeeded 0 failed 0 suspended 0", seen
    gone = cli(k8s_lab, tmp_path, "cancel", f"k8s://jobgen-lab/{NS}/tj-pods", "--wait-s", "60")
    assert gone.returncode == 0 and "DELETED" in gone.stdout, gone.stdout + gone.stderr
    wait_for(lambda: not pods_of(k8s_lab, "tj-pods"), "the pods deleted with the TrainJob (garbage collector)")
    wait_for(lambda: k8s_lab.request("GET", f"/api/v1/namespaces/{NS}/services/tj-pods")[0] == 404, "the Service deleted")


# --------------------------------------------------------------------------- status


def test_all_indexes_succeeded_complete_the_trainjob(k8s_lab, trainer, tmp_path):
    submit(k8s_lab, tmp_path, "tj-done")
    pods = wait_for(lambda: len(pods_of(k8s_lab, "tj-done")) == 2 and pods_of(k8s_lab, "tj-done"), "2 pods")
    kubelet(k8s_lab, pods[1], "Succeeded", exit_code=0)
    time.sleep(2.5)  # two passes: one index done is not the Job done
    assert condition(k8s_lab, "tj-done", "Complete") is None
    assert [p["metadata"]["name"] for p in pods_of(k8s_lab, "tj-done")] == [p["metadata"]["name"] for p in pods]  # no replacement
    kubelet(k8s_lab, pods[0], "Succeeded", exit_code=0)
    done = wait_for(lambda: condition(k8s_lab, "tj-done", "Complete"), "Complete")
    assert (done["reason"], done["message"]) == ("AllJobsCompleted", "jobset completed successfully")
    seen = jobgen_state(k8s_lab, tmp_path, "tj-done")
    assert seen["state"] == "COMPLETED" and seen["details"]["reason"] == "AllJobsCompleted", seen
    assert seen["details"][tc.NODE] == "jobs active 0 ready 0 succeeded 1 failed 0 suspended 0", seen
    assert len(pods_of(k8s_lab, "tj-done")) == 2  # finished pods stay (their logs with them)


def test_restarts_past_the_jobs_backoff_limit_fail_the_trainjob(k8s_lab, trainer, tmp_path):
    submit(k8s_lab, tmp_path, "tj-fail")
    pods = wait_for(lambda: len(pods_of(k8s_lab, "tj-fail")) == 2 and pods_of(k8s_lab, "tj-fail"), "2 pods")
    kubelet(k8s_lab, pods[0], "Running")
    kubelet(k8s_lab, pods[1], "Running", restarts=tc.DEFAULT_BACKOFF_LIMIT)  # at the limit: still running
    time.sleep(2.5)
    assert condition(k8s_lab, "tj-fail", "Failed") is None
    kubelet(k8s_lab, pods[1], "Running", restarts=tc.DEFAULT_BACKOFF_LIMIT + 1)
    failed = wait_for(lambda: condition(k8s_lab, "tj-fail", "Failed"), "Failed")
    assert failed["reason"] == "FailedJobs" and failed["message"].endswith("(first failed job: tj-fail-node-0)"), failed
    wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in pods_of(k8s_lab, "tj-fail")), "the failed Job's active pods deleted")
    seen = jobgen_state(k8s_lab, tmp_path, "tj-fail")
    assert seen["state"] == "FAILED" and seen["details"]["reason"] == "FailedJobs", seen


def test_suspend_deletes_the_pods_and_resume_brings_them_back(k8s_lab, trainer, tmp_path):
    submit(k8s_lab, tmp_path, "tj-pause")
    first = wait_for(lambda: len(pods_of(k8s_lab, "tj-pause")) == 2 and pods_of(k8s_lab, "tj-pause"), "2 pods")
    suspend(k8s_lab, "tj-pause", True)
    suspended = wait_for(lambda: condition(k8s_lab, "tj-pause", "Suspended"), "Suspended")
    assert (suspended["reason"], suspended["message"]) == ("Suspended", "TrainJob is suspended")
    wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in pods_of(k8s_lab, "tj-pause")), "the pods deleted")
    assert jobgen_state(k8s_lab, tmp_path, "tj-pause")["state"] == "SUSPENDED"
    suspend(k8s_lab, "tj-pause", False)
    resumed = wait_for(lambda: next((c for c in get_job(k8s_lab, "tj-pause")["status"]["conditions"] if c["type"] == "Suspended"
                                     and c["status"] == "False"), None), "Suspended False")
    assert (resumed["reason"], resumed["message"]) == ("Resumed", "TrainJob is resumed")
    for pod in pods_of(k8s_lab, "tj-pause"):  # no kubelet: remove the deleted pods as their kubelet would
        k8s_lab.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0")
    again = wait_for(lambda: [p for p in pods_of(k8s_lab, "tj-pause") if not p["metadata"].get("deletionTimestamp")], "new pods")
    wait_for(lambda: len([p for p in pods_of(k8s_lab, "tj-pause") if not p["metadata"].get("deletionTimestamp")]) == 2, "2 new pods")
    assert not {p["metadata"]["name"] for p in again} & {p["metadata"]["name"] for p in first}


def test_past_its_active_deadline_the_trainjob_fails_and_its_pods_go(k8s_lab, trainer, tmp_path):
    job = submit(k8s_lab, tmp_path, "tj-late", create=False, time_limit_min=1)
    assert job["spec"]["activeDeadlineSeconds"] == 60  # what jobgen renders from resources.time_limit_min
    job["spec"]["activeDeadlineSeconds"] = 8  # a shorter deadline, so that the test does not wait a minute
    status, answer = k8s_lab.request("POST", TRAINJOBS, job)
    assert status == 201, answer
    wait_for(lambda: len(pods_of(k8s_lab, "tj-late")) == 2, "2 pods")
    assert condition(k8s_lab, "tj-late", "Failed") is None
    failed = wait_for(lambda: condition(k8s_lab, "tj-late", "Failed"), "Failed after the deadline", timeout=30)
    assert (failed["reason"], failed["message"]) == ("DeadlineExceeded", "TrainJob exceeded its active deadline")
    wait_for(lambda: not pods_of(k8s_lab, "tj-late"), "the pods deleted")
    wait_for(lambda: k8s_lab.request("GET", f"/api/v1/namespaces/{NS}/services/tj-late")[0] == 404, "the Service deleted")
    seen = jobgen_state(k8s_lab, tmp_path, "tj-late")
    assert seen["state"] == "FAILED" and seen["details"]["reason"] == "DeadlineExceeded", seen
