"""The emulated Kubeflow Trainer v2 stack for the Kubernetes labs: what the Trainer v2.3.0
TrainJob controller with the ``torch-distributed`` ClusterTrainingRuntime, the JobSet v0.12.0
controller (the Trainer's only runtime backend) and the Kubernetes Job controller (Indexed
completion mode) together do to a cluster when a TrainJob is created. The real ones are Go
programs that cannot be built here (no Go module proxy); and the lab's kube-apiserver 1.20 cannot
run the Jobs JobSet creates: Indexed Jobs came in 1.21 (alpha), so 1.20 drops
``completionMode: Indexed`` and would start unindexed pods with no completion index, no hostname
and no PET_NODE_RANK. So this one process stands for the three controllers, and everything it
talks to is real (kube-apiserver, etcd, the garbage collector, the endpoints controller, and in
the pod lab the scheduler and kubelets).

Run it as a process::

    python tests/integration/k8s/trainer_controller.py --kubeconfig KUBECONFIG --context CONTEXT

or import it (:func:`crd_for_120`, :func:`torch_distributed_runtime`, :func:`desired_jobset`,
:func:`desired_pods`, :class:`Controller`, :func:`controller_process`). Standard library and the
official ``kubernetes`` client only; nothing from jobgen.

Sources read (never copied):

* kubeflow/trainer tag v2.3.0 (commit 658725bd): pkg/runtime/core/trainingruntime.go
  (``newRuntimeInfo``: runtimePatches' template metadata labels/annotations go to the JobSet,
  ``mergeRuntimePatches``: each patch's ``trainingRuntimeSpec.template.spec`` strategic-merged
  into the runtime's JobSet spec, replicatedJobs by name; ``resourcesPerNode`` merged into the
  ``node`` container of the ``trainer`` ancestor; the trainer's pod count is ``numNodes``);
  pkg/runtime/framework/plugins/torch/torch.go (``EnforceMLPolicy``: PET_NNODES = numNodes,
  PET_NPROC_PER_NODE = numProcPerNode, or with "auto" and no GPU the CPU request (at least 1);
  PET_NODE_RANK from the pod's ``batch.kubernetes.io/job-completion-index`` annotation;
  PET_MASTER_ADDR ``<trainjob>-node-0-0.<trainjob>``; PET_MASTER_PORT and a container port 29500;
  ``spec.trainer.env`` upserted first); pkg/runtime/framework/plugins/jobset/jobset.go (``Build``:
  JobSet ``<trainjob>`` owned by the TrainJob, parallelism = completions = pod count; ``Status``:
  the JobSet's Completed/Failed conditions copied as Complete/Failed with their reason and
  message, ``jobsStatus`` from its replicatedJobsStatus) and builder.go (``Trainer``: replicas 1,
  image, command, args, env on the ``node`` container); pkg/controller/trainjob_controller.go
  (``setSuspendedCondition``: Suspended True/Suspended, then False/Resumed; ``reconcileDeadline``:
  past activeDeadlineSeconds from creation or the last resume, Failed/DeadlineExceeded and the
  JobSet deleted); pkg/constants;
  manifests/base/runtimes/torch_distributed.yaml (:func:`torch_distributed_runtime`).
* kubernetes-sigs/jobset tag v0.12.0 (commit f22e565a): pkg/webhooks/jobset_webhook.go
  (``Default``: completionMode Indexed, pod restartPolicy OnFailure, enableDNSHostnames and
  publishNotReadyAddresses true); pkg/controllers/jobset_controller.go (Jobs
  ``<jobset>-<replicatedJob>-<jobIndex>``, ``labelAndAnnotateObject``: the jobset.sigs.k8s.io
  labels and annotations on Jobs and pods, pod ``subdomain`` = the JobSet name,
  ``createHeadlessSvcIfNecessary``: headless Service ``<jobset>`` selecting
  ``jobset.sigs.k8s.io/jobset-name``, completed condition AllJobsCompleted); failure_policy.go
  (no failurePolicy: the first failed Job fails the JobSet, FailedJobs, "... (first failed job:
  <job>)"); pkg/constants/constants.go (reasons and messages).
* kubernetes/kubernetes pkg/controller/job (job_controller.go, indexed_job_utils.go; 1.28+
  behaviour, read through excerpts of the source): Indexed pods ``generateName
  <job>-<index>-``, hostname ``<job>-<index>``, the completion index as annotation and label and
  as JOB_COMPLETION_INDEX (fieldRef) in every container, the Job's selector labels
  (``batch.kubernetes.io/job-name``, ``job-name``, ``batch.kubernetes.io/controller-uid``,
  ``controller-uid``); backoffLimit default 6, counted as failed pods plus the container
  restarts of active pods (restartPolicy OnFailure); a Job past it fails (BackoffLimitExceeded)
  and its active pods are deleted.

Emulation decisions: the JobSet and its Jobs are computed in memory and never written (the JobSet
CRD is not installed, and 1.20 cannot run Indexed Jobs); pods and the headless Service are
created with their real names, labels, annotations and spec, owned (controller,
blockOwnerDeletion) by the TrainJob itself, standing for the TrainJob -> JobSet -> Job -> pod
chain, so a foreground delete of the TrainJob removes them through the real garbage collector.
The uids those objects would have (the ``jobset-uid`` and ``controller-uid`` labels) are stand-ins
derived from the TrainJob's uid.
The Job and JobSet statuses exist only inside a pass; the TrainJob's status (conditions,
jobsStatus) is written through its /status subresource. Each pass lists the TrainJobs and their
pods (no informers, watches or work queue: one pass per second).

Not emulated: the Trainer's admission webhooks (jobgen's offline validator and the 1.36 CRD
server check TrainJobs), initializers (dataset/model), the MPI/JAX/XGBoost/Flux plugins,
torchtune commands, podGroupPolicy (coscheduling, Volcano), TrainingRuntime (namespaced) refs,
``managedBy``, JobSet failurePolicy/restarts,
successPolicy other than All, startupPolicy, exclusive placement, TTL, Events and metrics,
Job podFailurePolicy/backoffLimitPerIndex/podReplacementPolicy.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # imported from this directory or run as a script: the repository's tests package
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.processes import process_running  # noqa: E402

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
RUNTIME_PLURAL, RUNTIME_KIND = "clustertrainingruntimes", "ClusterTrainingRuntime"
#: pkg/constants: the trainer's replicated Job and container, its ancestor label, its port.
NODE, ANCESTOR_LABEL, ANCESTOR_TRAINER, TRAINER_PORT = "node", "trainer.kubeflow.org/trainjob-ancestor-step", "trainer", 29500
RUNTIME_NAME = "torch-distributed"
JS = "jobset.sigs.k8s.io/"
JOBSET_NAME_LABEL, REPLICATED_JOB_LABEL, JOB_INDEX_LABEL = JS + "jobset-name", JS + "replicatedjob-name", JS + "job-index"
RESTARTS_KEY = JS + "restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
DEFAULT_BACKOFF_LIMIT = 6  # batch/v1 SetDefaults_Job
TORCH_RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")

log = logging.getLogger("jobgen-lab-trainer")


def now() -> str:
    """metav1.Now() as the API server stores it (RFC 3339, seconds, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- CRDs and the runtime


def crd_for_120(crd: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """A copy of a Trainer v2.3.0 CRD that kube-apiserver 1.20 accepts, and what was removed.

    1.20 rejects the shipped CRDs: every ``default: ""`` (the ``name`` of LocalObjectReferences:
    secretKeyRef, configMapKeyRef, imagePullSecrets, ...) fails its default validation ("Invalid
    value: \\"null\\": in body must be of type string"; 24 in the TrainJob CRD, 33 in the
    ClusterTrainingRuntime CRD). Removed here: those defaults; then the ``x-kubernetes-list-type:
    map`` of any list keyed on such a property (imagePullSecrets: 1.20 requires a map key to have
    a default or be required; the list becomes ``atomic``); and the ``x-kubernetes-validations``
    (CEL) rules, which 1.20 does not know (its decoder would drop them anyway). Everything else
    (structure, types, enums, required fields, pruning) is kept. Strict validation, CEL included,
    stays proven on the 1.36 CRD server with the CRDs as shipped."""
    crd = copy.deepcopy(crd)
    removed = {"empty_string_defaults": 0, "cel_rule_lists": 0, "map_lists_made_atomic": 0}

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("default") == "":
                del node["default"]
                removed["empty_string_defaults"] += 1
            if "x-kubernetes-validations" in node:
                del node["x-kubernetes-validations"]
                removed["cel_rule_lists"] += 1
            for value in node.values():
                visit(value)
            keys = node.get("x-kubernetes-list-map-keys")
            if keys:
                items = node.get("items") or {}
                props, required = items.get("properties") or {}, items.get("required") or []
                if any("default" not in props.get(k, {}) and k not in required for k in keys):
                    node["x-kubernetes-list-type"] = "atomic"
                    del node["x-kubernetes-list-map-keys"]
                    removed["map_lists_made_atomic"] += 1
        elif isinstance(node, list):
            for value in node:
                visit(value)
    visit(crd)
    return crd, removed


def torch_distributed_runtime() -> dict[str, Any]:
    """The ``torch-distributed`` ClusterTrainingRuntime of Trainer v2.3.0
    (manifests/base/runtimes/torch_distributed.yaml)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": RUNTIME_KIND,
        "metadata": {"name": RUNTIME_NAME, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
            "name": NODE, "template": {"metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}}, "spec": {"template": {"spec": {
                "containers": [{"name": NODE, "image": "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime"}]}}}}}]}}},
    }


#: The Trainer v2.3.0 CRDs the labs install (paths under jobgen/_crds), made acceptable to 1.20.
CRD_FILES = ("trainer-v2.3.0/trainer.kubeflow.org_trainjobs.yaml", "trainer-v2.3.0/trainer.kubeflow.org_clustertrainingruntimes.yaml")


@contextlib.contextmanager
def lab_crds(lab: Any, crds_dir: Path, timeout: float = 60.0) -> Iterator[dict[str, dict[str, int]]]:
    """Install :data:`CRD_FILES` through :func:`crd_for_120` and the torch-distributed runtime on
    ``lab`` (anything with ``request(method, path, body)`` answering ``(status, object)``) for the
    ``with`` block, yielding file -> what was removed; deleted again on the way out (their
    TrainJobs with them). An error names the server's refusal."""
    import yaml

    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    removed, names = {}, []
    for rel in CRD_FILES:
        crd, removed[rel] = crd_for_120(yaml.load((crds_dir / rel).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
        status, answer = lab.request("POST", crd_path, crd)
        if status not in (201, 409):
            raise RuntimeError(f"1.20 refused {rel} made for it: {status} {answer}")
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for name in names:
        while not any(c.get("type") == "Established" and c.get("status") == "True"
                      for c in (lab.request("GET", f"{crd_path}/{name}")[1].get("status") or {}).get("conditions") or []):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout} s")
            time.sleep(0.2)
    status, answer = lab.request("POST", f"/apis/{GROUP}/{VERSION}/{RUNTIME_PLURAL}", torch_distributed_runtime())
    while status == 404 and time.monotonic() < deadline:  # the new API is served a moment after Established
        time.sleep(0.2)
        status, answer = lab.request("POST", f"/apis/{GROUP}/{VERSION}/{RUNTIME_PLURAL}", torch_distributed_runtime())
    if status not in (201, 409):
        raise RuntimeError(f"the torch-distributed runtime was refused: {status} {answer}")
    try:
        yield removed
    finally:
        for name in names:
            lab.request("DELETE", f"{crd_path}/{name}")


# --------------------------------------------------------------------------- the JobSet the Trainer builds

#: Strategic-merge keys of the lists a runtime patch can reach (patchMergeKey in the Go types:
#: JobSetSpec.replicatedJobs, PodSpec, Container); other lists are replaced.
MERGE_KEYS = {"replicatedJobs": "name", "containers": "name", "initContainers": "name", "volumes": "name",
              "imagePullSecrets": "name", "env": "name", "volumeMounts": "mountPath", "ports": "containerPort"}


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """``patch`` merged into ``base`` as strategicpatch.StrategicMergePatch does for these types:
    maps recursively, keyed lists item by item (:data:`MERGE_KEYS`), anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = strategic_merge(out[k], v, k) if k in out and v is not None else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merge_key, out = MERGE_KEYS[key], copy.deepcopy(base)
        for item in patch:
            at = next((i for i, b in enumerate(out) if isinstance(b, dict) and b.get(merge_key) == item.get(merge_key)), None)
            if at is None:
                out.append(copy.deepcopy(item))
            else:
                out[at] = strategic_merge(out[at], item)
        return out
    return copy.deepcopy(patch)


def _upsert(items: list[dict[str, Any]], new: dict[str, Any], *keys: str) -> None:
    """apply.Upsert*: replace the item matching ``new`` on any of ``keys``, else append."""
    for i, item in enumerate(items):
        if any(k in new and item.get(k) == new[k] for k in keys):
            items[i] = new
            return
    items.append(new)


def _cpu_count(quantity: Any) -> int:
    """resource.Quantity.Value() of a CPU quantity (rounded up), 0 when unset."""
    if quantity is None:
        return 0
    text = str(quantity)
    value = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return int(-(-value // 1))


def torch_env(trainjob: dict[str, Any], num_nodes: int, resources: dict[str, Any]) -> list[dict[str, Any]]:
    """The variables torch.go ``EnforceMLPolicy`` upserts into the ``node`` container, in order."""
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"].get("trainer") or {}
    nproc = trainer.get("numProcPerNode")
    if nproc is None:
        gpus = any(k.endswith("/gpu") for part in ("limits", "requests") for k in (resources.get(part) or {}))
        requests = resources.get("requests") or {}
        cpu = _cpu_count(requests.get("cpu")) if requests.get("cpu") not in (None, "0") else _cpu_count((resources.get("limits") or {}).get("cpu"))
        nproc = "auto" if gpus else max(1, cpu)
    return [
        {"name": "PET_NNODES", "value": str(num_nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
    ]


def desired_jobset(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet Trainer v2.3.0 applies for ``trainjob`` with ``runtime`` (a ClusterTrainingRuntime),
    JobSet's webhook defaults included (see the module docstring for the sources)."""
    meta, spec = trainjob["metadata"], trainjob["spec"]
    trainer = spec.get("trainer") or {}
    template = copy.deepcopy(runtime["spec"]["template"])
    labels, annotations = dict((template.get("metadata") or {}).get("labels") or {}), dict((template.get("metadata") or {}).get("annotations") or {})
    js_spec = template["spec"]
    order = [r["name"] for r in js_spec.get("replicatedJobs") or []]
    for patch in spec.get("runtimePatches") or []:
        patch_template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        labels.update((patch_template.get("metadata") or {}).get("labels") or {})
        annotations.update((patch_template.get("metadata") or {}).get("annotations") or {})
        if patch_template.get("spec") is not None:
            js_spec = strategic_merge(js_spec, patch_template["spec"])
    js_spec["replicatedJobs"].sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    ml_policy = runtime["spec"].get("mlPolicy") or {}
    for rjob in js_spec["replicatedJobs"]:
        job_spec = rjob["template"].setdefault("spec", {})
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        is_trainer = ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) == ANCESTOR_TRAINER
        count = job_spec.get("parallelism", 1)
        if is_trainer:
            count = trainer.get("numNodes", ml_policy.get("numNodes", 1))
            rjob["replicas"] = 1
            for container in pod_spec.get("containers") or []:
                if container.get("name") != NODE:
                    continue
                for field in ("image", "command", "args"):
                    if trainer.get(field) is not None:
                        container[field] = copy.deepcopy(trainer[field])
                if trainer.get("resourcesPerNode") is not None:
                    container["resources"] = strategic_merge(container.get("resources") or {}, trainer["resourcesPerNode"])
                env = container.setdefault("env", [])
                for var in trainer.get("env") or []:
                    _upsert(env, copy.deepcopy(var), "name")
                if "torch" in ml_policy:
                    for var in torch_env(trainjob, count, container.get("resources") or {}):
                        _upsert(env, var, "name")
                    _upsert(container.setdefault("ports", []), {"containerPort": TRAINER_PORT}, "containerPort")
        job_spec["parallelism"] = job_spec["completions"] = count
        job_spec.setdefault("completionMode", "Indexed")  # JobSet webhook Default
        pod_spec.setdefault("restartPolicy", "OnFailure")
        rjob.setdefault("replicas", 1)
    network = js_spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    js_spec.setdefault("successPolicy", {"operator": "All"})
    js_spec["suspend"] = bool(spec.get("suspend"))
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels, "annotations": annotations,
                         "ownerReferences": [owner_reference(trainjob)]},
            "spec": js_spec}


def owner_reference(trainjob: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": trainjob["metadata"]["name"],
            "uid": trainjob["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def job_name(jobset: dict[str, Any], rjob: str, job_index: int) -> str:
    """placement.GenJobName: ``<jobset>-<replicatedJob>-<jobIndex>``."""
    return f"{jobset['metadata']['name']}-{rjob}-{job_index}"


def _jobset_labels(jobset: dict[str, Any], rjob: dict[str, Any], job_index: int) -> dict[str, str]:
    """labelAndAnnotateObject's keys (no groups, no exclusive placement, no restarts yet)."""
    name, namespace = jobset["metadata"]["name"], jobset["metadata"]["namespace"]
    job = job_name(jobset, rjob["name"], job_index)
    total = sum(int(r.get("replicas", 1)) for r in jobset["spec"]["replicatedJobs"])
    before = 0
    for r in jobset["spec"]["replicatedJobs"]:
        if r["name"] == rjob["name"]:
            break
        before += int(r.get("replicas", 1))
    return {JOBSET_NAME_LABEL: name, JS + "jobset-uid": jobset["metadata"]["ownerReferences"][0]["uid"] + "-jobset",
            REPLICATED_JOB_LABEL: rjob["name"], RESTARTS_KEY: "0", JS + "replicatedjob-replicas": str(rjob.get("replicas", 1)),
            JS + "global-replicas": str(total), JOB_INDEX_LABEL: str(job_index),
            JS + "job-key": hashlib.sha1(f"{namespace}/{job}".encode()).hexdigest(), JS + "job-global-index": str(before + job_index),
            JS + "group-name": "default", JS + "group-replicas": str(total), JS + "job-group-index": str(before + job_index)}


def desired_pod(jobset: dict[str, Any], rjob: dict[str, Any], job_index: int, completion_index: int) -> dict[str, Any]:
    """The pod the Job ``<jobset>-<rjob>-<jobIndex>`` creates for ``completion_index`` (generateName:
    the API server adds the random suffix), owned by the TrainJob (module docstring)."""
    job = job_name(jobset, rjob["name"], job_index)
    template = copy.deepcopy(rjob["template"]["spec"]["template"])
    meta = template.get("metadata") or {}
    js_labels = _jobset_labels(jobset, rjob, job_index)
    job_uid = hashlib.sha1(f"{jobset['metadata']['ownerReferences'][0]['uid']}/{job}".encode()).hexdigest()[:32]
    labels = {**(meta.get("labels") or {}), **js_labels, "batch.kubernetes.io/controller-uid": job_uid, "controller-uid": job_uid,
              "batch.kubernetes.io/job-name": job, "job-name": job, COMPLETION_INDEX: str(completion_index)}
    annotations = {**(meta.get("annotations") or {}), **js_labels, COMPLETION_INDEX: str(completion_index)}
    spec = template["spec"]
    if jobset["spec"]["network"].get("enableDNSHostnames"):
        spec["subdomain"] = jobset["spec"]["network"].get("subdomain") or jobset["metadata"]["name"]
    spec["hostname"] = f"{job}-{completion_index}"
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        env = container.setdefault("env", [])
        if not any(v.get("name") == "JOB_COMPLETION_INDEX" for v in env):
            env.append({"name": "JOB_COMPLETION_INDEX",
                        "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": f"{job}-{completion_index}-", "namespace": jobset["metadata"]["namespace"], "labels": labels,
                         "annotations": annotations, "ownerReferences": jobset["metadata"]["ownerReferences"]},
            "spec": spec}


def desired_service(jobset: dict[str, Any]) -> dict[str, Any]:
    """createHeadlessSvcIfNecessary: the headless Service pods' hostnames resolve through."""
    network = jobset["spec"]["network"]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": network.get("subdomain") or jobset["metadata"]["name"], "namespace": jobset["metadata"]["namespace"],
                         "ownerReferences": jobset["metadata"]["ownerReferences"]},
            "spec": {"clusterIP": "None", "selector": {JOBSET_NAME_LABEL: jobset["metadata"]["name"]},
                     "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses", True))}}


# --------------------------------------------------------------------------- status


def _phase(pod: dict[str, Any]) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def _active(pod: dict[str, Any]) -> bool:
    return _phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def _restarts(pod: dict[str, Any]) -> int:
    status = pod.get("status") or {}
    return sum(int(c.get("restartCount") or 0) for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])])


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def job_status(rjob: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The Job's counts as its controller keeps them: succeeded indexes, failed pods, active and
    ready pods, and whether it completed or failed (backoffLimit, default 6: failed pods plus the
    restarts of active pods)."""
    job_spec = rjob["template"]["spec"]
    completions, limit = int(job_spec["completions"]), int(job_spec.get("backoffLimit", DEFAULT_BACKOFF_LIMIT))
    succeeded = {int(p["metadata"]["annotations"][COMPLETION_INDEX]) for p in pods if _phase(p) == "Succeeded"}
    failed = sum(1 for p in pods if _phase(p) == "Failed")
    active = [p for p in pods if _active(p)]
    status = {"succeeded": len(succeeded & set(range(completions))), "failed": failed, "active": len(active),
              "ready": sum(1 for p in active if _ready(p)), "succeeded_indexes": succeeded, "state": None}
    if status["succeeded"] == completions:
        status["state"] = "Complete"
    elif failed + sum(_restarts(p) for p in active) > limit:
        status["state"] = "Failed"
    return status


def set_condition(conditions: list[dict[str, Any]], ctype: str, value: str, reason: str, message: str) -> None:
    """meta.SetStatusCondition: the transition time changes only with the status."""
    for cond in conditions:
        if cond["type"] == ctype:
            if cond["status"] != value:
                cond["lastTransitionTime"] = now()
            cond.update(status=value, reason=reason, message=message)
            return
    conditions.append({"type": ctype, "status": value, "reason": reason, "message": message, "lastTransitionTime": now()})


def past_deadline(trainjob: dict[str, Any], conditions: list[dict[str, Any]]) -> bool:
    """trainjob_controller.go ``reconcileDeadline``: ``activeDeadlineSeconds`` counted from the
    creation, or from the last resume (Suspended False)."""
    limit = int(trainjob["spec"].get("activeDeadlineSeconds") or 0)
    if not limit:
        return False
    resumed = next((c for c in conditions if c["type"] == "Suspended" and c["status"] == "False"), None)
    start = (resumed or {}).get("lastTransitionTime") or trainjob["metadata"]["creationTimestamp"]
    started = datetime.strptime(start, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    return time.time() > started + limit


def finished(status: dict[str, Any]) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in status.get("conditions") or [])


# --------------------------------------------------------------------------- the controller


class Controller:
    """Trainer + JobSet + Job controllers for TrainJobs on the torch-distributed runtime.
    :meth:`reconcile` is one pass for one TrainJob (importable); :meth:`run` passes over every
    TrainJob once a second until ``stop`` is set."""

    def __init__(self, api_client: Any):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def _raw(self, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return json.loads(call(*args, _preload_content=False, **kwargs).data or b"{}")

    def _quiet(self, ok: int, call: Any, *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            call(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status != ok:
                raise

    def reconcile(self, trainjob: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = trainjob["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp"):
            return
        status = copy.deepcopy(trainjob.get("status") or {})
        if finished(status):
            return
        ref = trainjob["spec"].get("runtimeRef") or {}
        if ref.get("kind", RUNTIME_KIND) != RUNTIME_KIND:
            log.warning("%s/%s: runtimeRef kind %s is not emulated", namespace, name, ref.get("kind"))
            return
        try:
            runtime = self._raw(self.custom.get_cluster_custom_object, GROUP, VERSION, RUNTIME_PLURAL, ref["name"])
        except ApiException as exc:
            if exc.status == 404:
                log.warning("%s/%s: ClusterTrainingRuntime %s not found", namespace, name, ref["name"])
                return
            raise
        jobset = desired_jobset(trainjob, runtime)
        selector = f"{JOBSET_NAME_LABEL}={name}"
        pods = [p for p in self._raw(self.core.list_namespaced_pod, namespace, label_selector=selector).get("items") or []
                if any(r.get("uid") == meta["uid"] for r in p["metadata"].get("ownerReferences") or [])]
        conditions = status.setdefault("conditions", [])
        if jobset["spec"]["suspend"]:  # setSuspendedCondition; a suspended JobSet suspends its Jobs: no pods
            set_condition(conditions, "Suspended", "True", "Suspended", "TrainJob is suspended")
            for pod in pods:
                if _active(pod):
                    self._quiet(404, self.core.delete_namespaced_pod, pod["metadata"]["name"], namespace)
            pods = []
        else:
            if any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
                set_condition(conditions, "Suspended", "False", "Resumed", "TrainJob is resumed")
            service = desired_service(jobset)
            self._quiet(409, self.core.create_namespaced_service, namespace, service)
        jobs_status, failed_job, all_complete = [], None, True
        for rjob in jobset["spec"]["replicatedJobs"]:
            counts = {"name": rjob["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
            for job_index in range(int(rjob.get("replicas", 1))):
                mine = [p for p in pods if p["metadata"]["labels"].get(REPLICATED_JOB_LABEL) == rjob["name"]
                        and p["metadata"]["labels"].get(JOB_INDEX_LABEL) == str(job_index)]
                st = job_status(rjob, mine)
                if jobset["spec"]["suspend"]:
                    counts["suspended"] += 1
                    all_complete = False
                    continue
                if st["state"] == "Failed":
                    failed_job = failed_job or job_name(jobset, rjob["name"], job_index)
                    for pod in mine:
                        if _active(pod):
                            self._quiet(404, self.core.delete_namespaced_pod, pod["metadata"]["name"], namespace)
                    counts["failed"] += 1
                elif st["state"] == "Complete":
                    counts["succeeded"] += 1
                else:
                    all_complete = False
                    counts["active"] += 1
                    counts["ready"] += int(st["ready"] + st["succeeded"] >= int(rjob["template"]["spec"]["completions"]))
                    busy = {int(p["metadata"]["annotations"][COMPLETION_INDEX]) for p in mine if _active(p)}
                    for index in range(int(rjob["template"]["spec"]["completions"])):
                        if index not in busy and index not in st["succeeded_indexes"]:
                            pod = desired_pod(jobset, rjob, job_index, index)
                            created = self._raw(self.core.create_namespaced_pod, namespace, pod)
                            log.info("created pod %s/%s", namespace, created["metadata"]["name"])
            jobs_status.append(counts)
        status["jobsStatus"] = jobs_status
        if failed_job is not None:  # no failurePolicy: the first failed Job fails the JobSet
            set_condition(conditions, "Failed", "True", "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {failed_job})")
        elif all_complete:
            set_condition(conditions, "Complete", "True", "AllJobsCompleted", "jobset completed successfully")
        if not finished(status) and not jobset["spec"]["suspend"] and past_deadline(trainjob, conditions):
            # reconcileDeadline: Failed, and the JobSet deleted (its Jobs, pods and Service with it)
            set_condition(conditions, "Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline")
            for pod in pods:
                self._quiet(404, self.core.delete_namespaced_pod, pod["metadata"]["name"], namespace)
            self._quiet(404, self.core.delete_namespaced_service, desired_service(jobset)["metadata"]["name"], namespace)
        if status != (trainjob.get("status") or {}):
            body = {**trainjob, "status": status}
            self.custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name, body, _preload_content=False)
            log.info("%s/%s: %s", namespace, name, json.dumps({"conditions": [(c["type"], c["status"], c["reason"]) for c in conditions],
                                                               "jobsStatus": jobs_status}))

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        from kubernetes.client.exceptions import ApiException

        log.info("reconciling %s.%s/%s in all namespaces every %s s", PLURAL, GROUP, VERSION, interval)
        while not stop.is_set():
            try:
                jobs = self._raw(self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL).get("items") or []
            except Exception as exc:  # the server went away for a moment, or the CRD is not there yet
                log.warning("list trainjobs: %s", exc)
                jobs = []
            for job in jobs:
                try:
                    self.reconcile(job)
                except ApiException as exc:  # a conflict (the object moved on): the next pass sees it
                    log.info("reconcile %s/%s: %s %s", job["metadata"]["namespace"], job["metadata"]["name"], exc.status, exc.reason)
                except Exception:
                    log.exception("reconcile %s/%s failed", job["metadata"]["namespace"], job["metadata"]["name"])
            stop.wait(interval)


@contextlib.contextmanager
def controller_process(kubeconfig: Path | str, log_path: Path, context: str = "jobgen-lab") -> Iterator[subprocess.Popen[bytes]]:
    """This module run as a process for the ``with`` block, its output in ``log_path``; stopped
    (TERM, then KILL after 15 s) on the way out. Raises AssertionError when it exits at start or
    when its log shows a traceback (a pass that failed) once it has stopped."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--kubeconfig", str(kubeconfig), "--context", context]
    with process_running(argv, log_path, "trainer controller") as proc:
        yield proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The emulated Trainer v2.3.0 + JobSet v0.12.0 + Indexed Job controllers (jobgen's k8s labs).")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--context", default=None)
    parser.add_argument("--interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    from kubernetes import config

    controller = Controller(config.new_client_from_config(config_file=args.kubeconfig, context=args.context))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    controller.run(stop, args.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
